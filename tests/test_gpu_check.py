"""make gpu-check's bookkeeping: the budget, the parts skipped with their reason, a
report rewritten as each part ends. (The parts themselves run in CI: .ci/run calls
`make gpu-check`, tiny shapes on the CPU.)"""

from __future__ import annotations

import json
import time

import pytest

from scripts import gpu_check


@pytest.fixture
def fake_parts(monkeypatch):
    """Parts that take no time and record what the report held when each began."""
    seen = {}

    def runner(name):
        def run(check, part):
            seen[name] = json.loads((check.folder / "results.json").read_text()) \
                if (check.folder / "results.json").exists() else None
            part.lines.append(f"{name} ran")
            if name == "optim":  # it fails, and leaves a second of the budget
                check.budget = time.monotonic() - check.start + 1
                raise gpu_check.Failed("planted failure")
        return run

    monkeypatch.setattr(gpu_check, "RUNNERS", {n: runner(n) for n in gpu_check.PARTS})
    return seen


def test_parts_run_in_order_skip_with_their_reason_and_the_report_grows(tmp_path, monkeypatch,
                                                                        fake_parts):
    # Parts estimated at 10 s (2.5 s once the instant mission scales them by its
    # floor, a quarter), a minute's budget; optim uses all but a second of it.
    monkeypatch.setattr(gpu_check, "ESTIMATES", {n: (10, 10) for n in gpu_check.PARTS})
    check = gpu_check.Check(1, gpu_check.PARTS, root=tmp_path)
    rc = check.run()
    assert rc == 1  # optim failed: the command says so
    data = json.loads((check.folder / "results.json").read_text())
    status = {p["name"]: p["status"] for p in data["parts"]}
    assert status == {"mission": "done", "bench": "done", "optim": "failed",
                      "sparse": "skipped", "track3": "skipped", "char": "skipped",
                      "matrix": "skipped"}, status
    notes = {p["name"]: p["note"] for p in data["parts"]}
    assert notes["optim"] == "planted failure"
    assert "about 2 s needed" in notes["sparse"] and "left of the budget" in notes["sparse"]
    # Each part found the one before it already in results.json (a check cut short
    # keeps what it finished).
    assert fake_parts["mission"] is None
    assert [p["status"] for p in fake_parts["optim"]["parts"][:2]] == ["done", "done"]
    report = (check.folder / "report.md").read_text()
    assert report.startswith("# gpu-check: cpu") and "No GPU" in report
    assert "| sparse | skipped |" in report and "bench ran" in report
    assert data["tiny_shapes"] is True and data["device"] == "cpu"
    assert check.folder.name.startswith("gpu-check-cpu-")


def test_without_git_the_sources_hash_names_the_check(tmp_path, monkeypatch, fake_parts):
    """A lent machine gets the working tree without .git: the folder and the report
    name the code by its sources' hash, as every run folder records it."""
    code = {"sources": "0123456789abcdef", "commit": None, "dirty": None}
    monkeypatch.setattr(gpu_check, "code_identity", lambda: code)
    check = gpu_check.Check(5, ("char",), root=tmp_path)
    assert check.folder.name == "gpu-check-cpu-src-0123456789"
    check.run()
    assert "- code: src 0123456789abcdef\n" in (check.folder / "report.md").read_text()
    assert json.loads((check.folder / "results.json").read_text())["commit"] is None


def test_only_the_parts_asked_for_run(tmp_path, monkeypatch, fake_parts):
    monkeypatch.setattr(gpu_check, "ESTIMATES", {n: (1, 1) for n in gpu_check.PARTS})
    check = gpu_check.Check(5, ("char",), root=tmp_path)
    assert check.run() == 0
    data = json.loads((check.folder / "results.json").read_text())
    assert [p["name"] for p in data["parts"] if p["status"] == "done"] == ["char"]
    assert {p["note"] for p in data["parts"] if p["name"] != "char"} == {
        "not in GPU_CHECK_PARTS"}


@pytest.mark.parametrize("env,message", [
    ({"GPU_CHECK_MINUTES": "0"}, "between 1 and 600"),
    ({"GPU_CHECK_MINUTES": "nine"}, "between 1 and 600"),
    ({"GPU_CHECK_PARTS": "mission rm"}, "names 'rm'")])
