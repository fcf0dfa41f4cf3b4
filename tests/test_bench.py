"""The optimizer benchmark runs and prints one row per pair, relative to AdamW."""

from __future__ import annotations

from helpers import run_py


def test_bench_optim_prints_ratios_against_adamw():
    proc = run_py("scripts/bench_optim.py", "--device=cpu", "--n-layer=2", "--n-head=2",
                  "--n-embd=128", "--block-size=16", "--batch-size=2", "--steps=2",
                  "--warmup=1", "--only=adamw,muon", check=True)
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.startswith(("adamw ", "muon "))]
    assert [r[:2] for r in rows] == [["adamw", "none"], ["adamw", "magnitude"],
                                     ["adamw", "movement"], ["muon", "none"],
                                     ["muon", "magnitude"], ["muon", "movement"]]
    assert rows[0][3] == "1.00" and rows[0][5] == "1.00"
    # movement keeps a float32 score per target weight on top of AdamW's two moments
    assert float(rows[2][5]) > float(rows[1][5]) > 1.0


def test_make_bench_measures_the_configured_model_and_writes_json(tmp_path):
    import json

    from helpers import run_make
    from gpt2.training.flops import flops_per_token

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
    from gpt2.training.device import COMPILE_MODES, Runtime

    table = {(mode, device): Runtime(device, "float32").compiles(mode)
             for mode in COMPILE_MODES for device in ("cuda", "cuda:1", "cpu", "mps")}
    assert [key for key, on in table.items() if on] == [
        ("auto", "cuda"), ("auto", "cuda:1"), ("on", "cuda"), ("on", "cuda:1"), ("on", "cpu"),
        ("on", "mps")]
