"""report.md: what a researcher pastes into a paper, and how to reproduce it."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from gpt2.matrix import paired as pairs
from gpt2.matrix import oneshot_cells, sparsity_report, speedup, track3
from gpt2.matrix import extend
from gpt2.matrix.plan_file import planned_config
from gpt2.matrix.tuning import (grid_settings, grids, has_grid, settings_that_differ, tuned,
                                tuned_cells)
from gpt2.config.axes import COMPARED, label, value_tag
from gpt2.matrix.results import CellResult, finite
from gpt2.training import provenance
from gpt2.run_folder import PENDING
from gpt2.processes import terminal_safe
from gpt2.storage import write_text_atomic
from gpt2.config.matrix import DEFAULT_BASELINE
from gpt2.config.options import Config

# Passes over the training split past which a comparison mostly measures overfitting
# (CONFIG_EPOCH_WARNING's default, where a cell's config does not say).
EPOCH_WARNING = Config.epoch_warning
# Cells whose load averages differ by more than this factor, or that ran on different
# devices, did not measure speed under like conditions.
LOAD_SPREAD = 1.5

# Plots about the tuning itself; the report shows the loss-vs-LR one with the table.
TUNING_PLOTS = ("lr_sweep.png",)
RUNNER_NOTE = ("Each cell is a full single run in `cells/<cell>/` (config, config.json, "
               "metrics.jsonl, summary.json, train.log); `python gpt2/train.py $(args)` "
               "with a cell's args from plan.yaml reproduces it on its own.")


def _num(x: Any, fmt: str) -> str:
    return format(x, fmt) if finite(x) else "n/a"


def _pm(row: dict[str, Any], key: str, fmt: str) -> str:
    """ "mean" for one seed, "mean ± std" for more, "n/a" for none."""
    mean, std = row[f"{key}_mean"], row[f"{key}_std"]
    if not finite(mean):
        return "n/a"
    return format(mean, fmt) + (f" ± {std:{fmt}}" if finite(std) else "")


def _ci(row: dict[str, Any], key: str, fmt: str) -> str:
    ci = row[f"{key}_ci95"]
    return f"± {ci:{fmt}}" if finite(ci) else "—"


def _sort_key(row: dict[str, Any]) -> tuple:
    ppl = row["final_val_ppl_mean"]
    return (0, ppl) if finite(ppl) else (1, math.inf)


def _config_cell(c: CellResult) -> str:
    if c.config_diff is None:
        return "not started"
    return "matches" if not c.config_diff else "DIFFERS: " + ", ".join(c.config_diff)


def _results_table(rows: list[dict[str, Any]], labels: list[str], multi: bool,
                   tuned: bool = False) -> list[str]:
    """One row per combination, best perplexity first. ``tuned``: rows are settings
    at their best point, with how many points their grid had."""
    axes = [a for a in COMPARED if any(a.name in row for row in rows)]
    head = ["#", *(a.heading for a in axes), *labels, "measured sparsity", "val loss",
            "val perplexity", "epochs"]
    if multi:
        head += ["ppl 95 % CI", "seeds"]
    if tuned:
        head += ["points"]
    head += ["tokens/s", "peak MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, row in enumerate(sorted(rows, key=_sort_key), 1):
        grid = [value_tag(row["settings"][k]) if k in row["settings"] else "—" for k in labels]
        cols = [str(i), *(a.column(row.get(a.name)) for a in axes), *grid,
                _num(row["final_sparsity_mean"], ".3f"), _pm(row, "final_val_loss", ".4f"),
                _pm(row, "final_val_ppl", ".2f"), _num(row.get("epochs_trained_mean"), ".2f")]
        if tuned and not row["best"]:
            first = 1 + len(axes)
            cols[first:first + len(labels)] = ["none completed"] + ["—"] * (len(labels) - 1)
        if multi:
            cols += [_ci(row, "final_val_ppl", ".2f"), f"{row['n']}/{row['planned']}"]
        if tuned:
            cols += [f"{row['eligible']}/{row['points']}"]
        cols += [_num(row["tokens_per_sec_mean"], ",.0f"),
                 _num(row["peak_memory_mb_mean"], ",.0f")]
        lines.append("| " + " | ".join(cols) + " |")
    return lines


def _grid_lines(plan: dict[str, Any]) -> list[str]:
    """The grid each optimizer got, in words."""
    lines = []
    for optimizer, axes in grids(plan).items():
        parts = [f"{label} {' '.join(map(value_tag, a['values']))} (`{a['field']}`)"
                 + (", not tuned" if len(a["values"]) == 1 else "")
                 for label, a in axes.items()]
        lines.append(f"- **{optimizer}**: " + ("; ".join(parts) if parts else "no grid"))
    return lines


def _differing_lines(plan: dict[str, Any]) -> list[str]:
    """The settings, beyond the grids, whose values differ between optimizers' cells."""
    differ = settings_that_differ(plan)
    if not differ:
        return []
    lines = ["Settings that differ between optimizers' cells besides the grids (each "
             "optimizer's own, at the values of the configuration):", ""]
    for optimizer, values in differ.items():
        lines.append(f"- **{optimizer}**: " + ", ".join(f"`{k}` {v}" for k, v in values.items()))
    return lines + [""]


