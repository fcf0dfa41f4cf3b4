"""Typed settings of the Matrix menu (kconfig/matrix.kconfig).

The matrix axes are not settings of a run: each cell is an ordinary run whose
optimizer, pruning method, target sparsity and seed come from these axes. The
symbols follow the registries, one bool per entry (MATRIX_OPTIMIZER_<NAME>,
MATRIX_PRUNING_<NAME>), and tests/test_matrix_plan.py checks that Kconfig offers
exactly the registry's entries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpt2.training.optimizers import OPTIMIZERS
from gpt2.training.pruning import PRUNING_METHODS

ENABLE = "MATRIX"
SPARSITIES = "MATRIX_SPARSITIES"
SEEDS = "MATRIX_SEEDS"
JOBS = "MATRIX_JOBS"
MAX_JOBS = 64
# The Config fields a cell's axes set: the base configuration never sets them.
AXIS_FIELDS = ("optimizer", "pruning_method", "target_sparsity", "seed")


def optimizer_symbol(name: str) -> str:
    return f"MATRIX_OPTIMIZER_{name.upper()}"


def pruning_symbol(name: str) -> str:
    return f"MATRIX_PRUNING_{name.upper()}"


@dataclass(frozen=True)
class MatrixSettings:
    optimizers: tuple[str, ...]  # registry order
    pruning_methods: tuple[str, ...]  # registry order
    sparsities: tuple[float, ...]  # as written
    seeds: tuple[int, ...]  # as written
    jobs: int = 1

    def __post_init__(self):
        assert set(self.optimizers) <= set(OPTIMIZERS), self.optimizers
        assert set(self.pruning_methods) <= set(PRUNING_METHODS), self.pruning_methods


def _items(text: str) -> list[str]:
    return [item for item in re.split(r"[\s,]+", text.strip()) if item]


def parse_sparsities(text: str) -> tuple[float, ...]:
    """ "0.5 0.7 0.9" -> (0.5, 0.7, 0.9); raises ValueError saying what is wrong."""
    out: list[float] = []
    for item in _items(text):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{item!r} is not a number (write e.g. \"0.5 0.7 0.9\")") from None
        if not 0.0 < value < 1.0:
            raise ValueError(f"{item} is not a sparsity: each level must be strictly between "
                             "0 and 1 (0.7 prunes 70 %)")
        if value in out:
            raise ValueError(f"{item} is listed twice")
        out.append(value)
    if not out:
        raise ValueError("no sparsity levels: list at least one, e.g. \"0.5 0.7 0.9\"")
    return tuple(out)


def parse_seeds(text: str) -> tuple[int, ...]:
    """ "1337 1338" -> (1337, 1338); raises ValueError saying what is wrong."""
    out: list[int] = []
    for item in _items(text):
        if not re.fullmatch(r"[0-9]+", item) or int(item) > 2**31 - 1:
            raise ValueError(f"{item!r} is not a seed: use whole numbers from 0 to 2147483647")
        if int(item) in out:
            raise ValueError(f"seed {item} is listed twice")
        out.append(int(item))
    if not out:
        raise ValueError("no seeds: list at least one, e.g. \"1337\"")
    return tuple(out)


def parse_jobs(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text.strip()) or not 1 <= int(text) <= MAX_JOBS:
        raise ValueError(f"{text!r} is not a job count: use a whole number from 1 to {MAX_JOBS}")
    return int(text)
