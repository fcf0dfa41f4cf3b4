"""The optimizer benchmark runs and prints one row per pair, relative to AdamW."""

from __future__ import annotations

import pytest
from helpers import run_py


@pytest.mark.e2e
def test_bench_optim_prints_ratios_against_adamw():
    proc = run_py("scripts/bench_optim.py", "--device=cpu", "--n-layer=2", "--n-head=2",
                  "--n-embd=128", "--block-size=16", "--batch-size=2", "--steps=2",
                  "--warmup=1", "--only=adamw,muon", "--pruning=none,magnitude,movement,rigl",
                  check=True)
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.startswith(("adamw ", "muon "))]
    assert [r[:2] for r in rows] == [["adamw", "none"], ["adamw", "magnitude"],
                                     ["adamw", "movement"], ["adamw", "rigl"],
                                     ["muon", "none"], ["muon", "magnitude"],
                                     ["muon", "movement"], ["muon", "rigl"]]
    # RigL keeps a mask (and its generator), as magnitude keeps a mask
    assert float(rows[3][-1]) == pytest.approx(float(rows[1][-1]), abs=0.02)
    rows = [r for r in rows if r[1] != "rigl"]
    # step, optimizer step and state, each against the first row's
    assert rows[0][3] == rows[0][5] == rows[0][-1] == "1.00" and len(rows[0]) == 8
    # movement keeps a float32 score per target weight on top of AdamW's two moments
    assert float(rows[2][-1]) > float(rows[1][-1]) > 1.0
    # Muon's rows add the time of its Newton-Schulz iterations alone
    assert all(len(r) == 9 and float(r[6]) > 0 for r in rows[3:])
    assert float(rows[3][-1]) < 1.0  # one momentum buffer (not two moments) per block matrix