def _paired_lines(plan: dict[str, Any], cells: list[CellResult],
                  best: list[dict[str, Any]], multi: bool) -> list[str]:
    """The paired comparison with the baseline, the evaluation's error and the seeds'
    noise: what can be claimed."""
    baseline = plan.get("baseline", DEFAULT_BASELINE)
    rows = pairs.paired(cells, best, baseline)
    error = pairs.evaluation_error(cells)
    noise = pairs.seed_noise(cells)
    lines = [f"## Paired differences from {baseline}", ""]
    if not rows:
        others = {r["optimizer"] for r in best} - {baseline}
        why = (f"{baseline} (the baseline, CONFIG_MATRIX_BASELINE) has no completed cells "
               "here" if others else "there is no other optimizer to compare")
        return lines + [f"None: {why}.", ""]
    lines += [f"Final validation loss of each optimizer minus {baseline}'s, seed by seed (the "
              "same seed gives both the same initial weights and batches), each at its own "
              "best grid point; negative is better. Verdict: **better** or **worse** when the "
              "95 % interval of the mean difference excludes 0, else **not distinguishable**.",
              ""]
    others = " / ".join(a.heading for a in COMPARED if a.name != "optimizer" and not a.qualifies
                        and any(r.get(a.name) is not None for r in rows)) or "setting"
    lines += [f"| optimizer | {others} | vs | seeds | mean difference | 95 % CI | verdict |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        interval = (f"{r['mean'] - r['ci95']:+.4f} to {r['mean'] + r['ci95']:+.4f}"
                    if finite(r["ci95"]) else
                    f"eval. noise ±{r['noise']:.4f}" if finite(r["noise"]) else "—")
        lines.append(f"| {r['optimizer']} | {label(r, skip=('optimizer',))} "
                     f"| {baseline} | {r['n']} | {_num(r['mean'], '+.4f')} | {interval} | "
                     f"{r['verdict'] or 'no seed in common'} |")
    lines.append("")
    notes = []
    if error:
        tokens = ", ".join(f"{t:,}" for t in error["val_tokens"]) or "an unknown number of"
        notes.append(f"Evaluation error: the final validation loss's own standard error (over "
                     f"its windows) is {error['median']:.4f} (median over cells; "
                     f"{error['min']:.4f} to {error['max']:.4f}), on {tokens} validation "
                     "tokens.")
    if noise is not None:
        notes.append(f"Seed noise: the final validation loss varies by {noise:.4f} (standard "
                     "deviation, pooled over every grid point with several seeds) from seed "
                     "to seed; differences between optimizers smaller than that need the "
                     "paired test above.")
    if not multi:
        notes.append("**One seed: no difference beyond the evaluation's own noise can be "
                     "claimed** (seed noise is unmeasured; list 3 or more seeds in "
                     "CONFIG_MATRIX_SEEDS).")
    if has_grid(plan):
        notes.append("Best points are chosen on the same seeds the differences are computed "
                     "on, which favours every tuned optimizer alike.")
    return lines + [f"{n}" for n in notes] + ([""] if notes else [])


def _epoch_lines(cells: list[CellResult]) -> list[str]:
    """A warning when cells trained many passes over their training data."""
    over = [c for c in cells if finite(c.epochs_trained) and c.epochs_trained > _limit(c)]
    if not over:
        return []
    most = max(over, key=lambda c: c.epochs_trained)
    return [f"**Warning: {len(over)} cell(s) trained past {_limit(most):g} epochs over their "
            f"training split (up to {most.epochs_trained:.1f}, `{most.cell}`)**: final "
            "validation losses then mostly measure overfitting, and a comparison of them "
            "says little about the optimizers. Train on a larger dataset or fewer steps.", ""]


