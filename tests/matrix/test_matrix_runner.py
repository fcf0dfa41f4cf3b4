"""The matrix runner's bookkeeping, in-process and fast: which cells it starts,
resumes, retries or skips, what it records in status.json, what it prints, and how it
stops. Each cell's train.py is replaced by a small script that ends the way a test
tells it to (test_matrix_run.py runs the real trainer through make)."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import checkpoint_state

from gpt2.config import kconfig
from gpt2.errors import EXIT_INTERRUPTED, MatrixError
from gpt2.matrix import runner as runner_module
from gpt2.matrix.plan import plan_from_dotconfig
from gpt2.matrix.runner import (
    Runner,
    cell_dir,
    cell_outcome,
    check_changed,
    fmt_duration,
)

# Four cells: two unpruned, two pruned (their progress line shows the sparsity).
MATRIX = """CONFIG_MATRIX=y
CONFIG_MATRIX_OPTIMIZER_SGD=y
CONFIG_MATRIX_OPTIMIZER_ADAMW=y
CONFIG_MATRIX_PRUNING_NONE=y
CONFIG_MATRIX_PRUNING_MAGNITUDE=y
CONFIG_MATRIX_SPARSITIES="0.5"
CONFIG_DEVICE_CPU=y
"""
CELLS = ["sgd-none-seed1337", "sgd-magnitude-50-seed1337", "adamw-none-seed1337",
         "adamw-magnitude-50-seed1337"]

# What a cell's "trainer" does, by the word the test gives it:
#   complete:LOSS:SPARSITY  summary.json completed (this config's hash), exit 0
#   error                   prints an error line, exit 1
#   bytes                   prints bytes that are not UTF-8, then an error line, exit 1
#   summary-error           summary.json with an error, exit 1
#   silent                  exit 3, nothing said
#   killed                  SIGKILL (as the kernel's OOM killer would)
#   wait                    marks itself started, then waits for SIGTERM: exit 130
FAKE_TRAINER = r'''
import json, os, signal, sys, time
from pathlib import Path
run_dir, config_hash, what = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
def summary(**kw):
    (run_dir / "summary.json").write_text(json.dumps({"config_hash": config_hash, **kw}))
print("training", run_dir.name, flush=True)
(run_dir / "seen.json").write_text(json.dumps({
    "cwd": os.getcwd(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "stdin": sys.stdin.read(), "status": json.loads((run_dir.parent.parent / "status.json")
                                                   .read_text())[run_dir.name]}))
print("to stderr", file=sys.stderr, flush=True)
kind, *rest = what.split(":")
if kind == "complete":
    summary(status="completed", final_val_loss=float(rest[0]),
            final_sparsity=float(rest[1]) if rest[1] else None, wall_time_s=7.0)
    print("step 12 done", flush=True)
elif kind == "error":
    print("error: the data is not prepared", flush=True)
    sys.exit(1)
elif kind == "bytes":
    sys.stdout.flush()
    os.write(1, b"\xff\xfe not UTF-8\n")
    print("error: after bytes", flush=True)
    sys.exit(1)
elif kind == "summary-error":
    summary(status="failed", error="out of memory at step 3")
    sys.exit(1)
elif kind == "silent":
    sys.exit(3)
elif kind == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
elif kind == "wait":
    terms = []
    signal.signal(signal.SIGTERM, lambda *a: terms.append(1))
    (run_dir / "started").write_text("")
    while not terms:
        time.sleep(0.02)
    summary(status="interrupted")
    (run_dir / "sigterms").write_text(str(len(terms)))
    sys.exit(130)
'''


# How long a test's stopper waits for cells to reach the state it stops them in: long
# enough for any machine's load (on a machine running four other heavy jobs, 60 s once
# was not, and the stop went out before the cells it was meant for had started), yet
# bounded.
WAIT_S = 600


class FakeRunner(Runner):
    """The real runner, with each cell's trainer replaced by FAKE_TRAINER."""

    def __init__(self, plan, todo: dict[str, str], fake: Path, **kw):
        super().__init__(plan, out=io.StringIO(), **kw)
        self.todo, self.fake = todo, fake

    def _argv(self, cell):
        return [sys.executable, str(self.fake), str(cell_dir(self.folder, cell.id)),
                cell.cfg.config_hash(), self.todo[cell.id]]

    def printed(self) -> str:
        return self.out.getvalue()


