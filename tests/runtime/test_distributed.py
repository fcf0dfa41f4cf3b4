"""Data-parallel training: 2 processes on the CPU (gloo) through torchrun.

A step is defined globally (its micro-batches are divided among the processes), so
two processes must train exactly what one process trains with the same batch and
accumulation; a stop and a signal must lose nothing."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
import torch

from helpers import (PY, REPO, TINY, only_run_dir, read_jsonl, run_make, run_py,
                      signal_at_step, train_tiny)

pytestmark = pytest.mark.e2e

# Dropout on, so the per-process random streams must be saved and restored too.
ARGS = ["--gradient-accumulation=2", "--max-iters=8", "--eval-interval=4", "--log-interval=1",
        "--checkpoint-interval=100", "--sample-tokens=8"]

# The only clock in these tests: a guard that turns a hung job into a failed test instead
# of a CI job that never ends. It judges nothing about speed (a 30-step 2-process run
# once took 739 s on a loaded machine), so it is many times what a loaded machine needs;
# what a test proves is said by its assertions, never by how long something took.
HANG_GUARD_S = 1200


def trajectory(run):
    return [(r["step"], r.get("train_loss"), r.get("val_loss"))
            for r in read_jsonl(run / "metrics.jsonl")]


def assert_close(a, b, tol=1e-5):
    assert [r[0] for r in a] == [r[0] for r in b]
    for ra, rb in zip(a, b):
        for x, y in zip(ra[1:], rb[1:]):
            assert (x is None) == (y is None) and (x is None or abs(x - y) <= tol), (ra, rb)


@pytest.fixture(scope="module")
def single(data_dir, tmp_path_factory):
    """The one-process reference run."""
    results = tmp_path_factory.mktemp("single")
    train_tiny(data_dir, results, *ARGS)
    return only_run_dir(results)


def test_two_processes_train_what_one_process_trains(data_dir, single, tmp_path):
    proc = train_tiny(data_dir, tmp_path, *ARGS, "--nproc-per-node=2")
    # steps 0, 4 and 8, printed by rank 0 only
    assert "x 2 processes" in proc.stdout and proc.stdout.count("val loss") == 3
    run = only_run_dir(tmp_path)
    assert_close(trajectory(run), trajectory(single))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["tokens"] == 8 * 2 * 4 * 32
    a = torch.load(single / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(run / "ckpt.pt", weights_only=True)
    for k, v in a.items():
        torch.testing.assert_close(b["model"][k], v, rtol=1e-5, atol=1e-6)
    assert len(b["rng"]) == 2  # each process's random state
    assert (run / "samples.txt").read_text() == (single / "samples.txt").read_text()


@pytest.mark.reliability
def test_a_stopped_two_process_run_resumes_exactly(data_dir, single, tmp_path):
    stopped = train_tiny(data_dir, tmp_path, *ARGS, "--nproc-per-node=2", "--stop-at-step=3",
                         check=False)
    assert stopped.returncode == 130, stopped.stdout + stopped.stderr
    run = only_run_dir(tmp_path)
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    resumed = train_tiny(data_dir, tmp_path, *ARGS, "--nproc-per-node=2")
    assert "from step 3" in resumed.stdout
    assert_close(trajectory(run), trajectory(single))


@pytest.mark.reliability
def test_a_signal_to_the_launcher_stops_every_process_at_one_step(data_dir, single, tmp_path):
    args = [*TINY, *ARGS, "--max-iters=400", "--eval-interval=200", "--nproc-per-node=2",
            f"--data-dir={data_dir}", f"--results-dir={tmp_path}", "--run-name=tiny"]
    rc, out = signal_at_step([PY, str(REPO / "gpt2" / "train.py"), *args], signal.SIGINT)
    assert rc == 130, out
    assert "asking 2 processes" in out and out.count("SIGTERM received") == 1
    run = only_run_dir(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    step = torch.load(run / "ckpt.pt", weights_only=True)["step"]
    assert summary["status"] == "interrupted" and summary["iters"] == step >= 5


def _worker_of_rank(launcher_pid: int, rank: int) -> int | None:
    """The pid of the training process of ``rank`` among the launcher's descendants."""
    from pathlib import Path

    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            pass

    def descends(pid):
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == launcher_pid:
                return True
        return False

    for pid in parents:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and descends(pid):
            return pid
    return None


