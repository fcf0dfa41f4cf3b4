"""Matrix cells on the CPU, started by fork from a process that has imported the trainer.

A cell is an ordinary ``python -m gpt2.train`` run. Started as a fresh process it pays
Python's start and the imports (torch, then torch._dynamo, which torch's optimizers
import on first use, then matplotlib): about 1.5 s of a 2-core machine's CPU before it
reads its first batch, and the same again on a busy machine. A CPU matrix of small
cells (the tests' tiny ones, a user's matrix-cpu) paid that in every cell. So the
runner starts this server once per matrix; it imports all of that and nothing else,
and forks each cell from itself. The fork is then what a fresh process would have been
after its imports: the same modules, the same environment (each cell's own), a session
of its own, SIGTERM when the server dies, stdout and stderr to the cell's log, and its
exit status reported as a Popen's.

Why only CPU cells: the server never touches CUDA, but a forked child's CUDA is not
what this project can test without a GPU, and a GPU cell's minutes of training make its
second of start-up nothing. Why it is safe to fork here: this process runs no tensor
operation, so torch's OpenMP threads do not exist yet (a fork of a process that has
them waits on them forever, docs/testing.md on mutation testing), and it has one
thread.

The protocol, one JSON object a line: the runner writes ``{"argv", "env", "log"}`` (and
``"module"``, whose ``main(argv)`` runs: gpt2.train unless named); the
server answers ``{"pid"}`` once the cell has its own session (so a stop signal sent to
its process group right after reaches it), or ``{"error"}``, and ``{"exited", "code"}``
(``code`` as Popen's returncode: negative for a signal) when a cell ends. End of input
ends the server; its cells have ended by then, or get SIGTERM from the kernel
(PR_SET_PDEATHSIG) as the cells of a killed runner do.

    server = CellServer.start(lock_fd)     # in the runner; None if it cannot start
    proc = server.run(argv, env, log)      # pid, poll(), wait(), returncode
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from gpt2 import REPO, processes

# What every training process imports before its first batch (the parts that cost).
PRELOAD = ("gpt2.train", "gpt2.training.trainer", "torch._dynamo", "matplotlib.figure",
           "matplotlib.backends.backend_agg")
READY = "ready"


# ---- the runner's side --------------------------------------------------------------------

class CellServer:
    """The runner's handle on the server process."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.codes: dict[int, int] = {}  # pid -> exit code, as the server reports them
        self.pending = b""
        self.gone = False

    @classmethod
    def start(cls, lock_fd: int) -> "CellServer | None":
        """The server, ready to fork cells (it holds the matrix's lock as the cells do);
        None if it could not start (the cells are then started as processes)."""
        proc = processes.start([sys.executable, "-m", "gpt2.matrix.cell_server", str(lock_fd)],
                               cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               pass_fds=(lock_fd,))
        server = cls(proc)
        first = server._read_line(timeout=None)
        if first != {"ready": True}:
            server.close()
            return None
        return server

    def run(self, argv: list[str], env: dict[str, str], log: Path,
            module: str = "gpt2.train") -> "ServedCell | None":
        """Fork a cell running ``<module>.main(argv)``; None if the server is gone."""
        if self.gone:
            return None
        request = {"argv": argv, "env": env, "log": str(log), "module": module}
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            self.gone = True
            return None
        while True:
            msg = self._read_line(timeout=None)
            if msg is None or "error" in msg:
                return None
            if "pid" in msg:
                return ServedCell(self, msg["pid"])

    def poll(self) -> None:
        """Take in every exit the server has reported so far, without waiting."""
        while not self.gone and self._read_line(timeout=0) is not None:
            pass

    def _read_line(self, timeout: float | None) -> dict | None:
        """The next message (an exit is recorded on the way); None when none came in
        ``timeout`` seconds or the server is gone."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                self.gone = True
                return None
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        msg = json.loads(line)
        if "exited" in msg:
            self.codes[msg["exited"]] = msg["code"]
        return msg

    def close(self) -> None:
        """End the server (its cells have ended: the runner waited for them)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ServedCell:
    """A forked cell, with what the runner uses of a Popen."""

    def __init__(self, server: CellServer, pid: int):
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.poll()
            if self.pid in self.server.codes:
                self.returncode = self.server.codes.pop(self.pid)
            elif self.server.gone and not _exists(self.pid):
                # The server died: its cells got SIGTERM from the kernel, and nobody is
                # left to report how they ended (their folders say: cell_outcome).
                self.returncode = -signal.SIGTERM
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"cell {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- the server's side --------------------------------------------------------------------

def _say(msg: dict) -> None:
    os.write(1, (json.dumps(msg) + "\n").encode())


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _fork_cell(request: dict, keep_fds: set[int]) -> None:
    """Fork the cell; answer with its pid once it has its own session."""
    ready_r, ready_w = os.pipe()
    server = os.getpid()
    pid = os.fork()
    if pid == 0:  # the cell
        os.close(ready_r)
        code = 1
        try:
            _become_cell(request, server, keep_fds | {ready_w}, ready_w)
            code = _run_main(request.get("module", "gpt2.train"), request["argv"])
        finally:
            os._exit(code)
    os.close(ready_w)
    started = os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    _say({"pid": pid} if started else {"error": f"cell {pid} did not start"})


def _become_cell(request: dict, server: int, keep_fds: set[int], ready_w: int) -> None:
    """What a fresh ``python -m gpt2.train`` started by processes.start would be: a
    session of its own, SIGTERM when its parent dies, its log as stdout and stderr,
    /dev/null as stdin, its own environment, the checkout as cwd, Python's signal
    dispositions, only the descriptors it was given."""
    os.setsid()
    if processes._PRCTL is not None:
        processes._PRCTL(processes.PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != server:
            os._exit(128 + signal.SIGTERM)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for fd in _open_fds():
        if fd > 2 and fd not in keep_fds:
            try:
                os.close(fd)
            except OSError:
                pass
    os.chdir(REPO)
    os.environ.clear()
    os.environ.update(request["env"])
    # A fresh interpreter: SIGINT raises KeyboardInterrupt, the other stop signals end
    # the process, and one ignored where the runner started stays ignored.
    for sig in processes.STOP_SIGNALS:
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                          else signal.SIG_DFL)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.write(ready_w, b"1")
    os.close(ready_w)


def _open_fds() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))


def _run_main(name: str, argv: list[str]) -> int:
    """``python -m <name> <argv>``, its exit included: the status main returns (or
    SystemExit's), a traceback and 1 for an uncaught exception, then what an
    interpreter does before it exits (threads joined, exit handlers run, streams
    flushed), as multiprocessing's forked processes do."""
    import importlib

    try:
        module = importlib.import_module(name)
        sys.argv = [str(getattr(module, "__file__", name)), *argv]
        processes.survive_lost_terminal()
        code = module.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # (what the interpreter's own exit does first)
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    return int(code or 0)


def serve(keep_fds: set[int]) -> int:
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    # Signals: the runner sends its cells what it means for them; a stop signal meant
    # for the runner's group never reaches this process (a session of its own), and
    # if the runner dies the kernel's SIGTERM ends this process and so its cells.
    _say({READY: True})
    buffered = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.05)
        _reap()
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            _fork_cell(json.loads(line), keep_fds)
    # The runner has waited for every cell; report any that ended meanwhile.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        _say({"exited": pid, "code": os.waitstatus_to_exitcode(status)})
    return 0


if __name__ == "__main__":
    # The descriptor the runner passed (the matrix's lock) stays open in every cell.
    sys.exit(serve({int(fd) for fd in sys.argv[1:]}))