@pytest.fixture
def matrix(tmp_path):
    """(plan with its folder under tmp_path, fake trainer path). Its data folder is
    empty: with no data prepared there is no data identity to compare results with."""
    path = tmp_path / "config"
    path.write_text(MATRIX + f'CONFIG_DATA_DIR="{tmp_path / "data"}"\n')
    plan = plan_from_dotconfig(kconfig.load(path), [])
    plan = dataclasses.replace(plan, results_dir=str(tmp_path / "results"))
    assert [c.id for c in plan.cells] == CELLS
    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE_TRAINER)
    return plan, fake


def status_of(plan) -> dict:
    return json.loads((plan.folder / "status.json").read_text())


def starts(plan, cell_id: str) -> int:
    """How many times the runner started a cell (it heads the cell's log each time)."""
    log = (cell_dir(plan.folder, cell_id) / "train.log").read_text()
    return log.count("matrix runner starts this cell")


DURATION = r"\d+m\d\ds"


@pytest.mark.e2e
def test_a_run_records_each_outcome_and_a_rerun_retries_only_the_failed(matrix):
    plan, fake = matrix
    a, b, c, d = CELLS
    first = FakeRunner(plan, {a: "complete:2.5:", b: "complete:3.0:0.5", c: "error",
                              d: "killed"}, fake)
    assert first.run() == 1
    out = first.printed()
    lines = out.splitlines()
    assert lines[:3] == [f"matrix {plan.folder}",
                         "  4 cells: 0 completed, 4 to run (0 to resume, 0 to retry), 1 at a time",
                         f"[1/4] starting {a}"]
    # One cell at a time: its log is echoed, indented, between its start and its end.
    assert lines[3:6] == [f"    training {a}", "    to stderr", "    step 12 done"]
    assert re.fullmatch(rf"\[1/4\] {a} completed in {DURATION}: val loss 2\.5000 \(ppl 12\.18\) "
                        rf"\| 3 left, ETA {DURATION}", lines[6]), lines[6]
    assert lines[7] == f"[2/4] starting {b}"
    assert re.search(rf"^\[2/4\] {b} completed in {DURATION}: val loss 3\.0000 \(ppl 20\.09\), "
                     rf"sparsity 0\.500 \| 2 left, ETA {DURATION}$", out, re.M)
    assert re.search(rf"^\[2/4\] {c} failed in {DURATION}: error: the data is not prepared "
                     rf"\| 1 left, ETA {DURATION}$", out, re.M)
    assert re.search(rf"^\[2/4\] {d} failed in {DURATION}: killed by SIGKILL \(out of memory\?\)$",
                     out, re.M)
    assert lines[-1] == (f"2 cell(s) failed: {c}, {d}. Their errors are in "
                         f"{plan.folder / 'status.json'} and cells/<cell>/train.log; run the "
                         "same command again to retry them.")
    status = first_status = status_of(plan)
    assert {cid: (s["status"], s["returncode"], s["error"], s["attempts"])
            for cid, s in status.items()} == {
        a: ("completed", 0, None, 1), b: ("completed", 0, None, 1),
        c: ("failed", 1, "error: the data is not prepared", 1),
        d: ("failed", -signal.SIGKILL, "killed by SIGKILL (out of memory?)", 1)}
    assert all(isinstance(s["wall_s"], float) and s["wall_s"] == round(s["wall_s"], 1)
               for s in status.values())
    # What each cell's process got: the checkout as its folder, nothing on stdin, its
    # stderr in its log, and status.json saying it runs (attempt 1, no error yet).
    from gpt2.matrix.plan import REPO

    seen = json.loads((cell_dir(plan.folder, a) / "seen.json").read_text())
    assert seen == {"cwd": str(REPO), "gpu": None, "stdin": "",
                    "status": {"attempts": 1, "status": "running", "error": None}}
    log = (cell_dir(plan.folder, a) / "train.log").read_text()
    assert re.match(r"==== \d{4}-\d\d-\d\d \d\d:\d\d:\d\d matrix runner starts this cell\n"
                    rf"training {a}\nto stderr\n", log), log

    # The re-run: completed cells are skipped, the failed ones retried (attempt 2).
    again = FakeRunner(plan, {c: "complete:4.0:", d: "silent"}, fake)
    assert again.run() == 1
    out = again.printed()
    assert out.splitlines()[1] == ("  4 cells: 2 completed, 2 to run (0 to resume, 2 to retry), "
                                   "1 at a time")
    assert f"\n[3/4] starting {c}\n" in out and f"\n[4/4] starting {d}\n" in out
    # The ETA counts the completed cells' recorded wall times (7 s each): 1 cell left.
    assert re.search(rf"^\[3/4\] {c} completed in {DURATION}: val loss 4\.0000 \(ppl 54\.60\) "
                     rf"\| 1 left, ETA 0m0[4-9]s$", out, re.M), out
    assert re.search(rf"^\[3/4\] {d} failed in {DURATION}: exited with status 3 \(see "
                     rf"{re.escape(str(cell_dir(plan.folder, d) / 'train.log'))}\)$", out, re.M)
    status = status_of(plan)
    assert [starts(plan, cid) for cid in CELLS] == [1, 1, 2, 2]
    assert (status[c]["status"], status[c]["attempts"], status[c]["error"]) == ("completed", 2, None)
    assert (status[d]["status"], status[d]["returncode"], status[d]["attempts"]) == ("failed", 3, 2)
    assert status[a] == first_status[a]  # a skipped cell's record is kept as it was

    # The third run: one failed cell left, and once it completes the matrix returns 0.
    last = FakeRunner(plan, {d: "complete:5.0:0.5"}, fake)
    assert last.run() == 0
    assert last.printed().splitlines()[1] == (
        "  4 cells: 3 completed, 1 to run (0 to resume, 1 to retry), 1 at a time")
    assert [starts(plan, cid) for cid in CELLS] == [1, 1, 2, 3]
    assert {s["status"] for s in status_of(plan).values()} == {"completed"}
    assert FakeRunner(plan, {}, fake).run() == 0  # nothing left: nothing starts


