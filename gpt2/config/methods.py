"""What a method module declares, and the registry that finds the modules.

A method (an optimizer, a pruning method) is one module: ``gpt2/optim/<name>.py``
declares everything about an optimizer as ``METHOD = Optimizer(...)``: its name, its
summary and reference, its settings (typed, with defaults, ranges and help), the
tuning grids a matrix gives it, its pairing rules, its memory and its builder. The
rest of kgpt derives what it needs from the declarations: the Config fields and
flags (gpt2/config/options.py), the Kconfig menus (`make kconfig-sync` writes
kconfig/optimizers.kconfig), the matrix axis and grids, the memory estimator and
docs' method table. Nothing outside the module names the method.

gpt2/config/registry.py loads the modules. A method module imports only this module
at its top (tests/test_architecture.py checks it), so reading the declarations
imports no torch; its builder imports the code it needs when a run builds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

# ---- settings -------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One setting a method owns: a Config field, a flag and a Kconfig entry.

    ``help`` is the one line the flag's --help and Config show; ``prompt`` and
    ``text`` are the Kconfig menu's line and help paragraph. The type is the
    default's. A setting shared by several methods is declared by one of them (the
    one whose name it carries, or the first to have it) and listed in the others'
    ``reads``."""

    name: str
    default: Any
    help: str
    prompt: str
    text: str
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False
    why: str = ""  # why the range is what it is (see options.Opt.why)
    omit_default: bool = False  # (see options.Opt.omit_default)
    # Further conditions besides the method being chosen: ((field, values), ...).
    when: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # A choice: its values, each with its Kconfig entry's (prompt, help).
    choices: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Grid:
    """A tuning grid a matrix gives an optimizer (MATRIX_<LABEL>_<NAME>): ``label``
    (lr, wd, adam_lr, ...), its default values, and its Kconfig prompt and help.
    ``defaults`` may hold (values, Kconfig condition) pairs before the plain default,
    where the default depends on another setting (Muon's scale)."""

    label: str
    default: str
    prompt: str
    text: str
    defaults: tuple[tuple[str, str], ...] = ()
    depends: str = ""  # a Kconfig condition for the grid to show
    # Which parameters a rate grid's setting drives, where the optimizer has several
    # rates ("matrices", "the rest"): how pages and plots name each rate.
    part: str = ""


# ---- optimizers -----------------------------------------------------------------------

def _rate_and_decay(cfg) -> dict[str, str]:
    return {"lr": "learning_rate", "wd": "weight_decay"}


def _no_span(cfg) -> str | None:
    return None


def adam_fused(device: str, cfg) -> bool:
    """Whether torch's AdamW runs fused: on CUDA (the whole update in one launch per
    parameter group), and on any device for a bfloat16 token table
    (CONFIG_MODEL_PRECISION=bf16-table): the fused kernel computes its update in
    float32 and rounds once, as track 3's fused AdamW does, where the unfused path
    would compute in bfloat16."""
    return device == "cuda" or cfg.model_precision == "bf16-table"


def adam_scratch(device: str, s, cfg) -> int:
    # torch's Adam family: fused (adam_fused), no temporaries; else one tensor at a
    # time (two float32 temporaries)
    return 0 if adam_fused(device, cfg) else 8 * s.largest


def widened_table(s, cfg) -> int:
    """Bytes kgpt's own optimizers (optimizer_base.DecoupledOptimizer) add to their
    step for a bfloat16 table: float32 copies of it, its gradient and two state
    tensors (measured, tests/estimates/test_memory.py)."""
    return 16 * s.table if cfg.model_precision == "bf16-table" else 0


