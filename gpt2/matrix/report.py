"""report.md: what a researcher pastes into a paper, and how to reproduce it."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from gpt2.matrix.tuning import grid_labels, grids, has_grid, tuned
from gpt2.matrix.results import CellResult, finite, percent, value_tag
from gpt2.training import provenance
from gpt2.storage import write_text_atomic

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
    head = ["#", "optimizer", "pruning", "target", *labels, "measured sparsity", "val loss",
            "val perplexity"]
    if multi:
        head += ["ppl 95 % CI", "seeds"]
    if tuned:
        head += ["points"]
    head += ["tokens/s", "peak MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, row in enumerate(sorted(rows, key=_sort_key), 1):
        target = row["target_sparsity"]
        grid = [value_tag(row["grid"][k]) if k in row["grid"] else "—" for k in labels]
        cols = [str(i), row["optimizer"], row["pruning"],
                "—" if target is None else percent(target), *grid,
                _num(row["final_sparsity_mean"], ".3f"), _pm(row, "final_val_loss", ".4f"),
                _pm(row, "final_val_ppl", ".2f")]
        if tuned and not row["best"]:
            cols[4:4 + len(labels)] = ["none completed"] + ["—"] * (len(labels) - 1)
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


def _plot_lines(p) -> list[str]:
    return ([f"### {p.title}", "", f"![{p.title}](plots/{p.filename})", ""]
            + [f"- {note}" for note in p.notes] + ([""] if p.notes else []))


def render(plan: dict[str, Any], cells: list[CellResult], combos: list[dict[str, Any]],
           plots: list[Any], best: list[dict[str, Any]] | None = None) -> str:
    counts: dict[str, int] = {}
    for c in cells:
        counts[c.status] = counts.get(c.status, 0) + 1
    seeds = plan["axes"].get("seeds") or []
    multi = len(seeds) > 1
    labels = grid_labels(cells)
    gridded = has_grid(plan)
    best = best if best is not None else tuned(plan, combos)
    lines = [f"# Test matrix {plan['name']} ({plan['hash']})", "",
             f"{len(cells)} cells planned: " + ", ".join(f"{n} {s}" for s, n in sorted(
                 counts.items())) + f". Seeds: {', '.join(map(str, seeds))}. "
             f"Written {time.strftime('%Y-%m-%d %H:%M %Z')}.", ""]
    lines += _mixed_provenance(cells)
    top = {p.filename: p for p in plots if p.filename in TUNING_PLOTS}
    if gridded:
        lines += ["## Tuned comparison: each optimizer at its best grid point", "",
                  "Each optimizer x pruning x sparsity at the grid point with the lowest final "
                  "validation loss" + (" (mean over seeds; only points whose every seed "
                                       "completed count)" if multi else
                                       " (only completed points count)")
                  + ". `points`: grid points that count / planned.", ""]
        lines += _results_table(best, labels, multi, tuned=True) + [""]
        edges = [w for r in best for w in r["edges"]]
        if edges:
            lines += ["**Under-tuned** (best point on the edge of its grid):", ""]
            lines += [f"- {w}" for w in edges] + [""]
        lines += ["Grids:", ""] + _grid_lines(plan) + [""]
        if "lr_sweep.png" in top:
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
                 "of a 95 % Student-t confidence interval." if multi else ""), ""]
    rest = [p for p in plots if p.filename != "lr_sweep.png"]  # with the tuned table, or none
    if rest:
        lines += ["## Plots", ""]
        if gridded:
            lines += ["Drawn from the tuned cells: each setting at its best grid point.", ""]
        for p in rest:
            lines += _plot_lines(p)
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
    write_text_atomic(path, render(plan, cells, combos, plots, best))
    return path
