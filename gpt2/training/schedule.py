"""Learning-rate schedules: linear warmup, then one of SCHEDULES.

Every schedule is a multiplier path from the peak rate to the floor (min_lr) over the
schedule's steps; the trainer sets each parameter group's rate to the schedule's rate
times the group's own scale (optimizers.LR_SCALE), so every optimizer follows it,
Muon's hidden-matrix rate included.

- cosine: half a cosine from the peak (after warmup) to the floor at the last step
  (nanoGPT's get_lr).
- wsd: warmup, stable at the peak, then a cooldown over the last ``cooldown`` fraction
  of the steps to the floor: linear (modded-nanogpt's and nanochat's), sqrt (1 - sqrt
  of its progress, Hägele et al. 2024) or cosine. Runs that differ only in length share
  everything before their cooldowns.
- linear: a straight line from the peak to the floor.
- constant: the peak after warmup.

Steps are 0-based update indices; the floor is reached at ``total`` (the schedule's
length, which the last update of a run of that length just precedes) and kept past it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from gpt2.config.choices import LR_SCHEDULES, OPTIMIZERS, WSD_SHAPES, implemented
from gpt2.config.options import applies, fields, opt
from gpt2.config.registry import DEFAULT_OPTIMIZER

# Cooldown shapes: the fraction of (peak - floor) left at progress p in [0, 1].
SHAPES: dict[str, Callable[[float], float]] = {
    "linear": lambda p: 1.0 - p,
    "sqrt": lambda p: 1.0 - math.sqrt(p),
    "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
}
implemented(WSD_SHAPES, SHAPES, "WSD cooldown shapes")


def _decay_start(schedule: str, warmup: int, total: int, cooldown: float) -> int:
    """The step at which the rate starts to leave the peak."""
    if schedule == "wsd":
        return max(warmup, total - round(cooldown * total))
    return warmup


# What fraction of (peak - floor) remains at progress p of the decay phase.
SCHEDULES: dict[str, Callable[[float, str], float]] = {
    "cosine": lambda p, shape: SHAPES["cosine"](p),
    "wsd": lambda p, shape: SHAPES[shape](p),
    "linear": lambda p, shape: SHAPES["linear"](p),
    "constant": lambda p, shape: 1.0,
}
implemented(LR_SCHEDULES, SCHEDULES, "learning-rate schedules")


def lr_at(step: int, *, lr: float, min_lr: float, warmup: int, total: int,
          schedule: str = "cosine", cooldown: float = 0.2, shape: str = "linear") -> float:
    """Learning rate for the update with 0-based index ``step`` of a schedule ``total``
    steps long. Warmup rises linearly and reaches ``lr`` on its last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    start = _decay_start(schedule, warmup, total, cooldown)
    if step < start:
        return lr
    progress = min(1.0, (step - start) / max(1, total - start))
    return min_lr + SCHEDULES[schedule](progress, shape) * (lr - min_lr)


def schedule_of(cfg: Any) -> dict[str, Any]:
    """lr_at's schedule arguments from a Config or a run's config.json (a record from
    before LR_SCHEDULE is a cosine one, or constant when it did not decay)."""
    get = cfg.get if isinstance(cfg, dict) else lambda name, default=None: getattr(cfg, name)
    schedule = get("lr_schedule", "cosine")
    if schedule == "cosine" and not get("decay_lr", True):
        schedule = "constant"
    optimizer = OPTIMIZERS.get(get("optimizer", DEFAULT_OPTIMIZER))
    if optimizer and optimizer.holds_peak(get):
        schedule = "constant"  # its warmup, then its peak: it averages instead of decaying
    return {"lr": get("learning_rate"), "min_lr": get("min_lr"), "warmup": get("warmup_iters"),
            "schedule": schedule, "cooldown": get("wsd_cooldown", 0.2),
            "shape": get("wsd_shape", "linear")}


# ---- cooldown branches -----------------------------------------------------------------
#
# Under WSD, a run of B steps and a longer run differ in nothing before B's cooldown
# starts: the same rates, batches and random numbers. So a B-step run can start from the
# longer run's checkpoint at that step (a branch) and end exactly as if it had trained
# from step 0: the matrix trains each budget's stable phase once (gpt2/matrix/plan.py).

def branch_step(cfg: Any) -> int | None:
    """The step at which a run of ``cfg`` could branch from a longer one: where its
    WSD cooldown begins (None: not a WSD run laid out over its own length)."""
    if cfg.lr_schedule != "wsd" or cfg.schedule_iters or cfg.epochs or not cfg.max_iters:
        return None
    start = _decay_start("wsd", cfg.warmup_iters, cfg.max_iters, cfg.wsd_cooldown)
    return start if 0 < start < cfg.max_iters else None


def branch_problem(parent: Any, cfg: Any) -> str | None:
    """Why a run of ``cfg`` cannot branch from a run of ``parent`` at branch_step(cfg)
    and still be the run it would be from step 0; None if it can."""
    step = branch_step(cfg)
    if step is None:
        return ("it is not a WSD run over its own length (CONFIG_LR_SCHEDULE_WSD, "
                "SCHEDULE_ITERS 0, EPOCHS 0)")
    if cfg.pruning_method != "none":
        return "its pruning ramp is laid out over its own length"
    spans = OPTIMIZERS[cfg.optimizer].spans_run(cfg)
    if spans:
        return spans
    differ = [f.name for f in fields() if opt(f.name).hashed and f.name != "max_iters"
              and (applies(parent, f.name) or applies(cfg, f.name))
              and getattr(parent, f.name) != getattr(cfg, f.name)]
    if differ:
        return f"it differs from the longer run in {', '.join(differ)}, not only in length"
    if parent.max_iters <= step:
        return f"the other run ({parent.max_iters} steps) does not reach step {step}"
    mine, theirs = schedule_of(cfg), schedule_of(parent)
    if any(lr_at(s, total=cfg.max_iters, **mine) != lr_at(s, total=parent.max_iters, **theirs)
           for s in range(step)):
        return f"the learning rates differ before step {step}"
    return None
