"""Processes and what is above them (gpt2/processes.py, docs/reliability.md): a
trainer or torchrun whose parent is killed, a terminal that closes, a lock file
deleted from under a run, two preparations of one dataset at once."""

from __future__ import annotations

import errno
import json
import os
import pty
import select
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from helpers import BRIDGE, PY, REPO, TINY, only_run_dir, run_make, run_py

pytestmark = pytest.mark.reliability

CPU_DEFCONFIG = (REPO / "defconfigs" / "gpt2-shakespeare-cpu").read_text()
# A run far longer than any test: it ends only when it is stopped.
ENDLESS = [*TINY, "--max-iters=100000", "--eval-interval=100000", "--checkpoint-interval=100000"]


# ---- watching processes through /proc ----------------------------------------------------

def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat from its third field on: state, parent, ..., start time at
    [19]; [] once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def descendants(pid: int) -> dict[int, str]:
    """The processes below ``pid``, each with its start time: a pid may be reused
    once its process is gone, the pair is never."""
    stats = {int(p.parent.name): _stat(int(p.parent.name))
             for p in Path("/proc").glob("[0-9]*/stat")}
    found: dict[int, str] = {}
    frontier = {pid}
    while frontier:
        children = {c: s[19] for c, s in stats.items() if s and int(s[1]) in frontier}
        found.update(children)
        frontier = set(children)
    return found


def alive(pid: int, started: str) -> bool:
    s = _stat(pid)
    return bool(s) and s[0] != "Z" and s[19] == started


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    def seen():
        assert proc.poll() is None or text in path.read_text(errors="replace"), \
            path.read_text(errors="replace")
        return text in path.read_text(errors="replace")

    wait_until(seen, timeout, f"{text!r} in {path.name}")


def kill_leftovers(procs: dict[int, str], *popens: subprocess.Popen) -> None:
    """What a failing test leaves running (an orphaned trainer, a paused process)
    must not outlive it."""
    for pid, started in procs.items():
        if alive(pid, started):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
    for popen in popens:
        if popen.poll() is None:
            popen.send_signal(signal.SIGCONT)
            popen.kill()
            popen.wait()


