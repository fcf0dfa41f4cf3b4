"""The .config a make target acts on: read once per target, checked (for a matrix,
every cell), and turned into the entry points' flags.

A target loads the file once (load_existing) and hands the loaded configuration
to what it calls. A single run is resolved once (single_run): .config, then SMOKE,
then TRAIN_ARGS over it, into one checked Config; train.py gets that Config as
flags (every setting in force) and TRAIN_ARGS' run-control flags, nothing else,
and reads no file; the run folder follows from the same Config."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from gpt2 import train
from gpt2.cli.environment import config_path, if_changed, smoke, train_args
from gpt2.cli.presets import DEFAULT_DEFCONFIG
from gpt2.config import kconfig
from gpt2.config.argparser import unknown_flags
from gpt2.config.options import DATA, TRAIN, Config, to_argv
from gpt2.errors import KconfigError, UsageError
from gpt2.matrix.plan import plan_from_dotconfig
from gpt2.run_folder import RunDir


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


def load_existing(complete: bool) -> kconfig.LoadedConfig:
    """The configuration file, loaded strictly: once per target, which passes it on.
    Its values across fields are checked where they are resolved (single_run,
    matrix_plan), or by check()."""
    return kconfig.load(existing_config(), complete=complete)


def check(loaded) -> None:
    """Floats and cross-field rules; for a matrix, every cell's configuration."""
    if kconfig.to_matrix(loaded) is None:
        kconfig.to_config(loaded)
    else:
        matrix_plan(loaded, [])


def matrix_plan(loaded, extra: list[str]):
    return plan_from_dotconfig(loaded, extra, adjust=smoke())


def is_matrix(loaded) -> bool:
    return kconfig.to_matrix(loaded) is not None


@dataclass(frozen=True)
class SingleRun:
    """A single-run .config resolved once: the Config train.py trains (.config, then
    SMOKE, then TRAIN_ARGS), the flags that carry it (every setting in force), the
    run-control flags TRAIN_ARGS gave (--stop-at-step ...), and its run folder."""
    cfg: Config
    active: list[str]
    flags: list[str]
    control: list[str]
    run: RunDir

    def argv(self) -> list[str]:
        """train.py's arguments: the settings, then run control, then IF_CHANGED."""
        policy = [f"--if-changed={if_changed()}"] if os.environ.get("IF_CHANGED") else []
        return [*self.flags, *self.control, *policy]


def single_run(loaded) -> SingleRun:
    """The single run ``loaded`` describes, with SMOKE and TRAIN_ARGS applied: parsed
    by train.py's own parser, resolved into one checked Config."""
    given = train_args()
    parser = train.build_parser()
    parser.exit_on_error = False  # (a bad value is this target's one-line error)
    try:
        args, unknown = parser.parse_known_args(given)
    except argparse.ArgumentError as e:
        raise UsageError(f"TRAIN_ARGS: {e}") from None
    if unknown:
        raise UsageError(f"TRAIN_ARGS: unrecognized arguments: {unknown_flags(parser, unknown)}")
    if args.dotconfig:
        raise UsageError("TRAIN_ARGS --dotconfig: make trains the file KCONFIG_CONFIG names "
                         f"({config_path()}); name another with KCONFIG_CONFIG=")
    # (every setting, the data preparation's too: `make` and `make data` take it from here)
    cfg, _ = kconfig.to_config_with(loaded, None, train.settings_given(args), adjust=smoke(),
                                    source="TRAIN_ARGS")
    _, active = kconfig.to_values(loaded)
    return SingleRun(cfg, active, to_argv(cfg, TRAIN), train.control_argv(args),
                     RunDir(cfg, args.run_dir))


def data_config(loaded):
    """What `make data` prepares: for a matrix, the data every cell shares."""
    if kconfig.to_matrix(loaded) is None:
        return kconfig.to_config(loaded)
    _, active = kconfig.to_values(loaded)
    return matrix_plan(loaded, train_args()).cells[0].cfg, active


def one_run() -> tuple:
    """(Config, train.py flags) of what the per-run tools (bench, resume-check) act on:
    the single run .config describes, or the matrix cell CELL= names."""
    loaded = load_existing(complete=True)
    if kconfig.to_matrix(loaded) is None:
        run = single_run(loaded)
        return run.cfg, run.flags
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


def data_argv(cfg, active: list[str]) -> list[str]:
    return to_argv(cfg, DATA, active)


def check_hardware(cfg) -> None:
    """Stop before any work if the config asks for a device this machine lacks."""
    # (imported here: asking the device means importing torch, which a target that
    # has nothing to do, such as `make` on a finished run, never needs)
    from gpt2.runtime.device import check_dtype, resolve_device

    check_dtype(resolve_device(cfg.device), cfg.dtype)
