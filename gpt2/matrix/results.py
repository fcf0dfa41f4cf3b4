"""What a matrix left behind, read back from its folder.

Everything downstream of training (summary.csv, the plots, report.md) is built from
:class:`CellResult` objects, and those are built only from files on disk, so
``make plots`` and ``make report`` can rebuild a killed or half-failed matrix
without training anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpt2.config import axes
from gpt2.config.axes import value_tag
from gpt2.run_folder import COMPLETED


@dataclass
class CellResult:
    """One planned cell and, if it ran, its figures. Missing figures are None."""

    cell: str  # cell id, e.g. "adamw-movement-70-seed1337"
    # Its value of each axis of the plan ({"optimizer": <name>, "pruning": <name>,
    # "target_sparsity": None, "seed": 1337}): gpt2/config/axes.py.
    axes: dict[str, Any]
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
    sparse_kernel_layers: int | None = None  # Linears it ran on the 2:4 kernel (summary.json)
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
    # same point by the settings it sets (an optimizer's "lr" may set a rate of its own).
    grid: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    # The four built-in axes by name (the plots colour by optimizer and draw sparsity).
    @property
    def optimizer(self) -> str:
        return self.axes["optimizer"]

    @property
    def pruning(self) -> str:  # pruning method; "none" for the dense cells
        return self.axes["pruning"]

    @property
    def target_sparsity(self) -> float | None:  # None for pruning "none"
        return self.axes.get("target_sparsity")

    @property
    def seed(self) -> int:
        return self.axes["seed"]

    @property
    def setting(self) -> tuple:
        """What the tuned comparison compares: the compared axes' values (optimizer,
        pruning method, sparsity, and any other declared)."""
        return axes.setting(self.axes)

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
        return axes.label(self.axes)

    @property
    def usable(self) -> bool:
        """Completed with a finite final validation loss: fit for tables and plots."""
        return self.status == COMPLETED and finite(self.final_val_loss)


def grid_label(grid: dict[str, Any]) -> str:
    """ "lr 6e-4, wd 0.1" ("" for no grid)."""
    return ", ".join(f"{k} {value_tag(v)}" for k, v in grid.items())


def finite(x: Any) -> bool:
    """A number (not a bool) that is finite, as a float too (10**400 is not)."""
    try:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    except OverflowError:
        return False
