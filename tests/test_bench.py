"""The optimizer benchmark runs and prints one row per pair, relative to AdamW."""

from __future__ import annotations

from conftest import run_py


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