def _limit(c: CellResult) -> float:
    value = (c.config or {}).get("epoch_warning")
    return value if finite(value) and value > 0 else EPOCH_WARNING


def _ratio(row: dict[str, Any]) -> tuple[str, str]:
    """ "1.25x" (">= 1.25x" for a lower bound) and its 95 % interval."""
    if not finite(row["mean"]):
        return "—", "—"
    bound = ">= " if row.get("at_least") else ""
    interval = (f"{row['mean'] - row['ci95']:.2f}x to {row['mean'] + row['ci95']:.2f}x"
                if finite(row["ci95"]) and not bound else "—")
    return f"{bound}{row['mean']:.2f}x", interval


def speedup_lines(found: dict[str, Any], multi: bool) -> list[str]:
    """The report's opening: each optimizer's speedup over the tuned baseline."""
    baseline, rows = found["baseline"], found["tokens_to_match"]
    lines = [f"## Speedup over tuned {baseline}", ""]
    if not rows:
        return lines + [f"None: {baseline} (the baseline, CONFIG_MATRIX_BASELINE) has no "
                        "completed setting to compare with.", ""]
    lines += [f"Tokens {baseline} needed to reach each optimizer's final validation loss "
              f"(on its own validation curve, at its best grid point), over the tokens the "
              "optimizer trained, seed by seed against the same seed: above 1 is faster. "
              "**faster** / **slower** when the 95 % interval excludes 1"
              + ("." if multi else "; with one seed there is no verdict.")
              + f" {baseline}'s curve is its loss while it trained, before its rates decayed, "
              "which flatters the others; D_eff below (with three or more budgets) compares "
              "with finished runs.", "",
              "| setting | vs | seeds | speedup | 95 % CI | verdict |", "|---|---|---|---|---|---|"]
    for r in rows:
        ratio, interval = _ratio(r)
        lines.append(f"| {r['setting']} | {baseline} | {r['n']} | {ratio} | {interval} | "
                     f"{r['verdict'] or 'no seed in common'} |")
    lines.append("")
    for fit in found["fits"]:
        lines += [f"**D_eff** (Wen et al. 2025): {baseline}'s final losses at {fit['setting']} "
                  f"fitted as L(D) = {fit['a']:.4g} · D^-{fit['b']:.4g} + {fit['c']:.4f} over "
                  f"{fit['points']} cells (R² {fit['r2']:.4f}, RMSE {fit['rmse']:.4f}); an "
                  "optimizer's final loss l after D tokens is worth (a / (l - c))^(1/b) of "
                  f"{baseline}'s tokens.", ""]
    if found["d_eff"]:
        lines += ["| setting | seeds | D_eff / D | 95 % CI | verdict |", "|---|---|---|---|---|"]
        for r in found["d_eff"]:
            ratio, interval = _ratio(r)
            beyond = f" ({r['beyond_fit']} below the fit's floor)" if r["beyond_fit"] else ""
            outside = (f"; extrapolated for {r['extrapolated']} of {r['n']} seeds"
                       if r.get("extrapolated") else "")
            lines.append(f"| {r['setting']} | {r['n']}{beyond} | {ratio} | {interval} | "
                         f"{r['verdict'] or '—'}{outside} |")
        lines += ["", f"D_eff outside the tokens {baseline} trained (its smallest to its "
                  "largest budget) is the fit's extrapolation, not a measurement.", ""]
    return lines


def speedup_summary(found: dict[str, Any]) -> list[str]:
    """The speedup table in a few terminal lines."""
    out = []
    for r in found["tokens_to_match"]:
        ratio, interval = _ratio(r)
        out.append(f"{r['setting']}: {ratio} vs tuned {found['baseline']}"
                   + (f" ({interval}, {r['verdict']})" if interval != "—" else
                      f" ({r['verdict']})" if r["verdict"] else ""))
    for r in found["d_eff"]:
        ratio, interval = _ratio(r)
        out.append(f"{r['setting']}: D_eff {ratio}" + (f" ({interval})" if interval != "—"
                                                       else ""))
    return out


def extension_lines(extensions: dict[str, Any] | None) -> list[str]:
    """The grid points CONFIG_MATRIX_TUNE_EXTEND added, round by round, and why."""
    rounds = (extensions or {}).get("rounds") or []
    if not rounds:
        return []
    lines = ["## Grid extension", "",
             "Best points on the end of a tuning grid added the next point beyond it at the "
             "grid's own ratio (CONFIG_MATRIX_TUNE_EXTEND; extensions.json):", ""]
    for r in rounds:
        for p in r.get("added") or []:
            lines.append(f"- round {r.get('round')}: {p.get('optimizer')} {p.get('label')} "
                         f"+ {value_tag(p.get('value'))} ({p.get('why')})")
    return lines + [""]