@pytest.mark.reliability
def test_a_signal_to_one_process_stops_both_at_the_same_step(data_dir, tmp_path):
    import subprocess

    cmd = [PY, str(REPO / "gpt2" / "train.py"), *TINY, *ARGS, "--max-iters=400",
           "--eval-interval=200", "--nproc-per-node=2", f"--data-dir={data_dir}",
           f"--results-dir={tmp_path}", "--run-name=tiny"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO)
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.startswith("step      5/"):
            pid = _worker_of_rank(proc.pid, 1)
            assert pid is not None
            os.kill(pid, signal.SIGTERM)
            break
    out.append(proc.stdout.read())
    # Hang guard only: the output has ended, so the launcher is exiting.
    assert proc.wait(timeout=HANG_GUARD_S) == 130, "".join(out)
    run = only_run_dir(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    state = torch.load(run / "ckpt.pt", weights_only=True)
    # Both processes saved their random state at the one step they agreed on.
    assert summary["status"] == "interrupted" and summary["iters"] == state["step"] >= 5
    assert len(state["rng"]) == 2


@pytest.mark.reliability
@pytest.mark.parametrize("fault", ["crash@3:rank1", "die@3:rank1"])
def test_a_failing_process_ends_the_job_and_the_checkpoint_resumes(data_dir, single, tmp_path,
                                                                   fault):
    """One process raising (or killed outright) at step 3 must end the whole job, not
    leave the other waiting in a collective forever; the checkpoint of step 2 then
    resumes to what one process trains."""
    args = [*ARGS, "--nproc-per-node=2", "--checkpoint-interval=2"]
    # Hang guard only: a survivor left waiting in a collective would wait out gloo's
    # 30-minute timeout, so the guard makes that hang a failure well before.
    proc = run_py("gpt2/train.py", *TINY, *args, f"--data-dir={data_dir}",
                  f"--results-dir={tmp_path}", "--run-name=tiny",
                  env={"KGPT_FAULTS": fault}, timeout=HANG_GUARD_S)
    assert proc.returncode not in (0, 130), proc.stdout + proc.stderr
    assert "failed in one of its 2 processes" in proc.stderr
    # The job ended because rank 1 failed: torchrun names it the first failure, with the
    # fault's own exit (its exception, or the SIGKILL); rank 0 was ended with it (torchrun
    # terminated it, or its collective lost the peer), not by a collective timing out.
    root = re.search(r"Root Cause \(first observed failure\):\s*\[0\]:(.*?)=====",
                     proc.stderr, re.S)
    assert root, proc.stderr
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)", root[1]), root[1]
    exit_status = -signal.SIGKILL if fault.startswith("die") else 1
    assert re.search(rf"exitcode\s*: {exit_status} ", root[1]), root[1]
    assert not re.search(r"timed out|timeout", proc.stderr, re.I), proc.stderr
    # Neither process got past the step rank 1 failed at (rank 0 prints every step).
    assert "step      2/8 |" in proc.stdout and "step      3/8 |" not in proc.stdout
    run = only_run_dir(tmp_path)
    assert json.loads((run / "summary.json").read_text())["status"] != "completed"
    assert torch.load(run / "ckpt.pt", weights_only=True)["step"] == 2
    resumed = train_tiny(data_dir, tmp_path, *args)
    assert "from step 2" in resumed.stdout
    assert_close(trajectory(run), trajectory(single))


def test_accumulation_must_divide_among_the_processes(data_dir, tmp_path):
    proc = train_tiny(data_dir, tmp_path, "--gradient-accumulation=3", "--nproc-per-node=2",
                      check=False)
    assert proc.returncode == 2 and "CONFIG_GRADIENT_ACCUMULATION" in proc.stderr
    assert "among 2 processes (CONFIG_NPROC_PER_NODE)" in proc.stderr


def test_make_ngpu_sets_the_process_count(tmp_path):
    config = tmp_path / ".config"
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_make("defconfig-gpt2-shakespeare-cpu", env=env).returncode == 0
    proc = run_make("train", "NGPU=2", "DRY_RUN=1", "TRAIN_ARGS=--gradient-accumulation=2",
                    env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout[proc.stdout.index("{"):])["config"]["nproc_per_node"] == 2


