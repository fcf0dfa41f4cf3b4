"""The make variables a target reads. make passes its command-line variables
through the environment, as typed (the Makefile never expands them):

    KCONFIG_CONFIG  configuration file (default .config, the kconfiglib convention)
    TRAIN_ARGS      extra train.py flags, appended last so they win (every matrix cell)
    NGPU=N          train with N processes: --nproc-per-node=N, before TRAIN_ARGS
    MATRIX_JOBS     matrix cells run at once (overrides CONFIG_MATRIX_JOBS)
    SMOKE=N         the configuration for N steps, its schedule scaled with them
    DRY_RUN=1       print what would run, run nothing
    V=1             print full commands
    IF_CHANGED      refuse (default) | rerun | reuse: what to do with a result made under
                    other code or data (gpt2/training/provenance.py)
    PROMPT, MAX_NEW_TOKENS, TEMPERATURE, TOP_K, NUM_SAMPLES, SEED, RUN   for `generate`
    RUN             the folder `plots`, `report`, `matrix-status` and `matrix-cancel` act on
                    (default results/latest-matrix); the run `export` writes (default
                    results/latest); the runs `compare` shows; the folder `results` pages
    EXPORT_ARGS     gpt2/export.py flags (--out DIR, --keep-padded-vocab)
    DETACH=1        a Slurm matrix: submit, and return without waiting for the cells
    SLURM=1         `make`/`make train`: submit the run to Slurm instead of training here
    CELL            the matrix cell bench, resume-check, memcheck, generate act on
    CARD            the GPU `memcheck` predicts for: a card (l4, h100, ...) or a size (24GB)
    METHOD, SPARSITY, STRUCTURE, FINETUNE, ONESHOT_ARGS   for `prune-oneshot`

Standard library and gpt2's leaf modules only: `make help` imports this module
with a Python that may have nothing else installed.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
from pathlib import Path
from typing import Callable

from gpt2 import REPO
from gpt2.config import smoke as smoke_test
from gpt2.errors import UsageError
from gpt2.processes import CONTROL, terminal_safe
from gpt2.training.provenance import IF_CHANGED

# Make variables holding flags, split as a shell would split them (nothing expanded).
FLAG_VARS = ("TRAIN_ARGS", "BENCH_ARGS", "TORCHRUN_ARGS", "CHECK_ARGS", "EXPORT_ARGS",
             "ONESHOT_ARGS")


def config_path() -> Path:
    return Path(os.environ.get("KCONFIG_CONFIG") or REPO / ".config")


def verbose() -> bool:
    return os.environ.get("V", "") == "1"


def dry_run() -> bool:
    return os.environ.get("DRY_RUN", "") not in ("", "0")


def split_flags(var: str) -> list[str]:
    text = os.environ.get(var, "")
    bad = CONTROL.search(text) if var == "TORCHRUN_ARGS" else None
    if bad:  # (torchrun prints its flags back in its own errors, past kgpt's output guard)
        raise UsageError(f"{var} holds the control character {terminal_safe(bad.group())}: "
                         "write its flags on one line, in plain text")
    try:
        return shlex.split(text)
    except ValueError as e:
        raise UsageError(f"{var}={text!r}: {str(e).lower()}: close each quote you open "
                         "(a value with spaces goes in quotes: --flag 'a b')") from None


def train_args() -> list[str]:
    """TRAIN_ARGS, after NGPU=N as --nproc-per-node=N (so TRAIN_ARGS still wins)."""
    ngpu = os.environ.get("NGPU", "")
    if ngpu and not (ngpu.isascii() and ngpu.isdigit() and int(ngpu) > 0):
        raise UsageError(f"NGPU={ngpu!r} is not a number of processes: use e.g. NGPU=2 (one "
                         "per GPU), or leave it out for one")
    gpus = [f"--nproc-per-node={int(ngpu)}"] if ngpu else []
    return [*gpus, *split_flags("TRAIN_ARGS")]


def if_changed() -> str:
    """IF_CHANGED: what train.py and the matrix do with results of other code or data."""
    value = os.environ.get("IF_CHANGED", "") or "refuse"
    if value not in IF_CHANGED:
        raise UsageError(f"IF_CHANGED={value!r}: use one of {', '.join(IF_CHANGED)} (what to do "
                         "with a result made under other code or data)")
    return value


def switch(var: str, what: str) -> bool:
    """A 0/1 make variable (DETACH=1, SLURM=1); anything else is refused, so a typo
    never quietly means "off"."""
    value = os.environ.get(var, "")
    if value not in ("", "0", "1"):
        raise UsageError(f"{var}={value!r}: use {var}=1 ({what}) or leave it out")
    return value == "1"


def detach() -> bool:
    return switch("DETACH", "submit the matrix's cells to Slurm and return at once")


def slurm() -> bool:
    return switch("SLURM", "submit the run to Slurm with the Slurm menu's settings")


@functools.lru_cache(maxsize=None)
def say_once(text: str) -> None:
    """``text`` to stderr, the first time only: a command may shorten its
    configuration more than once (the run, then its data), and says so once."""
    print(text, file=sys.stderr, flush=True)


def smoke() -> Callable[[dict], dict] | None:
    """SMOKE=N: a function shortening the configuration to N steps, schedule scaled
    with it (gpt2/config/smoke.py), which says once what it changed; else None."""
    text = os.environ.get("SMOKE", "")
    if not text:
        return None
    try:
        steps = smoke_test.parse_steps(text)
    except ValueError as e:
        raise UsageError(str(e)) from None

    def adjust(values: dict) -> dict:
        out, notes = smoke_test.shrink(values, steps)
        say_once(f"  SMOKE   {steps} steps, the schedule scaled with them: " + ", ".join(notes))
        return out

    return adjust