def branch_lines(plan: dict[str, Any], cells: list[CellResult]) -> list[str]:
    """What training the shorter WSD budgets as cooldown branches saved."""
    planned = {c["id"]: c["branch"] for c in plan["cells"] if c.get("branch")}
    if not planned:
        return []
    branched = [c.cell for c in cells if c.cell in planned
                and ((c.provenance or {}).get("parent") or {}).get("how") == "branches"]
    total = sum(planned_config(c["args"]).max_iters for c in plan["cells"])
    saved = sum(planned[cid]["step"] for cid in branched)
    lines = ["## Cooldown branches", "",
             f"Under WSD, {len(branched)} of the {len(planned)} shorter-budget cells that "
             "could branch started from their longest cell's checkpoint where their own "
             "cooldown begins: exactly the cell trained from step 0, for the steps of its "
             f"cooldown. The cells trained {total - saved:,} of the {total:,} steps they add "
             f"up to ({saved / total:.0%} saved).", ""]
    # A cell that has not started is neither: it is counted as not run yet, never as
    # trained from step 0 (a matrix stopped halfway listed its pending cells so).
    started = {c.cell for c in cells if c.status != PENDING}
    straight = [cid for cid in planned if cid not in branched and cid in started]
    waiting = [cid for cid in planned if cid not in started]
    if straight:
        lines += ["Trained from step 0 instead (their longest cell kept no checkpoint for "
                  "them, or they ran on Slurm): "
                  + ", ".join(f"`{cid}`" for cid in straight) + ".", ""]
    if waiting:
        lines += [f"Not run yet: {len(waiting)} of them (counted above as trained from "
                  "step 0 until they branch).", ""]
    return lines


