"""Faults injected for real, and what must survive them (docs/reliability.md).

Every test breaks a tiny training run at an exact point (a stop, a signal, SIGKILL
halfway through a checkpoint, a damaged file, a NaN loss, an out-of-memory error, a
crafted pickle) and checks that the run says what happened, keeps its last good
checkpoint, and, where it goes on, ends exactly where an unbroken run ends.
Faults are named in KGPT_FAULTS (gpt2/faults.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest
import torch

from helpers import PY, REPO, TINY, TINY_DATASET, call_main, only_run_dir, read_jsonl, run_py

pytestmark = pytest.mark.reliability

# Dropout, accumulation and worker threads on: every piece of state a resume must
# restore (random streams, optimizer moments, data position) changes the losses.
ARGS = ["--dropout=0.1", "--gradient-accumulation=2", "--data-workers=2", "--max-iters=16",
        "--eval-interval=4", "--checkpoint-interval=4", "--epochs=0"]


# Faults that signal or kill the process they fire in: those runs are processes of
# their own (the others run in this one, helpers.call_main; faults.py reads the
# variable at each check, so it takes effect in either).
PROCESS_FAULTS = ("kill-", "sig", "die")


def train(data_dir, results, *extra, faults: str = "", check=True, process: bool = False):
    env = {"KGPT_FAULTS": faults} if faults else None
    process = process or any(f.startswith(PROCESS_FAULTS) for f in faults.split(","))
    return (run_py if process else call_main)(
        "gpt2/train.py", *TINY, f"--data-dir={data_dir}", f"--results-dir={results}",
        "--run-name=tiny", *ARGS, *extra, env=env, check=check)


def trajectory(run):
    return [(r["step"], r.get("train_loss"), r.get("val_loss"), r.get("grad_norm"))
            for r in read_jsonl(run / "metrics.jsonl")]


def state(run):
    return torch.load(run / "ckpt.pt", weights_only=True)


def differences(a, b) -> list[str]:
    """What differs between two finished runs: losses, weights, optimizer state,
    samples (compared exactly). Empty when one is an exact continuation."""
    out = []
    if trajectory(a) != trajectory(b):
        out.append("losses")
    sa, sb = state(a), state(b)
    if any(not torch.equal(v, sb["model"][k]) for k, v in sa["model"].items()):
        out.append("weights")
    oa, ob = sa["optimizer"]["state"], sb["optimizer"]["state"]
    if oa.keys() != ob.keys() or any(
            not torch.equal(torch.as_tensor(x), torch.as_tensor(ob[p][name]))
            for p, slots in oa.items() for name, x in slots.items()):
        out.append("optimizer state")
    if (a / "samples.txt").read_text() != (b / "samples.txt").read_text():
        out.append("samples")
    return out


def summary(run):
    return json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def straight(data_dir, tmp_path_factory):
    """The uninterrupted reference run."""
    results = tmp_path_factory.mktemp("straight")
    train(data_dir, results)
    return only_run_dir(results)


@pytest.fixture(scope="module")
def stopped_at_7(data_dir, tmp_path_factory):
    """The same run stopped after step 7 (checkpoints of steps 4 and 7 kept)."""
    results = tmp_path_factory.mktemp("stopped")
    proc = train(data_dir, results, "--stop-at-step=7", check=False)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    return results


def copy_run(results, tmp_path):
    dest = tmp_path / "results"
    shutil.copytree(results, dest, symlinks=True)
    return dest, only_run_dir(dest)


# ---- 1. exact resume, with the negative controls that prove the test can fail ----

def test_resume_in_a_fresh_process_is_exact(data_dir, straight, stopped_at_7, tmp_path):
    """(straight and stopped_at_7 ran in the test's process: the fresh process also
    shows that a run in one is the run of the other.)"""
    results, run = copy_run(stopped_at_7, tmp_path)
    assert summary(run)["status"] == "interrupted" and state(run)["step"] == 7
    proc = train(data_dir, results, process=True)
    assert "resuming" in proc.stdout and "from step 7" in proc.stdout
    assert differences(straight, run) == []


@pytest.mark.parametrize("fault, breaks", [
    ("forget-rng", "losses"),                 # dropout masks differ
    ("forget-optimizer", "optimizer state"),  # Adam restarts its moments
    ("forget-data-position", "losses"),       # batches from the start again
])
def test_each_piece_of_resume_state_is_needed(data_dir, straight, stopped_at_7, tmp_path,
                                              fault, breaks):
    results, run = copy_run(stopped_at_7, tmp_path)
    train(data_dir, results, faults=fault)
    assert breaks in differences(straight, run)


# ---- 2. kill -9 in the middle of writing a checkpoint ------------------------------

def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one(data_dir, straight, tmp_path):
    proc = train(data_dir, tmp_path, faults="kill-in-checkpoint@8", check=False)
    assert proc.returncode == -signal.SIGKILL
    run = only_run_dir(tmp_path)
    leftovers = list((run / "checkpoints").glob(".*.tmp"))
    assert leftovers and leftovers[0].stat().st_size <= 4096  # the half-written file
    assert os.readlink(run / "ckpt.pt") == "checkpoints/step-00000004.pt"
    assert state(run)["step"] == 4
    proc = train(data_dir, tmp_path)
    assert "from step 4" in proc.stdout
    assert differences(straight, run) == []
    assert not list((run / "checkpoints").glob(".*.tmp"))  # cleaned up by the next save


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(data_dir, tmp_path):
    """The disk fills up 4 KiB into step 8's checkpoint: one line, the partial file
    removed, ckpt.pt still on step 4's intact checkpoint (which resumes exactly, as
    after a kill above)."""
    from gpt2.training import checkpoint

    proc = train(data_dir, tmp_path, faults="enospc-in-checkpoint@8", check=False)
    run = only_run_dir(tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (f"error: disk full while writing {run}/checkpoints/"
                                   "step-00000008.pt: free space and run the same command "
                                   "again to resume")
    assert os.readlink(run / "ckpt.pt") == "checkpoints/step-00000004.pt"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step-00000004.pt", "step-00000004.pt.sha256"]  # nothing half-written is left
    checkpoint.verify(run / "checkpoints" / "step-00000004.pt")
    s = summary(run)
    assert s["status"] == "failed" and s["exit_status"] == 2 and "disk full" in s["error"]


# ---- 3. signals at any moment: in a step, in an evaluation, in data preparation ----

def test_signals_mid_step_and_mid_evaluation_stop_with_a_checkpoint(data_dir, straight,
                                                                   tmp_path):
    proc = train(data_dir, tmp_path, faults="sigusr1-in-step@6", check=False)
    run = only_run_dir(tmp_path)
    assert proc.returncode == 130 and "SIGUSR1 received" in proc.stdout
    assert "stopped at step 6" in proc.stdout and state(run)["step"] == 6
    # Step 8 ends with an evaluation: the stop abandons it and the resume redoes it.
    proc = train(data_dir, tmp_path, faults="sigterm-in-eval@8", check=False)
    assert proc.returncode == 130 and "SIGTERM during evaluation" in proc.stdout
    assert state(run)["step"] == 8 and not state(run)["after_step_done"]
    assert summary(run)["status"] == "interrupted"
    proc = train(data_dir, tmp_path)
    assert summary(run)["status"] == "completed"
    assert differences(straight, run) == []


def test_a_signal_during_a_long_evaluation_stops_within_seconds(data_dir, tmp_path):
    """A stop must not wait for the rest of an evaluation (here the whole validation
    split one window at a time on a wider model: about a thousand batches, many
    seconds): it is abandoned, and redone on resume. Judged by how far the evaluation
    got, which the stop message reports, not by a time on a busy machine."""
    cmd = [PY, str(REPO / "gpt2/train.py"), *TINY, f"--data-dir={data_dir}",
           f"--results-dir={tmp_path}", "--run-name=tiny", "--max-iters=4", "--n-embd=256",
           "--batch-size=1", "--eval-tokens=0", "--checkpoint-interval=100"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO)
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.startswith("memory predicted peak"):  # the evaluation of step 0 is next
            time.sleep(1.0)
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.stdout.read()
    rc = proc.wait(timeout=120)
    assert rc == 130, "".join(out) + rest
    done = re.search(r"SIGTERM during evaluation \(after ([\d,]+) of ([\d,]+) validation "
                     r"batches\)", rest)
    count = [int(g.replace(",", "")) for g in done.groups()] if done else []
    assert done and count[1] >= 500 and count[0] < count[1] / 2, rest
    run = only_run_dir(tmp_path)
    assert state(run)["step"] == 0 and not state(run)["after_step_done"]
    assert read_jsonl(run / "metrics.jsonl") == []  # nothing half-recorded


def test_a_signal_during_data_preparation_keeps_finished_shards(tmp_path, corpus, data_dir):
    args = ["--dataset=shakespeare", f"--data-dir={tmp_path}", f"--input={corpus}",
            "--val-fraction=0.1", "--shard-tokens=20000", "--prepare-workers=1"]
    proc = run_py("gpt2/prepare_data.py", *args, env={"KGPT_FAULTS": "sigterm-in-prepare@3"})
    assert proc.returncode == 130, proc.stderr
    assert "SIGTERM received" in proc.stderr and "Traceback" not in proc.stderr
    folder = tmp_path / "shakespeare"
    kept = len(list(folder.glob("*.bin")))  # one long piece may fill several at once
    assert kept >= 3 and f"{kept} finished shard(s) kept" in proc.stderr
    assert not (folder / "meta.json").exists()
    proc = run_py("gpt2/prepare_data.py", *args, check=True)
    assert f"{kept} finished shard(s) kept" in proc.stdout
    from gpt2.data.loader import open_split

    for split in ("train", "val"):  # the same tokens as a preparation never stopped
        a, b = open_split(tmp_path, "shakespeare", split), open_split(data_dir, "shakespeare", split)
        assert len(a) == len(b) and (a.read(0, len(a)) == b.read(0, len(b))).all()


# ---- 4. damaged checkpoints and shards ---------------------------------------------

def flip_a_bit_in_tensor_data(b: bytes) -> bytes:
    """One bit flipped in the middle of the largest tensor's bytes: the file still
    loads (torch stores tensor data uncompressed in its zip), so only the sha256
    check can tell."""
    import io
    import struct
    import zipfile

    entry = max(zipfile.ZipFile(io.BytesIO(b)).infolist(), key=lambda i: i.file_size)
    assert "/data/" in entry.filename and entry.compress_type == zipfile.ZIP_STORED
    name_len, extra_len = struct.unpack("<HH", b[entry.header_offset + 26:
                                                 entry.header_offset + 30])
    at = entry.header_offset + 30 + name_len + extra_len + entry.file_size // 2
    return b[:at] + bytes([b[at] ^ 0x10]) + b[at + 1:]


@pytest.mark.parametrize("damage", [
    lambda b: b[: len(b) // 2],                                   # truncated
    lambda b: b"",                                                # empty
    flip_a_bit_in_tensor_data,
], ids=["truncated", "empty", "bit-flipped"])
def test_a_damaged_checkpoint_is_refused_and_an_older_one_resumes(data_dir, straight,
                                                                  stopped_at_7, tmp_path,
                                                                  damage):
    results, run = copy_run(stopped_at_7, tmp_path)
    newest = run / os.readlink(run / "ckpt.pt")
    newest.write_bytes(damage(newest.read_bytes()))
    proc = train(data_dir, results, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{newest} is damaged" in proc.stderr
    assert "--resume-step=4" in proc.stderr  # the intact older checkpoint, and how to use it
    proc = train(data_dir, results, "--resume-step=4")
    assert "from step 4" in proc.stdout and "superseded-step-00000007.pt" in proc.stdout
    assert differences(straight, run) == []


def test_a_dangling_or_missing_checkpoint_link_never_restarts_silently(data_dir, straight,
                                                                     stopped_at_7, tmp_path):
    results, run = copy_run(stopped_at_7, tmp_path)
    link = run / "ckpt.pt"
    newest = run / os.readlink(link)
    hidden = newest.with_name("elsewhere")
    newest.rename(hidden)
    proc = train(data_dir, results, check=False)
    assert proc.returncode == 2 and "which is missing" in proc.stderr
    assert "--resume-step=4" in proc.stderr
    hidden.rename(newest)
    # No link at all (a kill between a first save and its link, or a deleted link):
    # the newest checkpoint that verifies is used.
    link.unlink()
    proc = train(data_dir, results)
    assert "resuming from the newest intact checkpoint" in proc.stdout
    assert "from step 7" in proc.stdout
    assert differences(straight, run) == []


def test_a_checkpoint_missing_state_is_refused_in_one_line(data_dir, stopped_at_7, tmp_path):
    """A checkpoint whose sha256 matches but which lacks what a resume reads (written
    by another kgpt, or edited and re-hashed)."""
    from gpt2.training import checkpoint
    from gpt2.training.checkpoint import sha256_file

    results, run = copy_run(stopped_at_7, tmp_path)
    target = run / os.readlink(run / "ckpt.pt")
    good = state(run)
    torch.save({k: v for k, v in good.items() if k not in ("optimizer", "data_position")},
               target)
    target.with_name(target.name + ".sha256").write_text(f"{sha256_file(target)}  x\n")
    proc = train(data_dir, results, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: {target} lacks optimizer, data_position")
    assert "--resume-step=4" in proc.stderr and len(proc.stderr.splitlines()) == 1
    # The same list of contents is what a save checks: the two cannot drift apart.
    with pytest.raises(ValueError, match="lacks optimizer"):
        checkpoint.save(run / "ckpt.pt", {k: v for k, v in good.items()
                                          if k not in ("format", "optimizer")}, 9)


def test_a_bit_flip_in_a_data_shard_is_refused(data_copy, tmp_path):
    shard = data_copy / TINY_DATASET / "train_000000.bin"
    raw = bytearray(shard.read_bytes())
    raw[1000] ^= 0x01  # header and size still right: only the hash can tell
    shard.write_bytes(bytes(raw))
    proc = train(data_copy, tmp_path, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "train_000000.bin is damaged" in proc.stderr and "make data" in proc.stderr


# ---- read-only results, and a folder where results/latest goes ---------------------

def test_a_read_only_results_folder_reports_a_finished_run_and_refuses_training(
        data_dir, straight, tmp_path, read_only, capsys):
    from gpt2 import train as train_py

    def args(results, *extra):
        return [*TINY, f"--data-dir={data_dir}", f"--results-dir={results}", "--run-name=tiny",
                *ARGS, *extra]

    linked, elsewhere = tmp_path / "linked", tmp_path / "elsewhere"
    for results in (linked, elsewhere):
        shutil.copytree(straight.parent, results, symlinks=True)
    (elsewhere / "latest").unlink()
    (elsewhere / "latest").symlink_to("another-run")
    read_only(linked)
    read_only(elsewhere)
    # Nothing to write: results/latest already names the run.
    assert train_py.main(args(linked)) == 0
    out, err = capsys.readouterr()
    assert "is already complete" in out and "note:" not in out and err == ""
    # results/latest names another run: moving it is skipped, with a note.
    assert train_py.main(args(elsewhere)) == 0
    out, err = capsys.readouterr()
    assert "is already complete" in out and err == ""
    assert f"note: cannot write {elsewhere / 'latest'} (Read-only file system)" in out
    assert os.readlink(elsewhere / "latest") == "another-run"
    # A run not trained yet: one line naming the folder and the setting that moves it.
    assert train_py.main(args(elsewhere, "--seed=5")) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert err.startswith(f"error: cannot write {elsewhere}/tiny-") and len(err.splitlines()) == 1
    assert "(Read-only file system)" in err and "CONFIG_RESULTS_DIR" in err
    # (what the copied folder held, and nothing else: train.py writes no page itself)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["latest", straight.name]


def test_a_folder_named_latest_is_left_alone_with_a_note(tmp_path, capsys):
    from gpt2.config.options import resolve
    from gpt2.storage import StorageError
    from gpt2.run_folder import RunDir
    from gpt2.storage import point_link

    (tmp_path / "latest").mkdir()
    (tmp_path / "latest" / "notes.txt").write_text("mine")
    run = RunDir(resolve({"results_dir": str(tmp_path), "run_name": "tiny"}))
    run.create("", {})
    out = capsys.readouterr().out
    assert out.startswith(f"note: {tmp_path / 'latest'} is a folder, not the link kgpt keeps")
    assert (tmp_path / "latest" / "notes.txt").read_text() == "mine"
    # A plain file is never replaced either; the matrix's link is refused in one line.
    (tmp_path / "latest-matrix").write_text("mine")
    with pytest.raises(StorageError, match="latest-matrix is a file, not the link"):
        point_link(tmp_path / "latest-matrix", "matrix-x")
    assert (tmp_path / "latest-matrix").read_text() == "mine"


# ---- 5. NaN / inf loss --------------------------------------------------------------

def test_a_nan_loss_stops_before_the_update_and_says_what_to_try(data_dir, tmp_path):
    proc = train(data_dir, tmp_path, faults="nan-loss@6", check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    run = only_run_dir(tmp_path)
    assert "the loss of step 6 is nan" in proc.stdout
    assert "checkpoint of step 4 is kept" in proc.stdout
    assert "CONFIG_LEARNING_RATE" in proc.stdout and "CONFIG_NONFINITE_SKIP=y" in proc.stdout
    s = summary(run)
    assert s["status"] == "failed" and s["exit_status"] == 3 and s["iters"] == 5
    assert state(run)["step"] == 4
    assert all(torch.isfinite(v).all() for v in state(run)["model"].values())


def test_the_skip_policy_drops_the_bad_step_and_resumes_a_stopped_run(data_dir, tmp_path):
    """Stopped by a NaN, then resumed under the skip policy (same run folder: the
    policy is not hashed), ends where a skip run from the start ends."""
    skipped = tmp_path / "skip"
    proc = train(data_dir, skipped, "--nonfinite=skip", faults="nan-loss@6")
    assert "loss nan is not finite: step skipped" in proc.stdout
    run = only_run_dir(skipped)
    assert summary(run)["status"] == "completed"
    assert summary(run)["nonfinite_skipped_steps"] == 1
    assert all(torch.isfinite(v).all() for v in state(run)["model"].values())
    rows = {r["step"]: r for r in read_jsonl(run / "metrics.jsonl")}
    assert rows[6]["skipped_steps"] == 1 and rows[16]["val_loss"] < rows[0]["val_loss"]

    stopped = tmp_path / "stop-then-skip"
    assert train(data_dir, stopped, faults="nan-loss@6", check=False).returncode == 3
    proc = train(data_dir, stopped, "--nonfinite=skip", faults="nan-loss@6")
    assert "from step 4" in proc.stdout
    assert differences(run, only_run_dir(stopped)) == []


def test_the_skip_policy_gives_up_after_too_many_bad_steps_in_a_row(data_dir, tmp_path):
    proc = train(data_dir, tmp_path, "--nonfinite=skip", "--nonfinite-max-skips=2",
                 faults="inf-loss", check=False)
    assert proc.returncode == 3
    assert "for 3 steps in a row, the last at step 3" in proc.stdout


# ---- 6. out of memory (simulated: the CPU has no CUDA allocator to exhaust) ----------

def test_out_of_memory_is_reported_with_the_estimate_and_what_to_change(data_dir, tmp_path):
    proc = train(data_dir, tmp_path, faults="oom@6", check=False)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    out = proc.stdout
    assert "out of memory in step 6" in out
    assert "predicted peak" in out and "activations" in out  # the estimator's breakdown
    assert "CONFIG_BATCH_SIZE=" in out or "CONFIG_ACTIVATION_CHECKPOINTING" in out
    assert "checkpoint of step 4 is intact" in out
    run = only_run_dir(tmp_path)
    assert summary(run)["status"] == "failed" and summary(run)["exit_status"] == 4
    assert state(run)["step"] == 4


# ---- 8. unsafe checkpoints ----------------------------------------------------------

class _RunsCode:
    """A pickle that runs a command when loaded with weights_only=False."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_every_file_the_framework_writes_loads_weights_only(straight):
    files = list(straight.rglob("*.pt"))
    assert len(files) >= 2  # the kept checkpoints
    for path in files:
        torch.load(path, weights_only=True)


