"""Typed settings of the Matrix menu (kconfig/matrix.kconfig).

The matrix axes are not settings of a run: each cell is an ordinary run whose
optimizer, pruning method, target sparsity, budget and seed come from the axes
declared in gpt2/config/axes.py, which also says how Kconfig lists each one's values
(one bool per registry entry, MATRIX_OPTIMIZER_<NAME>, or a list, MATRIX_SEEDS);
tests/matrix/test_matrix_plan.py checks that Kconfig offers exactly the registry's entries.

Grid axes vary numeric settings of the cells, all by one mechanism (gpt2/matrix/
plan.py): with MATRIX_TUNE each optimizer gets its own learning-rate and
weight-decay grid (MATRIX_LR_<NAME>, MATRIX_WD_<NAME>; the settings they set are
the optimizer's own, Optimizer.tuned), and MATRIX_SWEEP names any other numeric
or y/n setting with its values ("WARMUP_ITERS=50,100 BATCH_SIZE=8,16").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from gpt2.config.slurm import BACKENDS
from gpt2.config.options import check_value, field_type, fields, opt
from gpt2.errors import ConfigError
from gpt2.config.choices import ONESHOT_METHODS, OPTIMIZERS, PRUNING_METHODS
from gpt2.config.registry import DEFAULT_OPTIMIZER
from gpt2.config.axes import AXIS_FIELDS, CellAxis, numbers

ENABLE = "MATRIX"
JOBS = "MATRIX_JOBS"
TUNE = "MATRIX_TUNE"
BRANCH = "MATRIX_BRANCH"
EXTEND = "MATRIX_TUNE_EXTEND"
ONESHOT = "MATRIX_ONESHOT"
ONESHOT_FINETUNE = "MATRIX_ONESHOT_FINETUNE"
ROUNDS = "MATRIX_TUNE_ROUNDS"
SWEEP = "MATRIX_SWEEP"
MAX_JOBS = 64
# The paired comparison's baseline when the configuration names none.
BASELINE = "MATRIX_BASELINE"
# The validation loss the report counts steps to and tests by track 3's rules
TARGET_LOSS = "MATRIX_TARGET_LOSS"
DEFAULT_BASELINE = DEFAULT_OPTIMIZER


def tuning_grids(optimizer: str) -> tuple[str, ...]:
    """The labels of an optimizer's tuning grids ("lr", "wd", Muon's "adam_lr", ...):
    OptimizerChoice.grids, one Kconfig symbol each (grid_symbol)."""
    return OPTIMIZERS[optimizer].grids


def is_rate(label: str) -> bool:
    """Whether a grid holds learning rates (positive) rather than decays (>= 0)."""
    return label.endswith("lr")


def backend_symbol(backend: str) -> str:
    """MATRIX_BACKEND_SLURM: where the cells run (gpt2.config.slurm.BACKENDS)."""
    return f"MATRIX_BACKEND_{backend.upper()}"


def grid_symbol(label: str, optimizer: str) -> str:
    """MATRIX_LR_ADAMW: an optimizer's grid of one tuned setting."""
    return f"MATRIX_{label.upper()}_{optimizer.upper()}"


class Sweep(NamedTuple):
    """One swept setting: its Config field and values, in the cells of ``optimizer``
    only ("muon:WARMUP_ITERS=10,20") or, when None, in every cell it applies to."""

    field: str
    values: tuple
    optimizer: str | None = None


@dataclass(frozen=True)
class MatrixSettings:
    optimizers: tuple[str, ...]  # registry order
    pruning_methods: tuple[str, ...]  # registry order
    sparsities: tuple[float, ...]  # as written
    seeds: tuple[int, ...]  # as written
    jobs: int = 1
    # {optimizer: {"lr": values, "wd": values}} when tuning, else {} (each optimizer
    # trains at its configured values).
    grids: dict[str, dict[str, tuple[float, ...]]] = field(default_factory=dict)
    # Other settings swept in the cells they apply to.
    sweep: tuple[Sweep, ...] = ()
    backend: str = "local"  # where the cells run: "local" or "slurm" (config/slurm.py)
    # What the report's paired differences compare every optimizer with.
    baseline: str = DEFAULT_BASELINE
    # The values of the axes declared beyond the four above ({plural: values}; an
    # optional axis left empty has none).
    more: dict[str, tuple] = field(default_factory=dict)
    # Shorter WSD budgets start from the longest cell's checkpoints (matrix/plan.py).
    branch: bool = True
    # Rounds of grid extension past a best point on a grid's edge (0: off;
    # gpt2/matrix/extend.py).
    extend_rounds: int = 0
    # One-shot baselines pruned from each dense cell at the pruned cells' targets
    # (gpt2/matrix/oneshot_cells.py), and the fine-tune steps after each (0: none).
    oneshot: tuple[str, ...] = ()
    oneshot_finetune: int = 0
    # The validation loss the report counts each cell's steps to and tests each tuned
    # setting's mean against, by track 3's rules (gpt2/matrix/track3.py); None: none.
    target_loss: float | None = None

    def values_of(self, axis: CellAxis) -> tuple:
        """The values the configuration lists for ``axis`` (() where none)."""
        return self.more[axis.plural] if axis.plural in self.more else getattr(
            self, axis.plural, ())

    def in_force(self, axis: CellAxis) -> bool:
        """Whether ``axis`` is an axis of this matrix (an optional one needs values)."""
        return not axis.optional or bool(self.values_of(axis))

    def __post_init__(self):
        assert set(self.optimizers) <= set(OPTIMIZERS), self.optimizers
        assert set(self.pruning_methods) <= set(PRUNING_METHODS), self.pruning_methods
        assert not self.grids or set(self.grids) == set(self.optimizers), self.grids
        assert self.backend in BACKENDS, self.backend
        assert self.baseline in OPTIMIZERS, self.baseline