@pytest.mark.e2e
def test_make_bench_measures_the_configured_model_and_writes_json(tmp_path):
    import json

    from helpers import run_make
    from gpt2.estimates.flops import flops_per_token

    config = tmp_path / "config"
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_make("defconfig-gpt2-shakespeare-cpu", env=env).returncode == 0
    proc = run_make("bench", "BENCH_ARGS=--steps 3 --warmup 1",
                    f"TRAIN_ARGS=--n-layer=2 --n-embd=64 --block-size=32 --batch-size=4 "
                    f"--gradient-accumulation=2 --results-dir={tmp_path}/r", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "tokens/s (median of 3 steps after 1 warm-up)" in proc.stdout
    assert "MFU n/a" in proc.stdout  # no peak for a CPU
    [path] = (tmp_path / "r" / "bench").iterdir()
    r = json.loads(path.read_text())
    assert r["tokens_per_step"] == 4 * 32 * 2 and len(r["step_times_s"]) == 3
    assert r["config"]["n_layer"] == 2 and r["config"]["gradient_accumulation"] == 2
    assert r["tokens_per_sec"] == r["tokens_per_step"] / r["step_time_s"]["median"]
    assert r["flops_per_token"] == flops_per_token(r["n_params"] - 32 * 64, 2, 64, 32)
    assert r["achieved_tflops"] == r["tokens_per_sec"] * r["flops_per_token"] / 1e12
    assert r["mfu"] is None
    p10, median, p90 = (r["step_time_s"][k] for k in ("p10", "median", "p90"))
    assert min(r["step_times_s"]) <= p10 <= median <= p90 <= max(r["step_times_s"])


def test_compile_auto_compiles_on_cuda_only():
    from gpt2.config.choices import COMPILE_MODES
    from gpt2.runtime.device import Runtime

    table = {(mode, device): Runtime(device, "float32").compiles(mode)
             for mode in COMPILE_MODES for device in ("cuda", "cuda:1", "cpu", "mps")}
    assert [key for key, on in table.items() if on] == [
        ("auto", "cuda"), ("auto", "cuda:1"), ("on", "cuda"), ("on", "cuda:1"), ("on", "cpu"),
        ("on", "mps")]


@pytest.mark.e2e
def test_a_sweep_row_the_memory_check_refuses_is_a_prediction_not_an_out_of_memory(tmp_path):
    """The check's refusal says "This would run out of memory": a row must still read
    as what it was (seen on an H200: math attention, predicted at 204 GiB, was
    reported as "out of memory")."""
    import json
    import re

    out = tmp_path / "sweep.json"
    run_py("scripts/bench.py", "--model-size=custom", "--n-layer=1", "--n-head=2",
           "--n-embd=32", "--block-size=16", "--batch-size=2", "--device=cpu",
           "--dtype=float32", "--steps=1", "--warmup=1", f"--results-dir={tmp_path}",
           f"--json={out}", "--sweep=memory_budget_mb=0,1", check=True)
    rows = {r["settings"]["memory_budget_mb"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["0"]["status"] == "measured"
    assert rows["1"]["status"] == "failed"
    assert re.fullmatch(r"predicted not to fit: [\d,.]+ MiB against 1 MiB", rows["1"]["note"])


@pytest.mark.e2e
def test_the_bench_sweep_measures_every_combination_at_the_same_tokens_per_step(tmp_path):
    """--sweep: one child process per combination; batch sizes keep the sequences per
    step (accumulation adjusted, a size that does not divide them skipped); a
    combination that cannot run is a row saying why; the fastest is named."""
    import json

    from helpers import run_py

    out = tmp_path / "sweep.json"
    proc = run_py("scripts/bench.py", "--model-size=custom", "--n-layer=1", "--n-head=2",
                  "--n-embd=32", "--block-size=16", "--batch-size=2",
                  "--gradient-accumulation=2", "--device=cpu", "--dtype=float32",
                  "--steps=2", "--warmup=1", f"--results-dir={tmp_path}", f"--json={out}",
                  "--sweep", "batch_size=1,3,4", "--sweep=attention_backend=math,efficient",
                  check=True)
    r = json.loads(out.read_text())
    rows = {(row["settings"]["batch_size"], row["settings"]["attention_backend"]): row
            for row in r["rows"]}
    assert len(rows) == 6
    for batch, accumulation in (("1", 4), ("4", 1)):
        row = rows[batch, "math"]
        assert row["status"] == "measured" and row["micro_batch"] == int(batch)
        assert row["gradient_accumulation"] == accumulation and row["tokens_per_step"] == 64
        assert row["config"]["attention_backend"] == "math"
        assert "need a CUDA GPU" in rows[batch, "efficient"]["note"]
    assert {rows["3", b]["status"] for b in ("math", "efficient")} == {"skipped"}
    fastest = max((rows[b, "math"] for b in ("1", "4")), key=lambda row: row["tokens_per_sec"])
    assert (f"best     --batch-size={fastest['micro_batch']} --attention-backend=math "
            in proc.stdout)
    proc = run_py("scripts/bench.py", "--sweep", "batch_sise=1,2")
    assert proc.returncode == 2 and "'batch_sise' is not a training setting" in proc.stderr


def test_a_swept_on_off_setting_becomes_its_flag_or_its_negation():
    """--sweep loss_fused=n,y: on/off settings are flags without a value (a child
    given --loss-fused=y would refuse it); spellings other than on/off words are a
    usage error, not a silent "off"."""
    import argparse

    import pytest

    from scripts.bench import parse_sweeps, setting_flag

    parser = argparse.ArgumentParser()
    sweeps = parse_sweeps(parser, ["loss_fused=No,TRUE,1", "batch_size=8"])
    assert sweeps == {"loss_fused": ["n", "y", "y"], "batch_size": ["8"]}
    assert [setting_flag("loss_fused", v) for v in ("n", "y")] == ["--no-loss-fused",
                                                                   "--loss-fused"]
    assert setting_flag("batch_size", "8") == "--batch-size=8"
    with pytest.raises(SystemExit):
        parse_sweeps(parser, ["loss_fused=maybe"])


def test_a_sweep_row_leaves_out_the_settings_it_takes_out_of_force():
    """--sweep compile=off,on on a compiled configuration: the off row must not carry
    the compile mode and backend, which train.py refuses where they do nothing (the
    off row was "not measured" before make gpu-check found it)."""
    from scripts.bench import in_force

    argv = ["--compile=on", "--compile-mode=default", "--compile-backend=aot_eager",
            "--batch-size=4", "--sparse-kernel=auto", "--pruning-structure=2:4"]
    assert in_force(argv, {"compile": "off"}) == ["--compile=on", "--batch-size=4",
                                                  "--sparse-kernel=auto",
                                                  "--pruning-structure=2:4"]
    assert in_force(argv, {"compile": "on"}) == argv
    assert "--sparse-kernel=auto" not in in_force(argv, {"pruning_structure": "unstructured"})


@pytest.mark.e2e
def test_the_bench_of_a_2of4_model_measures_it_at_its_final_masks_and_names_the_kernel(
        tmp_path):
    """With 2:4 masks the bench compares dense and sparse kernels on the same model:
    masks final from the first step; on the CPU it says no sparse kernel ran, and a
    sweep's sparse_kernel=on row says why it cannot."""
    import json

    from helpers import run_py

    out = tmp_path / "sweep.json"
    proc = run_py("scripts/bench.py", "--model-size=custom", "--n-layer=1", "--n-head=2",
                  "--n-embd=32", "--block-size=16", "--batch-size=2", "--device=cpu",
                  "--dtype=float32", "--steps=2", "--warmup=1", "--pruning-method=magnitude",
                  "--pruning-structure=2:4", "--target-sparsity=0.5",
                  f"--results-dir={tmp_path}", f"--json={out}",
                  "--sweep", "sparse_kernel=off,auto,on", check=True)
    rows = {row["settings"]["sparse_kernel"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["off"]["status"] == rows["auto"]["status"] == "measured"
    assert rows["auto"]["sparse_kernel"]["used"] is False
    assert "no semi-structured sparse kernel on cpu" in rows["auto"]["sparse_kernel"]["note"]
    assert rows["on"]["status"] != "measured" and "CONFIG_SPARSE_KERNEL_ON, but" in rows["on"]["note"]
    # the measured model is the pruned one, from its first step (warm-up 1, then 2)
    assert rows["off"]["sparse_kernel"]["sparsity"] == 0.5
    proc = run_py("scripts/bench.py", "--model-size=custom", "--n-layer=1", "--n-head=2",
                  "--n-embd=32", "--block-size=16", "--batch-size=2", "--device=cpu",
                  "--dtype=float32", "--steps=1", "--warmup=0", "--pruning-method=magnitude",
                  "--pruning-structure=2:4", "--target-sparsity=0.5", "--sparse-kernel=auto",
                  f"--results-dir={tmp_path}", check=True)
    assert json.loads(next((tmp_path / "bench").glob("*.json")).read_text()
                      )["sparse_kernel"]["sparsity"] == 0.5
    assert ("sparse   no sparse kernel used: PyTorch has no semi-structured sparse kernel on "
            "cpu" in proc.stdout)
