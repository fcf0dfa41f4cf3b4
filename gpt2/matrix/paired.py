"""Paired differences: each optimizer against the baseline, seed by seed.

Two optimizers trained with the same seed see the same initial weights and the same
batches, so most of the seed-to-seed noise is shared: the difference of their final
validation losses, seed by seed, varies far less than either loss does. For each
setting (optimizer x pruning x sparsity ...) at its best grid point (gpt2/matrix/
tuning.py), the differences from the baseline optimizer at the same values of the other
compared axes (gpt2/config/axes.py; also at its best point) over the seeds both
completed give a mean, a 95 % Student-t confidence interval and a verdict:

    better               the whole interval is below zero (a lower loss)
    worse                the whole interval is above zero
    not distinguishable  the interval holds zero

With one seed there is no interval. Then a difference within the evaluation's own
noise (1.96 x the standard error of the two validation losses, from the spread of
the loss over the validation windows) is "not distinguishable", and any larger one
gets no verdict: seed noise is unmeasured, and on the CPU tuning preset it was
several times the differences between optimizers.

The best points are chosen on the same seeds the differences are computed on, which
favours every tuned optimizer alike (a selection bias the report states).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from gpt2.config.axes import setting, setting_of
from gpt2.matrix.results import CellResult, finite

# Two-sided 95 % Student t quantiles t(0.975, df) for df = 1..30; above 30 the
# normal 1.96 is within 4 %.
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
VERDICTS = ("better", "worse", "not distinguishable", "no verdict (one seed)")


def t95(n: int) -> float:
    """The t quantile of a 95 % interval of a mean of ``n`` >= 2 values."""
    return T95[n - 2] if n - 1 <= len(T95) else 1.96


def best_cells(cells: list[CellResult], row: dict[str, Any]) -> dict[int, CellResult]:
    """{seed: completed cell} of a tuned row's best grid point."""
    key = setting(row)
    point = tuple(row["grid"].items())
    return {c.seed: c for c in cells if c.setting == key and c.point == point and c.usable}


def evaluation_noise(a: CellResult, b: CellResult) -> float | None:
    """1.96 x the standard error of the difference of two final validation losses
    from the validation set alone (None where a cell did not record its error)."""
    if not (finite(a.final_val_loss_se) and finite(b.final_val_loss_se)):
        return None
    return 1.96 * math.hypot(a.final_val_loss_se, b.final_val_loss_se)


def verdict(diffs: list[float], noise: float | None = None) -> dict[str, Any]:
    """Mean, standard deviation, 95 % half-width and verdict of paired differences
    (loss of the optimizer minus the baseline's; negative is better)."""
    n = len(diffs)
    mean = statistics.fmean(diffs)
    if n < 2:
        within = noise is not None and abs(mean) <= noise
        return {"n": n, "mean": mean, "std": None, "ci95": None, "noise": noise,
                "verdict": VERDICTS[2] if within else VERDICTS[3]}
    std = statistics.stdev(diffs)
    half = t95(n) * std / math.sqrt(n)
    which = 0 if mean + half < 0 else 1 if mean - half > 0 else 2
    return {"n": n, "mean": mean, "std": std, "ci95": half, "noise": noise,
            "verdict": VERDICTS[which]}


def paired(cells: list[CellResult], best: list[dict[str, Any]],
           baseline: str) -> list[dict[str, Any]]:
    """One row per tuned setting of another optimizer than ``baseline`` whose
    baseline setting (the same values of every other compared axis: pruning method,
    sparsity, budget) has a best point: the seeds both
    completed, the per-seed differences and their :func:`verdict`. Settings with no
    seed in common are listed with "n" 0."""
    def partner(row):  # the setting with the baseline in the optimizer's place
        return setting({**row, "optimizer": baseline})

    bases = {setting(r): r for r in best if r["optimizer"] == baseline and r["best"]}
    out = []
    for row in best:
        base = bases.get(partner(row))
        if row["optimizer"] == baseline or base is None or not row["best"]:
            continue
        mine, theirs = best_cells(cells, row), best_cells(cells, base)
        seeds = sorted(set(mine) & set(theirs))
        entry = {**setting_of(row), "baseline": baseline,
                 "grid": row["grid"], "baseline_grid": base["grid"], "seeds": seeds,
                 "differences": [mine[s].final_val_loss - theirs[s].final_val_loss
                                 for s in seeds]}
        if seeds:
            noise = evaluation_noise(mine[seeds[0]], theirs[seeds[0]]) if len(seeds) == 1 \
                else None
            entry.update(verdict(entry["differences"], noise))
        else:
            entry.update({"n": 0, "mean": None, "std": None, "ci95": None, "noise": None,
                          "verdict": None})
        out.append(entry)
    return out


def evaluation_error(cells: list[CellResult]) -> dict[str, Any] | None:
    """The validation loss's own standard error over the completed cells (median,
    range) and the validation tokens it is measured on; None if no cell recorded it."""
    ses = sorted(c.final_val_loss_se for c in cells if c.usable and finite(c.final_val_loss_se))
    if not ses:
        return None
    tokens = {c.val_tokens for c in cells if c.usable and isinstance(c.val_tokens, int)}
    return {"median": statistics.median(ses), "min": ses[0], "max": ses[-1],
            "val_tokens": sorted(tokens)}


def seed_noise(cells: list[CellResult]) -> float | None:
    """The pooled standard deviation of the final validation loss over seeds, within
    each setting and grid point that has 2 or more completed seeds (None if none)."""
    groups: dict[tuple, list[float]] = {}
    for c in cells:
        if c.usable:
            groups.setdefault(c.combination, []).append(c.final_val_loss)
    num = sum((len(v) - 1) * statistics.variance(v) for v in groups.values() if len(v) > 1)
    dof = sum(len(v) - 1 for v in groups.values() if len(v) > 1)
    return math.sqrt(num / dof) if dof else None