@pytest.mark.e2e
def test_cells_side_by_side_are_numbered_in_start_order_and_not_echoed(matrix):
    plan, fake = matrix
    todo = {cid: "complete:2.0:0.5" if "magnitude" in cid else "complete:2.0:" for cid in CELLS}
    two = FakeRunner(plan, todo, fake, jobs=2)
    assert two.run() == 0
    out = two.printed()
    assert out.splitlines()[1].endswith(", 2 at a time")
    # The first two start before either ends: the second is numbered 2, not 1.
    assert out.splitlines()[2:4] == [f"[1/4] starting {CELLS[0]}", f"[2/4] starting {CELLS[1]}"]
    assert "training" not in out  # interleaved logs would be unreadable
    assert len(re.findall(rf"completed in {DURATION}: val loss 2\.0000", out)) == 4
    assert re.search(r"^\[4/4\] .* completed in .*: val loss 2\.0000 \(ppl 7\.39\)(, sparsity "
                     r"0\.500)?$", out, re.M)  # the last has nothing left: no ETA


@pytest.mark.e2e
def test_a_stop_reaches_each_running_cell_once_and_the_rerun_resumes_it(matrix):
    plan, fake = matrix
    first = FakeRunner(plan, dict.fromkeys(CELLS, "wait"), fake, jobs=2)
    started = [cell_dir(plan.folder, cid) / "started" for cid in CELLS[:2]]

    def stop_when_both_run():
        deadline = time.monotonic() + WAIT_S
        while not all(p.is_file() for p in started) and time.monotonic() < deadline:
            time.sleep(0.02)
        first._on_signal(signal.SIGTERM, None)

    stopper = threading.Thread(target=stop_when_both_run)
    stopper.start()
    assert first.run() == EXIT_INTERRUPTED
    stopper.join()
    out = first.printed()
    assert ("\nSIGTERM: stopping the matrix; running cells save a checkpoint and exit (send it "
            "again to abort them without saving)\n") in out
    assert out.splitlines()[-1] == ("matrix stopped: 0/4 cells completed. Run the same command "
                                    "again to continue; nothing is lost.")
    ends = [re.fullmatch(rf"\[0/4\] (\S+) interrupted in {DURATION} \| (\d) left", ln)
            for ln in out.splitlines()]
    # Left: the two never started, and the other running cell until it ends too.
    assert sorted(m[2] for m in ends if m) == ["2", "3"]
    assert sorted(m[1] for m in ends if m) == sorted(CELLS[:2])
    for cid in CELLS[:2]:
        assert (cell_dir(plan.folder, cid) / "sigterms").read_text() == "1"
    assert not cell_dir(plan.folder, CELLS[2]).exists()  # nothing new starts once stopping
    status = status_of(plan)
    assert sorted(status) == sorted(CELLS[:2])
    assert {(s["status"], s["returncode"], s["error"]) for s in status.values()} == {
        ("interrupted", EXIT_INTERRUPTED, None)}

    # A checkpoint makes a cell "interrupted": the re-run says it resumes it.
    (cell_dir(plan.folder, CELLS[0]) / "ckpt.pt").write_bytes(b"")
    again = FakeRunner(plan, dict.fromkeys(CELLS, "complete:1.0:0.5"), fake)
    assert again.run() == 0
    out = again.printed()
    assert out.splitlines()[1] == ("  4 cells: 0 completed, 4 to run (1 to resume, 0 to retry), "
                                   "1 at a time")
    assert f"[1/4] resuming {CELLS[0]}\n" in out and f"[2/4] starting {CELLS[1]}\n" in out


