"""What a run says about itself when there is nothing to train: the report of a run
its folder already holds complete.

Torch-free on purpose: `make` on a finished run asks here first (gpt2/train.py,
``already_complete``) and answers in a fraction of a second, before torch is
imported. Anything short of "complete, for this configuration, made by this code
and data" goes the whole way through the trainer, which resumes, refuses, sets
aside or reports as --if-changed says (gpt2/training/trainer.py).
"""

from __future__ import annotations

import math
from typing import Any

from gpt2.config.options import Config
from gpt2.run_folder import RunDir, format_summary
from gpt2.training import provenance


def mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    """The mean of a numeric metric over the rows that logged it (None if none did)."""
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))
              and not isinstance(r.get(key), bool) and math.isfinite(r[key])]
    return sum(values) / len(values) if values else None


def fmt_time(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def progress_line(row: dict[str, Any], max_iters: int, eta_s: float, memory_mb: float,
                  pruning: bool) -> str:
    """The line a progress row prints."""
    return (f"step {row['step']:>6}/{max_iters} | loss {row['train_loss']:.4f} | "
            f"lr {row['lr']:.2e} | {row['tokens_per_sec']:>9,.0f} tok/s | ETA {fmt_time(eta_s)} | "
            f"mem {memory_mb:,.0f} MB" + (f" | sparsity {row['sparsity']:.3f}" if pruning else ""))


def figures_of(rows: list[dict[str, Any]], peak_now_mb: float | None) -> dict[str, Any]:
    """The summary's figures that metrics.jsonl holds: the final and best validation
    loss (and the final one's standard error), the last HellaSwag accuracies, the mean
    load, and the run's peak memory: the highest any of its processes logged, and
    ``peak_now_mb`` (this process's, when it trained: a process that only rewrites the
    summary measured nothing, and adds None)."""
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    final_val = vals[-1] if vals else None
    peaks = [r["peak_memory_mb"] for r in rows
             if isinstance(r.get("peak_memory_mb"), (int, float))
             and math.isfinite(r["peak_memory_mb"])]
    if peak_now_mb is not None:
        peaks.append(peak_now_mb)
    hellaswag = next(({k: r[k] for k in ("hellaswag_acc", "hellaswag_acc_norm")}
                      for r in reversed(rows) if "hellaswag_acc" in r), {})
    return {"final_val_loss": final_val,
            "final_val_ppl": math.exp(min(final_val, 700.0)) if final_val is not None else None,
            "final_val_loss_se": next((r.get("val_loss_se") for r in reversed(rows)
                                       if "val_loss" in r), None),
            "best_val_loss": min(vals) if vals else None,
            **hellaswag, "peak_memory_mb": max(peaks, default=None),
            "load_avg": mean_of(rows, "load_avg")}


def complete_report(run: RunDir, reused: bool = False) -> str:
    """The lines train.py prints for a run that is already complete."""
    made = ("made under other code or data, reported as --if-changed=reuse asks" if reused
            else "same code and data")
    return (f"{run.path} is already complete (same configuration, {made}); summary:\n"
            + format_summary(run.path, run.summary()))


def already_complete(cfg: Config, run_dir: str | None = None) -> str | None:
    """The report of the run ``cfg`` names when its folder holds it complete for this
    configuration, made by this code and data, and started from no other run; None
    otherwise (the trainer then decides what to do). results/latest is pointed at a
    single run reported here, as the trainer does."""
    if cfg.extend_from or cfg.init_from:  # a parent run's identity needs its checkpoint
        return None
    run = RunDir(cfg, run_dir)
    summary = run.summary()
    if summary is None or summary.config_hash != cfg.config_hash() or not run.completed():
        return None
    current = provenance.identity(cfg.data_dir, cfg.dataset)
    if provenance.changes(provenance.read(run.path), current):
        return None
    run.point_latest()
    return complete_report(run)
