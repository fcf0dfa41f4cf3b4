"""The cell server (gpt2/matrix/cell_server.py): a cell forked from it is what a fresh
process started by processes.start would be. Each promise is checked on a stand-in
module whose main() reports what it sees, so the checks are exact and take no
training; test_matrix_run.py runs the real trainer through it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from helpers import REPO
from gpt2 import processes
from gpt2.matrix.cell_server import CellServer

pytestmark = pytest.mark.e2e  # (it starts the server process)

STAND_IN = r'''
import json, os, signal, sys, time
from pathlib import Path

def fds():
    out = {}
    for f in os.listdir("/proc/self/fd"):
        try:
            out[f] = os.readlink(f"/proc/self/fd/{f}")
        except FileNotFoundError:  # (listdir's own, closed by now)
            pass
    return {f: target for f, target in out.items() if int(f) > 2}

def main(argv):
    out, what = Path(argv[0]), argv[1]
    out.write_text(json.dumps({
        "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
        "cwd": os.getcwd(), "stdin": sys.stdin.read(), "env": os.environ.get("CELL_VAR"),
        "fds": fds(),
        "sigint": repr(signal.getsignal(signal.SIGINT)),
        "sigterm": repr(signal.getsignal(signal.SIGTERM)),
        "sighup": repr(signal.getsignal(signal.SIGHUP))}))
    print("to stdout", flush=True)
    print("to stderr \x1b[2J", file=sys.stderr, flush=True)
    if what == "wait":
        Path(str(out) + ".waiting").write_text("")
        while True:
            time.sleep(0.05)
    if what == "raise":
        raise RuntimeError("planted")
    if what == "exit":
        sys.exit(7)
    return int(what)
'''


@pytest.fixture
def served(tmp_path, monkeypatch):
    """``(server, lock_fd, run)``: a server holding a locked descriptor, as the runner's
    does; ``run(what)`` forks the stand-in and returns (cell, what it saw, its log)."""
    (tmp_path / "stand_in_cell.py").write_text(STAND_IN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(REPO)]))
    lock_fd = processes.lock_folder(tmp_path, 5)
    server = CellServer.start(lock_fd)
    assert server is not None
    runs = iter(range(100))

    def run(what: str, env: dict | None = None):
        n = next(runs)
        seen, log = tmp_path / f"seen{n}.json", tmp_path / f"cell{n}.log"
        cell = server.run([str(seen), what], {**os.environ, "CELL_VAR": f"cell {n}",
                                               **(env or {})}, log, module="stand_in_cell")
        assert cell is not None
        return cell, seen, log

    yield server, lock_fd, run
    server.close()
    os.close(lock_fd)


def test_a_served_cell_is_a_process_of_its_own_as_a_started_one_would_be(served, tmp_path):
    server, lock_fd, run = served
    cell, seen, log = run("0")
    assert cell.wait(timeout=60) == 0
    got = json.loads(seen.read_text())
    assert got["pid"] == cell.pid == got["pgid"] == got["sid"]  # a session of its own
    assert got["cwd"] == str(REPO) and got["stdin"] == ""
    assert got["env"] == "cell 0"  # its own environment, not the server's
    # no descriptor but the matrix's lock, inherited (a re-run waits for the cell)
    assert got["fds"] == {str(lock_fd): str(tmp_path)}
    assert "default_int_handler" in got["sigint"] and "SIG_DFL" in got["sigterm"]
    assert "SIG_DFL" in got["sighup"]
    text = log.read_text()
    # stdout and stderr into its log, its control characters shown (as train.py's)
    assert "to stdout\n" in text and "to stderr \\x1b[2J\n" in text


def test_a_stop_sent_to_a_served_cells_group_as_soon_as_it_is_started_reaches_it(served):
    """The runner's stop signal goes to the cell's process group (os.killpg): the
    server answers with the pid only once the cell leads its own session, so a signal
    sent right after reaches it."""
    _, _, run = served
    cell, seen, _ = run("wait")
    os.killpg(cell.pid, signal.SIGTERM)
    assert cell.wait(timeout=60) == -signal.SIGTERM


@pytest.mark.parametrize("what,code", [("3", 3), ("exit", 7), ("raise", 1)])
def test_a_served_cells_exit_status_is_what_its_process_would_give(served, what, code):
    _, _, run = served
    cell, _, log = run(what)
    assert cell.wait(timeout=60) == code
    if what == "raise":
        assert "RuntimeError: planted" in log.read_text()


def test_cells_of_a_killed_server_get_sigterm_and_are_not_left_running(served):
    server, _, run = served
    cell, seen, _ = run("wait")
    while not Path(str(seen) + ".waiting").exists():
        assert cell.poll() is None, "the stand-in ended before it waited"
        time.sleep(0.02)
    server.proc.kill()  # as the kernel's SIGTERM to it would, when the runner dies
    server.proc.wait()
    # PR_SET_PDEATHSIG: the cell gets SIGTERM (here it has no handler: it ends)
    assert cell.wait(timeout=60) == -signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(cell.pid, 0)
    assert server.run(["x", "0"], dict(os.environ), seen) is None  # gone: not served
