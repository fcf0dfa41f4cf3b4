"""Which cells a matrix runs: exactly the valid combinations of what is enabled.

A cell is an ordinary training run. Its configuration is the base configuration
(every menu but the Matrix one), then TRAIN_ARGS, then the cell's values of the
matrix's axes (optimizer, pruning method, target sparsity, budget, seed: declared in
gpt2/config/axes.py, which also derives ids and groups from them), then its grid
point. Settings that do not apply
to a cell (SPAM's threshold in an AdamW cell) are left out of that cell, exactly as
a single run leaves them out; a setting that applies to no cell at all is an error,
because the user believes it is in force.

A grid point is one value of each grid axis that applies to the cell: the
optimizer's own grids when tuning, one for every rate and decay it has (the settings
OptimizerChoice.tuned names: Muon's are its block matrices' rate and decay and those of
its AdamW part), then the swept settings in the order given, each only where it
applies (and only in one optimizer's cells when the sweep names it). One mechanism for all
of them: an axis is a label, the Config field it sets, and its values. When an axis
sets learning_rate, min_lr keeps its configured ratio to it, so the schedule has the
same shape at every point.

The plan's hash covers every cell's configuration hash, so the same plan always
lands in the same folder (a re-run continues it) and a changed plan gets a new one.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


from gpt2 import REPO
from gpt2.config import kconfig
from gpt2.config.axes import (AXES, AXIS, AXIS_FIELDS, COMPARED, REPLICATES, optimizer_symbol,
                              value_tag)
from gpt2.config.matrix import MatrixSettings, grid_symbol, tuning_grids
from gpt2.config.options import TRAIN, Config, applies, parse_train_flags, resolve, to_argv
from gpt2.config.smoke import shrink_budgets
from gpt2.names import flag, symbol
from gpt2.errors import ConfigError
from gpt2.config.choices import OPTIMIZERS, pair_problem
from gpt2.errors import PlanError
from gpt2.matrix import extend
from gpt2.training.schedule import branch_problem, branch_step



@dataclass(frozen=True)
class Axis:
    """One grid axis of a cell: ``label`` names it in cell ids and tables ("lr", "wd",
    or the field), ``field`` is the Config field it sets."""

    label: str
    field: str
    values: tuple

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "values": list(self.values)}


@dataclass(frozen=True)
class Cell:
    id: str
    # (axis name, value) of each axis of the plan, in AXES order; None where the axis
    # is not in force (no target sparsity in a dense cell).
    values: tuple[tuple[str, Any], ...]
    cfg: Config
    argv: tuple[str, ...]  # train.py flags that reproduce cfg (run control excluded)
    point: tuple[tuple[str, Any], ...] = ()  # (axis label, value) of its grid point

    def value(self, axis: str) -> Any:
        return dict(self.values).get(axis)

    @property
    def optimizer(self) -> str:
        return self.value("optimizer")

    @property
    def pruning(self) -> str:
        return self.value("pruning")

    @property
    def sparsity(self) -> float | None:  # None for pruning "none"
        return self.value("target_sparsity")

    @property
    def seed(self) -> int:
        return self.value("seed")

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, **dict(self.values), "grid": dict(self.point),
                "config_hash": self.cfg.config_hash(), "args": list(self.argv)}


@dataclass(frozen=True)
class Plan:
    name: str
    settings: MatrixSettings
    cells: tuple[Cell, ...]
    results_dir: str
    train_args: tuple[str, ...]
    axes: dict[str, tuple[Axis, ...]] = field(default_factory=dict)  # per optimizer
    # {cell id: (the longer cell it branches from, the step)}: see branches()
    branches: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Grid points added past the configured grids (gpt2/matrix/extend.py), and the hash
    # of the configured plan, which names the folder they continue.
    added: dict[str, dict[str, tuple[float, ...]]] = field(default_factory=dict)
    configured_hash: str = ""

    def keep_steps(self, cell_id: str) -> tuple[int, ...]:
        """The steps whose checkpoints cell ``cell_id`` keeps for its branches."""
        return tuple(sorted({s for parent, s in self.branches.values() if parent == cell_id}))

    @property
    def hash(self) -> str:
        blob = json.dumps([[c.id, c.cfg.config_hash()] for c in self.cells]).encode()
        return hashlib.sha256(blob).hexdigest()[:10]

    @property
    def folder(self) -> Path:
        """results/matrix-<name>-<hash> (the configured plan's hash: extended grids
        continue its folder); a relative results dir is relative to the repo, as it is
        for train.py."""
        return (REPO / self.results_dir
                / f"matrix-{self.name}-{self.configured_hash or self.hash}")

    def oneshot(self) -> dict[str, Any]:
        """The one-shot baselines (CONFIG_MATRIX_ONESHOT; gpt2/matrix/oneshot_cells.py):
        the methods, the fine-tune steps, and the targets, each (structure, sparsity)
        the pruned cells train to."""
        targets = sorted({(c.cfg.pruning_structure, c.cfg.target_sparsity) for c in self.cells
                          if c.cfg.pruning_method != "none"}, key=lambda t: (t[1], t[0]))
        return {"methods": list(self.settings.oneshot), "finetune": self.settings.oneshot_finetune,
                "targets": [{"structure": st, "sparsity": sp} for st, sp in targets]}

    def to_dict(self) -> dict[str, Any]:
        s = self.settings
        cells = [c.to_dict() for c in self.cells]
        for c in cells:
            if c["id"] in self.branches:
                parent, step = self.branches[c["id"]]
                c["branch"] = {"from": parent, "step": step}
        return {"name": self.name, "hash": self.configured_hash or self.hash,
                **({"added": {o: {k: list(v) for k, v in g.items()}
                              for o, g in self.added.items()}} if self.added else {}),
                "axes": {**{a.plural: list(s.values_of(a)) for a in AXES if s.in_force(a)},
                         "grids": {o: {a.label: a.to_dict() for a in axes}
                                   for o, axes in self.axes.items()}},
                "baseline": s.baseline, "train_args": list(self.train_args),
                **({"target_loss": s.target_loss} if s.target_loss is not None else {}),
                **({"oneshot": self.oneshot()} if s.oneshot else {}),
                "cells": cells}


def cell_id(values: dict[str, Any], point: tuple[tuple[str, Any], ...] = (),
            shown: frozenset[str] | None = None) -> str:
    """adamw-movement-70-lr6e-4-seed1337: the compared axes' tags, the varying grid
    axes, then the replicates' (gpt2/config/axes.py), each where it is in force;
    ``shown`` limits the axes to those the matrix names in ids (tag_alone)."""
    def tags(axes):
        return [a.tag(values[a.name]) for a in axes if values.get(a.name) is not None
                and (shown is None or a.name in shown)]

    parts = tags(COMPARED) + [f"{label}{value_tag(value)}" for label, value in point]
    return "-".join(parts + tags(REPLICATES))


def grid_axes(settings: MatrixSettings, probe: Config) -> tuple[Axis, ...]:
    """The grid axes of the cells of ``probe``'s optimizer and pruning method."""
    axes = []
    if settings.grids:
        grids = settings.grids[probe.optimizer]
        axes += [Axis(label, name, grids[label])
                 for label, name in OPTIMIZERS[probe.optimizer].tuned(probe).items()
                 if label in grids]
    axes += [Axis(s.field, s.field, s.values) for s in settings.sweep
             if s.optimizer in (None, probe.optimizer) and applies(probe, s.field)]
    return tuple(axes)


