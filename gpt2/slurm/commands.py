"""Slurm's own command-line tools, called with argument lists and read back.

Only what kgpt needs: submit a script (sbatch --parsable), list the tasks of its jobs
that Slurm still knows (squeue), cancel or signal them (scancel) and requeue one
(scontrol). There is no accounting database on many clusters (nor on the local test
cluster), so nothing here uses sacct: what happened to a finished task is read from
the files the task left (gpt2/slurm/task.py).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpt2.errors import SlurmError

TIMEOUT_S = 60
# squeue's states of a job that will still run, or is running (the others are gone,
# or about to be: COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED, ...).
WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "RESV_DEL_HOLD",
           "CONFIGURING", "STAGE_OUT", "SIGNALING", "RESIZING", "SPECIAL_EXIT"}
RUNNING = {"RUNNING", "COMPLETING"}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SlurmError(f"Slurm's `{name}` is not on PATH: run this on a machine of the "
                         "cluster (a login node), or choose the local backend "
                         "(CONFIG_MATRIX_BACKEND_LOCAL). To try kgpt's Slurm support on this "
                         "machine: `python -m scripts.slurm_cluster start` (docs/matrix.md)")
    return path


def run(argv: list[str]) -> str:
    """Run one Slurm command; its standard output, or SlurmError with its message."""
    try:
        done = subprocess.run([_tool(argv[0]), *argv[1:]], capture_output=True, text=True,
                              timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(argv)}` did not answer in {TIMEOUT_S} s: is the "
                         "controller (slurmctld) up? `sinfo` tells") from None
    if done.returncode:
        said = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise SlurmError(f"`{' '.join(argv)}` failed: {said}")
    return done.stdout


def submit(script: Path, options: list[str] = ()) -> str:
    """sbatch ``options`` ``script``; the job id Slurm gave it."""
    out = run(["sbatch", "--parsable", *options, str(script)]).strip()
    job = out.split(";")[0]  # "id;cluster" on a federation
    if not job.isdigit():
        raise SlurmError(f"sbatch answered {out!r}, not a job id")
    return job


@dataclass(frozen=True)
class Task:
    """One line of squeue: a job, or one task of a job array."""

    job: str  # the array's job id (%F), or the job's own
    index: int | None  # array task id (%K), None for a plain job
    state: str  # PENDING, RUNNING, ...
    reason: str  # why it is pending ("Priority", "BeginTime", ...), "None" when running

    @property
    def id(self) -> str:
        return self.job if self.index is None else f"{self.job}_{self.index}"


def queued(jobs: set[str], scripts: set[Path]) -> list[Task]:
    """The tasks of the jobs ``jobs`` (job ids kgpt recorded when it submitted them;
    an array's id covers its tasks) that Slurm still lists and that are kgpt's: this
    user's, running one of ``scripts`` (the sbatch scripts kgpt wrote for them). Jobs
    are found by id, never by name (a name is anyone's to give: another user's job,
    or one renamed with scontrol, would be taken for kgpt's), and an id is believed
    only with its user and script: one reused after the controller forgot its jobs,
    or written into a record by someone else, is left alone (never cancelled). A
    finished task leaves the list soon after it ends (the cluster's MinJobAge); one
    about to start again after a requeue is listed as PENDING."""
    if not jobs:
        return []
    try:
        out = run(["squeue", "--noheader", "--array", f"--jobs={','.join(sorted(jobs))}",
                   "--format=%F|%K|%T|%r|%u|%o"])
    except SlurmError as e:
        # squeue refuses a list whose one job it no longer knows (with several,
        # it lists the ones it knows): that job has ended.
        if "Invalid job id specified" in str(e):
            return []
        raise
    me = pwd.getpwuid(os.getuid()).pw_name
    mine = {str(s) for s in scripts}
    tasks = []
    for line in out.splitlines():
        parts = line.strip().split("|", 5)  # (the script's path is last: it may hold a |)
        if len(parts) != 6 or parts[0] not in jobs:
            continue
        job, index, state, reason, user, command = parts
        if user != me or command not in mine:
            continue
        tasks.append(Task(job, int(index) if index.isdigit() else None, state, reason))
    return tasks


def cancel(jobs: list[str], *extra: str) -> None:
    if jobs:
        run(["scancel", *extra, *jobs])


def requeue(job: str) -> None:
    """Put a job (an array task's own job id) back in the queue: Slurm ends this
    allocation and starts the job again later, with SLURM_RESTART_COUNT one higher."""
    run(["scontrol", "requeue", job])
