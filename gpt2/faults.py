"""Fault injection, for the reliability tests (tests/test_reliability*.py).

A fault is named in the environment and fires at one step, so a test can break a
run at an exact point and check what survives:

    KGPT_FAULTS="nan-loss@5"                 the loss of step 5 becomes NaN
    KGPT_FAULTS="inf-loss@5"                 ... +inf
    KGPT_FAULTS="oom@3"                      step 3 raises torch.OutOfMemoryError
    KGPT_FAULTS="kill-in-checkpoint@4"       SIGKILL halfway through writing step 4's checkpoint
    KGPT_FAULTS="sigterm-in-eval@4"          SIGTERM to this process during step 4's evaluation
    KGPT_FAULTS="sigint-in-hellaswag@2"      SIGINT as step 2's HellaSwag evaluation starts
    KGPT_FAULTS="sigusr1-in-step@3"          SIGUSR1 between two micro-batches of step 3
    KGPT_FAULTS="sighup-in-step@3"           SIGHUP (the terminal closed) ... of step 3
    KGPT_FAULTS="crash@3:rank1"              rank 1 raises at step 3 (the others carry on)
    KGPT_FAULTS="die@3:rank1"                rank 1 SIGKILLs itself at step 3
    KGPT_FAULTS="kill-in-prepare@5"          data preparation SIGKILLs itself after 5 shards
    KGPT_FAULTS="sigterm-in-prepare@2"       ... sends itself SIGTERM after 2 shards
    KGPT_FAULTS="enospc-in-checkpoint@4"     the disk fills up 4 KiB into step 4's checkpoint
    KGPT_FAULTS="enospc-in-shard@2"          ... halfway through writing shard 2 of a split
    KGPT_FAULTS="sigstop-in-prepare@1"       ... pauses (SIGSTOP) after 1 shard, until SIGCONT
    KGPT_FAULTS="slow-steps"                 every step takes 1 s longer (a run that lasts, for
                                             tests that stop it from outside: Slurm's time limit)
    KGPT_FAULTS="forget-rng"                 resume without restoring the random generators
    KGPT_FAULTS="forget-optimizer"           ... without the optimizer state
    KGPT_FAULTS="forget-data-position"       ... reading batches from the start again

The forget-* faults are resume bugs on purpose: the exact-resume test runs with each
to prove that it notices.

Several faults are separated by commas. Without the variable nothing here does
anything: each check is one dictionary lookup.

The training loop reaches them through one narrow hook, ``for_training(model)``:
None without the variable (the trainer then calls nothing), else an object the
trainer tells where it is (``at("step" | "eval" | "hellaswag", step)``) and which
corrupts the loss, or raises out of memory, from a forward hook on the model.
Saving checkpoints and writing shards call ``active``/``disk_full`` where the bytes
are written, since that is where a real kill or full disk strikes.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import signal
import time
from typing import Any

ENV = "KGPT_FAULTS"
SLOW_STEP_S = 1.0  # what slow-steps adds to each step; it changes nothing computed
SIGNALS = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigusr1": signal.SIGUSR1,
           "sighup": signal.SIGHUP, "sigstop": signal.SIGSTOP}
_SPEC = re.compile(r"^(?P<name>[a-z0-9-]+)(?:@(?P<step>\d+))?(?::rank(?P<rank>\d+))?$")


class InjectedCrash(RuntimeError):
    """The ``crash`` fault: stands for any bug that raises in the middle of a run."""


@functools.lru_cache(maxsize=None)
def _parse(spec: str) -> dict[str, list[tuple[int | None, int | None]]]:
    faults: dict[str, list[tuple[int | None, int | None]]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        m = _SPEC.match(item)
        if not m:
            raise ValueError(f"{ENV}: cannot read {item!r} (expected name[@step][:rankN])")
        step, rank = m["step"], m["rank"]
        faults.setdefault(m["name"], []).append((None if step is None else int(step),
                                                 None if rank is None else int(rank)))
    return faults


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def active(name: str, step: int | None = None) -> bool:
    """Whether fault ``name`` fires at ``step`` in this process (a fault named
    without a step fires at every step)."""
    spec = os.environ.get(ENV)
    if not spec:
        return False
    return any((s is None or s == step) and (r is None or r == _rank())
               for s, r in _parse(spec).get(name, ()))


def signal_self(phase: str, step: int) -> None:
    """Send this process the signal a ``<signal>-in-<phase>@step`` fault names."""
    if not os.environ.get(ENV):
        return
    for name, sig in SIGNALS.items():
        if active(f"{name}-in-{phase}", step):
            os.kill(os.getpid(), sig)


def disk_full(phase: str, step: int) -> None:
    """The ``enospc-in-<phase>@step`` fault: raise what a write to a full disk raises."""
    if os.environ.get(ENV) and active(f"enospc-in-{phase}", step):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def at_step(step: int) -> None:
    """The faults that stand for a process dying or raising at ``step``."""
    if not os.environ.get(ENV):
        return
    if active("die", step):
        os.kill(os.getpid(), signal.SIGKILL)
    if active("crash", step):
        raise InjectedCrash(f"injected crash at step {step} (rank {_rank()})")
    if active("slow-steps", step):
        time.sleep(SLOW_STEP_S)


def forgotten() -> frozenset[str]:
    """What a resume leaves out on purpose (``forget-<part>``): "rng", "optimizer",
    "data-position"."""
    parts = ("rng", "optimizer", "data-position")
    return frozenset(p for p in parts if active(f"forget-{p}"))


class TrainingFaults:
    """The faults of the training loop, for one model. ``at(point, step)`` is the
    hook the trainer calls; the loss faults act from a forward hook on the model, in
    training mode only (evaluation passes are left alone)."""

    def __init__(self, model):
        self.step = 0
        self.forwards = 0  # training forward passes in this step
        model.register_forward_hook(self._after_forward)

    def at(self, point: str, step: int) -> None:
        """``point``: "step" as step ``step`` begins (a process dying or raising
        there); "eval" and "hellaswag" as those evaluations begin (a signal)."""
        if point == "step":
            self.step, self.forwards = step, 0
            at_step(step)
        else:
            signal_self(point, step)

    def _after_forward(self, module, inputs, output: Any):
        if not module.training or output[1] is None:
            return None
        self.forwards += 1
        step = self.step
        if self.forwards == 1 and active("oom", step):
            raise _out_of_memory()
        if self.forwards == 1:
            signal_self("step", step)  # arrives while the step is under way
        for name, value in (("nan-loss", "nan"), ("inf-loss", "inf")):
            if active(name, step):
                return output[0], output[1] * float(value)
        return None


def _out_of_memory() -> Exception:
    import torch  # only when the fault fires: this module imports nothing heavy

    return torch.OutOfMemoryError("CUDA out of memory (injected by KGPT_FAULTS). "
                                  "Tried to allocate 2.00 GiB")


def for_training(model) -> TrainingFaults | None:
    """The training loop's fault hook, or None when no fault is asked for."""
    return TrainingFaults(model) if os.environ.get(ENV) else None
