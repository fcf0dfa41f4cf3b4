"""The matrix's built-in axes: one declaration each, in AXES.

A cell of a test matrix is a point on a list of axes (an optimizer, a pruning method,
a target sparsity where the method prunes, a training budget when one is listed, a
seed), and then a grid point of its tuning grids and sweeps (gpt2/matrix/plan.py).
Everything that names or groups cells is derived from AXES, in its order:

- which cells there are: every value of each axis, nested in order, where the axis
  is in force (``needs``) and the value pairs with the earlier ones (``refuses``);
- the cell id: the compared axes' tags, the grid point, then the replicate axes'
  tags ("adamw-movement-70-lr6e-4-seed1337");
- plan.yaml: each axis's values under ``axes.<plural>``, each cell's under ``<name>``;
- summary.csv's columns, CellResult.axes and the rows of summary.json;
- the *setting*: the compared axes' values. The tuned comparison tunes, ranks and
  pairs settings; a replicate axis (the seed) is what results are averaged and
  paired over;
- labels in tables, plots and warnings ("adamw / movement 70%"), and the report's
  table columns.

Kconfig gives an axis its values either as one bool per registry entry
(MATRIX_OPTIMIZER_<NAME>: ``entries`` with ``symbol`` a function of the entry) or as a
list in one text symbol (MATRIX_SEEDS: ``symbol`` a name, ``parse`` its reader). An
``optional`` axis left empty is not an axis of that matrix: its cells keep the
configuration's value, and the ids, files and tables are those of a matrix without it.
docs/architecture.md adds one, step by step.

Plain data (no torch): the configuration tools read it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable

from gpt2.config.choices import (OPTIMIZERS, PRUNING_METHODS, PRUNING_STRUCTURES, VOCAB_SIZE,
                                 pair_problem, structure_sparsity)
from gpt2.config.datasets import vocab_rows
from gpt2.config.sizes import parameter_count


# ---- how values are written (cell ids, tables, plots) ---------------------------------

def sparsity_tag(sparsity: float) -> str:
    """0.7 -> "70", 0.925 -> "92.5", 0.7000001 -> "70.00001": the sparsity in percent,
    as short as exact (the shortest decimal that reads back as the float, times
    100, so two sparsities never share a tag). Cell ids, labels, plots and the
    report all write sparsities this way."""
    return format((Decimal(repr(float(sparsity))) * 100).normalize(), "f")


def value_tag(value: float | int) -> str:
    """A grid value as short as exact: 0.0006 -> "6e-4", 0.0012 -> "1.2e-3", 0.02 ->
    "0.02", 100 -> "100", 0.1000001 -> "0.1000001", True -> "y". The digits are the
    shortest that read back as the same float (repr's), so two values never share a
    tag. Cell ids, tables and plots all write grid values this way."""
    if isinstance(value, bool):
        return "y" if value else "n"
    if isinstance(value, int):
        return str(value)
    exact = Decimal(repr(float(value)))
    if value and abs(value) < 1e-2:
        return format(exact.normalize(), "e")
    if exact == exact.to_integral_value():
        return format(exact.to_integral_value(), "f")
    return repr(float(value))  # (no exponent between 1e-2 and 1e16)


def percent(sparsity: float) -> str:
    """0.7 -> "70%", 0.925 -> "92.5%"."""
    return sparsity_tag(sparsity) + "%"


# ---- reading an axis's list from its Kconfig symbol -----------------------------------

def items(text: str) -> list[str]:
    """The entries of a list written with spaces or commas between them."""
    return [item for item in re.split(r"[\s,]+", text.strip()) if item]


def numbers(text: str, example: str, problem: Callable[[float], str | None],
            empty: str) -> tuple[float, ...]:
    """A list of distinct numbers, each checked by ``problem`` (a reason, or None)."""
    out: list[float] = []
    for item in items(text):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{item!r} is not a number (write e.g. \"{example}\")") from None
        why = problem(value)
        if why:
            raise ValueError(f"{item} {why}")
        if value in out:
            raise ValueError(f"{item} is listed twice")
        out.append(value)
    if not out:
        raise ValueError(empty)
    return tuple(out)


def whole_numbers(text: str, what: str, low: int, high: int, example: str) -> tuple[int, ...]:
    """A list of distinct whole numbers from ``low`` to ``high``."""
    out: list[int] = []
    for item in items(text):
        if not re.fullmatch(r"[0-9]+", item) or not low <= int(item) <= high:
            raise ValueError(f"{item!r} is not a {what}: use whole numbers from {low} to {high}")
        if int(item) in out:
            raise ValueError(f"{what} {item} is listed twice")
        out.append(int(item))
    if not out:
        raise ValueError(f"no {what}s: list at least one, e.g. \"{example}\"")
    return tuple(out)


def parse_sparsities(text: str) -> tuple[float, ...]:
    """ "0.5 0.7 0.9" -> (0.5, 0.7, 0.9); raises ValueError saying what is wrong."""
    return numbers(text, "0.5 0.7 0.9", lambda v: None if 0.0 < v < 1.0 else (
        "is not a sparsity: each level must be strictly between 0 and 1 (0.7 prunes 70 %)"),
        "no sparsity levels: list at least one, e.g. \"0.5 0.7 0.9\"")


def parse_seeds(text: str) -> tuple[int, ...]:
    """ "1337 1338" -> (1337, 1338); raises ValueError saying what is wrong."""
    return whole_numbers(text, "seed", 0, 2**31 - 1, "1337")


def parse_structures(text: str) -> tuple[str, ...]:
    """Mask structures: "unstructured 2:4" -> ("unstructured", "2:4"); empty -> () (no
    structure axis: every pruned cell has CONFIG_PRUNING_STRUCTURE's). Raises
    ValueError saying what is wrong."""
    out: list[str] = []
    for item in items(text):
        if item not in PRUNING_STRUCTURES:
            raise ValueError(f"{item!r} is not a mask structure: use "
                             f"{', '.join(PRUNING_STRUCTURES)}")
        if item in out:
            raise ValueError(f"{item} is listed twice")
        out.append(item)
    return tuple(out)


def _structure_refuses(point: dict[str, Any], structure: str) -> bool:
    """An N:M structure pairs only with its own sparsity, 1 - N/M (2:4 with 50 %)."""
    fixed = structure_sparsity(structure)
    return fixed is not None and abs(point["target_sparsity"] - fixed) > 1e-9


MAX_BUDGET = 10**9  # steps (Config's max_iters has no other upper bound)
# Hoffmann et al. 2022's compute-optimal ratio: "1x Chinchilla" is 20 training tokens per
# parameter.
TOKENS_PER_PARAMETER = 20


def parse_budgets(text: str) -> tuple[int | str, ...]:
    """Training budgets: "500 1000 2000" -> (500, 1000, 2000) optimizer steps, or
    "0.5x 1x 2x" -> ("0.5x", "1x", "2x"), multiples of TOKENS_PER_PARAMETER tokens per
    parameter; empty -> () (no budget axis: every cell trains for MAX_ITERS). Raises
    ValueError saying what is wrong."""
    parts = items(text)
    if not parts:
        return ()
    multiples = [p.lower().endswith("x") for p in parts]
    if all(multiples):
        values = numbers(" ".join(p[:-1] for p in parts), "0.5x 1x 2x",
                         lambda v: None if 0 < v < 1e6 else "is not a budget: a multiple of "
                         "20 tokens per parameter is above 0 (e.g. 0.5x 1x 2x)",
                         "no budgets")
        return tuple(f"{value_tag(v)}x" for v in values)
    if any(multiples):
        raise ValueError("write every budget in steps (\"1000 2000\") or every one in "
                         "Chinchilla multiples (\"0.5x 1x 2x\"), not both")
    return whole_numbers(text, "budget", 1, MAX_BUDGET, "500 1000 2000")


def budget_steps(budget: int | str, cfg: Any) -> int:
    """The optimizer steps of a budget for a cell's Config: the steps themselves, or
    for a multiple m, enough steps for m x 20 tokens per parameter of its model
    (all its parameters, the tied head once; tokens per step with one process)."""
    if isinstance(budget, int):
        return budget
    n_layer, _, n_embd = cfg.dims()
    vocab = VOCAB_SIZE if cfg.init_from else vocab_rows(cfg.dataset)
    params = parameter_count(n_layer, n_embd, vocab, cfg.block_size, cfg.bias,
                             cfg.tie_weights, rmsnorm=cfg.model_norm == "rmsnorm",
                             learned_positions=cfg.model_position == "learned",
                             embedding_norm=cfg.model_embedding_norm,
                             head_bias=cfg.model_head_bias)
    tokens = float(budget[:-1]) * TOKENS_PER_PARAMETER * params
    return max(1, math.ceil(tokens / cfg.tokens_per_step()))


def _budget_text(budget: int | str) -> str:
    return f"{budget} steps" if isinstance(budget, int) else f"{budget} Chinchilla"


def _no_epochs(base: dict[str, Any]) -> str | None:
    if base.get("epochs"):
        return (f"CONFIG_EPOCHS={base['epochs']:g} sets every cell's length, which "
                "CONFIG_MATRIX_MAX_ITERS (the budget axis) sets: set CONFIG_EPOCHS to 0")
    return None


# ---- the axes --------------------------------------------------------------------------

def optimizer_symbol(name: str) -> str:
    return f"MATRIX_OPTIMIZER_{name.upper()}"


def pruning_symbol(name: str) -> str:
    return f"MATRIX_PRUNING_{name.upper()}"


def _always(point: dict[str, Any]) -> bool:
    return True


def _never(point: dict[str, Any], value: Any) -> bool:
    return False


@dataclass(frozen=True)
class CellAxis:
    """One built-in axis of the matrix (see the module's docstring for what each use)."""

    name: str  # plan.yaml's key in each cell, summary.csv's column, CellResult.axes' key
    field: str  # the Config field a cell's value sets
    plural: str  # plan.yaml's list of its values (axes.<plural>); MatrixSettings' field
    heading: str  # the report's column
    kind: tuple[type, ...]  # the type of its values in plan.yaml
    # Where Kconfig gives its values: a text symbol read by ``parse``, or, with
    # ``entries``, a function naming each entry's bool symbol.
    symbol: str | Callable[[str], str]
    entries: tuple[str, ...] = ()
    parse: Callable[[str], tuple] | None = None
    none_enabled: str = ""  # the error when a required axis has no value
    # compared: part of the setting the comparison ranks; else a replicate (averaged).
    compared: bool = True
    optional: bool = False  # empty: not an axis of this matrix
    needs: Callable[[dict[str, Any]], bool] = _always  # in force, given earlier axes' values
    refuses: Callable[[dict[str, Any], Any], bool] = _never  # a value that does not pair
    # The Config fields a value sets, from the cell's configuration without it (a budget
    # in tokens per parameter needs the model's size); None: {field: value}.
    sets: Callable[[Any, Any], dict[str, Any]] | None = None
    # Why the base configuration clashes with this axis (a setting it overrules), or None.
    clash: Callable[[dict[str, Any]], str | None] | None = None
    tag: Callable[[Any], str] = str  # its part of a cell id
    tag_alone: bool = True  # in the id even when it has one value
    text: Callable[[Any], str] = str  # in labels and tables
    qualifies: bool = False  # its text follows the previous axis's after a space

    def column(self, value: Any) -> str:
        """The report's table cell for ``value`` (a dash where it does not apply)."""
        return "—" if value is None else self.text(value)


AXES: tuple[CellAxis, ...] = (
    CellAxis("optimizer", "optimizer", "optimizers", "optimizer", (str,),
             symbol=optimizer_symbol, entries=tuple(OPTIMIZERS),
             none_enabled="the test matrix has no optimizer: enable at least one "
             "CONFIG_MATRIX_OPTIMIZER_* (`make menuconfig`, Test matrix menu)"),
    CellAxis("pruning", "pruning_method", "pruning_methods", "pruning", (str,),
             symbol=pruning_symbol, entries=tuple(PRUNING_METHODS),
             none_enabled="the test matrix has no pruning method: enable at least one "
             "CONFIG_MATRIX_PRUNING_* (\"none\" for dense cells)",
             refuses=lambda point, method: pair_problem(point["optimizer"], method) is not None),
    CellAxis("target_sparsity", "target_sparsity", "sparsities", "target", (int, float),
             symbol="MATRIX_SPARSITIES", parse=parse_sparsities,
             needs=lambda point: point["pruning"] != "none",
             tag=sparsity_tag, text=percent, qualifies=True),
    CellAxis("structure", "pruning_structure", "structures", "structure", (str,),
             symbol="MATRIX_STRUCTURES", parse=parse_structures, optional=True,
             needs=lambda point: "pruning_structure" in PRUNING_METHODS[point["pruning"]].hparams,
             refuses=_structure_refuses,
             tag=lambda s: s.replace(":", "of"), tag_alone=False, qualifies=True),
    CellAxis("budget", "max_iters", "budgets", "budget", (int, str),
             symbol="MATRIX_MAX_ITERS", parse=parse_budgets, optional=True,
             sets=lambda budget, cfg: {"max_iters": budget_steps(budget, cfg)},
             clash=_no_epochs,
             tag=lambda b: f"iters{b}" if isinstance(b, int) else f"budget{b}",
             tag_alone=False, text=_budget_text),
    CellAxis("seed", "seed", "seeds", "seed", (int,), symbol="MATRIX_SEEDS",
             parse=parse_seeds, compared=False, tag=lambda seed: f"seed{seed}"),
)
AXIS = {a.name: a for a in AXES}
COMPARED = tuple(a for a in AXES if a.compared)
REPLICATES = tuple(a for a in AXES if not a.compared)
# The fields the axes always set: the base configuration never sets them. (An optional
# axis's field is the matrix's only where the matrix lists values for it.)
AXIS_FIELDS = tuple(a.field for a in AXES if not a.optional)


def setting(values: dict[str, Any]) -> tuple:
    """The compared axes' values of a cell or table row ({axis name: value}): what the
    tuned comparison tunes, ranks and pairs."""
    return tuple(values.get(a.name) for a in COMPARED)


def setting_of(values: dict[str, Any]) -> dict[str, Any]:
    """The compared axes' entries of ``values`` that it has, by name, in axis order."""
    return {a.name: values[a.name] for a in COMPARED if a.name in values}


def label(values: dict[str, Any], skip: tuple[str, ...] = ()) -> str:
    """ "adamw / movement 70%" (", 2000 steps" and so on for the other compared axes the
    values hold); ``skip`` leaves axes out ("movement 70%" without the optimizer)."""
    out = ""
    for a in COMPARED:
        if a.name in skip or values.get(a.name) is None:
            continue
        text = a.text(values[a.name])
        out += (" " if a.qualifies else " / ") + text if out else text
    return out