def combinations(settings: MatrixSettings) -> list[dict[str, Any]]:
    """{axis name: value} of every cell but its grid point, for the axes in force, in
    registry order: each axis's values nested inside the earlier axes', where the
    axis applies (else None) and the value pairs with the earlier ones."""
    points: list[dict[str, Any]] = [{}]
    for axis in (a for a in AXES if settings.in_force(a)):
        points = [{**p, axis.name: v} for p in points
                  for v in (settings.values_of(axis) if axis.needs(p) else (None,))
                  if v is None or not axis.refuses(p, v)]
    return points


def shown_axes(settings: MatrixSettings) -> frozenset[str]:
    """The axes a cell id names: every one in force, an optional one only when it has
    several values (one budget names nothing new)."""
    return frozenset(a.name for a in AXES if settings.in_force(a)
                     and (a.tag_alone or len(settings.values_of(a)) > 1))


def axis_fields(settings: MatrixSettings) -> tuple[str, ...]:
    """The Config fields this matrix's axes set: TRAIN_ARGS and sweeps cannot."""
    return tuple(a.field for a in AXES if settings.in_force(a))


def parse_train_args(train_args: list[str],
                     varied_fields: tuple[str, ...] = AXIS_FIELDS) -> dict[str, Any]:
    """TRAIN_ARGS -> the configuration values it sets. Only configuration flags are
    accepted: run control (--stop-at-step, --dry-run) is the matrix runner's job."""
    try:
        given, unknown = parse_train_flags(train_args)
    except argparse.ArgumentError as e:
        raise PlanError(f"TRAIN_ARGS: {e}") from None
    if unknown:
        raise PlanError(f"TRAIN_ARGS: {unknown}: not a configuration "
                        "flag of train.py (`python gpt2/train.py --help` lists them)")
    varied = [flag(n) for n in varied_fields if n in given]
    if varied:
        raise PlanError(f"TRAIN_ARGS sets {', '.join(varied)}, which the matrix varies per "
                        "cell: change the Test matrix menu instead (`make menuconfig`)")
    return given


