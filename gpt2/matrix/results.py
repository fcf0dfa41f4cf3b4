"""What a matrix left behind, read back from its folder.

Everything downstream of training (summary.csv, the plots, report.md) is built from
:class:`CellResult` objects, and those are built only from files on disk, so
``make plots`` and ``make report`` can rebuild a killed or half-failed matrix
without training anything.
"""

from __future__ import annotations

import math
from decimal import Decimal
from dataclasses import dataclass, field
from typing import Any

from gpt2.run_folder import COMPLETED


@dataclass
class CellResult:
    """One planned cell and, if it ran, its figures. Missing figures are None."""

    cell: str  # cell id, e.g. "adamw-movement-70-seed1337"
    optimizer: str
    pruning: str  # pruning method; "none" for the dense cells
    target_sparsity: float | None  # None for pruning "none"
    seed: int
    status: str  # completed | failed | interrupted | pending (never started)
    final_val_loss: float | None = None
    best_val_loss: float | None = None
    final_val_ppl: float | None = None
    final_sparsity: float | None = None
    tokens_per_sec: float | None = None
    peak_memory_mb: float | None = None
    wall_time_s: float | None = None
    # The final validation loss's standard error over the validation windows, and the
    # tokens it was measured on (the evaluation's own noise).
    final_val_loss_se: float | None = None
    val_tokens: int | None = None
    epochs_trained: float | None = None  # passes over the training split
    device: str | None = None  # what it trained on ("NVIDIA H100 ...", "cpu (2 cores, ...)")
    load_avg: float | None = None  # mean 1-minute load average while it trained
    config_hash: str | None = None  # the hash the plan gives this cell
    error: str | None = None
    # Settings where the run's config.json differs from the plan ([] when it matches,
    # None when the cell never started).
    config_diff: list[str] | None = None
    git_commit: str | None = None  # the commit the run's summary recorded
    # The code and data it ran with (its provenance.json; None: never started, or made
    # by a kgpt before provenance was recorded).
    provenance: dict[str, Any] | None = None
    config: dict[str, Any] | None = None  # the run's config.json (None: never started)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # rows of metrics.jsonl
    damaged_lines: int = 0  # lines of metrics.jsonl skipped as damaged (cut by a crash)
    slurm_job: str | None = None  # the Slurm array task that last ran it ("812_3")

    # Its grid point, {axis label: value} ({} in a matrix without grid axes), and the
    # same point by the settings it sets ({"muon_lr": 0.02} for Muon's "lr").
    grid: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def setting(self) -> tuple[str, str, float | None]:
        """What the tuned comparison compares: optimizer, pruning method, sparsity."""
        return self.optimizer, self.pruning, self.target_sparsity

    @property
    def point(self) -> tuple[tuple[str, Any], ...]:
        return tuple(self.grid.items())

    @property
    def combination(self) -> tuple:
        """What seeds are aggregated over: the setting at one grid point."""
        return (*self.setting, self.point)

    @property
    def label(self) -> str:
        """Short human label of the setting: "adamw / movement 70%"."""
        return f"{self.optimizer} / {pruning_label(self.pruning, self.target_sparsity)}"

    @property
    def usable(self) -> bool:
        """Completed with a finite final validation loss: fit for tables and plots."""
        return self.status == COMPLETED and finite(self.final_val_loss)


def grid_label(grid: dict[str, Any]) -> str:
    """ "lr 6e-4, wd 0.1" ("" for no grid)."""
    return ", ".join(f"{k} {value_tag(v)}" for k, v in grid.items())


def pruning_label(pruning: str, sparsity: float | None) -> str:
    return pruning if sparsity is None else f"{pruning} {percent(sparsity)}"


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


def finite(x: Any) -> bool:
    """A number (not a bool) that is finite, as a float too (10**400 is not)."""
    try:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    except OverflowError:
        return False
