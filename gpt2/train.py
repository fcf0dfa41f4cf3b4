"""Train a GPT-2 model: ``python gpt2/train.py --help``.

Usually run by ``make`` (which turns .config into these flags), but a complete
command line on its own. Every flag has a Kconfig symbol of the same name:
``--learning-rate`` is CONFIG_LEARNING_RATE.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run by path (python gpt2/train.py): run as the module instead, `python -m
    # gpt2.train`, so gpt2/ is not first on the import path, where its files would
    # shadow libraries' modules of the same names (evaluate, config, data, ...).
    import os

    os.execv(sys.executable, [sys.executable, "-m", "gpt2.train", *sys.argv[1:]])

import argparse
import functools
import json

from gpt2 import processes
from gpt2.config.argparser import Bounded, StrictArgumentParser, bounded_parser
from gpt2.config import kconfig
from gpt2.config.options import (TRAIN, Config, add_arguments, config_from_namespace, fields, opt,
                                 to_dotconfig)
from gpt2.errors import (EXIT_BAD_INPUT, ConfigError, DataError, KconfigError, ResumeError,
                         RunBusyError, StorageError)
from gpt2.run_folder import RunDir
from gpt2.runtime import launch
from gpt2.training import reporting
from gpt2.training.provenance import IF_CHANGED


STEPS = opt("max_iters").max  # (a step of the run: no run has more)
CONTROL = "run control (not part of the configuration)"  # the flags that are not settings


def build_parser() -> argparse.ArgumentParser:
    parser = StrictArgumentParser(
        prog="gpt2/train.py", description="Train a GPT-2 language model. Re-running the same "
        "configuration resumes it; a finished run prints its summary.")
    add_arguments(parser, TRAIN)
    run = parser.add_argument_group(CONTROL)
    run.add_argument("--dotconfig", metavar="PATH",
                     help="read the configuration from this .config (or defconfig) file; flags "
                     "given as well override it. The run folder records the configuration "
                     "trained: the file itself, or, when flags changed it, its rendering with "
                     "the flags applied")
    run.add_argument("--run-dir", metavar="PATH",
                     help="train in this folder instead of <results-dir>/<run-name>-<hash> "
                     "(the matrix runner gives each cell its own); results/latest is not moved")
    run.add_argument("--stop-at-step", type=Bounded(int, 1, STEPS), metavar="N",
                     help="checkpoint and stop after step N, as if interrupted")
    run.add_argument("--resume-step", type=Bounded(int, 0, STEPS), metavar="N",
                     help="resume from the run's kept checkpoint of step N instead of the "
                     "newest (after a damaged one); newer checkpoints are set aside")
    run.add_argument("--keep-steps", type=_steps, default=(), metavar="N[,N...]",
                     help="also keep the checkpoints of these steps, for shorter runs to "
                     "branch from (<run>/branches/); the matrix runner sets it")
    run.add_argument("--branch-from", metavar="RUN",
                     help="a WSD run only: start from RUN, a longer run of the same "
                     "configuration, at the step this run's cooldown begins (from the "
                     "checkpoint RUN kept there, --keep-steps); the result is the same as "
                     "training from step 0. The matrix runner sets it")
    run.add_argument("--if-changed", choices=IF_CHANGED, default="refuse",
                     help="when the run folder holds a result made under other code or data "
                     "(provenance.json): refuse and say what changed (default), rerun (set the "
                     "old folder aside and train again), or reuse (report or resume it anyway)")
    run.add_argument("--dry-run", action="store_true",
                     help="print the resolved configuration and run folder, then exit")
    return parser


@functools.partial(bounded_parser, low=1, high=STEPS)
def _steps(text: str) -> tuple[int, ...]:
    """ "80,160" -> (80, 160)."""
    try:
        steps = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write step numbers, e.g. 80,160") from None
    if any(s < 1 or s > STEPS for s in steps):
        raise argparse.ArgumentTypeError(f"{text!r}: steps are from 1 to {STEPS:,}")
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    try:
        cfg, dotconfig = configuration(args)
        if args.dry_run:
            print(json.dumps({"run_dir": str(RunDir(cfg, args.run_dir).path),
                              "config": cfg.to_dict()},
                             indent=2))
            return 0
        if args.resume_step is None and not launch.under_torchrun():
            report = reporting.already_complete(cfg, args.run_dir)
            if report:  # nothing to do: said without importing torch
                print(report)
                return 0
        if cfg.nproc_per_node > 1 and not launch.under_torchrun():
            return launch.launch(str(Path(__file__).resolve()), argv, cfg.nproc_per_node,
                                 RunDir(cfg, args.run_dir).path)
        from gpt2.training import trainer  # (torch: only once there is training to do)

        return trainer.train(cfg, dotconfig=dotconfig, stop_at_step=args.stop_at_step,
                             run_dir=args.run_dir, resume_step=args.resume_step,
                             if_changed=args.if_changed, keep_steps=args.keep_steps,
                             branch_from=args.branch_from)
    except (ConfigError, DataError, ResumeError, RunBusyError, StorageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KconfigError as e:
        print("error: invalid configuration:\n  " + "\n  ".join(e.problems), file=sys.stderr)
        return EXIT_BAD_INPUT


def settings_given(args: argparse.Namespace) -> dict:
    """The settings a parsed command line gives (the parser leaves out those it does
    not give, so each is an explicit choice)."""
    return {f.name: getattr(args, f.name) for f in fields(TRAIN) if hasattr(args, f.name)}


def control_argv(args: argparse.Namespace) -> list[str]:
    """The run-control flags a parsed command line gives, written back as arguments:
    what make passes on from TRAIN_ARGS beside the settings it resolved."""
    group = next(g for g in build_parser()._action_groups if g.title == CONTROL)
    out = []
    for action in group._group_actions:
        value, name = getattr(args, action.dest, None), action.option_strings[0]
        if value is None or value == action.default or action.dest == "dotconfig":
            continue
        if isinstance(action, argparse._StoreTrueAction):
            out.append(name)
        elif isinstance(value, tuple):  # --keep-steps
            out.append(f"{name}={','.join(map(str, value))}")
        else:
            out.append(f"{name}={value}")
    return out


def run_of(argv: list[str]) -> RunDir | None:
    """The run folder these train.py flags train in; None when they make no
    configuration (train.py itself says why). For what starts train.py and publishes
    the run's page once it has ended (gpt2/cli, gpt2/slurm/task.py)."""
    try:
        args = build_parser().parse_args(argv)
        return RunDir(configuration(args)[0], args.run_dir)
    except (SystemExit, ConfigError, DataError, KconfigError, ResumeError, StorageError,
            OSError):
        return None


def configuration(args: argparse.Namespace) -> tuple[Config, str | None]:
    """The Config to train, and the .config text the run folder records (None: the
    trainer renders one from the Config)."""
    explicit = settings_given(args)
    if not args.dotconfig and explicit.get("extend_from"):
        from gpt2.training import trained  # (torch: it loads the parent's checkpoint)

        return trained.extension_config(explicit), None  # the parent's settings, extended
    if not args.dotconfig:
        return config_from_namespace(args, TRAIN), None
    # A defconfig is a configuration too: settings it leaves out take their defaults.
    loaded = kconfig.load(args.dotconfig)
    cfg, overridden = kconfig.to_config_with(loaded, TRAIN, explicit)
    if not overridden:
        return cfg, loaded.text
    return cfg, (f"# {args.dotconfig} with command-line flags that change it; this is the "
                 f"configuration trained\n{to_dotconfig(cfg, TRAIN)}")


if __name__ == "__main__":
    processes.survive_lost_terminal()  # a closed terminal must not end (or fail) a run
    sys.exit(main())
