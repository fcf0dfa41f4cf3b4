"""What runs inside a Slurm allocation: a training command, watched through its end.

    python -m gpt2.slurm.task cell FOLDER [--if-changed=refuse|rerun|reuse]
                                   # one cell of a matrix: cell $SLURM_ARRAY_TASK_ID
    python -m gpt2.slurm.task report FOLDER      # the matrix's summary, plots, report
    python -m gpt2.slurm.task run [--per-node] -- FLAGS...   # a single run: gpt2.train FLAGS
    python -m gpt2.slurm.task node -- FLAGS...    # (from srun) one node's launcher

The script's process is this one (sbatch runs it with ``exec``), and training runs
in a child of its own session. Three things reach it:

- SIGUSR1 before the time limit (``--signal=B:USR1@margin``: B: sends it to this
  process alone). The child is sent SIGTERM, saves a checkpoint after its current
  step and exits 130; then this job asks to be requeued (``scontrol requeue``), and
  the next allocation resumes the checkpoint, exactly (tests/slurm/test_slurm_matrix.py).
- SIGTERM from ``scancel`` (which sends it to every process of the job) or from
  ``make matrix-cancel`` (``scancel --batch --signal=TERM``: to this one only). It is
  passed on, the child saves and exits 130, and the job ends without a requeue. A
  second signal does not abort training under Slurm (gpt2/training/trainer.py):
  the child may get the same signal from Slurm and from here.
- SIGKILL, KillWait seconds after a cancel. The child then gets SIGTERM from the
  kernel (processes.start) and saves if it still can.

How a cell ended is written to the matrix's status.json (under a lock: cells end at
once) and its output is appended to cells/<cell>/train.log, as the local runner does.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from gpt2.matrix.collect import collect
from gpt2.matrix.plan_file import PLAN_FILE, read_plan
from gpt2.matrix.runner import LOG_FILE, cell_outcome, own_cell_dir, update_status
from gpt2.matrix.slurm_backend import SlurmMatrix
from gpt2.results import pages
from gpt2.run_folder import INTERRUPTED, QUEUED, RUNNING
from gpt2.train import run_of
from gpt2 import REPO, processes, storage
from gpt2.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, PlanFileError, SlurmError, StorageError
from gpt2.slurm import commands


class Supervisor:
    """Runs one command in its own session and passes the stop signals on, once."""

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        self._say = say  # where its own messages go: the cell's log, or the job's output
        self._unsaid: list[str] = []  # what it said before it had somewhere to say it
        self.proc: subprocess.Popen | None = None
        self.requeue = False  # the time limit is near: requeue once the child saved
        self.signalled: str | None = None

    def say(self, text: str) -> None:
        if self._say is None:
            self._unsaid.append(text)
        else:
            self._say(text)

    def attach(self, say: Callable[[str], None]) -> None:
        """Say from now on through ``say``, starting with what was said before."""
        self._say = say
        for text in self._unsaid:
            say(text)
        self._unsaid.clear()

    def handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGUSR1:
            self.requeue = True
        if self.signalled is None:
            self.signalled = name
            self.say(f"kgpt task: {name} received: "
                     + ("the time limit is near: " if self.requeue else "")
                     + "stopping training at a checkpoint")
            if self.proc is not None and self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def run(self, argv: list[str], **popen) -> int:
        with processes.stop_signals_handled_by(self.handle):
            self.proc = processes.start(argv, cwd=REPO, stdin=subprocess.DEVNULL, **popen)
            if self.signalled:  # a signal came while it was starting
                os.killpg(self.proc.pid, signal.SIGTERM)
            # Polled, not wait(): a handler runs only between bytecodes of the main
            # thread, which a blocking waitpid would hold when the signal is taken by
            # another thread.
            while self.proc.poll() is None:
                time.sleep(0.1)
        if self.signalled and self.proc.returncode == -signal.SIGTERM:
            # Our SIGTERM came before training set up its handlers: it had not taken a
            # step in this allocation, so what it had saved before is all there is.
            self.say("kgpt task: training was still starting when it was stopped; nothing "
                     "new to save")
            return EXIT_INTERRUPTED
        return self.proc.returncode

    def finish(self, rc: int) -> int:
        """Requeue this job when the time limit stopped it at a checkpoint; the exit
        status of the job otherwise."""
        if not (self.requeue and rc == EXIT_INTERRUPTED):
            return rc
        job = os.environ.get("SLURM_JOB_ID", "")
        try:
            commands.requeue(job)
        except SlurmError as e:
            self.say(f"kgpt task: could not requeue job {job}: {e}; `make test-matrix` (or the "
                "same sbatch) resumes it from its checkpoint")
            return rc
        self.say(f"kgpt task: checkpoint saved; job {job} requeued to continue in a new allocation")
        return 0


def _allocation() -> str:
    env = os.environ
    job = env.get("SLURM_JOB_ID", "?")
    if env.get("SLURM_ARRAY_JOB_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID')} (job {job})"
    restarts = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
    return f"Slurm job {job}, allocation {restarts + 1}, on {socket.gethostname()}"


def run_cell(folder: Path, if_changed: str, supervisor: Supervisor) -> int:
    index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    try:
        # (checked: a plan edited since submission must not send a cell's folder
        # anywhere else, nor give it anything but train.py flags)
        cells = read_plan(folder)["cells"]
        if not 0 <= index < len(cells):
            raise PlanFileError(f"{folder / PLAN_FILE} has {len(cells)} cells; there is no "
                                f"cell {index}")
        cell = cells[index]
        d = own_cell_dir(folder, cell["id"])
    except (PlanFileError, StorageError) as e:
        print(f"error: {e}")
        return EXIT_BAD_INPUT
    argv = [sys.executable, "-m", "gpt2.train", *cell["args"], f"--run-dir={d}",
            f"--if-changed={if_changed}"]
    cpus = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if cpus.isdigit() and not any(a.startswith("--cpu-threads") for a in cell["args"]):
        argv.append(f"--cpu-threads={cpus}")  # the allocation's cores, not the node's
    job = (f"{os.environ.get('SLURM_ARRAY_JOB_ID', '')}_{index}"
           if os.environ.get("SLURM_ARRAY_JOB_ID") else os.environ.get("SLURM_JOB_ID", ""))
    update_status(folder, cell["id"], new_attempt=True, status=RUNNING, error=None,
                  slurm_job=job)
    started = time.monotonic()
    with storage.open_append(d / LOG_FILE) as log:
        def say(text: str) -> None:
            log.write(text + "\n")
            log.flush()

        say(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {_allocation()} starts this cell")
        supervisor.attach(say)
        rc = supervisor.run(argv, stdout=log, stderr=subprocess.STDOUT)
        status, error = cell_outcome(folder, cell["id"], cell["config_hash"], rc)
        rc = supervisor.finish(rc)
    pages.publish_after_run(d, None)  # (training leaves its page to what started it)
    update_status(folder, cell["id"], status=status, error=error, returncode=rc,
                  wall_s=round(time.monotonic() - started, 1),
                  requeued=supervisor.requeue and status == INTERRUPTED)
    return rc


def run_report(folder: Path) -> int:
    """The report job: summary, plots, report and pages, once no cell of the matrix is
    queued or running. Slurm can start it while a cell that requeued itself at its
    time limit waits for its next allocation (the requeue ends the job that the
    afterany dependency waited for); it then leaves the report to a new job that
    waits for the cells still to come."""
    backend = SlurmMatrix(folder)
    waiting = [v for v in backend.views() if v.state in (QUEUED, RUNNING)]
    if waiting:
        job = backend.submit_report()
        print(f"{len(waiting)} cell(s) still queued or running (requeued at their time "
              f"limit?): {', '.join(f'{v.id} ({v.job})' for v in waiting)}; job {job} "
              "writes the report once they end")
        return 0
    collected = collect(folder, report=True)
    for problem in collected.missing:
        print(f"  not in the results: {problem}")
    pages.publish_matrix(folder)
    print(f"wrote {folder / 'summary.csv'}, {folder / 'report.md'}, "
          f"{folder / pages.MATRIX_PAGE} and {folder / 'plots'}/")
    return 0


def run_single(flags: list[str], per_node: bool, supervisor: Supervisor) -> int:
    """A single run: gpt2.train here, or (``per_node``) one launcher per node through
    srun, each starting torchrun with the rendezvous of ``rendezvous()``."""
    print(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {_allocation()} starts this run",
          flush=True)
    supervisor.attach(lambda text: print(text, flush=True))
    train = [sys.executable, "-m", "gpt2.train", *flags]
    if per_node:  # srun passes a SIGTERM on to the launchers; they pass it to torchrun
        train = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", sys.executable, "-m",
                 "gpt2.slurm.task", "node", "--", *flags]
    rc = supervisor.finish(supervisor.run(train))
    run = run_of(flags)
    if run is not None:  # (training leaves its page to what started it)
        pages.publish_after_run(run.path, run.root if run.linked else None)
    return rc


def rendezvous(environ=os.environ) -> list[str]:
    """torchrun's flags for this allocation: as many nodes as Slurm gave, the c10d
    rendezvous on the first of them at a port derived from the job id (two jobs
    sharing a first node do not meet), named by the job id."""
    nodes = commands.run(["scontrol", "show", "hostnames", environ["SLURM_JOB_NODELIST"]])
    job = int(environ["SLURM_JOB_ID"])
    return [f"--nnodes={environ['SLURM_NNODES']}", "--rdzv_backend=c10d",
            f"--rdzv_endpoint={nodes.split()[0]}:{20000 + job % 10000}", f"--rdzv_id={job}"]


def run_node(flags: list[str]) -> int:
    """One node's launcher (a task of srun): gpt2.train with TORCHRUN_ARGS set."""
    os.environ["TORCHRUN_ARGS"] = shlex.join(rendezvous())
    print(f"kgpt task: node {os.environ.get('SLURM_NODEID', '?')}: torchrun "
          f"{os.environ['TORCHRUN_ARGS']}", flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "gpt2.train", *flags])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpt2.slurm.task", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    cell = sub.add_parser("cell", help="train the matrix cell $SLURM_ARRAY_TASK_ID")
    cell.add_argument("folder", type=Path)
    cell.add_argument("--if-changed", default="refuse", choices=("refuse", "rerun", "reuse"))
    report = sub.add_parser("report", help="collect a matrix: summary, plots, report")
    report.add_argument("folder", type=Path)
    single = sub.add_parser("run", help="train one run: gpt2.train with these flags")
    single.add_argument("--per-node", action="store_true",
                        help="one launcher per node through srun, torchrun's rendezvous "
                        "from Slurm's environment")
    single.add_argument("flags", nargs=argparse.REMAINDER)
    node = sub.add_parser("node", help="(inside srun) one node's launcher of a single run")
    node.add_argument("flags", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.what == "report":
        return run_report(args.folder)
    if args.what == "node":
        return run_node(_flags(args))
    # Listen for the stop signals before anything slow (a cell imports torch): with a
    # short time limit Slurm's warning can come in a job's first second, and
    # SIGUSR1's default action would end the job with nothing logged. The script
    # ignores it until here (script.render); one that came since is acted on when
    # training starts: it is stopped at once, and the job requeued.
    supervisor = Supervisor()
    with processes.stop_signals_handled_by(supervisor.handle):
        try:
            if args.what == "cell":
                return run_cell(args.folder, args.if_changed, supervisor)
            return run_single(_flags(args), args.per_node, supervisor)
        except StorageError as e:  # (a log or record that cannot be written)
            print(f"error: {e}")
            return EXIT_BAD_INPUT


def _flags(args: argparse.Namespace) -> list[str]:
    """gpt2.train's flags as given after `run` or `node` (a leading -- dropped)."""
    return args.flags[1:] if args.flags[:1] == ["--"] else args.flags


if __name__ == "__main__":
    sys.exit(main())