@pytest.fixture(scope="module")
def single_config(tmp_path_factory, data_dir) -> Path:
    """A complete single-run .config on the prepared data (the tiny model comes
    through TRAIN_ARGS, with the results folder)."""
    config = tmp_path_factory.mktemp("single") / "config"
    config.write_text(CPU_DEFCONFIG + f'CONFIG_DATA_DIR="{data_dir}"\n')
    proc = run_make("olddefconfig", env={"KCONFIG_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stderr
    return config


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def saved_step(run: Path) -> int:
    return torch.load(run / "ckpt.pt", weights_only=True)["step"]


# ---- 10. a trainer whose parent dies saves and exits ------------------------------------

def test_kill_9_of_make_stops_the_trainer_with_a_checkpoint_and_make_resumes(
        single_config, tmp_path):
    """SIGKILL to make's whole process group never reaches the trainer (its own
    session); the kernel tells it that the bridge died, and it saves and exits, so the
    next `make` resumes instead of finding the folder locked by an orphan. (`make
    train`: plain `make` starts its data preparation the same way, first.)"""
    results = tmp_path / "results"
    train_args = shlex.join([*ENDLESS, f"--results-dir={results}"])
    env = {**os.environ, "KCONFIG_CONFIG": str(single_config), "TRAIN_ARGS": train_args}
    log = tmp_path / "make.log"
    with open(log, "w") as out:
        make = subprocess.Popen(["make", "--no-print-directory", f"PYTHON={PY}", "train"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    trainers: dict[int, str] = {}
    try:
        wait_for_text(log, "step      5/", make)
        below = descendants(make.pid)
        # (gpt2/train.py re-runs itself as `-m gpt2.train`, in the same process)
        trainers = {p: t for p, t in below.items() if "-m gpt2.train " in cmdline(p)}
        assert len(trainers) == 1, [cmdline(p) for p in below]
        (trainer, started), = trainers.items()
        os.killpg(make.pid, signal.SIGKILL)
        make.wait(timeout=30)
        wait_until(lambda: not alive(trainer, started), 30, "the orphaned trainer to exit")
    finally:
        kill_leftovers(trainers, make)
    run = only_run_dir(results)
    assert "SIGTERM received" in log.read_text()
    assert summary(run)["status"] == "interrupted"
    step = saved_step(run)
    assert summary(run)["iters"] == step >= 5
    again = run_make("train", env={"KCONFIG_CONFIG": str(single_config),
                                   "TRAIN_ARGS": f"{train_args} --stop-at-step={step + 1}"})
    assert f"resuming {run} from step {step}/" in again.stdout, again.stdout + again.stderr
    assert saved_step(run) == step + 1


def test_kill_9_of_the_launcher_stops_every_process_with_a_checkpoint(data_dir, tmp_path):
    """The torchrun launcher killed outright: torchrun gets SIGTERM from the kernel
    and passes it on, and the workers save at one step, as on Ctrl-C."""
    cmd = [PY, str(REPO / "gpt2" / "train.py"), *ENDLESS, "--gradient-accumulation=2",
           "--nproc-per-node=2", f"--data-dir={data_dir}", f"--results-dir={tmp_path}",
           "--run-name=tiny"]
    log = tmp_path / "train.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    below: dict[int, str] = {}
    try:
        wait_for_text(log, "step      5/", launcher)
        below = descendants(launcher.pid)
        assert len(below) >= 3, [cmdline(p) for p in below]  # torchrun and 2 workers
        launcher.kill()
        launcher.wait(timeout=30)
        wait_until(lambda: not any(alive(*p) for p in below.items()), 60,
                   "torchrun and its workers to exit")
    finally:
        kill_leftovers(below, launcher)
    run = only_run_dir(tmp_path)
    state = torch.load(run / "ckpt.pt", weights_only=True)
    assert summary(run)["status"] == "interrupted"
    assert summary(run)["iters"] == state["step"] >= 5 and len(state["rng"]) == 2


# ---- 11. a closed terminal: SIGHUP saves, and output to it can no longer fail ----------------

def test_a_closed_terminal_stops_the_run_with_a_checkpoint(single_config, tmp_path):
    """`make train` in a terminal that closes: every write to it now fails with EIO,
    and the shell sends the job SIGHUP. Training goes on through the failed writes,
    then the hangup stops it with a checkpoint (exit 130), as Ctrl-C would."""
    results = tmp_path / "results"
    env = {**os.environ, "KCONFIG_CONFIG": str(single_config),
           "TRAIN_ARGS": shlex.join([*ENDLESS, f"--results-dir={results}"])}
    master, terminal = pty.openpty()
    kgpt = subprocess.Popen([*BRIDGE, "train"], cwd=REPO,
                            env=env, stdin=subprocess.DEVNULL, stdout=terminal,
                            stderr=terminal, start_new_session=True)
    os.close(terminal)
    below: dict[int, str] = {}
    try:
        seen, deadline = b"", time.monotonic() + 120
        while b"step      5/" not in seen:
            assert time.monotonic() < deadline and kgpt.poll() is None, seen.decode()
            if select.select([master], [], [], 1.0)[0]:
                seen += os.read(master, 65536)
        below = descendants(kgpt.pid)
        os.close(master)  # the terminal is gone: writes to it fail with EIO from now on
        time.sleep(0.5)  # the trainer prints a line per step meanwhile
        os.killpg(kgpt.pid, signal.SIGHUP)  # what the shell sends its jobs
        rc = kgpt.wait(timeout=60)
    finally:
        kill_leftovers(below, kgpt)
    run = only_run_dir(results)
    assert rc == 130, summary(run)
    assert summary(run)["status"] == "interrupted" and "error" not in summary(run)
    assert summary(run)["iters"] == saved_step(run) > 5


@pytest.mark.parametrize("gone", ["EIO", "EPIPE"])
def test_output_whose_reader_is_gone_goes_to_devnull(gone):
    """The function that decides: a write or flush that fails because the terminal
    closed (EIO) or the pipe's reader left (EPIPE) switches the stream to /dev/null."""
    from gpt2.processes import _SurvivingStream

    if gone == "EIO":
        master, end = pty.openpty()
    else:
        master, end = os.pipe()
    stream = open(end, "w", buffering=1)
    os.close(master)
    try:
        with pytest.raises(OSError) as raw:
            stream.write("a line\n")  # unguarded: the error a print would raise
        assert raw.value.errno == getattr(errno, gone)
        guarded = _SurvivingStream(stream)
        print("step 1", file=guarded, flush=True)
        print("step 2", file=guarded, flush=True)
        assert os.path.samestat(os.fstat(end), os.stat(os.devnull))
    finally:
        stream.close()


def test_a_hangup_during_data_preparation_keeps_finished_shards(tmp_path, corpus):
    proc = run_py("gpt2/prepare_data.py", "--dataset=shakespeare", f"--data-dir={tmp_path}",
                  f"--input={corpus}", "--shard-tokens=20000", "--prepare-workers=1",
                  env={"KGPT_FAULTS": "sighup-in-prepare@2"})
    assert proc.returncode == 130, proc.stderr
    assert "SIGHUP received" in proc.stderr and "finished shard(s) kept" in proc.stderr
    assert not (tmp_path / "shakespeare" / "meta.json").exists()


# ---- 12. locks that no deleted file can release ------------------------------------------

def test_deleting_the_lock_file_does_not_let_a_second_trainer_in(tmp_path):
    from gpt2.config.options import resolve
    from gpt2.run_folder import RunDir
    from gpt2.errors import RunBusyError

    cfg = resolve(dict(results_dir=str(tmp_path), run_name="busy"))
    with RunDir(cfg).locked():
        (RunDir(cfg).path / ".lock").unlink(missing_ok=True)  # rm -f results/<run>/.lock
        with pytest.raises(RunBusyError, match="another process is training"):
            with RunDir(cfg).locked():
                pass
    with RunDir(cfg).locked():  # released with its holder
        pass


def test_a_folder_that_cannot_be_locked_itself_gets_a_lock_file(tmp_path, monkeypatch):
    """NFS emulates flock with byte-range locks, which refuse a folder opened read-only."""
    import fcntl

    from gpt2 import processes

    real = fcntl.flock

    def nfs_like(fd, op):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real(fd, op)

    monkeypatch.setattr(processes.fcntl, "flock", nfs_like)
    held = processes.lock_folder(tmp_path)
    assert held is not None and (tmp_path / ".lock").is_file()
    assert processes.lock_folder(tmp_path) is None
    os.close(held)


def test_two_preparations_of_one_folder_wait_for_each_other(tmp_path, corpus):
    """The second waits, saying so, and then finds the data ready."""
    text = tmp_path / "input.txt"
    text.write_text(corpus.read_text()[:100_000])
    args = ["--dataset=shakespeare", f"--data-dir={tmp_path}", f"--input={text}",
            "--prepare-workers=1", "--shard-tokens=5000"]
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    started = []

    def start(log, faults=""):
        with open(log, "w") as out:
            started.append(subprocess.Popen([PY, str(REPO / "gpt2/prepare_data.py"), *args],
                                            cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                            env={**os.environ, "KGPT_FAULTS": faults}))
        return started[-1]

    try:
        # The first pauses itself (SIGSTOP) after its first shard, mid-preparation.
        first = start(logs[0], "sigstop-in-prepare@1")
        wait_until(lambda: first.poll() is not None or _stat(first.pid)[:1] == ["T"], 120,
                   "the first preparation to pause")
        second = start(logs[1])
        wait_for_text(logs[1], "being prepared by another process", second)
        first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=120) == 0, logs[0].read_text()
        assert second.wait(timeout=120) == 0, logs[1].read_text()
    finally:
        kill_leftovers({}, *started)
    assert "up to date" in logs[1].read_text() and "wrote" not in logs[1].read_text()
    assert "Traceback" not in logs[0].read_text() + logs[1].read_text()


def test_a_stop_signal_waits_until_a_record_is_written():
    """processes.stop_signals_deferred: a signal arriving while a failure is being
    recorded reaches the previous handler only afterwards, once (a launcher
    SIGTERMs the surviving processes while they write their summary)."""
    from gpt2.processes import stop_signals_deferred

    seen = []
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        with stop_signals_deferred():
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.05)
            assert seen == []  # held
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, old)