def test_a_crafted_pickle_checkpoint_is_refused_without_running_it(data_dir, stopped_at_7,
                                                                  tmp_path):
    from gpt2.training.checkpoint import sha256_file

    results, run = copy_run(stopped_at_7, tmp_path)
    marker = tmp_path / "pwned"
    target = run / os.readlink(run / "ckpt.pt")
    good = state(run)
    torch.save({**good, "payload": _RunsCode(marker)}, target)
    # A matching checksum, so only the weights-only loader stands in the way.
    target.with_name(target.name + ".sha256").write_text(f"{sha256_file(target)}  x\n")
    for proc in (train(data_dir, results, check=False),
                 call_main("gpt2/generate.py", f"--run-dir={run}", "--max-new-tokens=2")):
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "could run code" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()


def test_every_test_docs_reliability_names_exists():
    """docs/reliability.md names the test that keeps each promise: each must exist."""
    import re

    doc = (REPO / "docs" / "reliability.md").read_text()
    sources = "".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    named = set(re.findall(r"\b(test_[a-z0-9_]+)\b", doc)) - {
        n for n in re.findall(r"\b(test_[a-z0-9_]+)\.py", doc)}
    assert len(named) >= 25
    missing = sorted(n for n in named if f"def {n}(" not in sources)
    assert missing == []
