"""The matrix on Slurm: the unfinished cells as one job array, watched from here.

``make test-matrix`` with CONFIG_MATRIX_BACKEND_SLURM:

1. Plans the matrix as the local runner does (same folder, plan.yaml, cells/).
2. Works out what to submit: every cell that is not completed (for this exact
   configuration, code and data: the local runner's rules) and not already queued or
   running under a job array this folder submitted before (slurm/jobs.json, asked of
   squeue). Running it twice never trains a cell twice.
3. Writes slurm/cells.sbatch and submits those cells as one array: task i trains cell
   i of plan.yaml (gpt2/slurm/task.py), logging into cells/<cell>/train.log.
4. Watches: a line per finished cell (done, running, queued, failed, ETA) until no
   cell of the matrix is queued or running, then the CLI collects the results as for
   a local matrix. Ctrl-C stops watching, never the cells. With DETACH=1 it returns at
   once, and a job that depends on the arrays (afterany) writes summary, plots and
   report when they end.

``make matrix-status`` shows every cell from squeue and the result files;
``make matrix-cancel`` cancels the queued cells and has the running ones save a
checkpoint first (scancel --batch --signal=TERM reaches the task runner only, which
stops training once).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO


from gpt2 import processes, run_folder, storage
from gpt2.config.slurm import SlurmSettings
from gpt2.errors import EXIT_INTERRUPTED, MatrixError, SlurmError
from gpt2.matrix.plan import Plan
from gpt2.matrix.plan_file import read_plan
from gpt2.matrix.runner import (LOCK_WAIT_S, STATUS_FILE, cell_dir, cell_state, check_changed,
                                fmt_duration, read_json, read_status,
                                update_status, write_json_atomic, write_plan)
from gpt2.slurm import commands, script
from gpt2.run_folder import (COMPLETED, FAILED, INTERRUPTED, NO_SUMMARY, PENDING, QUEUED,
                             RUNNING, read_summary)

SLURM_DIR = "slurm"
JOBS_FILE = "jobs.json"  # in SLURM_DIR: every array this folder submitted, and report jobs
CELLS_SCRIPT = "cells.sbatch"
REPORT_SCRIPT = "report.sbatch"
POLL_S = 5.0
CANCEL_WAIT_S = 600.0
MAX_FAILED_POLLS = 10  # squeue failing this many times in a row ends the watching


def job_name(folder: Path) -> str:
    """The name every job of this matrix folder is submitted under, for people reading
    squeue; kgpt finds its jobs by the ids in slurm/jobs.json, never by name."""
    return f"kgpt-{folder.name}"


def array_spec(indices: list[int], max_running: int = 0) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8" (with "%N" when at most N may run at once)."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(indices) + [None]:
        if run and (i is None or i != run[-1] + 1):
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run = []
        if i is not None:
            run.append(i)
    return ",".join(parts) + (f"%{max_running}" if max_running else "")


def read_jobs(folder: Path) -> dict[str, Any]:
    """slurm/jobs.json: every job array and report job this folder submitted. A record
    of another shape is refused (MatrixError), never guessed at: read wrong, it could
    have kgpt submit cells a second time."""
    path = folder / SLURM_DIR / JOBS_FILE
    if not path.exists() and not path.is_symlink():
        return {"arrays": [], "reports": []}
    jobs = read_json(path)
    problem = jobs_problem(jobs)
    if problem:
        raise MatrixError(f"{path} is damaged ({problem}): it records the Slurm jobs kgpt "
                          "submitted for this matrix. Restore it, or delete it once none of "
                          "them is queued or running (`squeue --me`)")
    return jobs


def jobs_problem(jobs: Any) -> str | None:
    """What makes ``jobs`` unlike the jobs.json kgpt writes; None if nothing."""
    if not isinstance(jobs, dict):
        return "not a JSON object"
    for kind in ("arrays", "reports"):
        entries = jobs.get(kind, [])
        if not isinstance(entries, list):
            return f"{kind} is not a list"
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("job"), str) \
                    or not e["job"].isdigit():
                return f"an entry of {kind} has no job id"
            if not all(isinstance(a, str) for a in e.get("after", [])):
                return "a report job's dependencies are not job ids"
    jobs.setdefault("arrays", [])
    jobs.setdefault("reports", [])
    return None


def _plan_cells(folder: Path) -> list[dict[str, Any]]:
    return read_plan(folder)["cells"]


@dataclass
class CellView:
    """One cell as matrix-status shows it."""

    index: int
    id: str
    state: str  # one of run_folder.STATES
    job: str = ""  # the Slurm task (array_index) that last ran or will run it
    reason: str = ""  # squeue's reason a queued task waits
    attempts: int = 0
    error: str | None = None
    val_loss: float | None = None


class SlurmMatrix:
    """One matrix folder's Slurm jobs: submit, watch, show, cancel."""

    def __init__(self, folder: Path, settings: SlurmSettings | None = None,
                 out: TextIO | None = None, poll_s: float = POLL_S):
        self.folder = folder.resolve()  # (results/latest-matrix names another folder)
        self.settings = settings or SlurmSettings()
        self.out = out or sys.stdout
        self.poll_s = poll_s
        self.name = job_name(self.folder)
        self.stopping = False

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # ---- what Slurm and the files say ----------------------------------------------
    def arrays(self) -> set[str]:
        return {a["job"] for a in read_jobs(self.folder)["arrays"]}

    def reports(self) -> set[str]:
        return {r["job"] for r in read_jobs(self.folder)["reports"]}

    def scripts(self) -> set[Path]:
        """The scripts this folder's jobs run: what tells its jobs from others."""
        return {self.folder / SLURM_DIR / CELLS_SCRIPT, self.folder / SLURM_DIR / REPORT_SCRIPT}

    def tasks(self) -> dict[int, commands.Task]:
        """Array index -> its task, for the cells Slurm lists as queued or running."""
        listed = commands.queued(self.arrays(), self.scripts())
        return {t.index: t for t in listed if t.index is not None
                and t.state in commands.WAITING | commands.RUNNING}

    def views(self, cells: list[dict[str, Any]] | None = None,
              ask_slurm: bool = True) -> list[CellView]:
        """Every cell's state: queued or running as squeue says (unless not
        ``ask_slurm``: a local matrix, or no Slurm here), else as its files say."""
        cells = cells if cells is not None else _plan_cells(self.folder)
        tasks = self.tasks() if ask_slurm else {}
        status = read_status(self.folder)
        out = []
        for i, c in enumerate(cells):
            entry = status.get(c["id"], {})
            v = CellView(i, c["id"], PENDING, job=entry.get("slurm_job", ""),
                         attempts=entry.get("attempts", 0))
            disk = run_folder.live_state(cell_dir(self.folder, c["id"]), c["config_hash"])
            task = tasks.get(i)
            if task is not None:
                v.job = task.id
                v.state = RUNNING if task.state in commands.RUNNING else QUEUED
                v.reason = "" if task.reason == "None" else task.reason
            elif disk == RUNNING:  # a process on this machine trains it (a local cell)
                v.state = RUNNING
            elif disk == COMPLETED:
                v.state = COMPLETED
                v.val_loss = (read_summary(cell_dir(self.folder, c["id"])) or NO_SUMMARY
                              ).final_val_loss
            elif entry.get("status") == FAILED:
                v.state, v.error = FAILED, entry.get("error")
            elif disk == INTERRUPTED:
                v.state = INTERRUPTED
            out.append(v)
        return out

    # ---- submitting ----------------------------------------------------------------
    def _record_array(self, job: str, spec: str, cells: dict[int, str], command: str) -> None:
        jobs = read_jobs(self.folder)
        jobs["arrays"].append({"job": job, "array": spec,
                               "cells": {str(i): c for i, c in cells.items()},
                               "submitted": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "command": command})
        write_json_atomic(self.folder / SLURM_DIR / JOBS_FILE, jobs)

    def _write_cells_script(self, if_changed: str) -> Path:
        s = self.settings
        folder = script.safe_path(self.folder)
        return script.write(
            self.folder / SLURM_DIR / CELLS_SCRIPT,
            [f"kgpt matrix {self.folder.name}: one array task per cell, written by "
             "`make test-matrix`.",
             "Task i trains cell i of plan.yaml (gpt2/slurm/task.py) and logs into "
             "cells/<cell>/train.log;",
             "the --output file below holds only what happens before that log is open. "
             "kgpt submits it",
             "with --array=<the unfinished cells>; submitting it again by hand with "
             "--array=<i> runs cell i."],
            [f"--job-name={self.name}", f"--output={folder}/{SLURM_DIR}/%A_%a.out",
             *script.resources(s), *script.requeueing(s)],
            [script.python(), "-m", "gpt2.slurm.task", "cell", str(self.folder),
             f"--if-changed={if_changed}"])

    def submit_report(self) -> str:
        """A job that writes summary, plots and report once every job array of this
        matrix that is still queued or running has ended, however it ended (afterany).
        One such job at a time: a queued one that waits for fewer arrays is replaced."""
        listed = commands.queued(self.arrays() | self.reports(), self.scripts())
        after = sorted({t.job for t in listed if t.index is not None})
        # (Report jobs not started yet: a running one may be the caller, task.py's report.)
        waiting = [t.job for t in listed if t.index is None and t.job in self.reports()
                   and t.state in commands.WAITING]
        jobs = read_jobs(self.folder)
        for r in jobs["reports"]:
            if r["job"] in waiting and sorted(r["after"]) == after:
                return r["job"]
        commands.cancel(waiting)
        s = self.settings
        path = script.write(
            self.folder / SLURM_DIR / REPORT_SCRIPT,
            [f"kgpt matrix {self.folder.name}: summary.csv, plots/ and report.md, "
             "written when the cells' job arrays end",
             "(kgpt submits it with --dependency=afterany:<arrays>)."],
            [f"--job-name={self.name}",
             f"--output={script.safe_path(self.folder)}/{SLURM_DIR}/report-%j.out",
             "--nodes=1", "--ntasks=1", "--time=30",
             *[f"--{k}={v}" for k, v in (("partition", s.partition), ("account", s.account),
                                          ("qos", s.qos)) if v]],
            [script.python(), "-m", "gpt2.slurm.task", "report", str(self.folder)])
        with processes.stop_signals_deferred():
            job = commands.submit(path, [f"--dependency=afterany:{':'.join(after)}"] if after
                                  else [])
            jobs = read_jobs(self.folder)
            jobs["reports"].append({"job": job, "after": after,
                                    "submitted": time.strftime("%Y-%m-%d %H:%M:%S")})
            write_json_atomic(self.folder / SLURM_DIR / JOBS_FILE, jobs)
        return job

    def submit(self, plan: Plan, command: str, dotconfig: str | None,
               if_changed: str) -> list[int]:
        """Submit the cells that are neither completed nor queued nor running; returns
        the plan indices of the cells the matrix waits for (queued before, or now)."""
        storage.own_folder(self.folder)
        fd = processes.lock_folder(self.folder, LOCK_WAIT_S, waiting=lambda: self.say(
            f"waiting for another run of this matrix to release {self.folder} ..."))
        if fd is None:
            raise MatrixError(f"{self.folder} is in use by another `make test-matrix` (local "
                              "or submitting to Slurm); wait for it, then run this again")
        try:
            write_plan(plan, command, dotconfig)
            states = {c.id: cell_state(self.folder, c.id, c.cfg.config_hash())
                      for c in plan.cells}
            changed = check_changed(plan, states, if_changed)
            if if_changed == "rerun":
                for cid in changed:
                    states[cid] = PENDING
            waiting = self.tasks()
            todo = [i for i, c in enumerate(plan.cells)
                    if states[c.id] != COMPLETED and i not in waiting]
            status = read_status(self.folder)
            done = sum(1 for s in states.values() if s == COMPLETED)
            retry = sum(1 for i in todo if status.get(plan.cells[i].id, {}).get("status")
                        == FAILED)
            resume = sum(1 for i in todo if states[plan.cells[i].id] == INTERRUPTED)
            self.say(f"matrix {self.folder}\n  {len(plan.cells)} cells: {done} completed, "
                     f"{len(waiting)} already queued or running on Slurm, {len(todo)} to "
                     f"submit ({resume} to resume, {retry} to retry)")
            if changed:
                self.say(f"  {len(changed)} cell(s) made under other code or data: "
                         + ("training them again" if if_changed == "rerun"
                            else "kept as they are (IF_CHANGED=reuse)")
                         + f": {', '.join(changed)}")
            if todo:
                path = self._write_cells_script(if_changed)
                spec = array_spec(todo, self.settings.max_running)
                # A stop signal waits until the array is recorded: an array submitted
                # but not in jobs.json would be submitted again by the next run.
                with processes.stop_signals_deferred():
                    job = commands.submit(path, [f"--array={spec}"])
                    self._record_array(job, spec, {i: plan.cells[i].id for i in todo},
                                       command)
                for i in todo:
                    update_status(self.folder, plan.cells[i].id, status=QUEUED, error=None,
                                  slurm_job=f"{job}_{i}")
                self.say(f"  submitted job array {job} ({len(todo)} tasks, "
                         f"{self.folder / SLURM_DIR / CELLS_SCRIPT}); cell logs: "
                         f"{self.folder}/cells/<cell>/train.log")
            return sorted(set(todo) | set(waiting))
        finally:
            os.close(fd)

    # ---- watching ------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        self.stopping = True

    def watch(self, indices: list[int]) -> int:
        """Wait until none of the cells ``indices`` is queued or running, with a line
        per cell that ends; 0 when all completed, 1 when any failed, 130 when any was
        interrupted (cancelled) or when watching was stopped."""
        cells = _plan_cells(self.folder)
        watched = set(indices)
        total = len(cells)
        durations: list[float] = []
        reported: set[int] = set()
        first = True
        failures = 0
        with processes.stop_signals_handled_by(self._on_signal):
            while not self.stopping:
                try:
                    views = self.views(cells)
                    failures = 0
                except SlurmError as e:  # a controller busy or restarting: ask again
                    failures += 1
                    if failures > MAX_FAILED_POLLS:
                        raise
                    self.say(f"  note: {e}; asking again")
                    self._sleep()
                    continue
                active = [v for v in views if v.index in watched
                          and v.state in (RUNNING, QUEUED)]
                ended = watched - {v.index for v in active} - reported
                for v in views:
                    if v.index in ended:
                        reported.add(v.index)
                        wall = self._wall(v)
                        if v.state == COMPLETED and wall:
                            durations.append(wall)
                        self.say(self._progress(v, views, wall, durations))
                if first:
                    running = sum(1 for v in active if v.state == RUNNING)
                    self.say(f"  watching {len(active)} cells ({running} running); Ctrl-C "
                             "stops watching, not the cells")
                    first = False
                if not active:
                    break
                self._sleep()
        views = self.views(cells)
        if self.stopping:
            self.say("stopped watching; the cells go on on Slurm. `make matrix-status` shows "
                     "them, `make test-matrix` watches again (it submits nothing twice), "
                     "`make matrix-cancel` cancels them")
            return EXIT_INTERRUPTED
        mine = [v for v in views if v.index in watched]
        done = sum(1 for v in views if v.state == COMPLETED)
        failed = [v.id for v in mine if v.state == FAILED]
        stopped = [v.id for v in mine if v.state not in (COMPLETED, FAILED)]
        self.say(f"matrix on Slurm: {done}/{total} cells completed")
        if failed:
            self.say(f"{len(failed)} cell(s) failed: {', '.join(failed)}. Their errors are in "
                     f"{self.folder / STATUS_FILE} and cells/<cell>/train.log; `make "
                     "test-matrix` submits them again.")
        if stopped:
            self.say(f"{len(stopped)} cell(s) stopped before the end (cancelled?): "
                     f"{', '.join(stopped)}; `make test-matrix` resumes them.")
        return 1 if failed else EXIT_INTERRUPTED if stopped else 0

    def _sleep(self) -> None:
        deadline = time.monotonic() + self.poll_s
        while time.monotonic() < deadline and not self.stopping:
            time.sleep(0.1)

    def _wall(self, v: CellView) -> float | None:
        wall = (read_summary(cell_dir(self.folder, v.id)) or NO_SUMMARY).wall_time_s
        return wall if isinstance(wall, (int, float)) else None

    def _progress(self, v: CellView, views: list[CellView], wall: float | None,
                  durations: list[float]) -> str:
        total = len(views)
        done = sum(1 for x in views if x.state == COMPLETED)
        head = f"[{done:>{len(str(total))}}/{total}] {v.id} {v.state}"
        if wall:
            head += f" in {fmt_duration(wall)}"
        if v.job:
            head += f" (job {v.job})"
        if v.state == COMPLETED and isinstance(v.val_loss, (int, float)) \
                and math.isfinite(v.val_loss):
            head += f": val loss {v.val_loss:.4f} (ppl {math.exp(min(v.val_loss, 700)):.2f})"
        elif v.state == FAILED and v.error:
            head += f": {v.error}"
        running = sum(1 for x in views if x.state == RUNNING)
        queued = sum(1 for x in views if x.state == QUEUED)
        failed = sum(1 for x in views if x.state == FAILED)
        head += f" | {running} running, {queued} queued, {failed} failed"
        left = running + queued
        if left and durations:
            at_once = max(running, 1)
            eta = sum(durations) / len(durations) * math.ceil(left / at_once)
            head += f", ETA {fmt_duration(eta)}"
        return head

    # ---- cancelling ----------------------------------------------------------------
    def cancel(self, wait_s: float = CANCEL_WAIT_S) -> int:
        """Cancel the report job and the queued cells, and tell each running cell's
        task runner (alone: scancel --batch) to stop, so the cell saves a checkpoint;
        then wait for them to end. 0 when nothing of the matrix is left running."""
        if not self.arrays():
            raise MatrixError(f"{self.folder}: no cells of this matrix were submitted to Slurm "
                              "(a local matrix stops with Ctrl-C)")
        listed = commands.queued(self.arrays() | self.reports(), self.scripts())
        reports = [t.job for t in listed if t.index is None]
        cells = [t for t in listed if t.index is not None]
        running = [t.id for t in cells if t.state in commands.RUNNING]
        queued = [t for t in cells if t.state not in commands.RUNNING]
        # The report job first (it would start as the arrays end), then what has not
        # started, then the stop signal.
        commands.cancel(reports)
        commands.cancel(sorted({t.job for t in queued}), "--state=PENDING")
        commands.cancel(running, "--batch", "--signal=TERM")
        self.say(f"cancelled {len(queued)} queued cell(s)"
                 + (f" and the report job {', '.join(reports)}" if reports else "")
                 + f"; {len(running)} running cell(s) told to save a checkpoint and stop")
        deadline = time.monotonic() + wait_s
        while self.tasks():
            if time.monotonic() > deadline:
                left = ", ".join(t.id for t in self.tasks().values())
                self.say(f"still running after {wait_s:.0f} s: {left}; `scancel "
                         f"{' '.join(sorted(self.arrays()))}` ends them without a checkpoint")
                return 1
            time.sleep(min(self.poll_s, 1.0))
        self.say("`make test-matrix` resumes the interrupted cells from their checkpoints and "
                 "submits the others again")
        return 0
