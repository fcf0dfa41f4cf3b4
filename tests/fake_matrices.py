"""Made-up matrix folders, as the runner leaves them, for the tests of what reads them
(collect, report, plots, pages, the results' trust boundaries). A module of its own
so that a test file imports them without importing another test file: a run of one
file (make test-mutation's selections) finds them too."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from gpt2.config.matrix import MatrixSettings
from gpt2.matrix.plan import build_plan

# What a matrix without grids draws: no lr_sweep.png (no picture of nothing); with
# grids, that too.
PLOTS = {"val_loss.png", "val_loss_tokens_time.png", "ppl_heatmap.png",
         "ppl_vs_sparsity.png", "sparsity_vs_step.png", "throughput_memory.png",
         "lr_schedule.png"}
TUNED_PLOTS = PLOTS | {"lr_sweep.png"}


def fake_matrix(root: Path, seeds=(1, 2, 3), losses=None, skip=(), status=None,
                tamper=None) -> Path:
    """A matrix folder as the runner leaves it, with made-up figures.
    losses: {cell id: final val loss}; skip: cells never started; status: {cell: status};
    tamper: {cell: {field: value}} written into that cell's config.json."""
    settings = MatrixSettings(optimizers=("adamw", "adamwprune"),
                              pruning_methods=("none", "magnitude", "state"),
                              sparsities=(0.5,), seeds=tuple(seeds))
    plan = build_plan({"results_dir": str(root), "max_iters": 20, "warmup_iters": 2,
                       "pruning_warmup": 2,
                       "pruning_frequency": 2}, settings, [])
    folder = plan.folder
    folder.mkdir(parents=True)
    (folder / "plan.yaml").write_text(yaml.safe_dump({**plan.to_dict(), "command": "make x"}))
    losses, status, tamper = losses or {}, status or {}, tamper or {}
    for i, cell in enumerate(plan.cells):
        if cell.id in skip:
            continue
        d = folder / "cells" / cell.id
        d.mkdir(parents=True)
        loss = losses.get(cell.id, 4.0 + i / 10)
        sparsity = cell.sparsity or 0.0
        rows = [{"step": s, "train_loss": 11 - s / 3, "lr": 1e-3, "sparsity": sparsity * s / 20,
                 "val_loss": 11 - s / 3 if s < 20 else loss} for s in (0, 10, 20)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        record = {**cell.cfg.to_dict(), **tamper.get(cell.id, {})}
        (d / "config.json").write_text(json.dumps(record))
        (d / "summary.json").write_text(json.dumps({
            "status": status.get(cell.id, "completed"), "config_hash": cell.cfg.config_hash(),
            "final_val_loss": loss, "best_val_loss": loss,
            "final_val_ppl": math.exp(loss) if math.isfinite(loss) else loss,
            "final_sparsity": sparsity, "tokens_per_sec": 1000.0 + i,
            "peak_memory_mb": 500.0, "wall_time_s": 10.0, "git_commit": "abc123",
            **({"error": "RuntimeError: boom"} if status.get(cell.id) == "failed" else {})}))
    return folder


GRIDS = {"adamw": {"lr": (1e-3, 2e-3, 4e-3), "wd": (0.1,)},
         "muon": {"lr": (0.01, 0.02, 0.04), "wd": (0.0, 0.01)}}


def fake_tuned_matrix(root: Path, loss_of, seeds=(1, 2), status=None,
                      provenance=None, best_of=None, extra=None, optimizers=("adamw", "muon"),
                      grids=None, more=None) -> Path:
    """A tuning matrix (AdamW and Muon, dense) with made-up results: loss_of(cell)
    gives a cell's final loss; provenance(cell) its provenance.json content;
    best_of(cell) its best validation loss, reached at step 10 (default: the final
    loss, reached at the end); more: the values of further axes ({"budgets": (20, 40)})."""
    grids = grids or GRIDS
    settings = MatrixSettings(optimizers=optimizers, pruning_methods=("none",),
                              sparsities=(), seeds=tuple(seeds),
                              grids={o: grids.get(o, GRIDS["adamw"]) for o in optimizers},
                              more=more or {})
    plan = build_plan({"results_dir": str(root), "max_iters": 20, "warmup_iters": 2},
                      settings, [])
    folder = plan.folder
    folder.mkdir(parents=True)
    (folder / "plan.yaml").write_text(yaml.safe_dump({**plan.to_dict(), "command": "make x"}))
    status = status or {}
    for cell in plan.cells:
        d = folder / "cells" / cell.id
        d.mkdir(parents=True)
        loss = loss_of(cell)
        best = best_of(cell) if best_of else loss
        val = {0: 11.0, 10: best if best_of else 11 - 10 / 3, 20: loss}
        rows = [{"step": s, "tokens": 128 * s, "elapsed_s": s / 10.0, "train_loss": 11 - s / 3,
                 "lr": 1e-3, "val_loss": val[s]} for s in (0, 10, 20)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "config.json").write_text(json.dumps(cell.cfg.to_dict()))
        if provenance:
            (d / "provenance.json").write_text(json.dumps(provenance(cell)))
        (d / "summary.json").write_text(json.dumps({
            "status": status.get(cell.id, "completed"), "config_hash": cell.cfg.config_hash(),
            "final_val_loss": loss, "best_val_loss": best, "final_val_ppl": math.exp(loss),
            "final_sparsity": 0.0, "tokens_per_sec": 1000.0, "peak_memory_mb": 500.0,
            "wall_time_s": 10.0, **(extra(cell) if extra else {})}))
    return folder


def bowl(cell) -> float:
    """AdamW best at lr 2e-3 (inside its grid); Muon best at its largest rate, with
    decay 0.01, and seed 2 a little worse everywhere."""
    point = dict(cell.point)
    if cell.optimizer == "adamw":
        loss = 4.0 + abs(math.log2(point["lr"] / 2e-3)) / 10
    else:
        loss = 3.9 - point["lr"] - (0.01 if point["wd"] else 0.0)
    return loss + (0.02 if cell.seed == 2 else 0.0)
