"""Run a plan: one train.py process per cell, up to N at once, resumable.

What the runner promises, and how:

* Nothing is lost when it is stopped. Each cell is an ordinary run in
  ``cells/<cell id>/`` that checkpoints as it goes, so re-running the plan skips
  completed cells (their summary.json says so, for this exact configuration),
  resumes interrupted ones from their checkpoint and retries failed ones.
* A stop reaches every cell exactly once. Cells run in sessions of their own, so a
  Ctrl-C in the terminal reaches only the runner, which sends each cell one
  SIGTERM (the trainer then saves and exits 130). If the runner itself is killed
  (kill -9), Linux sends the cells SIGTERM through PR_SET_PDEATHSIG
  (gpt2/processes.py). A hangup (the terminal closed) stops it like Ctrl-C.
* One runner per matrix folder. The runner locks the folder itself (deleting a
  file in it cannot unlock it) and its cells inherit the locked descriptor, so a
  re-run waits until the cells of a killed runner have saved and exited instead of
  training the same cell twice.
* A failing cell is recorded (status.json, its train.log) and the others go on.
* A cell's result belongs to the code and data that made it (provenance.json). When
  any cell was made under other code or data the runner starts nothing and says so,
  unless told to retrain such cells (``if_changed="rerun"``: their folders are set
  aside, not deleted) or to keep them (``"reuse"``; the report then flags the mix).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

import yaml

from gpt2 import processes, storage
from gpt2.errors import DataError
from gpt2.matrix.cell_server import CellServer
from gpt2.matrix.plan import REPO, Cell, Plan
from gpt2.matrix.plan_file import (PlanDumper, PLAN_FILE, STATUS_FILE, read_status,
                                   status_problem)
from gpt2.training import provenance
from gpt2 import run_folder
from gpt2.run_folder import (COMPLETED, FAILED, INTERRUPTED, NO_SUMMARY, PENDING, RUNNING,
                             completion_problem, read_summary)
from gpt2.errors import EXIT_INTERRUPTED
from gpt2.storage import point_link, write_text_atomic
from gpt2.errors import MatrixError

LOG_FILE = "train.log"
LOCK_WAIT_S = 120.0


def cell_dir(folder: Path, cell_id: str) -> Path:
    return folder / "cells" / cell_id


def own_cell_dir(folder: Path, cell_id: str) -> Path:
    """The cell's folder, made for training into: cells/ and the cell's folder must be
    folders of the matrix's own, never links (storage.own_folder)."""
    storage.own_folder(folder / "cells")
    return storage.own_folder(cell_dir(folder, cell_id))



read_json = storage.read_json_object  # (None: missing, unreadable or not an object)




def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def write_status(folder: Path, status: dict[str, dict[str, Any]]) -> None:
    """status.json, checked as its readers check it (plan_file.read_status)."""
    problem = status_problem(status)
    if problem:
        raise ValueError(f"status.json would not read back: {problem}")
    write_json_atomic(folder / STATUS_FILE, status)


def cell_state(folder: Path, cell_id: str, config_hash: str) -> str:
    """COMPLETED, INTERRUPTED or PENDING: run_folder.state of the cell's folder."""
    return run_folder.state(cell_dir(folder, cell_id), config_hash)


def cell_outcome(folder: Path, cell_id: str, config_hash: str, rc: int) -> tuple[str, str | None]:
    """How a cell's process ended: (COMPLETED, INTERRUPTED or FAILED, the error), from
    its exit status, its summary.json and its log."""
    d = cell_dir(folder, cell_id)
    # The folder's own answer first, whatever the exit status: a cell the matrix's
    # SIGTERM reached after its summary said completed (writing its page) is complete,
    # and the report, which reads the folder, counts it so.
    if run_folder.completed(d, config_hash):
        return COMPLETED, None
    summary = read_summary(d) or NO_SUMMARY
    if summary.config_hash != config_hash:
        summary = NO_SUMMARY
    if rc == 0 and summary.status == COMPLETED:
        return COMPLETED, None
    if rc == EXIT_INTERRUPTED:
        return INTERRUPTED, None
    if summary.error:
        return FAILED, summary.error
    lines = (storage.read_regular(d / LOG_FILE) or b"").decode(errors="replace").splitlines()
    errors = [ln for ln in lines if ln.startswith("error:") or "Error:" in ln]
    if errors:
        return FAILED, errors[-1].strip()
    if rc == -signal.SIGKILL:  # what the kernel's out-of-memory killer sends
        return FAILED, "killed by SIGKILL (out of memory?)"
    if rc < 0:
        return FAILED, f"killed by {signal.Signals(-rc).name}"
    return FAILED, f"exited with status {rc} (see {d / LOG_FILE})"


