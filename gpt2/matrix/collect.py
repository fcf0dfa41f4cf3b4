"""Collect a matrix folder into summary.csv, summary.json, plots and report.md.

Reads only files: plan.yaml (what was planned), cells/<id>/{summary.json,
metrics.jsonl, config.json, provenance.json} (what each cell did) and status.json
(errors of cells that failed before writing a summary). So it works on a killed,
half-failed or copied folder, and ``make plots`` / ``make report`` can rebuild
everything.

With grid axes (tuning, sweeps) each setting (optimizer x pruning x sparsity x any
other compared axis of gpt2/config/axes.py) has
several grid points; :func:`tuned` picks each setting's best point by final
validation loss, mean over seeds, and says when that point is on the edge of its
grid. The plots of settings show the tuned cells.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt2.config.options import applies, fields, from_record, opt
from gpt2.errors import ConfigError
from gpt2.matrix.plan_file import planned_config, read_plan
from gpt2.matrix import oneshot_cells, plots as matrix_plots
from gpt2.matrix.report import mixed_provenance, speedup_summary, write_report
from gpt2.matrix.speedup import speedups
from gpt2.config.axes import AXES, setting_of
from gpt2.config.matrix import DEFAULT_BASELINE
from gpt2.matrix.paired import evaluation_error, paired, seed_noise, t95
from gpt2.matrix.results import CellResult, finite
from gpt2.matrix.tuning import grid_settings, grids, point_settings, tuned, tuned_cells
from gpt2.matrix.runner import cell_dir, read_json, read_status
from gpt2.training import provenance
from gpt2.run_folder import (COMPLETED, CONFIG_JSON, FAILED, INTERRUPTED, METRICS, PENDING,
                             SUMMARY, completion_problem, read_summary,
                             scan_metrics, summary_damaged)
from gpt2.storage import write_text_atomic

PLOTS_DIR = "plots"
MATRIX_SUMMARY = "summary.json"  # the matrix's own, beside summary.csv (a cell's: run_folder)
# What a cell's summary.json gives its CellResult, with the types kept (a value of
# another type is unknown, not an error: the report says n/a).
SUMMARY_FIELDS = {"final_val_loss": (int, float), "best_val_loss": (int, float),
                  "final_val_ppl": (int, float), "final_sparsity": (int, float),
                  "tokens_per_sec": (int, float), "peak_memory_mb": (int, float),
                  "wall_time_s": (int, float), "final_val_loss_se": (int, float),
                  "val_tokens": (int,), "epochs_trained": (int, float), "device": (str,),
                  "load_avg": (int, float), "sparse_kernel_layers": (int,)}
# summary.csv: "cell", the setting's axes (gpt2/config/axes.py), "final_sparsity", the
# replicates' axes (the seed), every setting a grid sets, then these, "code" and "data".
CSV_FIGURES = ("status", "final_val_loss", "best_val_loss", "final_val_ppl", "tokens_per_sec",
               "peak_memory_mb", "wall_time_s", "config_hash", "config_matches_plan", "error")


def config_differences(planned, record: dict[str, Any] | None) -> list[str] | None:
    """Settings (that can change results) where the run's config.json differs from
    the ``planned`` Config; None when the cell has not started."""
    if record is None:
        return None
    try:
        ran = from_record(record)
    except (ConfigError, TypeError) as e:
        return [f"unreadable config.json ({e})"]
    return [f.name for f in fields() if opt(f.name).hashed
            and (applies(planned, f.name) or applies(ran, f.name))
            and getattr(planned, f.name) != getattr(ran, f.name)]


def load_cells(folder: Path, plan: dict[str, Any] | None = None) -> list[CellResult]:
    """One CellResult per planned cell, in plan order, whatever state it is in."""
    plan = plan or read_plan(folder)
    status = read_status(folder)
    # Every setting a grid sets somewhere: a cell shows its value of each that is in
    # force in it, gridded or not (Muon's fixed AdamW-part rate is as visible as
    # AdamW's tuned one).
    gridded = list(dict.fromkeys(a["field"] for axes in grids(plan).values()
                                 for a in axes.values()))
    plan_axes = axes_of(plan)
    out = []
    for c in plan["cells"]:
        planned = planned_config(c["args"])
        point = point_settings(plan, c["optimizer"], c.get("grid") or {})
        d = cell_dir(folder, c["id"])
        summary = read_summary(d)
        damaged = summary_damaged(d)
        if summary and summary.config_hash != c["config_hash"]:
            summary = None  # left by another configuration: not this cell's result
        # Neither an unreadable summary nor a "completed" that the cell's checkpoint
        # contradicts is a result; the matrix command resumes such a cell.
        doubt = (f"{d / SUMMARY} cannot be read (damaged)" if damaged
                 else completion_problem(d, summary))
        if doubt:
            summary = None
        record = read_json(d / CONFIG_JSON)
        entry = status.get(c["id"], {})
        metrics, skipped = scan_metrics(d / METRICS)
        r = CellResult(cell=c["id"], axes={a.name: c.get(a.name) for a in plan_axes},
                       grid=dict(c.get("grid") or {}),
                       settings={**point, **{f: getattr(planned, f) for f in gridded
                                             if f not in point and applies(planned, f)}},
                       status=PENDING, config_hash=c["config_hash"],
                       metrics=metrics, config=record, provenance=provenance.read(d),
                       error=doubt, damaged_lines=skipped,
                       slurm_job=entry.get("slurm_job") or None)
        if summary:
            r.status = summary.get("status", FAILED)
            for key in SUMMARY_FIELDS:
                value = summary.get(key)
                # (an int past float's range is damage, not a figure; a float NaN is
                # a diverged run's loss and stays)
                setattr(r, key, value if isinstance(value, SUMMARY_FIELDS[key])
                        and not isinstance(value, bool)
                        and (isinstance(value, (str, float)) or finite(value)) else None)
            r.error = summary.error
            r.git_commit = summary.git_commit
        if entry.get("status") == FAILED and r.status != COMPLETED:
            r.status, r.error = FAILED, entry.get("error") or r.error
        elif r.status == PENDING and (record or r.metrics):
            r.status = INTERRUPTED  # started, killed before writing a summary
        r.config_diff = config_differences(planned, record)
        out.append(r)
    return out


def _stats(values: list[float]) -> dict[str, float | None]:
    n = len(values)
    if not n:
        return {"mean": None, "std": None, "ci95": None}
    mean = statistics.fmean(values)
    if n < 2:
        return {"mean": mean, "std": None, "ci95": None}
    std = statistics.stdev(values)
    return {"mean": mean, "std": std, "ci95": t95(n) * std / math.sqrt(n)}


def aggregate(cells: list[CellResult]) -> list[dict[str, Any]]:
    """Mean, standard deviation and 95 % CI over seeds, per combination (setting and
    grid point), in plan order. Only completed cells with a finite loss count; the
    rest are listed as missing."""
    groups: dict[tuple, list[CellResult]] = {}
    for c in cells:
        groups.setdefault(c.combination, []).append(c)
    out = []
    for members in groups.values():
        ok = [c for c in members if c.usable]
        row: dict[str, Any] = {
            **setting_of(members[0].axes),
            "grid": dict(members[0].point), "settings": dict(members[0].settings),
            "seeds": [c.seed for c in ok], "n": len(ok), "planned": len(members),
            "missing": [f"{c.cell} ({c.status if c.status != 'completed' else 'NaN loss'})"
                        for c in members if not c.usable]}
        for key in ("final_val_loss", "final_val_ppl", "final_sparsity", "tokens_per_sec",
                    "peak_memory_mb", "wall_time_s", "final_val_loss_se", "epochs_trained"):
            vals = [getattr(c, key) for c in ok if finite(getattr(c, key))]
            for stat, v in _stats(vals).items():
                row[f"{key}_{stat}"] = v
        out.append(row)
    return out


def csv_rows(cells: list[CellResult]) -> list[dict[str, Any]]:
    names = grid_settings(cells)
    present = [a for a in AXES if any(a.name in c.axes for c in cells)]
    rows = []
    for c in cells:
        row = {k: getattr(c, k, None) for k in CSV_FIGURES}
        row["config_matches_plan"] = (None if c.config_diff is None else not c.config_diff)
        rows.append({"cell": c.cell,
                     **{a.name: c.axes.get(a.name) for a in present if a.compared},
                     "final_sparsity": c.final_sparsity,
                     **{a.name: c.axes.get(a.name) for a in present if not a.compared},
                     **{name: c.settings.get(name) for name in names}, **row,
                     "code": ((c.provenance or {}).get("code") or {}).get("sources"),
                     "data": ((c.provenance or {}).get("data") or {}).get("sha256")})
    return rows


def axes_of(plan: dict[str, Any]):
    """The axes of a plan: those its cells carry (an old plan's four, an optional
    axis's only where the plan has it)."""
    return [a for a in AXES if not a.optional or any(a.name in c for c in plan["cells"])]


def write_tables(folder: Path, plan: dict[str, Any], cells: list[CellResult]) -> None:
    rows = csv_rows(cells)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["cell", *CSV_FIGURES],
                            lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    write_text_atomic(folder / "summary.csv", buf.getvalue())
    combos = aggregate(cells)
    best = tuned(plan, combos)
    # NaN and inf become null: JSON has no such numbers, and strict readers refuse them.
    write_text_atomic(folder / MATRIX_SUMMARY, json.dumps(_finite_or_null(
        {"matrix": plan["name"], "hash": plan["hash"], "grids": grids(plan), "cells": rows,
         "combinations": combos, "tuned": best,
         "paired": paired(cells, best, plan.get("baseline", DEFAULT_BASELINE)),
         "speedup": speedups(cells, best, plan.get("baseline", DEFAULT_BASELINE)),
         "evaluation_error": evaluation_error(cells), "seed_noise": seed_noise(cells),
         "oneshot": oneshot_cells.rows(folder, plan, cells)}),
        indent=2, allow_nan=False) + "\n")


def _finite_or_null(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite_or_null(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite_or_null(v) for v in x]
    return x


@dataclass
class Collected:
    """What :func:`collect` found to tell the user."""

    missing: list[str] = field(default_factory=list)  # "cell: status (error)"
    speedup: list[str] = field(default_factory=list)  # over the tuned baseline, one per line
    warnings: list[str] = field(default_factory=list)  # under-tuned grids, mixed code


def collect(folder: Path, plots: bool = True, report: bool = True) -> Collected:
    """Rebuild the outputs of a matrix folder; returns what the user should hear."""
    plan = read_plan(folder)
    cells = load_cells(folder, plan)
    write_tables(folder, plan, cells)
    combos = aggregate(cells)
    best = tuned(plan, combos)
    made = []
    if plots:
        fits = speedups(cells, best, plan.get("baseline", DEFAULT_BASELINE))["fits"]
        made = matrix_plots.make_plots(tuned_cells(cells, best), folder / PLOTS_DIR,
                                       all_cells=cells, grids=grids(plan), fits=fits,
                                       oneshot=oneshot_cells.rows(folder, plan, cells))
    if report:
        write_report(folder, plan, cells, combos, made, best)
    mixed = mixed_provenance(cells)
    damaged = [f"{c.cell}: skipped {c.damaged_lines} damaged line(s) of metrics.jsonl; its "
               "plots show the intact rows" for c in cells if c.damaged_lines]
    several = len({c.optimizer for c in cells}) > 1
    return Collected(
        speedup=speedup_summary(speedups(cells, best, plan.get("baseline", DEFAULT_BASELINE)))
        if several else [],
        missing=[f"{c.cell}: {c.status}" + (f" ({c.error})" if c.error else "")
                 for c in cells if not c.usable],
        warnings=[w for r in best for w in r["edges"]] + ([mixed] if mixed else []) + damaged)
