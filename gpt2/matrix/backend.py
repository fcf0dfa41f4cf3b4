"""Where a matrix's cells run: one interface, two backends.

    plan ─▶ backend.check(detached) ─▶ backend.run(...) ─▶ collect (gpt2/matrix/collect.py)
                                        │ local: run the cells here, as they end
                                        │ slurm: submit one job array, then watch it
    backend.views()   every cell's state (make matrix-status)
    backend.cancel()  stop what is queued or running (make matrix-cancel)

``LocalBackend`` runs the cells as processes on this machine (runner.Runner);
``SlurmBackend`` submits them as a job array and watches it (slurm_backend.SlurmMatrix).
The make bridge (gpt2/cli/matrix_commands.py) asks ``backend_for`` and never which one
it got. A third backend is a class with these methods and an entry in BACKENDS, whose
keys are CONFIG_MATRIX_BACKEND's choices (gpt2/config/slurm.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable

from gpt2.config.choices import implemented
from gpt2.config.slurm import BACKEND_LOCAL, BACKEND_SLURM, BACKENDS as BACKEND_NAMES, SlurmSettings
from gpt2.errors import UsageError
from gpt2.matrix.plan import Plan
from gpt2.matrix.runner import Runner
from gpt2.matrix.slurm_backend import CellView, SlurmMatrix, read_jobs


def local_gpus(plan: Plan, jobs: int) -> list[str] | None:
    """One GPU per running cell when cells run side by side on CUDA; None otherwise."""
    if jobs == 1 or not any(c.cfg.device in ("auto", "cuda") for c in plan.cells):
        return None
    import torch  # (slow to import, and only this question needs it)

    if not torch.cuda.is_available():
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = ([v.strip() for v in visible.split(",") if v.strip()] if visible
           else [str(i) for i in range(torch.cuda.device_count())])
    if jobs > len(ids):
        raise UsageError(f"MATRIX_JOBS={jobs} but {len(ids)} GPU(s) are visible: cells would "
                         "share a GPU and their memory figures would mix. Use "
                         f"MATRIX_JOBS={len(ids)} or fewer")
    return ids[:jobs]


class LocalBackend:
    """The cells as processes on this machine, ``jobs`` at a time."""

    runs_here = True  # the cells need this machine's hardware and data

    def __init__(self, folder: Path, *, jobs: int = 1,
                 cell_ended: Callable[[Path], Any] | None = None, **_: Any):
        self.folder, self.jobs, self.cell_ended = folder, jobs, cell_ended

    def check(self, detached: bool) -> None:
        if detached:
            raise UsageError("DETACH=1 submits a matrix to Slurm and returns; this matrix runs "
                             "here (CONFIG_MATRIX_BACKEND_LOCAL). Select Slurm in `make "
                             "menuconfig` (Test matrix -> Where the cells run) or `make "
                             "setconfig SET=MATRIX_BACKEND=slurm`")
        # One cell must not train in two places: here and in a Slurm job array of this
        # folder that is queued or running.
        if not read_jobs(self.folder)["arrays"] or not shutil.which("squeue"):
            return
        waiting = SlurmMatrix(self.folder).tasks()
        if waiting:
            jobs = sorted({t.job for t in waiting.values()})
            raise UsageError(f"{len(waiting)} cells of {self.folder} are queued or running on "
                             f"Slurm (job {', '.join(jobs)}): wait for them (`make "
                             "matrix-status`), or cancel them (`make matrix-cancel`) before "
                             "running the matrix here")

    def describe(self, plan: Plan) -> str:
        return f"  MATRIX  {len(plan.cells)} cells, {self.jobs} at a time"

    def run(self, plan: Plan, command: str, dotconfig: str | None,
            if_changed: str, detached: bool = False) -> int | None:
        return Runner(plan, jobs=self.jobs, command=command, gpus=local_gpus(plan, self.jobs),
                      dotconfig=dotconfig, if_changed=if_changed,
                      cell_ended=self.cell_ended).run()

    def views(self) -> list[CellView]:
        return SlurmMatrix(self.folder).views(ask_slurm=False)

    def cancel(self) -> int:
        return SlurmMatrix(self.folder).cancel()  # (says: a local matrix stops with Ctrl-C)


class SlurmBackend:
    """The cells as one Slurm job array (gpt2/matrix/slurm_backend.py)."""

    runs_here = False  # the compute nodes' hardware; the data is prepared here, shared

    def __init__(self, folder: Path, *, settings: SlurmSettings | None = None,
                 jobs_given: bool = False, poll_s: float | None = None, **_: Any):
        self.jobs_given = jobs_given
        self.matrix = SlurmMatrix(folder, settings, **({"poll_s": poll_s} if poll_s else {}))

    def check(self, detached: bool) -> None:
        if self.jobs_given:
            raise UsageError("MATRIX_JOBS is how many cells run at once on this machine; this "
                             "matrix runs on Slurm, where CONFIG_SLURM_MAX_RUNNING limits that "
                             "(`make setconfig SET=SLURM_MAX_RUNNING=N`)")

    def describe(self, plan: Plan) -> str:
        return f"  SLURM   {len(plan.cells)} cells"

    def run(self, plan: Plan, command: str, dotconfig: str | None,
            if_changed: str, detached: bool = False) -> int | None:
        """Submit the unfinished cells and watch them (an exit status), or, detached,
        submit a report job behind them and return None (nothing to collect here)."""
        waiting = self.matrix.submit(plan, command, dotconfig, if_changed)
        if not waiting:
            return 0  # every cell completed: collect here
        if detached:
            report = self.matrix.submit_report()
            self.matrix.say(f"  detached: job {report} writes the report when the cells end "
                            f"({plan.folder / 'report.md'}); `make matrix-status` shows the "
                            "cells, `make matrix-cancel` cancels them")
            return None
        return self.matrix.watch(waiting)

    def views(self) -> list[CellView]:
        return self.matrix.views(ask_slurm=shutil.which("squeue") is not None)

    def cancel(self) -> int:
        return self.matrix.cancel()


BACKENDS = {BACKEND_LOCAL: LocalBackend, BACKEND_SLURM: SlurmBackend}
implemented(BACKEND_NAMES, BACKENDS, "matrix backends")


def backend_for(name: str, folder: Path, **options: Any) -> LocalBackend | SlurmBackend:
    """The backend CONFIG_MATRIX_BACKEND names, for the matrix folder ``folder``
    (``options``: what each needs; the other's are ignored)."""
    return BACKENDS[name](folder, **options)


def backend_of(folder: Path) -> LocalBackend | SlurmBackend:
    """The backend a matrix folder was last run on: Slurm once it has job arrays."""
    return backend_for(BACKEND_SLURM if read_jobs(folder)["arrays"] else BACKEND_LOCAL, folder)