def build_plan(values: dict[str, Any], settings: MatrixSettings, train_args: list[str],
               where: Callable[[str], str] = lambda name: ".config") -> Plan:
    """The plan for base ``values`` (fields in force in .config, typed), the matrix
    ``settings`` and extra train.py flags. ``where(name)`` says where a .config
    setting came from, for error messages."""
    varying = axis_fields(settings)
    overrides = parse_train_args(train_args, varying)
    problems = [f"CONFIG_MATRIX_SWEEP: {s.field.upper()}: the matrix has its own axis for it "
                "(listed in the Test matrix menu); sweep it in one place"
                for s in settings.sweep if s.field in varying]
    problems += [why for a in AXES if settings.in_force(a) and a.clash
                 for why in [a.clash({**values, **overrides})] if why]
    for optimizer in settings.optimizers:
        if all(pair_problem(optimizer, m) for m in settings.pruning_methods):
            problems.append(f"CONFIG_{optimizer_symbol(optimizer)}: {optimizer} pairs with none "
                            f"of the enabled pruning methods ({', '.join(settings.pruning_methods)})"
                            f"; enable one it pairs with, or disable it")
    base = {k: v for k, v in values.items() if k not in varying}
    base.update(overrides)
    used: set[str] = set()
    cells: list[Cell] = []
    axes_of: dict[str, tuple[Axis, ...]] = {}
    swept: set[tuple[str, str | None]] = set()  # (field, None and the optimizer it is in)
    refused: dict[str, list[str]] = {}  # why a cell's configuration is refused: its cells
    shown = shown_axes(settings)
    for at in combinations(settings):
        optimizer = at["optimizer"]
        # the Config fields the axes set (an axis not in force sets nothing; one with
        # ``sets`` needs the rest of the cell first)
        axes = {AXIS[name].field: v for name, v in at.items()
                if v is not None and AXIS[name].sets is None}
        probe = Config(**{**base, **axes})  # unchecked: only asks which settings are in force
        grid = grid_axes(settings, probe)
        known = axes_of.setdefault(optimizer, ())
        axes_of[optimizer] = known + tuple(a for a in grid if a not in known)
        problems += _grid_conflicts(grid, overrides, optimizer)
        swept |= {(a.field, key) for a in grid for key in (None, optimizer)}
        for values_at in itertools.product(*(a.values for a in grid)):
            point = {a.field: v for a, v in zip(grid, values_at)}
            cid = cell_id(at, tuple((a.label, v) for a, v in zip(grid, values_at)
                                    if len(a.values) > 1), shown)
            given = {**base, **point, **axes, "run_name": cid}
            for name, v in at.items():
                if v is not None and AXIS[name].sets is not None:
                    given.update(AXIS[name].sets(v, Config(**given)))
            _keep_min_lr_ratio(given, base, point)
            probe = Config(**given)
            given = {k: v for k, v in given.items() if applies(probe, k)}
            used.update(given)
            try:
                cfg = resolve(given)
            except ConfigError as e:
                origin = ("TRAIN_ARGS" if e.name in overrides else "the matrix grid"
                          if e.name in point else where(e.name))
                refused.setdefault(f"{origin}: {e}", []).append(cid)
                continue
            cells.append(Cell(cid, tuple(at.items()), cfg,
                              tuple(to_argv(cfg, TRAIN, given)),
                              tuple((a.label, v) for a, v in zip(grid, values_at))))
    problems += [_cells_refused(cids, why) for why, cids in refused.items()]
    problems += _shared_ids(cells)
    for name in overrides:
        if name not in used:
            problems.append(f"TRAIN_ARGS {flag(name)} has no effect in any cell of this "
                            "matrix; remove it")
    for s in settings.sweep:
        if (s.field, s.optimizer) not in swept:
            what = f"{s.optimizer}:{s.field.upper()}" if s.optimizer else s.field.upper()
            problems.append(f"CONFIG_MATRIX_SWEEP: {what} applies to no cell of this "
                            "matrix; remove it, or enable what it applies to")
    if problems:
        raise PlanError("\n".join(dict.fromkeys(problems)))
    name = values.get("run_name", Config.run_name)
    results_dir = overrides.get("results_dir", values.get("results_dir", Config.results_dir))
    return Plan(name=name, settings=settings, cells=tuple(cells), results_dir=results_dir,
                train_args=tuple(train_args), axes=axes_of,
                branches=branches(cells) if settings.branch else {})


