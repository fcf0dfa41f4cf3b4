"""The make bridge: ``make <target>`` runs ``python -m gpt2.cli <target>``.

It reads .config strictly (gpt2/config/kconfig.py), turns the typed configuration
into argument lists, and starts the entry points with a list of arguments
(children.py): no shell ever sees a configuration value, so a string such as
``$(shell rm -rf ~)`` or ``"; reboot`` reaches train.py as plain text.

Modules, by what they hold:

- ``__init__``         the table of make targets (TARGETS) and ``main``
- ``help``             `make help`, written from TARGETS
- ``environment``      the make variables a target reads (KCONFIG_CONFIG, DRY_RUN, ...)
- ``presets``          the defconfigs/ presets: names and descriptions
- ``children``         ``run_child``: the one way a target starts an entry point
- ``dotconfig``        .config loaded and checked, and turned into entry-point flags
- ``config_tools``     defconfig, menuconfig, oldconfig, setconfig, savedefconfig, ...
- ``run_commands``     all, data, train, smoke, extend, bench, resume-check, memcheck,
                       generate, eval-hellaswag
- ``matrix_commands``  test-matrix, plots, report, matrix-status, matrix-cancel
- ``results_commands`` compare, results, tensorboard, export

`make help` runs with the system python3, before the virtual environment exists:
this module, help, environment and presets import only the standard library and
gpt2's light modules. A target's own module, which needs torch, is imported when
that target runs.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Callable

from gpt2 import processes
from gpt2.cli.environment import FLAG_VARS, detach, slurm, split_flags
from gpt2.cli.presets import DEFAULT_DEFCONFIG
from gpt2.errors import (CollectError, ConfigError, DataError, KconfigError, MatrixError,
                         PlanError, ResultsError, SlurmError, StorageError, UsageError)

# The sections of `make help`, in order: name -> heading.
CONFIGURATION, RUNNING, RESULTS, MATRIX, TESTING, CLEANING = (
    "Configuration", "Running", "Results", "Test matrix", "Testing and benchmarks", "Cleaning")
SECTIONS = {
    CONFIGURATION: "Configuration (the tools drop, and list, settings Kconfig no longer takes)",
    RUNNING: "Running (from .config)",
    RESULTS: "Looking at results (nothing is trained)",
    MATRIX: "Test matrix (CONFIG_MATRIX=y; `make` runs it too)",
    TESTING: "Testing and benchmarks",
    CLEANING: "Cleaning",
}

# What plain `make` runs (the Makefile's .DEFAULT_GOAL).
DEFAULT_TARGET = "all"


@dataclass(frozen=True)
class Target:
    """A make target. ``run``: the function under gpt2.cli that runs it, as
    "module.function" (imported only when it runs: `make help` has no torch), or
    None when the Makefile's recipe is all there is to it. ``help``: its lines in
    `make help`, under ``section`` (None: not listed)."""
    name: str
    run: str | None
    section: str | None
    help: str = ""

    def function(self) -> Callable[..., int]:
        module, _, name = self.run.rpartition(".")
        return getattr(importlib.import_module(f"{__name__}.{module}"), name)


TARGETS = (
    Target("defconfig-<name>", "config_tools.cmd_defconfig", CONFIGURATION,
           "write .config from defconfigs/<name> (list below)"),
    Target("defconfig", "config_tools.cmd_defconfig", CONFIGURATION,
           f"the same from the default preset, {DEFAULT_DEFCONFIG}"),
    Target("menuconfig", "config_tools.cmd_menuconfig", CONFIGURATION,
           "edit .config in a terminal menu"),
    Target("guiconfig", "config_tools.cmd_guiconfig", CONFIGURATION,
           "the same in a window (needs Python's tkinter and a display)"),
    Target("setconfig", "config_tools.cmd_setconfig", CONFIGURATION,
           'scripted edits: SET="LEARNING_RATE=1e-3 MAX_ITERS=500 OPTIMIZER=muon"'),
    Target("oldconfig", "config_tools.cmd_oldconfig", CONFIGURATION,
           "update .config, asking for each new setting"),
    Target("olddefconfig", "config_tools.cmd_olddefconfig", CONFIGURATION,
           "update .config, new settings take their defaults"),
    Target("listnewconfig", "config_tools.cmd_listnewconfig", CONFIGURATION,
           "list settings .config does not have yet"),
    Target("savedefconfig", "config_tools.cmd_savedefconfig", CONFIGURATION,
           "write the minimal form of .config to ./defconfig"),

    Target("all", "run_commands.cmd_all", RUNNING,
           "prepare the data, then train (resumes an unfinished run)"),
    Target("data", "run_commands.cmd_data", RUNNING,
           "tokenize the dataset into data/<dataset>/"),
    Target("train", "run_commands.cmd_train", RUNNING,
           "train only"),
    Target("smoke", "run_commands.cmd_smoke", RUNNING,
           "the configuration (run or matrix) for SMOKE=N steps (default 20), its\n"
           "warmup, evaluation, checkpoint and pruning schedule scaled to fit;\n"
           "named <run name>-smoke. SMOKE=N works on all, train and test-matrix too"),
    Target("extend", "run_commands.cmd_extend", RUNNING,
           "train a finished run on to more steps, as a new run that records it:\n"
           "RUN=results/<run> TRAIN_ARGS=--max-iters=N (its settings, its whole\n"
           "state; the schedules keep the run's length, docs/results.md)"),
    Target("generate", "run_commands.cmd_generate", RUNNING,
           'sample from the latest run: PROMPT="..." TEMPERATURE= TOP_K=\n'
           "MAX_NEW_TOKENS= NUM_SAMPLES= RUN=results/<run>"),
    Target("eval-hellaswag", "run_commands.cmd_eval_hellaswag", RUNNING,
           "HellaSwag acc/acc_norm of the latest run (RUN=) or of INIT_FROM=gpt2,\n"
           "EXAMPLES=N for the first N"),

    Target("prune-oneshot", "run_commands.cmd_prune_oneshot", RUNNING,
           "prune the latest run (RUN=) once and score it: METHOD=magnitude|wanda|\n"
           "sparsegpt SPARSITY=0.5 or STRUCTURE=2:4, calibrated on its training\n"
           "split (ONESHOT_ARGS=\"--calibration-samples N\"), FINETUNE=steps of\n"
           "training after, masks held; into <run>/oneshot/"),

    Target("compare", "results_commands.cmd_compare", RESULTS,
           'runs side by side: RUN="results/a results/b" (folders, matrix folders,\n'
           "globs); the settings that differ, the figures, loss curves against\n"
           "step, tokens and wall time, into <results>/compare-<hash>/"),
    Target("results", "results_commands.cmd_results", RESULTS,
           "write the HTML pages: results/index.html (every run and matrix), a\n"
           "page per run (run.html) and per matrix (report.html); RUN=<a results\n"
           "folder, run or matrix> for its pages only"),
    Target("tensorboard", "results_commands.cmd_tensorboard", RESULTS,
           "TensorBoard event files from metrics.jsonl for runs made without the\n"
           "tracker (every run and cell, or RUN=), then: tensorboard --logdir results"),
    Target("export", "results_commands.cmd_export", RESULTS,
           "the newest run (RUN=, CELL=) in Hugging Face format, for transformers'\n"
           "from_pretrained: <run>/hf/; EXPORT_ARGS=\"--out DIR --keep-padded-vocab\""),

    Target("test-matrix", "matrix_commands.cmd_test_matrix", MATRIX,
           "prepare the data, run every planned cell (skips completed ones,\n"
           "resumes interrupted ones, retries failed ones), then collect\n"
           "MATRIX_JOBS=N cells at once; DRY_RUN=1 prints the plan; on Slurm\n"
           "submits the cells as a job array and waits (DETACH=1: returns)"),
    Target("matrix-status", "matrix_commands.cmd_matrix_status", MATRIX,
           "every cell of the newest matrix (or RUN=): completed, running,\n"
           "queued (Slurm), failed, interrupted; its job and val loss"),
    Target("matrix-cancel", "matrix_commands.cmd_matrix_cancel", MATRIX,
           "cancel a Slurm matrix's cells; running ones save a checkpoint first"),
    Target("plots", "matrix_commands.cmd_plots", MATRIX,
           "rebuild summary.csv/json and plots/ of the newest matrix (or RUN=)"),
    Target("report", "matrix_commands.cmd_report", MATRIX,
           "the same plus report.md; neither trains anything"),

    Target("check", None, TESTING,
           "the whole test suite in one session, as CI and README run it\n"
           '(PYTEST_ADDOPTS="-k resume" to pick tests)'),
    Target("test", None, TESTING,
           "the suite but the fault-injection tests"),
    Target("test-fast", None, TESTING,
           "the unit tier: the tests that start no process and train nothing\n"
           "(under 90 s on 2 cores)"),
    Target("test-reliability", None, TESTING,
           "the fault-injection tests: signals, kill -9, damaged files, NaN,\n"
           "out of memory, DDP failures, hostile input (docs/reliability.md)"),
    Target("test-durations", None, TESTING,
           "run the suite and write each test's seconds and tier, sorted, with\n"
           "each tier's total (results/test-durations/<commit>.tsv and .md)"),
    Target("test-mutation", None, TESTING,
           "mutation testing (mutmut) of the config loader, the make bridge, pruning,\n"
           "checkpoints, the matrix plan and the optimizers: a score per module\n"
           'MUTATION_ARGS="--only pruning" (one module; --list names them)'),
    Target("bench", "run_commands.cmd_bench", TESTING,
           "tokens/s, FLOPs per token, TFLOP/s, MFU, peak memory and step-time\n"
           "spread of the configured model; writes JSON to <results>/bench/\n"
           'BENCH_ARGS="--steps 50 --warmup 10"'),
    Target("memcheck", "run_commands.cmd_memcheck", TESTING,
           "predicted peak memory of the configured run, term by term, against\n"
           "the device's free memory, with a verdict and what would fit; CARD=h100\n"
           "(or CARD=24GB) for a GPU this machine does not have"),
    Target("resume-check", "run_commands.cmd_resume_check", TESTING,
           "train the .config straight and stopped+resumed, print the largest\n"
           'difference (0 = exact resume on this machine); CHECK_ARGS="--stop-at N"'),
    Target("bench-optim", None, TESTING,
           "step time and state memory of every optimizer x pruning pair\n"
           'relative to AdamW: BENCH_ARGS="--device cuda --model-size gpt2"'),
    Target("gpu-check", None, TESTING,
           "kgpt's GPU acceptance within GPU_CHECK_MINUTES (default 9): the L4\n"
           "preset through make with resume-check, bench and its speed levers,\n"
           "bench-optim, the 2:4 kernel, shakespeare-char, a 4-cell matrix; tiny\n"
           "shapes without a GPU; into results/gpu-check-<device>-<commit>/"),
    Target("gpu-bundle", None, TESTING,
           "gather what a GPU machine without network lacks (packages, the corpus)\n"
           "into gpu-bundle/; carry it there and run make PYTHON=python3 gpu-check\n"
           "(docs/performance.md)"),
    Target("bench-noop", None, TESTING,
           "CPU seconds of `make` on the finished run and `make data` on its\n"
           "prepared data, and whether either imported torch"),
    Target("kconfig-sync", None, TESTING,
           "rewrite the default and range lines of kconfig/*.kconfig from Config,\n"
           "which owns them (tests/config/test_registry.py fails with the diff first)"),

    Target("clean", None, CLEANING,
           "remove caches and build leftovers (keeps .config, data, results)"),
    Target("mrproper", None, CLEANING,
           "clean + remove .config and the .venv"),
    Target("distclean", None, CLEANING,
           "mrproper + remove data/"),

    Target("help", "help.cmd_help", None),
)

# What `python -m gpt2.cli NAME` runs; `make defconfig-<name>` runs `defconfig NAME`.
RUNNABLE = {t.name: t for t in TARGETS if t.run and "<" not in t.name}
NAMED_DEFCONFIG = next(t for t in TARGETS if t.name == "defconfig-<name>")
USAGE = f"usage: python -m gpt2.cli {{defconfig NAME|{'|'.join(RUNNABLE)}}}"


def fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def find(argv: list[str]) -> tuple[Target, list[str]] | None:
    """The target ``argv`` names and the arguments its function takes; None if none."""
    if len(argv) == 2 and argv[0] == "defconfig":
        return NAMED_DEFCONFIG, argv[1:]
    if len(argv) == 1 and argv[0] in RUNNABLE:
        return RUNNABLE[argv[0]], []
    return None


def main(argv: list[str]) -> int:
    found = find(argv)
    if found is None:
        return fail(USAGE)
    target, args = found
    if target.name == "help":
        return target.function()(*args)
    # What runs from here may outlive the terminal (a hangup stops it with a
    # checkpoint): printing to a closed terminal must not crash us meanwhile.
    processes.survive_lost_terminal()
    try:
        for var in FLAG_VARS:
            split_flags(var)  # a stray quote is refused here, before anything runs
        detach(), slurm()  # as is a switch that is neither 0 nor 1
        return target.function()(*args)
    except KconfigError as e:
        return fail("invalid configuration:\n  " + "\n  ".join(e.problems))
    except PlanError as e:
        return fail("invalid test matrix:\n  " + str(e).replace("\n", "\n  "))
    except (ConfigError, DataError, UsageError, MatrixError, CollectError, StorageError,
            SlurmError, ResultsError) as e:
        return fail(str(e))
