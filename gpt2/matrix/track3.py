"""modded-nanogpt track 3's score and its significance rules, as its README states them
(records/track_3_optimization/README.md of KellerJordan/modded-nanogpt, "Rules" and
"Pairwise statistical significance").

- A result is valid when its mean final validation loss over n runs that were not
  cherry-picked is below the target (3.28) with a one-sided z-test at p < 0.001,
  taking the runs' standard deviation to be 0.0013:
  ``(3.28 - mean) * sqrt(n) >= 0.004`` (3.09 sigma = 0.004).
- One result is significantly better than another when
  ``(final_loss_diff + exp_stepbased_loss_diff) / sqrt(1/n1 + 1/n2) >= 0.004``, where a
  step count 100 steps shorter is worth 0.0045 of loss (measured on result #12).
- The score is the number of steps. A run may evaluate every 25 steps near its end
  and report the earliest step at which the mean over its seeds passes the test,
  provided that step is chosen alike for every seed.

The rules are arithmetic on losses and step counts; target_rows applies them to a
matrix's tuned cells for the report (CONFIG_MATRIX_TARGET_LOSS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpt2.config.axes import label, setting
from gpt2.matrix.paired import best_cells

TARGET_LOSS = 3.28
# 3.09 x sigma, sigma = 0.0013: the margin a z-test at p < 0.001 asks for
SIGNIFICANT_MARGIN = 0.004
# the loss 100 fewer steps cost, near the target (result #12 cut by 200 steps)
LOSS_PER_100_STEPS = 0.0045


def margin(mean_loss: float, runs: int, target: float = TARGET_LOSS) -> float:
    """The left-hand side of track 3's validity rule: (target - mean) x sqrt(n)."""
    return (target - mean_loss) * math.sqrt(runs)


def reaches_target(mean_loss: float, runs: int, target: float = TARGET_LOSS) -> bool:
    """Whether n runs with this mean loss pass track 3's test for the target."""
    return margin(mean_loss, runs, target) >= SIGNIFICANT_MARGIN


def pairwise(new_loss: float, new_runs: int, new_steps: int,
             old_loss: float, old_runs: int, old_steps: int,
             loss_per_100_steps: float = LOSS_PER_100_STEPS) -> float:
    """The left-hand side of track 3's pairwise rule for a new result against an old
    one: the old one's loss minus the new one's, plus what the new one's fewer steps
    are worth in loss, over sqrt(1/n_old + 1/n_new). Positive: the new is better."""
    step_worth = (old_steps - new_steps) / 100 * loss_per_100_steps
    return (old_loss - new_loss + step_worth) / math.sqrt(1 / old_runs + 1 / new_runs)


def significantly_better(new_loss: float, new_runs: int, new_steps: int,
                         old_loss: float, old_runs: int, old_steps: int) -> bool:
    return pairwise(new_loss, new_runs, new_steps, old_loss, old_runs,
                    old_steps) >= SIGNIFICANT_MARGIN


@dataclass(frozen=True)
class Score:
    """One optimizer's track 3 result over its seeds."""

    steps: int  # the run's length
    runs: int
    mean_loss: float  # the mean final validation loss
    margin: float  # (target - mean) x sqrt(n)
    valid: bool  # the margin reaches 0.004
    # the earliest evaluated step at which the seeds' mean passes the test (None: none)
    earliest_step: int | None


def score(losses_by_step: dict[int, list[float]], steps: int,
          target: float = TARGET_LOSS) -> Score:
    """Track 3's result of one optimizer from each evaluated step's validation losses,
    one per seed (every seed evaluated at the same steps): the final step's mean and
    test, and the earliest step whose mean passes. Steps where not every seed has a
    loss are skipped."""
    final = losses_by_step[steps]
    runs = len(final)
    full = sorted(s for s, losses in losses_by_step.items() if len(losses) == runs)
    earliest = next((s for s in full
                     if reaches_target(sum(losses_by_step[s]) / runs, runs, target)), None)
    mean = sum(final) / runs
    return Score(steps, runs, mean, margin(mean, runs, target),
                 reaches_target(mean, runs, target), earliest)


# ---- a matrix's cells by these rules ------------------------------------------------------

def val_curve(metrics: list[dict]) -> list[tuple[int, int, float]]:
    """(step, tokens, validation loss) of every evaluation in a cell's metrics rows."""
    return [(row["step"], row.get("tokens", 0), row["val_loss"]) for row in metrics
            if isinstance(row.get("val_loss"), (int, float))]


def first_below(metrics: list[dict], target: float) -> tuple[int, int] | None:
    """The first evaluated step (and the tokens trained by then) whose validation loss is
    at or below ``target``; None when none is."""
    return next(((step, tokens) for step, tokens, loss in val_curve(metrics)
                 if loss <= target), None)


def target_rows(cells, best: list[dict], baseline: str, target: float) -> list[dict]:
    """For each tuned setting (its best grid point, every completed seed): its steps,
    track 3's score against ``target``, each seed's first step at or below the target,
    and, for other optimizers than ``baseline``, the pairwise rule against the
    baseline's setting with the same other axes."""
    rows = {}
    for row in best:
        if not row["best"]:
            continue
        seeds = best_cells(cells, row)
        if not seeds:
            continue
        by_step: dict[int, list[float]] = {}
        for cell in seeds.values():
            for step, _, loss in val_curve(cell.metrics):
                by_step.setdefault(step, []).append(loss)
        if not by_step:  # (no evaluation recorded)
            continue
        steps = max(by_step)
        by_step[steps] = [c.final_val_loss for c in seeds.values()]  # the summaries' figure
        rows[setting(row)] = {"setting": label(row), "optimizer": row["optimizer"],
                              "partner": setting({**row, "optimizer": baseline}),
                              "score": score(by_step, steps, target),
                              "first": [first_below(c.metrics, target)
                                        for _, c in sorted(seeds.items())]}
    for entry in rows.values():
        base = rows.get(entry.pop("partner"))
        if entry["optimizer"] != baseline and base is not None:
            mine, theirs = entry["score"], base["score"]
            entry["pairwise"] = pairwise(mine.mean_loss, mine.runs, mine.steps,
                                         theirs.mean_loss, theirs.runs, theirs.steps)
    return list(rows.values())