def update_status(folder: Path, cell_id: str, new_attempt: bool = False, **fields: Any) -> None:
    """Update one cell's entry of status.json from a process that does not hold the
    matrix folder (a Slurm task: many write at once), under a lock of its own;
    ``new_attempt`` counts one more start of the cell."""
    # (O_NOFOLLOW: a link planted as the lock would have it created where it points)
    try:
        with storage.writing(folder / ".status.lock", storage.RESULTS_SETTING):
            fd = os.open(folder / ".status.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise
        raise storage.StorageError(f"{folder / '.status.lock'} is not a regular file (a link, "
                                   "a folder or a pipe): move it away") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        status = read_status(folder)
        entry = status.setdefault(cell_id, {"attempts": 0})
        entry.update(fields, attempts=entry.get("attempts", 0) + new_attempt)
        write_status(folder, status)
    finally:
        os.close(fd)


def cell_changes(folder: Path, cell_id: str, state: str,
                 current: dict[str, Any] | None) -> list[str]:
    """What differs between the code and data that made a cell's result and the
    current ones ([] for a cell with no result yet, or when the data is unknown)."""
    if state == PENDING or current is None:
        return []
    return provenance.changes(provenance.read(cell_dir(folder, cell_id)), current)


def write_plan(plan: Plan, command: str, dotconfig: str | None) -> None:
    """plan.yaml (what each cell runs, and the command that ran the matrix), the
    .config the plan came from as <folder>/config, and the results' latest-matrix link."""
    data = {**plan.to_dict(), "command": command}
    write_text_atomic(plan.folder / PLAN_FILE, yaml.dump(data, Dumper=PlanDumper, sort_keys=False,
                                                         width=100))
    if dotconfig is not None:
        write_text_atomic(plan.folder / "config", dotconfig)
    point_link(plan.folder.parent / "latest-matrix", plan.folder.name)


def _current(plan: Plan) -> dict[str, Any] | None:
    """The code and data the cells would run with now (None while the data is not
    prepared: the cells then stop on that themselves)."""
    cfg = plan.cells[0].cfg  # every cell reads the same data
    try:
        return provenance.identity(cfg.data_dir, cfg.dataset)
    except DataError:
        return None


def check_changed(plan: Plan, states: dict[str, str], if_changed: str) -> list[str]:
    """Cells whose result was made under other code or data; refuses to go on
    unless ``if_changed`` says what to do with them."""
    current = _current(plan)
    cells = plan.cells
    changed = {c.id: what for c in cells
               if (what := cell_changes(plan.folder, c.id, states[c.id], current))}
    if not changed or if_changed != "refuse":
        return list(changed)
    first, what = next(iter(changed.items()))
    others = [cid for cid in changed if cid != first]
    raise MatrixError(
        f"{len(changed)} of the {len(cells)} cells in {plan.folder} hold results made "
        f"under other code or data, e.g. {first}:\n  " + "\n  ".join(what)
        + (f"\nalso: {', '.join(others)}" if others else "")
        + "\nA table mixing them would compare different code. Train those cells again "
        "(their old folders are kept as cells/<cell>.superseded-N): `make test-matrix "
        "IF_CHANGED=rerun`; or keep their results, marked in the report: `make "
        "test-matrix IF_CHANGED=reuse`")


def fmt_duration(seconds: float) -> str:
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"


@dataclass
class Running:
    cell: Cell
    proc: subprocess.Popen
    reader: threading.Thread
    slot: int
    started: float


class Runner:
    def __init__(self, plan: Plan, jobs: int = 1, command: str = "", out: TextIO | None = None,
                 gpus: list[str] | None = None, cpu_count: int | None = None,
                 dotconfig: str | None = None, if_changed: str = "refuse",
                 cell_ended: Callable[[Path], Any] | None = None):
        assert if_changed in provenance.IF_CHANGED, if_changed
        self.plan = plan
        # Called with a cell's folder once its process has ended, however it ended
        # (the make bridge publishes the cell's page there).
        self.cell_ended = cell_ended
        self.if_changed = if_changed
        self.dotconfig = dotconfig  # the .config the plan came from, kept as <folder>/config
        self.folder = plan.folder
        self.jobs = jobs
        self.command = command
        self.out = out or sys.stdout  # looked up now: the entry point may have wrapped it
        self.gpus = gpus  # one per slot when set (multi-GPU machine)
        self.cpu_count = cpu_count or os.cpu_count() or 1
        self.status: dict[str, dict[str, Any]] = {}
        self.durations: list[float] = []  # measured wall times of cells, for the ETA
        self.stopping = 0  # signals received
        self.running: dict[str, Running] = {}
        self.server: CellServer | None = None  # forks the CPU cells (cell_server.py)
        # KGPT_CELL_SERVER=0: every cell a fresh process (docs/matrix.md)
        self.server_tried = os.environ.get("KGPT_CELL_SERVER") == "0"

    # ---- output -----------------------------------------------------------------
    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # ---- bookkeeping ------------------------------------------------------------
    def _save_status(self) -> None:
        write_status(self.folder, self.status)

    def _record(self, cell: Cell, **fields: Any) -> None:
        entry = self.status.setdefault(cell.id, {"attempts": 0})
        entry.update(fields)
        self._save_status()


    @contextlib.contextmanager
    def _locked(self):
        fd = processes.lock_folder(self.folder, LOCK_WAIT_S, waiting=lambda: self.say(
            f"waiting for another run of this matrix to release {self.folder} ..."))
        if fd is None:
            raise MatrixError(f"{self.folder} is in use by another matrix run (or the cells "
                              "of one that was killed are still saving); wait for it, or "
                              "stop it, then run this again")
        try:
            yield fd
        finally:
            os.close(fd)

    # ---- signals ------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        self.stopping += 1
        name = signal.Signals(signum).name
        if self.stopping == 1:
            self.say(f"\n{name}: stopping the matrix; running cells save a checkpoint and "
                     "exit (send it again to abort them without saving)")
        for r in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(r.proc.pid, signal.SIGTERM)

    # ---- cells ----------------------------------------------------------------------
    def _argv(self, cell: Cell) -> list[str]:
        argv = [sys.executable, "-m", "gpt2.train", *cell.argv]  # (cwd: this checkout)
        if self.jobs > 1 and not self.gpus and cell.cfg.cpu_threads == 0:
            # Cells side by side on the CPU: split the cores instead of oversubscribing.
            argv.append(f"--cpu-threads={max(1, self.cpu_count // self.jobs)}")
        keep = self.plan.keep_steps(cell.id)
        if keep:  # checkpoints for the shorter budgets that branch from this cell
            argv.append(f"--keep-steps={','.join(map(str, keep))}")
        parent = self.branch_parent(cell)
        if parent is not None:
            argv.append(f"--branch-from={parent}")
        return argv + [f"--run-dir={cell_dir(self.folder, cell.id)}",
                       f"--if-changed={self.if_changed}"]

    def branch_parent(self, cell: Cell) -> Path | None:
        """The longer cell's folder ``cell`` branches from, when that cell kept the
        checkpoint (a parent that failed first, or was trained without keeping it, leaves
        the cell to train from step 0: the same result, the full cost)."""
        if cell.id not in self.plan.branches:
            return None
        parent, step = self.plan.branches[cell.id]
        folder = cell_dir(self.folder, parent)
        return folder if run_folder.branch_checkpoint(folder, step).is_file() else None

    def _next(self, queue: list[Cell]) -> Cell | None:
        """The first queued cell whose branch parent is neither queued nor running."""
        waiting = {c.id for c in queue} | set(self.running)
        for cell in queue:
            parent = self.plan.branches.get(cell.id, (None,))[0]
            if parent not in waiting:
                queue.remove(cell)
                return cell
        return None

    def _start(self, cell: Cell, slot: int, lock_fd: int) -> Running:
        d = own_cell_dir(self.folder, cell.id)
        env = dict(os.environ)
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[slot]
        # The cell writes its log itself, so it never depends on the runner being
        # alive (a pipe to a killed runner would break the cell's next print).
        with storage.open_append(d / LOG_FILE) as log:
            log.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} matrix runner starts this "
                      "cell\n")
            log.flush()
            offset = log.tell()
            argv = self._argv(cell)
            proc = self._served(cell, lock_fd, argv, env, d / LOG_FILE)
            if proc is None:
                proc = processes.start(
                    argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, pass_fds=(lock_fd,))
        reader = threading.Thread(target=self._follow, args=(d / LOG_FILE, offset, proc),
                                  name=f"log-{cell.id}", daemon=True)
        reader.start()
        return Running(cell, proc, reader, slot, time.monotonic())

    def _served(self, cell: Cell, lock_fd: int, argv: list[str], env: dict[str, str],
                log: Path):
        """The cell forked by the cell server when it trains on the CPU in one process
        (what a fresh process would be, without its second and a half of imports);
        None: start it as a process (a GPU cell, torchrun's, a command that is not the
        trainer's, or no server)."""
        if (cell.cfg.device != "cpu" or cell.cfg.nproc_per_node > 1
                or argv[:3] != [sys.executable, "-m", "gpt2.train"]):
            return None
        if not self.server_tried:
            self.server_tried = True
            self.server = CellServer.start(lock_fd)
        if self.server is None:
            return None
        return self.server.run(argv[3:], env, log)

    def _follow(self, path: Path, offset: int, proc: subprocess.Popen) -> None:
        """Echo a cell's log to the terminal as it grows (one cell at a time only:
        interleaved lines of several cells would be unreadable)."""
        if self.jobs != 1:
            return
        with open(path, errors="replace") as f:
            f.seek(offset)
            while True:
                exited = proc.poll() is not None
                chunk = f.read()
                if chunk:
                    self.out.write("".join("    " + ln for ln in chunk.splitlines(True)))
                    self.out.flush()
                elif exited:
                    return
                else:
                    time.sleep(0.2)

    # ---- the loop ----------------------------------------------------------------------
    def run(self) -> int:
        storage.own_folder(self.folder)
        with self._locked() as lock_fd:
            self.status = read_status(self.folder)
            write_plan(self.plan, self.command, self.dotconfig)
            try:
                return self._run(lock_fd)
            finally:
                if self.server is not None:
                    self.server.close()

    def _run(self, lock_fd: int) -> int:
        cells = list(self.plan.cells)
        total = len(cells)
        states = {c.id: cell_state(self.folder, c.id, c.cfg.config_hash()) for c in cells}
        changed = check_changed(self.plan, states, self.if_changed)
        if self.if_changed == "rerun":
            for cid in changed:  # trained again from the start (train.py sets them aside)
                states[cid] = PENDING
        for c in cells:
            if states[c.id] == COMPLETED:
                s = read_summary(cell_dir(self.folder, c.id)) or NO_SUMMARY
                if s.wall_time_s:
                    self.durations.append(s.wall_time_s)
                self.status.setdefault(c.id, {"attempts": 0})["status"] = COMPLETED
        queue = [c for c in cells if states[c.id] != COMPLETED]
        done = total - len(queue)
        retry = sum(1 for c in queue if self.status.get(c.id, {}).get("status") == FAILED)
        resume = sum(1 for c in queue if states[c.id] == INTERRUPTED)
        self.say(f"matrix {self.folder}\n  {total} cells: {done} completed, {len(queue)} to run"
                 f" ({resume} to resume, {retry} to retry), {self.jobs} at a time")
        for c in queue:  # a "completed" its checkpoint contradicts: say why it runs again
            d = cell_dir(self.folder, c.id)
            problem = completion_problem(d, read_summary(d))
            if problem:
                self.say(f"  note: {c.id}: {problem}; resuming it from that checkpoint")
        if changed:
            self.say(f"  {len(changed)} cell(s) made under other code or data: "
                     + ("training them again" if self.if_changed == "rerun"
                        else "kept as they are (IF_CHANGED=reuse)") + f": {', '.join(changed)}")
        failed: list[str] = []
        free = list(range(self.jobs))
        with processes.stop_signals_handled_by(self._on_signal):
            while (queue and not self.stopping) or self.running:
                while queue and free and not self.stopping:
                    cell = self._next(queue)
                    if cell is None:  # every queued cell waits for a longer one
                        break
                    slot = free.pop(0)
                    how = "resuming" if states[cell.id] == INTERRUPTED else "starting"
                    where = f" on GPU {self.gpus[slot]}" if self.gpus else ""
                    self.say(f"[{done + len(self.running) + 1:>{len(str(total))}}/{total}] "
                             f"{how} {cell.id}{where}")
                    attempts = self.status.get(cell.id, {}).get("attempts", 0) + 1
                    self._record(cell, status=RUNNING, attempts=attempts, error=None)
                    self.running[cell.id] = self._start(cell, slot, lock_fd)
                time.sleep(0.1)
                for cid, r in list(self.running.items()):
                    if r.proc.poll() is None:
                        continue
                    r.reader.join()
                    del self.running[cid]
                    free.append(r.slot)
                    wall = time.monotonic() - r.started
                    status, error = cell_outcome(self.folder, cid, r.cell.cfg.config_hash(),
                                                 r.proc.returncode)
                    self._record(r.cell, status=status, returncode=r.proc.returncode,
                                 error=error, wall_s=round(wall, 1))
                    if self.cell_ended is not None:
                        self.cell_ended(cell_dir(self.folder, cid))
                    if status == COMPLETED:
                        done += 1
                        self.durations.append(wall)
                    elif status == FAILED:
                        failed.append(cid)
                    self.say(self._progress(r.cell, status, error, wall, done, total,
                                            len(queue) + len(self.running)))
        if self.stopping:
            self.say(f"matrix stopped: {done}/{total} cells completed. Run the same command "
                     "again to continue; nothing is lost.")
            return EXIT_INTERRUPTED
        if failed:
            self.say(f"{len(failed)} cell(s) failed: {', '.join(failed)}. Their errors are in "
                     f"{self.folder / STATUS_FILE} and cells/<cell>/{LOG_FILE}; run the same "
                     "command again to retry them.")
            return 1
        return 0

    def _progress(self, cell: Cell, status: str, error: str | None, wall: float, done: int,
                  total: int, left: int) -> str:
        head = f"[{done:>{len(str(total))}}/{total}] {cell.id} {status} in {fmt_duration(wall)}"
        if status == COMPLETED:
            s = read_summary(cell_dir(self.folder, cell.id)) or NO_SUMMARY
            loss, sparsity = s.final_val_loss, s.final_sparsity
            if isinstance(loss, (int, float)) and math.isfinite(loss):
                head += f": val loss {loss:.4f} (ppl {math.exp(min(loss, 700)):.2f})"
            if cell.sparsity is not None and isinstance(sparsity, (int, float)):
                head += f", sparsity {sparsity:.3f}"
        elif error:
            head += f": {error}"
        if left and self.durations:
            eta = sum(self.durations) / len(self.durations) * math.ceil(left / self.jobs)
            head += f" | {left} left, ETA {fmt_duration(eta)}"
        elif left:
            head += f" | {left} left"
        return head