def test_fsdp_trains_and_resumes_what_one_process_trains(data_dir, single, tmp_path):
    """Weights, gradients and Adam state sharded over 2 processes, stopped at step 3
    and resumed: the same losses as one process, and a checkpoint of whole tensors."""
    args = [*ARGS, "--nproc-per-node=2", "--parallel=fsdp"]
    stopped = train_tiny(data_dir, tmp_path, *args, "--stop-at-step=3", check=False)
    assert stopped.returncode == 130, stopped.stdout + stopped.stderr
    resumed = train_tiny(data_dir, tmp_path, *args)
    assert "from step 3" in resumed.stdout
    run = only_run_dir(tmp_path)
    assert_close(trajectory(run), trajectory(single))
    a = torch.load(single / "ckpt.pt", weights_only=True)
    b = torch.load(run / "ckpt.pt", weights_only=True)
    assert b["sharded"] and a["model"].keys() == b["model"].keys()
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, rtol=1e-4, atol=1e-5)
    assert (run / "samples.txt").read_text() == (single / "samples.txt").read_text()


def test_spam_steps_fsdp_shards_as_it_steps_whole_tensors(data_dir, tmp_path):
    """SPAM's foreach step (clip, reset, re-warmup) runs on FSDP's sharded tensors and
    trains what it trains in one process: clipping from step 2, a reset at step 5."""
    spam = ["--optimizer=adamwspam", "--spam-clip-delay=2", "--spam-reset-interval=5",
            "--spam-warmup=2", "--spam-threshold=2.0"]
    train_tiny(data_dir, tmp_path / "one", *ARGS, *spam)
    train_tiny(data_dir, tmp_path / "two", *ARGS, *spam, "--nproc-per-node=2",
               "--parallel=fsdp")
    one, two = (only_run_dir(tmp_path / n) for n in ("one", "two"))
    assert_close(trajectory(two), trajectory(one))


@pytest.mark.parametrize("optimizer", ["lion", "adopt", "ademamix"])
def test_elementwise_optimizers_step_fsdp_shards_as_whole_tensors(data_dir, tmp_path,
                                                                    optimizer):
    """The newer elementwise optimizers (Signum is Lion's code) train on FSDP's shards
    what they train in one process: ADOPT's first, measuring step and its clip, and
    AdEMAMix's warmups, on sharded state."""
    extra = ["--ademamix-warmup=3"] if optimizer == "ademamix" else []
    args = [*ARGS, f"--optimizer={optimizer}", *extra]
    train_tiny(data_dir, tmp_path / "one", *args)
    train_tiny(data_dir, tmp_path / "two", *args, "--nproc-per-node=2", "--parallel=fsdp")
    one, two = (only_run_dir(tmp_path / n) for n in ("one", "two"))
    assert_close(trajectory(two), trajectory(one))


@pytest.mark.parametrize("setting, message", [
    (dict(optimizer="mars"), "whole matrices"),
    (dict(optimizer="soap"), "soap needs whole matrices"),
    (dict(optimizer="kron"), "kron needs whole matrices"),
    (dict(optimizer="schedulefree"), "averaged weights from whole tensors"),
    (dict(optimizer="lion", cautious=True), "cautious"),
    (dict(optimizer="muon"), "whole matrices"),
    (dict(pruning_method="magnitude"), "pruning"),
    (dict(dtype="float16"), "float16"),
])
def test_fsdp_refuses_what_needs_whole_tensors(setting, message):
    from gpt2.config.options import resolve
    from gpt2.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        resolve({"parallel": "fsdp", **setting})


def _any_later_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as torch_dist

    from gpt2.runtime.distributed import Dist

    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=2)
    dist = Dist(rank=rank, local_rank=rank, world=2)
    answers = [dist.any_later(torch.tensor(flag))() for flag in (False, rank == 1)]
    torch_dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(answers, f)


def test_a_non_finite_loss_on_one_process_is_seen_by_every_process(tmp_path):
    """The non-finite check (Dist.any_later) reduces over the processes before any
    reads it: a NaN on rank 1 alone stops or skips the step on rank 0 as well."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_any_later_worker, args=(port, str(tmp_path / "answers")), nprocs=2)
    for rank in (0, 1):
        assert json.loads((tmp_path / f"answers.{rank}").read_text()) == [False, True]
