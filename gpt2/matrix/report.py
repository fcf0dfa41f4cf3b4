"""report.md: what a researcher pastes into a paper, and how to reproduce it."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from gpt2.matrix.results import CellResult, finite, percent
from gpt2.training import provenance
from gpt2.training.runs import write_text_atomic

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


def render(plan: dict[str, Any], cells: list[CellResult], combos: list[dict[str, Any]],
           plots: list[Any]) -> str:
    counts: dict[str, int] = {}
    for c in cells:
        counts[c.status] = counts.get(c.status, 0) + 1
    seeds = plan["axes"]["seeds"]
    lines = [f"# Test matrix {plan['name']} ({plan['hash']})", "",
             f"{len(cells)} cells planned: " + ", ".join(f"{n} {s}" for s, n in sorted(
                 counts.items())) + f". Seeds: {', '.join(map(str, seeds))}. "
             f"Written {time.strftime('%Y-%m-%d %H:%M %Z')}.", ""]
    lines += _mixed_provenance(cells)
    unusable = [c for c in cells if not c.usable]
    if unusable:
        lines += ["**Not in the results** (re-run the matrix command to resume or retry):", ""]
        lines += [f"- `{c.cell}`: {c.status if c.status != 'completed' else 'NaN loss'}"
                  + (f" — {c.error}" if c.error else "") for c in unusable]
        lines.append("")
    multi = len(seeds) > 1
    lines += ["## Results, best perplexity first", ""]
    head = ["#", "optimizer", "pruning", "target", "measured sparsity", "val loss",
            "val perplexity"]
    if multi:
        head += ["ppl 95 % CI", "seeds"]
    head += ["tokens/s", "peak MB"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, row in enumerate(sorted(combos, key=_sort_key), 1):
        target = row["target_sparsity"]
        cols = [str(i), row["optimizer"], row["pruning"],
                "—" if target is None else percent(target),
                _num(row["final_sparsity_mean"], ".3f"), _pm(row, "final_val_loss", ".4f"),
                _pm(row, "final_val_ppl", ".2f")]
        if multi:
            cols += [_ci(row, "final_val_ppl", ".2f"), f"{row['n']}/{row['planned']}"]
        cols += [_num(row["tokens_per_sec_mean"], ",.0f"), _num(row["peak_memory_mb_mean"], ",.0f")]
        lines.append("| " + " | ".join(cols) + " |")
    lines += ["", "Perplexity is exp(validation loss) at the end of training. Measured sparsity "
              "is the fraction of zero weights in the pruning targets at the end."
              + (" With several seeds: mean ± sample standard deviation, and the half-width "
                 "of a 95 % Student-t confidence interval." if multi else ""), ""]
    if plots:
        lines += ["## Plots", ""]
        for p in plots:
            lines += [f"### {p.title}", "", f"![{p.title}](plots/{p.filename})", ""]
            lines += [f"- {note}" for note in p.notes] + ([""] if p.notes else [])
    lines += ["## Cells", "", "| cell | status | val loss | sparsity | tokens/s | peak MB | "
              "wall | code | data | config vs plan |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        made = c.provenance or {}
        lines.append(f"| `{c.cell}` | {c.status} | {_num(c.final_val_loss, '.4f')} | "
                     f"{_num(c.final_sparsity, '.3f')} | {_num(c.tokens_per_sec, ',.0f')} | "
                     f"{_num(c.peak_memory_mb, ',.0f')} | {_num(c.wall_time_s, '.0f')} s | "
                     f"{provenance.short(made.get('code')) if made else 'n/a'} | "
                     f"{(made.get('data') or {}).get('sha256', 'n/a')} | {_config_cell(c)} |")
    commits = _commits(cells)
    lines += ["", "## Reproduce", "",
              f"Produced by `{plan.get('command') or 'make test-matrix'}` from the "
              "configuration in `config` (copy it to `.config`), at git commit(s) "
              f"{', '.join(sorted(set(commits.values()))) or 'n/a'}. " + RUNNER_NOTE,
              "",
              "`make report RUN=<this folder>` rebuilds this file and the plots without "
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
                 combos: list[dict[str, Any]], plots: list[Any]) -> Path:
    path = folder / "report.md"
    write_text_atomic(path, render(plan, cells, combos, plots))
    return path
