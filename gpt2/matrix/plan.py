"""Which cells a matrix runs: exactly the valid combinations of what is enabled.

A cell is an ordinary training run. Its configuration is the base configuration
(every menu but the Matrix one), then TRAIN_ARGS, then the cell's axes (optimizer,
pruning method, target sparsity, seed). Settings that do not apply to a cell (SPAM's
threshold in an AdamW cell) are left out of that cell, exactly as a single run
leaves them out; a setting that applies to no cell at all is an error, because the
user believes it is in force.

The plan's hash covers every cell's configuration hash, so the same plan always
lands in the same folder (a re-run continues it) and a changed plan gets a new one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gpt2.config.matrix import AXIS_FIELDS, MatrixSettings, optimizer_symbol
from gpt2.config.options import (TRAIN, Config, ConfigError, add_arguments, applies, flag,
                                 resolve, to_argv)
from gpt2.matrix.results import sparsity_tag
from gpt2.training.pruning import pair_problem

REPO = Path(__file__).resolve().parents[2]
PLAN_FILE = "plan.yaml"


class PlanError(Exception):
    """The matrix cannot be planned; one problem per line."""


@dataclass(frozen=True)
class Cell:
    id: str
    optimizer: str
    pruning: str
    sparsity: float | None  # None for pruning "none"
    seed: int
    cfg: Config
    argv: tuple[str, ...]  # train.py flags that reproduce cfg (run control excluded)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "optimizer": self.optimizer, "pruning": self.pruning,
                "target_sparsity": self.sparsity, "seed": self.seed,
                "config_hash": self.cfg.config_hash(), "args": list(self.argv)}


@dataclass(frozen=True)
class Plan:
    name: str
    settings: MatrixSettings
    cells: tuple[Cell, ...]
    results_dir: str
    train_args: tuple[str, ...]

    @property
    def hash(self) -> str:
        blob = json.dumps([[c.id, c.cfg.config_hash()] for c in self.cells]).encode()
        return hashlib.sha256(blob).hexdigest()[:10]

    @property
    def folder(self) -> Path:
        """results/matrix-<name>-<hash>; a relative results dir is relative to the repo,
        as it is for train.py."""
        return REPO / self.results_dir / f"matrix-{self.name}-{self.hash}"

    def to_dict(self) -> dict[str, Any]:
        s = self.settings
        return {"name": self.name, "hash": self.hash,
                "axes": {"optimizers": list(s.optimizers),
                         "pruning_methods": list(s.pruning_methods),
                         "sparsities": list(s.sparsities), "seeds": list(s.seeds)},
                "train_args": list(self.train_args),
                "cells": [c.to_dict() for c in self.cells]}


def cell_id(optimizer: str, pruning: str, sparsity: float | None, seed: int) -> str:
    parts = [optimizer, pruning] + ([sparsity_tag(sparsity)] if sparsity is not None else [])
    return "-".join(parts + [f"seed{seed}"])


def combinations(settings: MatrixSettings) -> list[tuple[str, str, float | None, int]]:
    """(optimizer, pruning, sparsity, seed) of every cell, in registry order."""
    out = []
    for optimizer in settings.optimizers:
        for method in settings.pruning_methods:
            if pair_problem(optimizer, method):
                continue
            for sparsity in (None,) if method == "none" else settings.sparsities:
                out.extend((optimizer, method, sparsity, seed) for seed in settings.seeds)
    return out


def parse_train_args(train_args: list[str]) -> dict[str, Any]:
    """TRAIN_ARGS -> the configuration values it sets. Only configuration flags are
    accepted: run control (--stop-at-step, --dry-run) is the matrix runner's job."""
    parser = argparse.ArgumentParser(prog="TRAIN_ARGS", add_help=False, exit_on_error=False)
    add_arguments(parser, TRAIN)
    try:
        ns, unknown = parser.parse_known_args(train_args)
    except argparse.ArgumentError as e:
        raise PlanError(f"TRAIN_ARGS: {e}") from None
    if unknown:
        raise PlanError(f"TRAIN_ARGS: {' '.join(unknown)}: not a configuration flag of "
                        "train.py (`python gpt2/train.py --help` lists them)")
    given = vars(ns)
    varied = [flag(n) for n in AXIS_FIELDS if n in given]
    if varied:
        raise PlanError(f"TRAIN_ARGS sets {', '.join(varied)}, which the matrix varies per "
                        "cell: change the Test matrix menu instead (`make menuconfig`)")
    return given


def build_plan(values: dict[str, Any], settings: MatrixSettings, train_args: list[str],
               where: Callable[[str], str] = lambda name: ".config") -> Plan:
    """The plan for base ``values`` (fields in force in .config, typed), the matrix
    ``settings`` and extra train.py flags. ``where(name)`` says where a .config
    setting came from, for error messages."""
    overrides = parse_train_args(train_args)
    problems = []
    for optimizer in settings.optimizers:
        if all(pair_problem(optimizer, m) for m in settings.pruning_methods):
            problems.append(f"CONFIG_{optimizer_symbol(optimizer)}: {optimizer} pairs with none "
                            f"of the enabled pruning methods ({', '.join(settings.pruning_methods)})"
                            f"; enable one it pairs with, or disable it")
    base = {k: v for k, v in values.items() if k not in AXIS_FIELDS}
    base.update(overrides)
    used: set[str] = set()
    cells = []
    for optimizer, method, sparsity, seed in combinations(settings):
        cid = cell_id(optimizer, method, sparsity, seed)
        axes: dict[str, Any] = {"optimizer": optimizer, "pruning_method": method, "seed": seed}
        if sparsity is not None:
            axes["target_sparsity"] = sparsity
        given = {**base, **axes, "run_name": cid}
        probe = Config(**given)  # unchecked: only asks which settings are in force
        given = {k: v for k, v in given.items() if applies(probe, k)}
        used.update(given)
        try:
            cfg = resolve(given)
        except ConfigError as e:
            origin = "TRAIN_ARGS" if e.name in overrides else where(e.name)
            problems.append(f"cell {cid}: {origin}: {e}")
            continue
        cells.append(Cell(cid, optimizer, method, sparsity, seed, cfg,
                          tuple(to_argv(cfg, TRAIN, given))))
    for name in overrides:
        if name not in used:
            problems.append(f"TRAIN_ARGS {flag(name)} has no effect in any cell of this "
                            "matrix; remove it")
    if problems:
        raise PlanError("\n".join(problems))
    name = values.get("run_name", Config.run_name)
    results_dir = overrides.get("results_dir", values.get("results_dir", Config.results_dir))
    return Plan(name=name, settings=settings, cells=tuple(cells), results_dir=results_dir,
                train_args=tuple(train_args))


def plan_from_dotconfig(loaded, train_args: list[str]) -> Plan:
    """The plan a loaded .config (gpt2.config.kconfig.load) describes."""
    from gpt2.config import kconfig

    settings = kconfig.to_matrix(loaded)
    if settings is None:
        raise PlanError(f"{loaded.path}: CONFIG_MATRIX is not set: this is a single-run "
                        "configuration. Enable the Test matrix menu (`make menuconfig`) or start "
                        "from `make defconfig-gpt2-shakespeare-matrix`")
    values, _ = kconfig.to_values(loaded)
    return build_plan(values, settings, train_args,
                      where=lambda name: loaded.where(name.upper()))
