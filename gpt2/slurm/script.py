"""The sbatch scripts kgpt writes: one directive per line, readable and re-submittable.

A script says everything about its job (resources, logs, the time-limit signal, the
command) except what changes from one submission to the next, which goes on sbatch's
command line: the matrix's array indices and the report job's dependency. Values in
#SBATCH lines were checked when .config was read (gpt2/config/slurm.py); paths are
checked here, since sbatch splits a directive at a space.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from gpt2 import REPO
from gpt2.config.slurm import SlurmSettings
from gpt2.errors import SlurmError
from gpt2.storage import own_folder, write_text_atomic

# (No %: sbatch expands %j, %x, %u ... in --output paths, so a folder named with one
# would send the job's output elsewhere.)
_PATH = re.compile(r"[A-Za-z0-9_./+@:-]+")
# The signal a job gets before its time limit. B: sends it to the batch script's
# process only (kgpt's task runner), which then stops the training process once.
TIME_SIGNAL = "USR1"
SHEBANG = "#!/bin/bash -p"  # privileged mode: no BASH_ENV, no functions from the environment


def safe_path(path: Path) -> str:
    text = str(path)
    if not _PATH.fullmatch(text):
        raise SlurmError(f"{text}: Slurm cannot take this path in an #SBATCH line (it holds "
                         "a space or another special character); use a checkout and a results "
                         "folder whose paths hold letters, digits and _ . / + @ : - only")
    return text


def resources(s: SlurmSettings, nodes: int = 1) -> list[str]:
    """The directives that ask for resources, from the Slurm menu."""
    lines = [f"--nodes={nodes}", "--ntasks-per-node=1"]
    for option, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos),
                          ("time", s.time_limit), ("mem", s.mem)):
        if value:
            lines.append(f"--{option}={value}")
    if s.cpus:
        lines.append(f"--cpus-per-task={s.cpus}")
    # sbatch keeps only the last --gres line, so the GPUs and a user's other
    # resources (--gres=nvme:1) go into one.
    gres = [f"gpu:{s.gpus}"] if s.gpus else []
    gres += [o.split("=", 1)[1] for o in s.extra_options if o.startswith("--gres=")]
    if gres:
        lines.append(f"--gres={','.join(gres)}")
    return lines + [o for o in s.extra_options if not o.startswith("--gres=")]


def requeueing(s: SlurmSettings) -> list[str]:
    """A job that is told before its limit (--signal), checkpoints, and requeues itself
    (--requeue), appending to its log across allocations (--open-mode)."""
    return [f"--signal=B:{TIME_SIGNAL}@{s.signal_margin}", "--requeue", "--open-mode=append"]


def python() -> str:
    """This Python (the checkout's .venv): the compute nodes must see the same path,
    as they must see the checkout, the data and the results (a shared filesystem)."""
    return safe_path(Path(sys.executable))


def render(about: list[str], directives: list[str], command: list[str]) -> str:
    """An sbatch script: ``about`` as comment lines, the directives, then ``cd`` into
    this checkout and ``exec`` the command (quoted for bash). A script told of its
    time limit ignores that signal until the command listens for it: Slurm sends it
    at a limit check that can come before the time asked for, so with a short limit
    it can come in the job's first moments (0.2 s in, on the test cluster), and its
    default action would end the job there. Ignored, it is lost:
    the job then runs to its limit, where Slurm's SIGTERM has training save a
    checkpoint that the next submission resumes.

    The script runs bash in privileged mode (-p): it reads no file that BASH_ENV or
    ENV names and imports no function from the environment (an exported ``cd``
    function would run in place of the builtin), so nothing but these lines runs
    before the command; sbatch passes the submitting shell's environment to the job
    by default, and options that change it are refused in .config."""
    text = f"{SHEBANG}\n" + "".join(f"# {line}\n" if line else "#\n" for line in about)
    text += "".join(f"#SBATCH {d}\n" for d in directives)
    if any(d.startswith("--signal=") for d in directives):
        text += (f"\n# {TIME_SIGNAL} is ignored until kgpt's task runner listens for it "
                 "(gpt2/slurm/task.py).\n"
                 f"trap '' {TIME_SIGNAL}")
    return text + f"\ncd {shlex.quote(str(REPO))}\nexec {shlex.join(command)}\n"


def write(path: Path, about: list[str], directives: list[str], command: list[str]) -> Path:
    own_folder(path.parent)  # (a link planted as slurm/ is refused, not written through)
    write_text_atomic(path, render(about, directives, command))
    return path