@pytest.mark.e2e
def test_a_completed_summary_its_checkpoint_contradicts_is_resumed_with_a_note(matrix):
    from gpt2.training import checkpoint

    plan, fake = matrix
    d = cell_dir(plan.folder, CELLS[0])
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(
        {"status": "completed", "config_hash": plan.cells[0].cfg.config_hash(), "max_iters": 12}))
    checkpoint.save(d / "ckpt.pt", checkpoint_state(4), 4)
    run = FakeRunner(plan, dict.fromkeys(CELLS, "complete:1.0:0.5"), fake)
    assert run.run() == 0
    lines = run.printed().splitlines()
    assert lines[1] == "  4 cells: 0 completed, 4 to run (1 to resume, 0 to retry), 1 at a time"
    assert lines[2] == (f"  note: {CELLS[0]}: {d / 'summary.json'} says completed, but the newest "
                        "checkpoint (step-00000004.pt) is of step 4 of 12; resuming it from that "
                        "checkpoint")
    assert lines[3] == f"[1/4] resuming {CELLS[0]}"


@pytest.mark.e2e
def test_cells_made_under_other_code_are_refused_rerun_or_reused_as_asked(matrix, monkeypatch):
    """With their data prepared, cells whose results record no (or other) code and
    data stop the matrix before anything starts, unless IF_CHANGED says what to do."""
    plan, fake = matrix
    now = {"code": {"sources": "x", "files": {}, "torch": "2"}, "data": {}}
    monkeypatch.setattr(runner_module, "_current", lambda plan: now)
    for cid in CELLS[:3]:  # results from before provenance.json
        d = cell_dir(plan.folder, cid)
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps(
            {"status": "completed", "config_hash": plan.cells[CELLS.index(cid)].cfg.config_hash()}))
    states = {c.id: runner_module.cell_state(plan.folder, c.id, c.cfg.config_hash())
              for c in plan.cells}
    assert list(states.values()) == ["completed"] * 3 + ["pending"]
    with pytest.raises(MatrixError) as err:
        check_changed(plan, states, "refuse")
    assert str(err.value) == (
        f"3 of the 4 cells in {plan.folder} hold results made under other code or data, e.g. "
        f"{CELLS[0]}:\n  it records no code or data identity (made by a kgpt version before "
        f"provenance.json)\nalso: {CELLS[1]}, {CELLS[2]}\nA table mixing them would compare "
        "different code. Train those cells again (their old folders are kept as "
        "cells/<cell>.superseded-N): `make test-matrix IF_CHANGED=rerun`; or keep their "
        "results, marked in the report: `make test-matrix IF_CHANGED=reuse`")
    assert check_changed(plan, states, "reuse") == CELLS[:3]
    monkeypatch.setattr(runner_module.provenance, "changes", lambda old, new: ["one", "two"])
    with pytest.raises(MatrixError) as err:
        check_changed(plan, {**states, CELLS[1]: "pending", CELLS[2]: "pending"}, "refuse")
    assert str(err.value).startswith(f"1 of the 4 cells in {plan.folder} hold results made under "
                                     f"other code or data, e.g. {CELLS[0]}:\n  one\n  two\nA table")
    refused = FakeRunner(plan, dict.fromkeys(CELLS, "complete:1.0:0.5"), fake)
    with pytest.raises(MatrixError):
        refused.run()
    assert not (cell_dir(plan.folder, CELLS[3]) / "train.log").exists()

    reuse = FakeRunner(plan, dict.fromkeys(CELLS, "complete:1.0:0.5"), fake, if_changed="reuse")
    assert reuse.run() == 0
    assert reuse.printed().splitlines()[1:3] == [
        "  4 cells: 3 completed, 1 to run (0 to resume, 0 to retry), 1 at a time",
        f"  3 cell(s) made under other code or data: kept as they are (IF_CHANGED=reuse): "
        f"{', '.join(CELLS[:3])}"]
    assert [starts(plan, cid) for cid in CELLS[3:]] == [1]

    rerun = FakeRunner(plan, dict.fromkeys(CELLS, "complete:1.0:0.5"), fake, if_changed="rerun")
    assert rerun.run() == 0
    assert rerun.printed().splitlines()[1:3] == [
        "  4 cells: 0 completed, 4 to run (0 to resume, 0 to retry), 1 at a time",
        f"  4 cell(s) made under other code or data: training them again: {', '.join(CELLS)}"]