def branches(cells: list[Cell]) -> dict[str, tuple[str, int]]:
    """Cells that differ only in budget share everything before the shorter one's WSD
    cooldown (gpt2/training/schedule.py): each shorter cell branches from the longest
    of its group at the step its cooldown begins, where branch_problem allows it.
    {cell id: (the longest cell's id, the step)}."""
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        if c.value("budget") is not None:
            key = (tuple((k, v) for k, v in c.values if k != "budget"), c.point)
            groups.setdefault(key, []).append(c)
    out = {}
    for group in groups.values():
        longest = max(group, key=lambda c: c.cfg.max_iters)
        for c in group:
            if c is not longest and branch_problem(longest.cfg, c.cfg) is None:
                out[c.id] = (longest.id, branch_step(c.cfg))
    return out


def _cells_refused(cids: list[str], why: str, shown: int = 3) -> str:
    """One line for one mistake, however many cells share it: a short budget under a
    pruning warmup refuses every pruned cell at that budget for the same reason."""
    if len(cids) == 1:
        return f"cell {cids[0]}: {why}"
    named = ", ".join(cids[:shown]) + (f" and {len(cids) - shown} more" if len(cids) > shown
                                       else "")
    return f"{len(cids)} cells ({named}): {why}"


def _shared_ids(cells: list[Cell]) -> list[str]:
    """Two cells with one id would share one folder, one row and one page: refused,
    naming both grid points (value_tag writes values exactly, so only a tag rule
    that loses digits could cause it; this is the check that it never does)."""
    first: dict[str, Cell] = {}
    out = []
    for c in cells:
        other = first.setdefault(c.id, c)
        if other is not c:
            points = [", ".join(f"{label}={value!r}" for label, value in x.point) or "no grid"
                      for x in (other, c)]
            out.append(f"two cells would be named {c.id} ({points[0]}; {points[1]}): give "
                       "values that differ in their written form")
    return out


