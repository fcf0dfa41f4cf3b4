"""The .config a make target acts on: loaded strictly, checked (for a matrix, every
cell), and turned into the entry points' flags: every setting in force, then
TRAIN_ARGS, so the last one wins."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from gpt2.cli.environment import config_path, if_changed, smoke, train_args
from gpt2.cli.presets import DEFAULT_DEFCONFIG
from gpt2.config import kconfig
from gpt2.config.options import DATA, TRAIN, applies, parse_train_flags, to_argv
from gpt2.errors import KconfigError, UsageError
from gpt2.matrix.plan import plan_from_dotconfig


def existing_config() -> Path:
    """The configuration file, which must exist."""
    path = config_path()
    if not path.is_file():
        what = ("is a folder" if path.is_dir() else "is not a regular file (a pipe, a device?)"
                if path.exists() else "does not exist")
        raise KconfigError([f"{path} {what}: start from a preset, e.g. `make "
                            f"defconfig-{DEFAULT_DEFCONFIG}` (`make help` lists them), or name a "
                            "configuration file with KCONFIG_CONFIG="])
    return path


def load_existing(complete: bool):
    loaded = kconfig.load(existing_config(), complete=complete)
    check(loaded)
    return loaded


def check(loaded) -> None:
    """Floats and cross-field rules; for a matrix, every cell's configuration."""
    if kconfig.to_matrix(loaded) is None:
        kconfig.to_config(loaded)
    else:
        matrix_plan(loaded, [])


def matrix_plan(loaded, extra: list[str]):
    return plan_from_dotconfig(loaded, extra, adjust=smoke())


def is_matrix() -> bool:
    return kconfig.to_matrix(load_existing(complete=True)) is not None


def resolved():
    """The typed Config from .config and the names of the fields in force."""
    return kconfig.to_config(load_existing(complete=True), adjust=smoke())


def data_config():
    """What `make data` prepares: for a matrix, the data every cell shares."""
    loaded = load_existing(complete=True)
    if kconfig.to_matrix(loaded) is None:
        return kconfig.to_config(loaded)
    _, active = kconfig.to_values(loaded)
    return matrix_plan(loaded, train_args()).cells[0].cfg, active


def one_run() -> tuple:
    """(Config, train.py flags) of what the per-run tools (bench, resume-check) act on:
    the single run .config describes, or the matrix cell CELL= names."""
    loaded = load_existing(complete=True)
    if kconfig.to_matrix(loaded) is None:
        cfg, active = kconfig.to_config(loaded, adjust=smoke())
        return cfg, train_argv(cfg, active, dotconfig=False)
    cell = selected_cell(matrix_plan(loaded, train_args()), required=True)
    return cell.cfg, list(cell.argv)


def selected_cell(plan, required: bool, name: str | None = None):
    """The cell CELL= (or ``name``) names in a matrix plan; None when none is named
    and none is required."""
    wanted = name or os.environ.get("CELL", "")
    ids = [c.id for c in plan.cells]
    if not wanted:
        if required:
            raise UsageError(f"{config_path()} describes a test matrix of {len(ids)} cells: "
                             f"name one with CELL=<id>, e.g. CELL={ids[0]} (`make test-matrix "
                             "DRY_RUN=1` lists them)")
        return None
    for cell in plan.cells:
        if cell.id == wanted:
            return cell
    raise UsageError(f"CELL={wanted!r} is not a cell of {plan.folder.name}"
                     f"{kconfig.did_you_mean(wanted, ids)}; `make test-matrix DRY_RUN=1` lists "
                     "them")


def run_folder_config(required: bool = True):
    """(Config, run folder) for generate and eval-hellaswag: RUN=<folder>, else the
    configuration's newest run. With a matrix .config, CELL=<id> (or RUN=<id>) names
    a cell and its folder; the Config is that cell's (or the first cell's, for the
    data settings every cell shares)."""
    run = os.environ.get("RUN", "")
    if not config_path().is_file():
        return None, run or str(Path("results") / "latest")
    loaded = load_existing(complete=True)
    if kconfig.to_matrix(loaded) is None:
        cfg, _ = kconfig.to_config(loaded)
        return cfg, run or str(Path(cfg.results_dir) / "latest")
    plan = matrix_plan(loaded, train_args())
    by_id = run if run and not Path(run).exists() and "/" not in run else None
    cell = selected_cell(plan, required=required and not run, name=by_id)
    if cell is None:
        return plan.cells[0].cfg, run
    return cell.cfg, str(plan.folder / "cells" / cell.id)


def run_folder() -> str:
    """The run folder of generate, export and prune-oneshot, which read nothing but the
    folder (it holds its own configuration): RUN= naming a folder is taken as it is,
    without reading a .config that may be stale or another experiment's; otherwise as
    run_folder_config finds it (the newest run, a matrix's CELL=)."""
    run = os.environ.get("RUN", "")
    if run and Path(run).is_dir():
        return run
    return run_folder_config()[1]


def train_argv(cfg, active: list[str], dotconfig: bool = True) -> list[str]:
    """.config -> train.py flags: every setting in force, then TRAIN_ARGS (last wins).

    TRAIN_ARGS may switch what is in force (``--optimizer sgd`` with an AdamW .config):
    .config settings that no longer apply are then left out, because train.py refuses
    a flag that has no effect. A TRAIN_ARGS flag that does not apply is still refused.
    """
    extra = train_args()
    try:
        overrides, _ = parse_train_flags(extra)  # unknown flags: train.py reports them
        effective = dataclasses.replace(cfg, **overrides)
        names = [n for n in active if n in overrides or applies(effective, n)]
    except (argparse.ArgumentError, ValueError, TypeError):
        names = active  # a malformed TRAIN_ARGS: let train.py report it
    record = ["--dotconfig", str(config_path())] if dotconfig else []
    return [*to_argv(cfg, TRAIN, names), *record, *extra]


def run_argv(cfg, active: list[str]) -> list[str]:
    """The train.py arguments of `make` and `make train`: the configuration, then what
    to do with a result of other code or data in its folder, when IF_CHANGED says."""
    policy = [f"--if-changed={if_changed()}"] if os.environ.get("IF_CHANGED") else []
    return [*train_argv(cfg, active), *policy]


def data_argv(cfg, active: list[str]) -> list[str]:
    return to_argv(cfg, DATA, active)


def check_hardware(cfg) -> None:
    """Stop before any work if the config asks for a device this machine lacks."""
    # (imported here: asking the device means importing torch, which a target that
    # has nothing to do, such as `make` on a finished run, never needs)
    from gpt2.training.device import check_dtype, resolve_device

    check_dtype(resolve_device(cfg.device), cfg.dtype)