@pytest.mark.e2e
def test_the_plan_and_config_are_written_beside_the_cells(matrix):
    import yaml

    plan, fake = matrix
    run = FakeRunner(plan, dict.fromkeys(CELLS, "complete:1.0:0.5"), fake, command="make x",
                     dotconfig="CONFIG_MATRIX=y\n")
    assert run.run() == 0
    written = yaml.safe_load((plan.folder / "plan.yaml").read_text())
    assert written == {**plan.to_dict(), "command": "make x"}
    assert (plan.folder / "config").read_text() == "CONFIG_MATRIX=y\n"
    assert (plan.folder.parent / "latest-matrix").resolve() == plan.folder.resolve()


def test_cell_outcome_reads_exit_status_summary_and_log(tmp_path):
    d = cell_dir(tmp_path, "c")
    d.mkdir(parents=True)

    def summary(**kw):
        (d / "summary.json").write_text(json.dumps({"config_hash": "h", **kw}))

    assert cell_outcome(tmp_path, "c", "h", 1) == ("failed", f"exited with status 1 (see "
                                                             f"{d / 'train.log'})")
    assert cell_outcome(tmp_path, "c", "h", -signal.SIGTERM) == ("failed", "killed by SIGTERM")
    assert cell_outcome(tmp_path, "c", "h", -signal.SIGKILL) == (
        "failed", "killed by SIGKILL (out of memory?)")
    assert cell_outcome(tmp_path, "c", "h", EXIT_INTERRUPTED) == ("interrupted", None)
    summary(status="completed")
    assert cell_outcome(tmp_path, "c", "h", 0) == ("completed", None)
    # Killed after it completed (the matrix stopping while the cell wrote its page):
    # complete, as the folder and the report say.
    assert cell_outcome(tmp_path, "c", "h", -signal.SIGTERM) == ("completed", None)
    assert cell_outcome(tmp_path, "c", "other", 0)[0] == "failed"  # another config's summary
    summary(status="running")
    (d / "train.log").write_text("step 1\nValueError: bad shard\nerror: the run failed\nbye\n")
    assert cell_outcome(tmp_path, "c", "h", 2) == ("failed", "error: the run failed")
    (d / "train.log").write_text("step 1\nValueError: bad shard\n  more\n")
    assert cell_outcome(tmp_path, "c", "h", 2) == ("failed", "ValueError: bad shard")
    summary(status="failed", error="out of memory at step 3")  # the summary's error wins
    assert cell_outcome(tmp_path, "c", "h", 1) == ("failed", "out of memory at step 3")
    assert cell_outcome(tmp_path, "c", "other", 1) == ("failed", "ValueError: bad shard")
    summary(status="interrupted")
    assert cell_outcome(tmp_path, "c", "h", 0)[0] == "failed"  # exit 0 is not enough


