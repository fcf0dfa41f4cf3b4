"""Typed settings of the Slurm menu (kconfig/slurm.kconfig) and their checks.

They become ``#SBATCH`` lines of the scripts kgpt writes (gpt2/slurm/script.py),
for the cells of a matrix whose backend is Slurm and for a single run submitted
with ``make SLURM=1``. A value is checked here, where .config is read, and again
as it is typed in menuconfig (kconfig.value_problem): sbatch reads the lines of a
script itself, so a value with a newline, a quote or a space could add a directive
or split one. Nothing here ever reaches a shell.

CONFIG_SLURM_EXTRA_OPTIONS is an allowlist (ALLOWED): each option is judged by the
full name sbatch expands it to (sbatch takes any unique prefix, "--jo" for
--job-name), its value by a pattern of its own, and it is written under that full
name. Options that set the job's environment, interpreter or user are refused: a
.config is data and never decides what code runs on the cluster.
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
_OPTION = re.compile(r"--([a-z][a-z0-9-]*)(?:=(.*))?", re.S)

# Every long option sbatch knows (22.05 and the current release together): the options
# of Slurm's option table (src/common/slurm_opt.c) that sbatch takes. sbatch reads an
# option given as any unique prefix of its name ("--outp" is --output), in #SBATCH
# lines too, so an option is judged by the name it expands to, never by what was
# typed; and the script gets the full name.
SBATCH_OPTIONS = frozenset("""
account acctg-freq array autocomplete batch bb bbf begin chdir cluster cluster-constraint
clusters comment consolidate-segments constraint container container-id context contiguous
core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot
dependency distribution error exclude exclusive export export-file external extra
extra-node-info get-user-env gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket
gpus-per-task gres gres-flags help hint hold ignore-pbs input job-name kill-on-invalid-dep
licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mem-update
mincpus network nice no-kill no-requeue nodefile nodelist nodes ntasks ntasks-per-core
ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres oom-kill-step open-mode
output overcommit oversubscribe parsable partition power prefer priority profile propagate
qos quiet reboot requeue reservation resources resv-ports runtime segment signal
sockets-per-node spread-job spread-segments stepmgr switches tasks-per-node test-only
thread-spec threads-per-core time time-min tmp tres-bind tres-per-task uid usage
use-min-nodes verbose version wait wait-all-nodes wckey wrap""".split())


@dataclass(frozen=True)
class Allowed:
    """An sbatch option a user may add: whether it takes a value ("none",
    "required", "optional") and, if so, what the value must look like."""

    takes: str
    pattern: str = ""
    example: str = ""

    def problem(self, name: str, value: str | None) -> str | None:
        if value is None:
            return (f"--{name} needs a value, e.g. --{name}={self.example}"
                    if self.takes == "required" else None)
        if self.takes == "none":
            return f"--{name} takes no value"
        if not re.fullmatch(self.pattern, value):
            return f"--{name}={value}: not a value of --{name} kgpt passes on (e.g. {self.example})"
        return None


_WORD = r"[A-Za-z0-9_.+-]+"
_HOSTS = r"[A-Za-z0-9_.,\[\]-]+"  # a Slurm hostlist: gpu[01-04],cn7
_FEATURES = r"[A-Za-z0-9_.,:&|!*\[\]()-]+"  # a feature expression: a100&ib, [r1|r2]*2


def _words(*words: str) -> str:
    """A comma list of ``words``, matched case-insensitively as sbatch does."""
    one = "(?i:" + "|".join(words) + ")"
    return f"{one}(,{one})*"


# The sbatch options a .config may add (CONFIG_SLURM_EXTRA_OPTIONS): what users of a
# cluster need to place and account a job. Anything else is refused: an allowlist,
# because an option's effect is open-ended (--export=BASH_ENV=... runs a file of the
# user's as the job starts) and sbatch accepts abbreviations of them all.
ALLOWED = {
    "constraint": Allowed("required", _FEATURES, "a100"),
    "prefer": Allowed("required", _FEATURES, "a100"),
    "exclusive": Allowed("optional", "user|mcs|topo", "user"),
    "gres": Allowed("required", rf"{_WORD}(:{_WORD})*(,{_WORD}(:{_WORD})*)*", "nvme:1"),
    "nodelist": Allowed("required", _HOSTS, "gpu[01-04]"),
    "exclude": Allowed("required", _HOSTS, "gpu07"),
    "reservation": Allowed("required", r"[A-Za-z0-9_.,+-]+", "maint-window"),
    "licenses": Allowed("required", r"[A-Za-z0-9_.@-]+(:[0-9]+)?([,|][A-Za-z0-9_.@-]+(:[0-9]+)?)*",
                        "scratch:1"),
    "mail-type": Allowed("required", _words(
        "NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT",
        "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS"),
        "END,FAIL"),
    "mail-user": Allowed("required", r"[A-Za-z0-9_.+-]+(@[A-Za-z0-9.-]+)?", "me@example.org"),
    "comment": Allowed("required", r"[A-Za-z0-9_.,:/=@%+-]+", "ablation-3"),
    "wckey": Allowed("required", r"[A-Za-z0-9_.+-]+", "project-x"),
    "nice": Allowed("optional", r"[0-9]+", "100"),
    "hint": Allowed("required", _words("compute_bound", "memory_bound", "multithread",
                                       "nomultithread"), "nomultithread"),
    "threads-per-core": Allowed("required", r"[1-9][0-9]*", "1"),
    "tmp": Allowed("required", r"[1-9][0-9]*[KMGT]?", "100G"),
    "switches": Allowed("required", r"[1-9][0-9]*(@[0-9:-]+)?", "1@10:00"),
    "profile": Allowed("required", _words("all", "none", "energy", "lustre", "network",
                                          "task"), "task"),
    "wait-all-nodes": Allowed("required", "[01]", "1"),
    "hold": Allowed("none"),  # submitted held: `scontrol release` starts it
    "oversubscribe": Allowed("none"),
    "contiguous": Allowed("none"),
    "spread-job": Allowed("none"),
}

# Options that set what runs or who runs it: the job's environment (which kgpt's
# scripts inherit from the shell that submits them, as sbatch does by default), its
# interpreter or user. A .config is data: it must never change what runs on a cluster.
ENVIRONMENT = {
    "export": "sets the job's environment (BASH_ENV, LD_PRELOAD or PYTHONPATH would run "
              "code of the .config's choosing); jobs get the environment of the shell "
              "that runs make",
    "export-file": "sets the job's environment from a file",
    "get-user-env": "loads the job's environment from a login shell",
    "propagate": "sets the job's resource limits from the submitting shell",
    "container": "runs the job in a container of the .config's choosing",
    "container-id": "runs the job in a container of the .config's choosing",
    "uid": "runs the job as another user",
    "gid": "runs the job as another group",
    "bb": "stages files in and out with a burst-buffer script",
    "bbf": "stages files in and out with a burst-buffer script",
}

# Options kgpt writes itself: given again as extra options they would contradict
# the script's own (an --output elsewhere loses the cell logs, a --signal without
# B: never reaches the cell, an --array renumbers the cells). The settings that
# have their own symbol are named with it.
OWN_OPTIONS = {
    "array": "kgpt makes one array task per unfinished cell",
    "output": "each cell logs into its own folder",
    "error": "each cell logs into its own folder",
    "input": "jobs read nothing",
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
    "gpus": f"set {GPUS}",
    "gpus-per-node": f"set {GPUS}",
    "cpus-per-task": f"set {CPUS}",
    "mem": f"set {MEM}",
    "nodes": f"set {NODES}",
    "ntasks-per-node": "kgpt starts one launcher per node",
    "cluster": "kgpt follows its jobs on this cluster",
    "clusters": "kgpt follows its jobs on this cluster",
}


def expand_option(typed: str) -> str:
    """The sbatch option ``typed`` (a long option's name, without --) stands for: its
    full name when it is one, or the one option it is a prefix of (sbatch's rule);
    raises ValueError when it is no option, or the prefix of several."""
    if typed in SBATCH_OPTIONS:
        return typed
    matches = sorted(o for o in SBATCH_OPTIONS if o.startswith(typed))
    if not matches:
        raise ValueError(f"--{typed}: not an sbatch option")
    if len(matches) > 1:
        raise ValueError(f"--{typed}: sbatch reads it as one of --{', --'.join(matches[:6])}"
                         f"{', ...' if len(matches) > 6 else ''}: write the option in full")
    return matches[0]


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
    m = re.fullmatch(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?", text)
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
    """ "--constraint=a100 --excl" -> ("--constraint=a100", "--exclusive"): long options
    separated by spaces, each written as one #SBATCH line under its full name. Only
    the options of ALLOWED pass, each with a value of its own form; raises ValueError
    saying what is wrong."""
    out: list[str] = []
    seen: set[str] = set()
    for item in text.split():
        m = _OPTION.fullmatch(item)
        if not m:
            raise ValueError(f"{item!r}: write sbatch's long options, --name or --name=value, "
                             "separated by spaces (\"--constraint=a100 --exclusive\")")
        typed, value = m.groups()
        name = expand_option(typed)
        shown = f"--{typed}" + (f" (sbatch's --{name})" if typed != name else "")
        if name in OWN_OPTIONS:
            raise ValueError(f"{shown}: kgpt sets it ({OWN_OPTIONS[name]})")
        if name in ENVIRONMENT:
            raise ValueError(f"{shown}: refused, it {ENVIRONMENT[name]}. A .config never "
                             "changes what runs on the cluster")
        if name not in ALLOWED:
            raise ValueError(f"{shown}: not one of the sbatch options kgpt passes on: "
                             f"--{', --'.join(sorted(ALLOWED))}")
        problem = ALLOWED[name].problem(name, value)
        if name == "gres" and not problem and any(
                g.split(":")[0].lower() == "gpu" for g in value.split(",")):
            problem = (f"--gres={value}: set the GPUs with {GPUS} (and their model with "
                       "--constraint); --gres is for other resources, e.g. --gres=nvme:1")
        if problem:
            raise ValueError(problem)
        if name in seen:
            raise ValueError(f"--{name} is given twice: give it once")
        seen.add(name)
        out.append(f"--{name}" + (f"={value}" if value is not None else ""))
    return tuple(out)


# The string symbols' checks, for the loader and the configuration tools.
PARSERS = {PARTITION: parse_name, ACCOUNT: parse_name, QOS: parse_name,
           TIME_LIMIT: parse_time_limit, MEM: parse_mem, EXTRA_OPTIONS: parse_extra_options}
