"""One training run as one Slurm job: ``make SLURM=1`` (or ``make train SLURM=1``).

The job is named after the run's folder (``kgpt-<run name>-<config hash>``), so a
second submission of the same configuration while the first is queued or running
submits nothing. Its script and output go to ``<results>/slurm/``; the run itself
writes its folder as it would here, and resumes it the same way.

Processes: one node and one process trains directly. More processes (GPUs) per
node, or several nodes, start one kgpt launcher per node with ``srun`` (``python -m
gpt2.slurm.task node``), which runs torchrun with its rendezvous taken from Slurm's
environment: the first node of the allocation hosts it, the job id names it
(torchrun's c10d rendezvous; docs/distributed.md).
"""

from __future__ import annotations

import time
from pathlib import Path

from gpt2.config.slurm import SlurmSettings
from gpt2.slurm import commands, script
from gpt2.storage import write_text_atomic

SLURM_DIR = "slurm"


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


def queued(run_folder: str) -> list[commands.Task]:
    """The jobs of this run that are queued or running."""
    name = job_name(run_folder)
    out = commands.run(["squeue", "--noheader", f"--name={name}", "--format=%i|%K|%T|%r"])
    tasks = []
    for line in out.splitlines():
        job, _, state, reason = (line.strip().split("|") + ["", "", "", ""])[:4]
        if job and state in commands.WAITING | commands.RUNNING:
            tasks.append(commands.Task(job, None, state, reason))
    return tasks


def submit(results: Path, run_folder: str, text: str) -> tuple[str, Path]:
    """Write the script and submit it; (job id, script path)."""
    path = script_path(results, run_folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
    return commands.submit(path), path