def test_progress_lines_and_durations(matrix):
    plan, fake = matrix
    assert [fmt_duration(s) for s in (0, 59.4, 59.6, 61, 3599, 3600, 3661, 7140, 7322.2)] == [
        "0m00s", "0m59s", "1m00s", "1m01s", "59m59s", "1h00m", "1h01m", "1h59m", "2h02m"]
    run = FakeRunner(plan, {}, fake, jobs=2)
    sgd, pruned = plan.cells[0], plan.cells[1]
    assert run._progress(sgd, "failed", "boom", 75, 1, 4, 3) == "[1/4] sgd-none-seed1337 failed in 1m15s: boom | 3 left"
    run.durations = [30.0, 90.0]  # mean 60 s; 3 left, 2 at a time: two rounds
    assert run._progress(sgd, "failed", "boom", 75, 1, 4, 3).endswith(" | 3 left, ETA 2m00s")
    assert run._progress(sgd, "interrupted", None, 5, 1, 4, 0) == (
        "[1/4] sgd-none-seed1337 interrupted in 0m05s")
    d = cell_dir(plan.folder, pruned.id)
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"final_val_loss": float("nan"),
                                                "final_sparsity": 0.4999}))
    assert run._progress(pruned, "completed", None, 5, 2, 4, 0) == (
        "[2/4] sgd-magnitude-50-seed1337 completed in 0m05s, sparsity 0.500")
    (d / "summary.json").write_text(json.dumps({"final_val_loss": 900.0}))
    assert run._progress(pruned, "completed", None, 5, 2, 4, 1) == (
        f"[2/4] sgd-magnitude-50-seed1337 completed in 0m05s: val loss 900.0000 (ppl "
        f"{math.exp(700):.2f}) | 1 left, ETA 1m00s")


@pytest.mark.e2e
def test_each_running_cell_sees_only_its_slots_gpu(matrix):
    """Two GPUs, two cells at a time, four cells: a slot freed by a finished cell goes
    to the next one, with its GPU."""
    plan, fake = matrix
    two = FakeRunner(plan, dict.fromkeys(CELLS, "complete:1.0:0.5"), fake, jobs=2,
                     gpus=["4", "6"])
    assert two.run() == 0
    out = two.printed()
    assert out.splitlines()[2:4] == [f"[1/4] starting {CELLS[0]} on GPU 4",
                                     f"[2/4] starting {CELLS[1]} on GPU 6"]
    starts_on = dict(re.findall(r"starting (\S+) on GPU (\d)", out))
    for cid in CELLS:
        seen = json.loads((cell_dir(plan.folder, cid) / "seen.json").read_text())
        assert seen["gpu"] == starts_on[cid]
    assert sorted(starts_on.values()) == ["4", "4", "6", "6"]


@pytest.mark.e2e
def test_a_log_that_is_not_utf8_is_echoed_and_read_with_replacement(matrix):
    plan, fake = matrix
    run = FakeRunner(plan, {**dict.fromkeys(CELLS, "complete:1.0:0.5"), CELLS[0]: "bytes"}, fake)
    assert run.run() == 1
    out = run.printed()
    assert "    \ufffd\ufffd not UTF-8\n" in out
    assert status_of(plan)[CELLS[0]]["error"] == "error: after bytes"


@pytest.mark.e2e
def test_a_second_stop_signal_is_passed_on_but_announced_once(matrix):
    plan, fake = matrix
    run = FakeRunner(plan, dict.fromkeys(CELLS, "wait"), fake)
    started = cell_dir(plan.folder, CELLS[0]) / "started"

    def stop_twice():
        deadline = time.monotonic() + WAIT_S
        while not started.is_file() and time.monotonic() < deadline:
            time.sleep(0.02)
        run._on_signal(signal.SIGINT, None)
        run._on_signal(signal.SIGTERM, None)

    stopper = threading.Thread(target=stop_twice)
    stopper.start()
    assert run.run() == EXIT_INTERRUPTED
    stopper.join()
    assert run.printed().count("stopping the matrix") == 1
    assert "\nSIGINT: stopping the matrix" in run.printed()
    assert run.stopping == 2