def _grid_conflicts(grid: tuple[Axis, ...], overrides: dict[str, Any],
                    optimizer: str) -> list[str]:
    """A setting the grid varies cannot also be fixed by TRAIN_ARGS or swept twice."""
    out = []
    fields = [a.field for a in grid]
    for a in grid:
        where = (symbol(grid_symbol(a.label, optimizer).lower())
                 if a.label in tuning_grids(optimizer) else "CONFIG_MATRIX_SWEEP")
        if a.field in overrides:
            out.append(f"TRAIN_ARGS sets {flag(a.field)}, which {where} varies; remove one")
        if fields.count(a.field) > 1:
            own = " / ".join(symbol(grid_symbol(label, optimizer).lower())
                             for label in tuning_grids(optimizer))
            out.append(f"CONFIG_MATRIX_SWEEP: {a.field.upper()} is already a tuning grid of "
                       f"{optimizer} ({own}); sweep it in one place")
    return out


def _keep_min_lr_ratio(given: dict[str, Any], base: dict[str, Any],
                       point: dict[str, Any]) -> None:
    """A grid point's learning rate brings min_lr along at the configured ratio."""
    if "learning_rate" in point and "min_lr" not in point:
        lr = base.get("learning_rate", Config.learning_rate)
        given["min_lr"] = base.get("min_lr", Config.min_lr) * point["learning_rate"] / lr


def matrix_preset() -> str:
    """The matrix preset to suggest: the GPU one only where there is a GPU."""
    import torch  # (slow to import, and only this question needs it)

    return ("gpt2-wikitext103-matrix" if torch.cuda.is_available()
            else "gpt2-shakespeare-matrix-cpu")


def extended(plan: Plan, values: dict[str, Any], train_args: list[str],
             added: dict[str, dict[str, tuple[float, ...]]],
             where: Callable[[str], str] = lambda name: ".config") -> Plan:
    """``plan`` with ``added`` points in its optimizers' tuning grids: the same folder,
    more cells (gpt2/matrix/extend.py)."""
    if not added:
        return plan
    s = plan.settings
    more = {o: {k: tuple(v) + tuple(x for x in added.get(o, {}).get(k, ()) if x not in v)
                for k, v in g.items()} for o, g in s.grids.items()}
    bigger = build_plan(values, dataclasses.replace(s, grids=more), train_args, where)
    return dataclasses.replace(bigger, added=added, configured_hash=plan.hash)


def plan_from_dotconfig(loaded, train_args: list[str],
                        adjust: Callable[[dict], dict] | None = None) -> Plan:
    """The plan a loaded .config (gpt2.config.kconfig.load) describes, with the grid
    points its folder's extensions.json added; ``adjust`` may change the base values
    first (a smoke test's)."""
    settings = kconfig.to_matrix(loaded)
    if settings is None:
        raise PlanError(f"{loaded.path}: CONFIG_MATRIX is not set: this is a single-run "
                        "configuration. Enable the Test matrix menu (`make menuconfig`) or start "
                        f"from `make defconfig-{matrix_preset()}`")
    values, _ = kconfig.to_values(loaded)
    if adjust is not None:
        values = adjust(values)
        if settings.more.get("budgets"):  # (a smoke run: its budgets shrink with it)
            settings = dataclasses.replace(settings, more={
                **settings.more, "budgets": shrink_budgets(settings.more["budgets"],
                                                           values["max_iters"])})
    where = lambda name: loaded.where(name.upper())  # noqa: E731
    plan = build_plan(values, settings, train_args, where=where)
    if not settings.grids:
        return plan
    return extended(plan, values, train_args, extend.added(extend.read(plan.folder, settings)),
                    where)
