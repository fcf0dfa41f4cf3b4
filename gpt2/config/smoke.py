"""Smoke tests: any configuration, single run or matrix, shortened to N steps.

``make smoke`` (or SMOKE=N on any run target) runs the .config for N optimizer steps.
Cutting max_iters alone would not do: warmup longer than the run is refused, and
evaluations, checkpoints and pruning updates would never happen in it. So every
step-count setting of the schedule shrinks by the same factor, N / max_iters, and
the run is named ``<run name>-smoke`` so it is never mistaken for the real one (its
configuration hash differs as well). Optimizer hyperparameters (SPAM's reset
interval and the like) are left alone: they are the method, not the schedule.
"""

from __future__ import annotations

from typing import Any

# Step counts that shrink with the run; the floor keeps an interval at least one step.
SCALED = {"warmup_iters": 0, "eval_interval": 1, "eval_late_interval": 1, "log_interval": 1,
          "checkpoint_interval": 1,
          "pruning_warmup": 0, "pruning_frequency": 1, "hellaswag_interval": 1,
          "schedule_iters": 1}
SUFFIX = "-smoke"
DEFAULT_STEPS = 20


def parse_steps(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < int(text) <= 10**6):
        raise ValueError(f"SMOKE={text!r} is not a number of steps: use e.g. SMOKE=20")
    return int(text)


def shrink(values: dict[str, Any], steps: int) -> tuple[dict[str, Any], list[str]]:
    """``values`` (the typed settings in force, as kconfig.to_values gives them) for a
    run of ``steps`` steps, and a note per setting changed ("warmup_iters 100 -> 1")."""
    total = values.get("max_iters") or 0
    out = dict(values, max_iters=steps)
    if values.get("epochs"):
        out["epochs"] = 0.0
    notes = [f"max_iters {total or 'from epochs'} -> {steps}"]
    for name, floor in SCALED.items():
        old = values.get(name)
        if not old:  # not in force, or 0 (HellaSwag off, no warmup)
            continue
        # Without max_iters (epochs) the length is unknown here: clamp to the run.
        new = max(floor, round(old * steps / total)) if total else min(old, max(floor, steps))
        if new != old:
            out[name] = new
            notes.append(f"{name} {old} -> {new}")
    name = values.get("run_name", "gpt2")
    if not name.endswith(SUFFIX):
        out["run_name"] = name[:128 - len(SUFFIX)] + SUFFIX
        notes.append(f"run_name {name} -> {out['run_name']}")
    return out, notes


def shrink_budgets(budgets: tuple, steps: int) -> tuple[int, ...]:
    """A matrix's training budgets (CONFIG_MATRIX_MAX_ITERS: steps, or Chinchilla
    multiples such as "2x") for a smoke run: the largest becomes ``steps`` and the
    others keep their proportion to it, in whole steps, at least 1, each once."""
    sizes = [float(b[:-1]) if isinstance(b, str) else float(b) for b in budgets]
    return tuple(dict.fromkeys(max(1, round(steps * s / max(sizes))) for s in sizes))
