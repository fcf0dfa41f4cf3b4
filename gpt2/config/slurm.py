"""Typed settings of the Slurm menu (kconfig/slurm.kconfig) and their checks.

They become ``#SBATCH`` lines of the scripts kgpt writes (gpt2/slurm/script.py),
for the cells of a matrix whose backend is Slurm and for a single run submitted
with ``make SLURM=1``. A value is checked here, where .config is read, and again
as it is typed in menuconfig (kconfig.value_problem): sbatch reads the lines of a
script itself, so a value with a newline, a quote or a space could add a directive
or split one. Nothing here ever reaches a shell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PARTITION = "SLURM_PARTITION"
ACCOUNT = "SLURM_ACCOUNT"
QOS = "SLURM_QOS"
TIME_LIMIT = "SLURM_TIME_LIMIT"
SIGNAL_MARGIN = "SLURM_SIGNAL_MARGIN"
GPUS = "SLURM_GPUS"
CPUS = "SLURM_CPUS"
MEM = "SLURM_MEM"
MAX_RUNNING = "SLURM_MAX_RUNNING"
NODES = "SLURM_NODES"
EXTRA_OPTIONS = "SLURM_EXTRA_OPTIONS"
# Every symbol of the Slurm menu, in menu order (kconfig.to_slurm reads each; the
# tests check that each one reaches the settings).
SYMBOLS = (PARTITION, ACCOUNT, QOS, TIME_LIMIT, SIGNAL_MARGIN, GPUS, CPUS, MEM, MAX_RUNNING,
           NODES, EXTRA_OPTIONS)
BACKEND_LOCAL, BACKEND_SLURM = "local", "slurm"
BACKENDS = (BACKEND_LOCAL, BACKEND_SLURM)

# Partition, account and QOS names (a partition and a QOS may be comma lists).
_NAME = re.compile(r"[A-Za-z0-9_.,+-]*")
# One value of an extra option: no space, quote, $, backquote, backslash or control
# character, so a #SBATCH line says exactly one thing however it is parsed.
_VALUE = re.compile(r"[A-Za-z0-9_.,:/=@%+-]+")
_OPTION = re.compile(r"--([a-z][a-z0-9-]*)(?:=(.*))?", re.S)

# Options kgpt writes itself: given again as extra options they would contradict
# the script's own (an --output elsewhere loses the cell logs, a --signal without
# B: never reaches the cell, an --array renumbers the cells). The settings that
# have their own symbol are named with it.
OWN_OPTIONS = {
    "array": "kgpt makes one array task per unfinished cell",
    "output": "each cell logs into its own folder",
    "error": "each cell logs into its own folder",
    "open-mode": "logs are appended across requeues",
    "job-name": "kgpt names the job after the matrix or run",
    "signal": f"set the margin with {SIGNAL_MARGIN}",
    "requeue": "cells requeue themselves at their time limit",
    "no-requeue": "cells requeue themselves at their time limit",
    "dependency": "kgpt sets the report job's dependency",
    "parsable": "kgpt reads sbatch's answer itself",
    "wrap": "kgpt writes the script",
    "chdir": "jobs run in this checkout",
    "wait": "`make test-matrix` waits by itself (DETACH=1 returns at once)",
    "partition": f"set {PARTITION}",
    "account": f"set {ACCOUNT}",
    "qos": f"set {QOS}",
    "time": f"set {TIME_LIMIT}",
    "gres": f"set {GPUS}",
    "gpus": f"set {GPUS}",
    "gpus-per-node": f"set {GPUS}",
    "cpus-per-task": f"set {CPUS}",
    "mem": f"set {MEM}",
    "nodes": f"set {NODES}",
    "ntasks-per-node": "kgpt starts one launcher per node",
}


@dataclass(frozen=True)
class SlurmSettings:
    """What every job kgpt submits asks Slurm for. Empty strings and zeros leave
    the choice to the cluster (its default partition, account, limit, memory)."""

    partition: str = ""
    account: str = ""
    qos: str = ""
    time_limit: str = ""  # as written, in one of Slurm's formats; "" = the partition's
    signal_margin: int = 300  # seconds before the limit a job is told to checkpoint
    gpus: int = 0  # per cell, or per node of a single run
    cpus: int = 0  # per cell, or per node of a single run
    mem: str = ""  # per node, as sbatch writes it ("32G")
    max_running: int = 0  # cells of one matrix running at once; 0 = no limit
    nodes: int = 1  # single runs only: a matrix cell is one node
    extra_options: tuple[str, ...] = ()  # checked --name[=value] items


def parse_name(text: str) -> str:
    text = text.strip()
    if not _NAME.fullmatch(text):
        raise ValueError(f"{text!r} is not a Slurm name: use letters, digits and _ . , + - "
                         "(empty: the cluster's default)")
    return text


def time_limit_seconds(text: str) -> int:
    """Slurm's time formats ("minutes", "minutes:seconds", "hours:minutes:seconds",
    "days-hours", "days-hours:minutes", "days-hours:minutes:seconds") in seconds;
    raises ValueError saying what is wrong."""
    text = text.strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        raise ValueError(f"{text!r} is not a Slurm time limit: write minutes (\"90\"), "
                         "hours:minutes:seconds (\"4:00:00\") or days-hours (\"2-00\")")
    days, a, b, c = m.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # hours:minutes:seconds
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    else:  # minutes[:seconds]
        seconds = int(a) * 60 + int(b or 0)
    if seconds <= 0:
        raise ValueError(f"{text!r}: a time limit must be longer than 0 (leave it empty for "
                         "the partition's limit)")
    return seconds


def parse_time_limit(text: str) -> str:
    if text.strip():
        time_limit_seconds(text)
    return text.strip()


def parse_mem(text: str) -> str:
    text = text.strip()
    if text and not re.fullmatch(r"[1-9][0-9]*[KMGT]?", text):
        raise ValueError(f"{text!r} is not a memory size: write a whole number with an "
                         "optional unit K, M, G or T (\"32G\"; empty: the cluster's default)")
    return text


def parse_extra_options(text: str) -> tuple[str, ...]:
    """ "--constraint=a100 --exclusive" -> ("--constraint=a100", "--exclusive"): long
    options separated by spaces, each written as one #SBATCH line; raises ValueError
    saying what is wrong."""
    out: list[str] = []
    for item in text.split():
        m = _OPTION.fullmatch(item)
        if not m:
            raise ValueError(f"{item!r}: write sbatch's long options, --name or --name=value, "
                             "separated by spaces (\"--constraint=a100 --exclusive\")")
        name, value = m.groups()
        if name in OWN_OPTIONS:
            raise ValueError(f"--{name}: kgpt sets it ({OWN_OPTIONS[name]})")
        if value is not None and not _VALUE.fullmatch(value):
            raise ValueError(f"{item!r}: a value may hold letters, digits and _ . , : / = @ % "
                             "+ - only (no spaces, quotes or shell characters)")
        out.append(item)
    return tuple(out)


# The string symbols' checks, for the loader and the configuration tools.
PARSERS = {PARTITION: parse_name, ACCOUNT: parse_name, QOS: parse_name,
           TIME_LIMIT: parse_time_limit, MEM: parse_mem, EXTRA_OPTIONS: parse_extra_options}