def target_lines(plan: dict[str, Any], cells: list[CellResult],
                 best: list[dict[str, Any]]) -> list[str]:
    """The steps to CONFIG_MATRIX_TARGET_LOSS, judged by track 3's rules."""
    target = plan.get("target_loss")
    if target is None:
        return []
    baseline = plan.get("baseline", DEFAULT_BASELINE)
    rows = track3.target_rows(cells, best, baseline, target)
    if not rows:
        return []
    lines = [f"## Steps to the target loss {target:g}", "",
             "Each tuned setting at its best grid point, every completed seed, judged by the "
             "rules of modded-nanogpt's optimization benchmark (track 3): its mean final "
             f"validation loss passes when (target - mean) x sqrt(seeds) >= "
             f"{track3.SIGNIFICANT_MARGIN} (a one-sided z-test at p < 0.001 with sigma 0.0013); "
             "`earliest` is the first evaluated step whose mean over the seeds passes; "
             f"`vs {baseline}` is track 3's pairwise rule, (baseline's loss - this loss + "
             f"{track3.LOSS_PER_100_STEPS} x the steps saved / 100) / sqrt(1/n1 + 1/n2), "
             f"significant at {track3.SIGNIFICANT_MARGIN}. `first at or below`: each seed's "
             "first evaluated step under the target. The sigma and the loss per 100 steps "
             "are track 3's (GPT-2 124M on FineWeb, near 3,000 steps); on another setup the "
             "paired differences below measure this matrix's own noise.", "",
             f"| setting | steps | seeds | mean final loss | margin | passes | earliest | "
             f"vs {baseline} | first at or below |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, pair = r["score"], r.get("pairwise")
        first = ", ".join(f"{f[0]:,}" if f else "not reached" for f in r["first"])
        lines.append(
            f"| {r['setting']} | {s.steps:,} | {s.runs} | {s.mean_loss:.4f} | {s.margin:+.4f} | "
            f"{'yes' if s.valid else 'no'} | "
            f"{f'{s.earliest_step:,}' if s.earliest_step is not None else 'none'} | "
            + (f"{pair:+.4f} ({'better' if pair >= track3.SIGNIFICANT_MARGIN else 'not significant'})"
               if pair is not None else "")
            + f" | {first} |")
    return lines + [""]


def _speed_lines(cells: list[CellResult]) -> list[str]:
    """Where the speed figures were measured, and whether they compare."""
    ran = [c for c in cells if c.usable]
    devices = sorted({c.device for c in ran if c.device})
    loads = [c.load_avg for c in ran if finite(c.load_avg)]
    if not devices and not loads:
        return []
    text = (f"Speed (tokens/s, wall) was measured on {' and '.join(devices) or 'unrecorded devices'}"
            + (f", at load averages {min(loads):.1f} to {max(loads):.1f}" if loads else "")
            + ".")
    if len(devices) > 1 or (loads and max(loads) > LOAD_SPREAD * max(min(loads), 1.0)):
        text = ("**Speed figures are not comparable between cells**: " + text[0].lower()
                + text[1:] + " Compare tokens/s only between cells of one device and load, or "
                "measure with `make bench`.")
    return [text, ""]


def _plot_lines(p) -> list[str]:
    return ([f"### {p.title}", "", f"![{p.title}](plots/{p.filename})", ""]
            + [f"- {note}" for note in p.notes] + ([""] if p.notes else []))


def render(plan: dict[str, Any], cells: list[CellResult], combos: list[dict[str, Any]],
           plots: list[Any], best: list[dict[str, Any]] | None = None,
           extensions: dict[str, Any] | None = None,
           oneshot: list[dict[str, Any]] | None = None) -> str:
    counts: dict[str, int] = {}
    for c in cells:
        counts[c.status] = counts.get(c.status, 0) + 1
    seeds = plan["axes"].get("seeds") or []
    multi = len(seeds) > 1
    labels = grid_settings(cells)
    gridded = has_grid(plan)
    best = best if best is not None else tuned(plan, combos)
    lines = [f"# Test matrix {plan['name']} ({plan['hash']})", "",
             f"{len(cells)} cells planned: " + ", ".join(f"{n} {s}" for s, n in sorted(
                 counts.items())) + f". Seeds: {', '.join(map(str, seeds))}. "
             f"Written {time.strftime('%Y-%m-%d %H:%M %Z')}.", ""]
    lines += _mixed_provenance(cells) + _epoch_lines(cells)
    if len({c.optimizer for c in cells}) > 1:
        lines += speedup_lines(speedup.speedups(
            cells, best, plan.get("baseline", DEFAULT_BASELINE)), multi)
    lines += extension_lines(extensions)
    top = {p.filename: p for p in plots if p.filename in TUNING_PLOTS}
    if gridded:
        lines += ["## Tuned comparison: each optimizer at its best grid point", "",
                  "Each " + " x ".join(a.name.replace("_", " ") for a in COMPARED
                                       if any(a.name in r for r in best))
                  + " at the grid point with the lowest final "
                  "validation loss" + (" (mean over seeds; only points whose every seed "
                                       "completed count)" if multi else
                                       " (only completed points count)")
                  + ". Grid columns name the setting each point sets (an optimizer with a "
                  "rate of its own shows it under that setting's name, the rest of its model's "
                  "under `learning_rate`). `points`: grid points that "
                  "count / planned.", ""]
        lines += _results_table(best, labels, multi, tuned=True) + [""]
        edges = [w for r in best for w in r["edges"]]
        if edges:
            lines += ["**Under-tuned** (best point on the edge of its grid):", ""]
            lines += [f"- {w}" for w in edges] + [""]
        lines += ["Grids:", ""] + _grid_lines(plan) + [""]
    lines += target_lines(plan, cells, best)
    lines += _differing_lines(plan) + branch_lines(plan, cells)
    if len({c.optimizer for c in cells}) > 1:
        lines += _paired_lines(plan, cells, best, multi)
    lines += sparsity_report.equal_cost_lines(tuned_cells(cells, best), oneshot or [],
                                              pairs.seed_noise(cells))
    lines += sparsity_report.lr_moved_lines(plan, best)
    if gridded and "lr_sweep.png" in top and not top["lr_sweep.png"].skipped:
        lines += _plot_lines(top.pop("lr_sweep.png"))
    unusable = [c for c in cells if not c.usable]
    if unusable:
        lines += ["**Not in the results** (re-run the matrix command to resume or retry):", ""]
        lines += [f"- `{c.cell}`: {c.status if c.status != 'completed' else 'NaN loss'}"
                  + (f" — {c.error}" if c.error else "") for c in unusable]
        lines.append("")
    lines += ["## Results, every grid point, best perplexity first" if gridded
              else "## Results, best perplexity first", ""]
    lines += _results_table(combos, labels, multi)
    lines += ["", "Perplexity is exp(validation loss) at the end of training. Measured sparsity "
              "is the fraction of zero weights in the pruning targets at the end."
              + (" With several seeds: mean ± sample standard deviation, and the half-width "
                 "of a 95 % Student-t confidence interval." if multi else "")
              + " Epochs: passes over the training split.", ""]
    lines += _speed_lines(cells)
    # (lr_sweep.png sits with the tuned table, or nowhere)
    rest = [p for p in plots if p.filename != "lr_sweep.png" and not p.skipped]
    if rest:
        lines += ["## Plots", ""]
        if gridded:
            lines += ["Drawn from the tuned cells: each setting at its best grid point.", ""]
        for p in rest:
            lines += _plot_lines(p)
        skipped = [p for p in plots if p.skipped]
        if skipped:
            lines += ["Not drawn, having nothing to show: " + "; ".join(
                f"{p.title} ({p.skipped})" for p in skipped) + ".", ""]
    on_slurm = any(c.slurm_job for c in cells)
    lines += ["## Cells", "", "| cell | status | val loss | sparsity | tokens/s | peak MB | "
              "wall | code | data | config vs plan |" + (" Slurm job |" if on_slurm else ""),
              "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if on_slurm else "")]
    for c in cells:
        made = c.provenance or {}
        lines.append(f"| `{c.cell}` | {c.status} | {_num(c.final_val_loss, '.4f')} | "
                     f"{_num(c.final_sparsity, '.3f')} | {_num(c.tokens_per_sec, ',.0f')} | "
                     f"{_num(c.peak_memory_mb, ',.0f')} | {_num(c.wall_time_s, '.0f')} s | "
                     f"{provenance.short(made.get('code')) if made else 'n/a'} | "
                     f"{(made.get('data') or {}).get('sha256', 'n/a')} | {_config_cell(c)} |"
                     + (f" {c.slurm_job or 'n/a'} |" if on_slurm else ""))
    commits = _commits(cells)
    lines += ["", "## Reproduce", "",
              f"Produced by `{plan.get('command') or 'make test-matrix'}` from the "
              "configuration in `config` (copy it to `.config`), at git commit(s) "
              f"{', '.join(sorted(set(commits.values()))) or 'n/a'}. " + RUNNER_NOTE,
              ""]
    if on_slurm:
        arrays = sorted({c.slurm_job.split("_")[0] for c in cells if c.slurm_job},
                        key=lambda j: (len(j), j))
        lines += [f"The cells ran on Slurm as job array(s) {', '.join(arrays)} "
                  "(`slurm/cells.sbatch`, submitted with `--array=<cells>`; `slurm/jobs.json` "
                  "lists every submission). The Slurm job column names the array task that "
                  "last ran each cell; its log is the cell's `train.log`.", ""]
    lines += ["`make report RUN=<this folder>` rebuilds this file and the plots without "
              "training.", ""]
    return "\n".join(lines)


def mixed_provenance(cells: list[CellResult]) -> str | None:
    """A warning when the results in the tables were made by different code or data
    (IF_CHANGED=reuse keeps such cells), else None."""
    made = {}
    for c in cells:
        if c.usable:
            made.setdefault(provenance.key(c.provenance), []).append(c.cell)
    if len(made) < 2:
        return None
    groups = []
    for key, members in made.items():
        code = next((c.provenance for c in cells if c.cell == members[0]), None) or {}
        what = (f"{provenance.short(code.get('code'))}, data {code['data'].get('sha256')}"
                if key else "unrecorded code and data")
        groups.append(f"{what}: {', '.join(members)}")
    return ("these results were made by " + str(len(made)) + " different code or data "
            "versions, so the tables compare them too: " + "; ".join(groups))


def _mixed_provenance(cells: list[CellResult]) -> list[str]:
    warning = mixed_provenance(cells)
    return [f"**Warning: {warning}.**", ""] if warning else []


def _commits(cells: list[CellResult]) -> dict[str, str]:
    out = {}
    for c in cells:
        if c.git_commit:
            out[c.cell] = c.git_commit[:12] + ("-dirty" if c.git_commit.endswith("-dirty") else "")
    return out


def write_report(folder: Path, plan: dict[str, Any], cells: list[CellResult],
                 combos: list[dict[str, Any]], plots: list[Any],
                 best: list[dict[str, Any]] | None = None) -> Path:
    path = folder / "report.md"
    extensions = extend.read_planned(folder, plan)  # (PlanError: one not written for it)
    # (people `cat` it: text from the plan and the cells is shown, never sent: terminal_safe)
    write_text_atomic(path, terminal_safe(render(plan, cells, combos, plots, best, extensions,
                                                 oneshot_cells.rows(folder, plan, cells))))
    return path