@pytest.mark.e2e
def test_a_lost_status_file_is_rebuilt_from_the_cells(matrix):
    plan, fake = matrix
    assert FakeRunner(plan, dict.fromkeys(CELLS, "complete:1.0:0.5"), fake).run() == 0
    (plan.folder / "status.json").unlink()
    (cell_dir(plan.folder, CELLS[3]) / "summary.json").unlink()  # one cell to run again
    assert FakeRunner(plan, {CELLS[3]: "complete:1.0:0.5"}, fake).run() == 0
    status = status_of(plan)
    assert {cid: status[cid] for cid in CELLS[:3]} == dict.fromkeys(
        CELLS[:3], {"attempts": 0, "status": "completed"})
    assert (status[CELLS[3]]["attempts"], status[CELLS[3]]["status"]) == (1, "completed")


def test_slurm_tasks_update_their_cells_status_under_one_lock(tmp_path):
    """update_status is how Slurm tasks, many at once, record their cells: each update
    merges into the cell's entry and counts a start only when asked; none is lost."""
    from multiprocessing import get_context

    from gpt2.matrix.runner import update_status

    update_status(tmp_path, "a", new_attempt=True, status="running")
    update_status(tmp_path, "a", status="failed", error="boom")
    update_status(tmp_path, "b", status="pending")
    assert json.loads((tmp_path / "status.json").read_text()) == {
        "a": {"attempts": 1, "status": "failed", "error": "boom"},
        "b": {"attempts": 0, "status": "pending"}}
    ctx = get_context("fork")  # (the children only lock, read and write JSON)
    procs = [ctx.Process(target=_bump, args=(str(tmp_path), f"c{i % 3}")) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    status = json.loads((tmp_path / "status.json").read_text())
    assert [status[f"c{i}"]["attempts"] for i in range(3)] == [20, 20, 20]  # 6 x 10, none lost


def _bump(folder: str, cell: str) -> None:
    from gpt2.matrix.runner import update_status

    for _ in range(10):
        update_status(Path(folder), cell, new_attempt=True, status="running")


def test_the_command_each_cell_runs(matrix):
    plan, _ = matrix
    cell = plan.cells[0]
    argv = Runner(plan, jobs=1)._argv(cell)
    assert argv[:3] == [sys.executable, "-m", "gpt2.train"]
    assert argv[3:-2] == list(cell.argv)  # one at a time: nothing added
    assert Runner(plan, jobs=2, cpu_count=3)._argv(cell)[-3] == "--cpu-threads=1"
    assert Runner(plan, jobs=4, cpu_count=2)._argv(cell)[-3] == "--cpu-threads=1"  # at least one
    assert Runner(plan, jobs=2, gpus=["0", "1"])._argv(cell)[3:-2] == list(cell.argv)
    assert Runner(plan, if_changed="rerun")._argv(cell)[-1] == "--if-changed=rerun"


def test_a_cells_changes_compare_its_recorded_provenance_with_the_current(tmp_path):
    """cell_changes reads the provenance.json the cell's run wrote: nothing when it
    agrees with the current code and data, the difference when it does not, and
    nothing to compare for a cell with no result or when the data is unknown."""
    from gpt2.matrix.runner import cell_changes

    now = {"code": {"sources": "s1", "files": {}, "torch": "2.13.0"}, "data": {}}
    d = cell_dir(tmp_path, "a")
    d.mkdir(parents=True)
    (d / "provenance.json").write_text(json.dumps(now))
    assert cell_changes(tmp_path, "a", "completed", now) == []
    later = {**now, "code": {**now["code"], "torch": "2.14.0"}}
    assert cell_changes(tmp_path, "a", "completed", later) == ["torch: then 2.13.0, now 2.14.0"]
    assert cell_changes(tmp_path, "a", "pending", later) == []
    assert cell_changes(tmp_path, "a", "completed", None) == []


@pytest.mark.e2e
def test_a_long_cell_does_not_hold_up_the_others_in_the_free_slot(matrix):
    """Two at a time, with the first cell still training: each cell that ends in the
    other slot is recorded at once, and the next one starts there."""
    plan, fake = matrix
    run = FakeRunner(plan, {CELLS[0]: "wait", **dict.fromkeys(CELLS[1:], "complete:1.0:0.5")},
                     fake, jobs=2)
    finished_first: list[bool] = []

    def others_recorded() -> bool:  # while the first cell still waits for its signal
        status = status_of(plan) if (plan.folder / "status.json").is_file() else {}
        return [status.get(cid, {}).get("status") for cid in CELLS] == \
            ["running"] + ["completed"] * 3

    def stop_when_the_others_are_done():
        deadline = time.monotonic() + WAIT_S
        while not others_recorded() and time.monotonic() < deadline:
            time.sleep(0.02)
        finished_first.append(others_recorded())
        run._on_signal(signal.SIGTERM, None)

    stopper = threading.Thread(target=stop_when_the_others_are_done)
    stopper.start()
    assert run.run() == EXIT_INTERRUPTED
    stopper.join()
    assert finished_first == [True]
    assert [status_of(plan)[cid]["status"] for cid in CELLS] == ["interrupted"] + ["completed"] * 3


# ---- where the cells run: one interface ---------------------------------------------------

def test_each_backend_name_has_a_backend_and_a_folder_says_which_ran_it(tmp_path):
    """CONFIG_MATRIX_BACKEND's choices and the backends are the same list; status and
    cancel go to the backend a folder last ran on: Slurm once it records a job array."""
    from gpt2.config.slurm import BACKENDS
    from gpt2.errors import UsageError
    from gpt2.matrix import backend

    assert tuple(backend.BACKENDS) == BACKENDS
    assert isinstance(backend.backend_of(tmp_path), backend.LocalBackend)
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "jobs.json").write_text(json.dumps(
        {"arrays": [{"job": "12"}], "reports": []}))
    assert isinstance(backend.backend_of(tmp_path), backend.SlurmBackend)
    local = backend.backend_for("local", tmp_path / "elsewhere", jobs=2)
    assert local.runs_here and local.jobs == 2
    with pytest.raises(UsageError, match="DETACH=1"):
        local.check(detached=True)
    slurm = backend.backend_for("slurm", tmp_path, jobs_given=True)
    assert not slurm.runs_here
    with pytest.raises(UsageError, match="CONFIG_SLURM_MAX_RUNNING"):
        slurm.check(detached=False)
    backend.backend_for("slurm", tmp_path).check(detached=True)  # (detaching is Slurm's)


