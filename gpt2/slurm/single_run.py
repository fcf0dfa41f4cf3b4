"""One training run as one Slurm job: ``make SLURM=1`` (or ``make train SLURM=1``).

The job is named after the run's folder (``kgpt-<run name>-<config hash>``) for
people reading squeue. kgpt records the id of every job it submits for a run
(``<results>/slurm/<run folder>.jobs.json``) and asks squeue for those ids, never for
the name (anyone can name a job so), so a second submission of the same
configuration while the first is queued or running submits nothing. Its script and
output go to ``<results>/slurm/``; the run itself writes its folder as it would
here, and resumes it the same way.

Processes: one node and one process trains directly. More processes (GPUs) per
node, or several nodes, start one kgpt launcher per node with ``srun`` (``python -m
gpt2.slurm.task node``), which runs torchrun with its rendezvous taken from Slurm's
environment: the first node of the allocation hosts it, the job id names it
(torchrun's c10d rendezvous; docs/distributed.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Iterator

from gpt2 import processes
from gpt2.config.slurm import SlurmSettings
from gpt2.errors import SlurmError
from gpt2.slurm import commands, script
from gpt2.storage import own_folder, read_json_object, write_text_atomic

SLURM_DIR = "slurm"
LOCK_WAIT_S = 60.0  # another submission of this results folder: a few sbatch calls


def job_name(run_folder: str) -> str:
    return f"kgpt-{run_folder}"


def script_path(results: Path, run_folder: str) -> Path:
    return results / SLURM_DIR / f"{run_folder}.sbatch"


def render_script(results: Path, run_folder: str, flags: list[str], settings: SlurmSettings,
                  nproc: int) -> str:
    """The run's sbatch script (kgpt writes it to script_path)."""
    folder = results / SLURM_DIR
    per_node = ["--per-node"] if settings.nodes > 1 or nproc > 1 else []
    return script.render(
        [f"kgpt run {run_folder}, written by `make SLURM=1` on "
         f"{time.strftime('%Y-%m-%d %H:%M:%S')}.",
         f"{settings.nodes} node(s) x {nproc} process(es); training flags as `make` "
         "would pass them to gpt2/train.py.",
         "Before its time limit the run saves a checkpoint and requeues itself "
         "(gpt2/slurm/task.py)."],
        [f"--job-name={job_name(run_folder)}",
         f"--output={script.safe_path(folder)}/{run_folder}-%j.out",
         *script.resources(settings, nodes=settings.nodes), *script.requeueing(settings)],
        [script.python(), "-m", "gpt2.slurm.task", "run", *per_node, "--", *flags])


def jobs_path(results: Path, run_folder: str) -> Path:
    return results / SLURM_DIR / f"{run_folder}.jobs.json"


def recorded_jobs(results: Path, run_folder: str) -> list[str]:
    """The ids of the jobs kgpt submitted for this run (an unreadable record: none)."""
    jobs = (read_json_object(jobs_path(results, run_folder)) or {}).get("jobs", [])
    return [j for j in jobs if isinstance(j, str) and j.isdigit()] if isinstance(jobs, list) \
        else []


def queued(results: Path, run_folder: str) -> list[commands.Task]:
    """The jobs of this run that are queued or running."""
    return [t for t in commands.queued(set(recorded_jobs(results, run_folder)),
                                       {script_path(results, run_folder)})
            if t.state in commands.WAITING | commands.RUNNING]


@contextlib.contextmanager
def submitting(results: Path) -> Iterator[None]:
    """Hold the lock of ``<results>/slurm/`` while one `make SLURM=1` looks for its
    run's jobs and submits: two at once would each find none and both submit."""
    folder = own_folder(results / SLURM_DIR)
    fd = processes.lock_folder(folder, LOCK_WAIT_S)
    if fd is None:
        raise SlurmError(f"another `make SLURM=1` is submitting from {folder}; wait for it, "
                         "then run this again")
    try:
        yield
    finally:
        os.close(fd)


def submit(results: Path, run_folder: str, text: str) -> tuple[str, Path]:
    """Write the script, submit it and record the job's id; (job id, script path).
    A stop signal waits until the id is recorded, so no job goes unrecorded."""
    path = script_path(results, run_folder)
    own_folder(path.parent)
    write_text_atomic(path, text)
    with processes.stop_signals_deferred():
        job = commands.submit(path)
        jobs = recorded_jobs(results, run_folder) + [job]
        write_text_atomic(jobs_path(results, run_folder), json.dumps({"jobs": jobs}) + "\n")
    return job, path