def test_bad_settings_are_refused_before_anything_runs(monkeypatch, capsys, env, message):
    for key in ("GPU_CHECK_MINUTES", "GPU_CHECK_PARTS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(gpu_check, "Check", None)  # (nothing may be built)
    assert gpu_check.main() == 2
    assert message in capsys.readouterr().err


@pytest.mark.e2e
def test_on_a_gpu_every_part_configures_its_preset_as_make_takes_it(tmp_path, monkeypatch):
    """The GPU side, without a GPU: with CUDA faked, each part's .config is written by
    the real `make defconfig-*` and `make setconfig` (a setting kgpt refuses would
    fail it there, in minutes that cannot be had back); what would train is recorded,
    not run. The device, its driver and its build head the report."""
    import types

    torch = gpu_check.torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(
        major=9, minor=0, total_memory=85_000_000_000))
    monkeypatch.setattr(gpu_check, "nvidia_driver", lambda: "580.1")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    real = gpu_check.Check.make
    ran = []

    def make(self, part, *args, **kw):
        if args and (args[0].startswith("defconfig-") or args[0] == "setconfig"):
            return real(self, part, *args, **kw)
        ran.append((part.name, args))
        return 0, ""

    monkeypatch.setattr(gpu_check.Check, "make", make)
    check = gpu_check.Check(60, gpu_check.PARTS, root=tmp_path)
    assert check.gpu and check.folder.name.startswith("gpu-check-nvidia-h100-80gb-hbm3-")
    check.run()
    data = json.loads((check.folder / "results.json").read_text())
    notes = {p["name"]: p["note"] for p in data["parts"]}
    assert not any("defconfig" in n or "setconfig" in n for n in notes.values()), notes
    # What would have trained: the H100's preset benched, the L4's trained.
    configs = {p: (check.folder / "configs" / f"{p}.config").read_text()
               for p in ("mission", "bench", "sparse", "track3", "char", "matrix")}
    assert 'CONFIG_RUN_NAME="bench-h100"' in configs["bench"]
    assert "CONFIG_BATCH_SIZE=64" in configs["bench"]
    assert "CONFIG_BATCH_SIZE=16" in configs["mission"] and "CONFIG_MAX_ITERS=60" in configs[
        "mission"]
    assert "CONFIG_PRUNING_STRUCTURE_2_4=y" in configs["sparse"]
    # track 3's step as its preset trains it, bfloat16 table and all
    for line in ("CONFIG_MODEL_PRECISION_BF16_TABLE=y", "CONFIG_BATCH_SIZE=64",
                 "CONFIG_GRADIENT_ACCUMULATION=8", "CONFIG_DEVICE_CUDA=y"):
        assert line in configs["track3"], line
    assert ("track3", ("bench", "BENCH_ARGS=--steps=5 --warmup=2 --json="
                       f"{check.folder / 'logs' / 'track3-optimizers.json'} "
                       "--sweep=optimizer=muon,adamw")) in ran
    assert "CONFIG_N_LAYER=6" in configs["char"] and "CONFIG_DEVICE_CUDA=y" in configs["matrix"]
    assert "CONFIG_MATRIX_OPTIMIZER_MUON=y" in configs["matrix"]
    assert 'CONFIG_MATRIX_SEEDS="1337 1338"' in configs["matrix"]
    assert ("optim", ("bench-optim", "BENCH_ARGS=--device=cuda --dtype=bfloat16 "
                      "--model-size=gpt2 --block-size=1024 --batch-size=8 --steps=10 "
                      "--warmup=3 --pruning=none")) in ran
    # the resume check runs eager on a GPU (compiling twice more took about 200 s of an H200's 8.3 minutes)
    assert ("mission", ("resume-check", "TRAIN_ARGS=--max-iters=60 --compile=off")) in ran
    report = (check.folder / "report.md").read_text()
    assert "NVIDIA H100 80GB HBM3 (CUDA 13.0, compute capability 9.0" in report and "driver 580.1" in report
    assert "No GPU" not in report


def test_the_mission_reports_the_last_log_intervals_rate_of_the_newest_run(tmp_path):
    """A short compiled run's own rate is mostly its first step: the report sets the
    last logged interval's rate beside it, from the newest run, skipping the rows
    (evaluations) that carry none."""
    import os

    old, new = tmp_path / "mission-old", tmp_path / "mission-new"
    for folder, rows in ((old, [{"step": 60, "tokens_per_sec": 1.0}]),
                         (new, [{"step": 15, "tokens_per_sec": 19_890.0},
                                {"step": 60, "tokens_per_sec": 428_455.0},
                                {"step": 60, "val_loss": 6.02}])):
        folder.mkdir()
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.utime(old / "metrics.jsonl", (1, 1))
    assert gpu_check.last_interval_rate(tmp_path) == 428_455.0
    assert gpu_check.last_interval_rate(tmp_path / "none") is None