def test_only_cpu_cells_of_the_trainer_in_one_process_are_forked_from_the_cell_server(
        matrix, monkeypatch):
    """The runner's choice of how a cell starts (gpt2/matrix/cell_server.py): a cell
    that trains on the CPU in one process, run by the trainer's own command, is forked
    from the cell server, which starts once, with the matrix's lock; a GPU cell (or one
    on "auto"), torchrun's, another command, KGPT_CELL_SERVER=0 and a server that did
    not start all give a process of its own (None)."""
    plan, _ = matrix
    calls = []

    class Server:
        fails = False

        @classmethod
        def start(cls, lock_fd):
            calls.append(("start", lock_fd))
            return None if cls.fails else cls()

        def run(self, argv, env, log):
            calls.append(("run", argv, env.get("CELL"), log))
            return "forked"

    monkeypatch.setattr(runner_module, "CellServer", Server)
    log = Path("train.log")
    runner = Runner(plan, out=io.StringIO())
    cell = plan.cells[0]
    assert cell.cfg.device == "cpu" and cell.cfg.nproc_per_node == 1
    argv = runner._argv(cell)
    assert runner._served(cell, 7, argv, {"CELL": "one"}, log) == "forked"
    assert runner._served(cell, 7, argv, {"CELL": "two"}, log) == "forked"
    assert calls == [("start", 7), ("run", argv[3:], "one", log), ("run", argv[3:], "two", log)]
    for changed in (dict(device="cuda"), dict(device="auto"), dict(nproc_per_node=2)):
        other = dataclasses.replace(cell, cfg=dataclasses.replace(cell.cfg, **changed))
        assert runner._served(other, 7, runner._argv(other), {}, log) is None, changed
    assert runner._served(cell, 7, [sys.executable, "other.py", *argv[3:]], {}, log) is None
    assert len(calls) == 3
    monkeypatch.setenv("KGPT_CELL_SERVER", "0")
    assert Runner(plan, out=io.StringIO())._served(cell, 7, argv, {}, log) is None
    monkeypatch.delenv("KGPT_CELL_SERVER")
    assert len(calls) == 3  # (never asked to start)
    Server.fails = True
    failed = Runner(plan, out=io.StringIO())
    assert failed._served(cell, 7, argv, {}, log) is None
    assert failed._served(cell, 7, argv, {}, log) is None
    assert calls[3:] == [("start", 7)]  # tried once, then every cell a process