def parse_jobs(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text.strip()) or not 1 <= int(text) <= MAX_JOBS:
        raise ValueError(f"{text!r} is not a job count: use a whole number from 1 to {MAX_JOBS}")
    return int(text)


def parse_grid(text: str, positive: bool) -> tuple[float, ...]:
    """ "3e-4 6e-4 1.2e-3" -> (0.0003, 0.0006, 0.0012): a learning-rate (positive) or
    weight-decay grid; raises ValueError saying what is wrong."""
    kind = "positive" if positive else "non-negative"
    return numbers(text, "3e-4 6e-4 1.2e-3", lambda v: None if math.isfinite(v) and (
        v > 0 or (v == 0 and not positive)) else f"is not a {kind} finite number",
        "the grid is empty: list at least one value")


def parse_baseline(text: str) -> str:
    """ " Name " -> "name": the optimizer every other is compared with, pair by pair."""
    name = text.strip().lower()
    if name not in OPTIMIZERS:
        raise ValueError(f"{text!r} is not an optimizer (one of {', '.join(OPTIMIZERS)})")
    return name


def parse_target_loss(text: str) -> float | None:
    """ "3.28" -> 3.28; "" -> None (no target)."""
    if not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number (write e.g. 3.28, or leave it empty)") \
            from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{text!r} is not a positive finite loss")
    return value


def parse_oneshot(text: str) -> tuple[str, ...]:
    """ "wanda sparsegpt" -> ("wanda", "sparsegpt"), in the registry's order; empty:
    no one-shot baselines."""
    names = text.lower().split()
    unknown = [n for n in names if n not in ONESHOT_METHODS]
    if unknown:
        raise ValueError(f"{' '.join(unknown)}: not a one-shot method (one of "
                         f"{', '.join(ONESHOT_METHODS)})")
    if len(set(names)) < len(names):
        raise ValueError("a method is listed twice")
    return tuple(m for m in ONESHOT_METHODS if m in names)


def parse_sweep(text: str) -> tuple[Sweep, ...]:
    """ "WARMUP_ITERS=50,100 <opt>:DECAY_LR=y,n" -> (Sweep("warmup_iters", (50, 100)),
    Sweep("decay_lr", (True, False), <opt>)): numeric and y/n settings
    that change results, each value typed and range-checked as in a .config, swept in
    every cell they apply to or, after "<optimizer>:", in that optimizer's cells only;
    raises ValueError saying what is wrong."""
    known = {f.name for f in fields()}
    out: list[Sweep] = []
    for item in re.sub(r"\s*,\s*", ",", text).split():
        name, eq, values = item.partition("=")
        only, colon, name = name.rpartition(":")
        only = only.strip().lower() or None
        if colon and only not in OPTIMIZERS:
            raise ValueError(f"{item!r}: {only or '(nothing)'} before ':' is not an optimizer "
                             f"(one of {', '.join(OPTIMIZERS)})")
        name = name.strip().lower().removeprefix("config_")
        if not eq or not values.strip(","):
            raise ValueError(f"{item!r}: write SYMBOL=value,value (e.g. WARMUP_ITERS=50,100, "
                             f"or {DEFAULT_OPTIMIZER}:WARMUP_ITERS=20,50 for one optimizer's cells)")
        if name not in known:
            raise ValueError(f"{name.upper()}: not a setting (`make menuconfig` shows their "
                             "names)")
        typ = field_type(name)
        if typ not in (int, float, bool) or opt(name).choices:
            raise ValueError(f"{name.upper()}: only numeric and y/n settings can be swept")
        if name in AXIS_FIELDS:
            raise ValueError(f"{name.upper()}: the matrix has its own axis for it (enable "
                             "entries in the Test matrix menu)")
        if not opt(name).hashed:
            raise ValueError(f"{name.upper()}: it does not change what a run computes, so "
                             "sweeping it would train identical cells")
        # once per optimizer: never for all cells and for one as well
        if any(name == seen.field and (None in (only, seen.optimizer) or only == seen.optimizer)
               for seen in out):
            raise ValueError(f"{name.upper()} is swept twice")
        parsed = []
        for raw in values.split(","):
            raw = raw.strip()
            if not raw:
                continue
            try:
                if typ is bool:
                    if raw not in ("y", "n"):
                        raise ValueError
                    value = raw == "y"
                else:
                    value = typ(raw) if typ is float else int(raw, 10)
                if typ is float and not math.isfinite(value):
                    raise ValueError
                check_value(name, value)
            except ValueError as e:
                why = (e.message if isinstance(e, ConfigError) else "use y or n" if typ is bool
                       else "not a number of its type")
                raise ValueError(f"{name.upper()}={raw}: {why}") from None
            if value in parsed:
                raise ValueError(f"{name.upper()}: {raw} is listed twice")
            parsed.append(value)
        if only is not None and not applies_to_optimizer(name, only):
            raise ValueError(f"{only}:{name.upper()}: it does not apply to {only} cells")
        out.append(Sweep(name, tuple(parsed), only))
    return tuple(out)


def applies_to_optimizer(name: str, optimizer: str) -> bool:
    """Whether a setting can be in force in a cell of ``optimizer`` (an optimizer
    setting of another one cannot; anything else can)."""
    owners = [o for o, spec in OPTIMIZERS.items() if name in spec.hparams]
    return not owners or optimizer in owners