@dataclass(frozen=True)
class Optimizer:
    """Everything about one optimizer (gpt2/optim/<name>.py)."""

    name: str
    order: int  # where it sits in menus and matrices (lower first)
    title: str  # its Kconfig entry's prompt
    summary: str  # one line: make help, summary.json, docs' table
    reference: str  # the paper and the code it follows
    text: str  # its Kconfig entry's help
    matrix_text: str  # its matrix entry's help
    build: Callable[..., Any]  # (model, cfg, device_type, total_steps) -> optimizer
    settings: tuple[Setting, ...] = ()  # the settings it owns
    # The optimizer a configuration gets when it names none, and the matrix's baseline
    # of the paired comparison: exactly one declares it (gpt2/config/registry.py).
    default: bool = False
    # The Python packages its builder imports beyond kgpt's own requirements' core
    # (torch, numpy): a bundle for another machine carries them (scripts/gpu_bundle.py).
    packages: tuple[str, ...] = ()
    # Config fields it reads besides learning_rate and weight_decay, in the order
    # summary.json records them: its own settings and those it shares.
    reads: tuple[str, ...] = ()
    # The pruning methods it pairs with; None: every method that does not demand a
    # particular optimizer (Pruning.optimizer). A tuple: those, the dense baseline and
    # the methods that demand this optimizer (choices.pairs_of). ``pairing`` says why.
    pruning: tuple[str, ...] | None = None
    pairing: str = ""
    # Its update treats each weight element on its own, so it runs on FSDP's shards;
    # ``whole`` says why not, where it does not.
    elementwise: bool = True
    whole: str = "needs whole matrices"
    # Whether the schedule holds its peak after the warmup, given a getter of the
    # run's settings, get(name, default), from a Config or a config.json record:
    # an optimizer that needs no decay of the rate (Schedule-Free, unless its own
    # setting says to follow the whole schedule).
    holds_peak: Callable[..., bool] = lambda get: False
    # Why its settings under a config depend on the run's length (so a shorter run
    # cannot branch from a longer one's checkpoint), or None.
    spans_run: Callable[..., str | None] = _no_span
    # The tuning grids a matrix gives it: every rate and decay it has, so no setting
    # of its own stays at a value tuned for another optimizer.
    tuning_grids: tuple[Grid, ...] = ()
    # What each grid sets under a config: {label: Config field}, a subset of the
    # grids' labels (a grid whose setting is shared with another under this config
    # is left out).
    tuned: Callable[..., dict[str, str]] = _rate_and_decay
    # Memory, in the estimator's terms (gpt2/estimates/memory.py; tests/estimates/test_memory.py
    # checks them against the real state): float32 state values per parameter as
    # (block matrices, other matrices, tensors of fewer than 2 dims); bytes of state
    # beyond them (SOAP's factors); bytes of temporaries its step allocates, from
    # the device type, the model's memory.Shapes and the config.
    state_floats: Callable[..., tuple[int, int, int]] = lambda cfg: (2, 2, 2)
    state_extra: Callable[..., int] = lambda cfg, s: 0
    state_words: str = ""  # state_extra in words, for docs/memory.md ("" when none)
    step_scratch: Callable[..., int] = adam_scratch
    # Whether, under a config, it updates a bfloat16 token table
    # (CONFIG_MODEL_PRECISION=bf16-table) as track 3's fused AdamW does: the arithmetic
    # in float32, the new values and state rounded to bfloat16 once.
    bf16_table: Callable[..., bool] = lambda cfg: False
    # Why its settings cannot hold together under a config, as (field, why), or None.
    check: Callable[..., tuple[str, str] | None] = lambda cfg: None
    # Facts the generic tests need (tests/optim/test_optimizers.py, tests/config/test_methods.py).
    # Where its decoupled decay acts: "before" its update, at the old point (the rule
    # of gpt2/optim/algorithms/optimizers.py); "after" it (SOAP's reference); "inside" its
    # step, at a point of its own (Schedule-Free's y).
    decays: str = "before"
    # Whether its first step moves the weights (ADOPT's and SOAP's only measure).
    first_step_moves: bool = True
    # Its steps are relative to each weight's size (Adafactor), so AdamW's rates mean
    # nothing to it: it has a rate of its own.
    relative_step: bool = False

    @property
    def hparams(self) -> tuple[str, ...]:
        return self.reads

    def rates(self, cfg) -> list[tuple[str, str]]:
        """(setting, the parameters it drives) for each peak rate it trains at under
        ``cfg``: its grids' rate settings, as its ``tuned`` maps them."""
        parts = {g.label: g.part for g in self.tuning_grids}
        return [(field, parts.get(label, "")) for label, field in self.tuned(cfg).items()
                if label.endswith("lr")]

    @property
    def grids(self) -> tuple[str, ...]:
        """The labels of its tuning grids (lr, wd, adam_lr, ...)."""
        return tuple(g.label for g in self.tuning_grids)


# ---- pruning methods ------------------------------------------------------------------

def _mask_only(cfg) -> int:
    return 0


@dataclass(frozen=True)
class Pruning:
    """Everything about one pruning method (gpt2/sparsity/<name>.py)."""

    name: str
    order: int
    title: str
    summary: str
    reference: str
    text: str
    matrix_text: str
    build: Callable[..., Any]  # (model, optimizer, cfg, total_steps) -> a sparsity.algorithms.pruning.Pruner
    settings: tuple[Setting, ...] = ()
    # Config fields it reads: its own settings and the shared schedule's (target
    # sparsity, warmup, ...: gpt2/config/options.py), in summary.json's order.
    reads: tuple[str, ...] = ()
    # The one optimizer it works with (it reads that optimizer's state); None: any
    # optimizer that does not restrict its pruning (Optimizer.pruning).
    optimizer: str | None = None
    # How the report groups it: dense, pruned during training (a ramp from dense), or
    # dynamic sparse (sparse from the start, the mask moving).
    family: str = "pruned during training"
    # Memory beyond the one-byte mask of each target weight, in bytes per target
    # weight (gpt2/estimates/memory.py), and memcheck's words for the whole.
    extra_bytes: Callable[..., int] = _mask_only
    memory_words: str = "1 B (mask)"
    # Whether it ranks all targets at once (one float32 copy of every score at a mask
    # update) rather than tensor by tensor, and whether it prunes the output head too
    # (a tied head is the token table): the memory estimator's questions.
    ranks_globally: Callable[..., bool] = lambda cfg: cfg.pruning_scope == "global"
    # A setting of its own whose choices cost differently (its scores): `make
    # bench-optim` times each choice as a row of its own.
    variants: str | None = None
    prunes_head: Callable[..., bool] = lambda cfg: False

    @property
    def hparams(self) -> tuple[str, ...]:
        return self.reads
