"""A single run submitted to a real Slurm with `make train SLURM=1` (the local cluster of
scripts/slurm_cluster.py): two processes started the multi-node way (srun, one launcher
per node, torchrun's rendezvous from Slurm's environment), stopped by a plain scancel,
resumed by submitting again, ending exactly as the same run trained here."""

from __future__ import annotations

import json
import re

import pytest

from helpers import read_jsonl, run_make
from slurm import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


def config(tmp_path, data_dir, results):
    path = tmp_path / f"config-{results.name}"
    path.write_text(f"""CONFIG_MODEL_SIZE_CUSTOM=y
CONFIG_N_LAYER=2
CONFIG_N_HEAD=2
CONFIG_N_EMBD=32
CONFIG_BLOCK_SIZE=32
CONFIG_BATCH_SIZE=4
CONFIG_GRADIENT_ACCUMULATION=2
CONFIG_MAX_ITERS=24
CONFIG_WARMUP_ITERS=3
CONFIG_EVAL_INTERVAL=8
CONFIG_EVAL_TOKENS=256
CONFIG_LOG_INTERVAL=2
CONFIG_CHECKPOINT_INTERVAL=4
CONFIG_SAMPLE_TOKENS=0
CONFIG_DEVICE_CPU=y
CONFIG_DTYPE_FLOAT32=y
CONFIG_CPU_THREADS=1
CONFIG_DATA_WORKERS=0
CONFIG_NPROC_PER_NODE=2
CONFIG_DATA_DIR="{data_dir}"
CONFIG_RESULTS_DIR="{results}"
CONFIG_RUN_NAME="tiny"
CONFIG_SLURM_CPUS=2
""")
    assert run_make("olddefconfig", env={"KCONFIG_CONFIG": str(path)}).returncode == 0
    return path


def losses(run_dir):
    return [(r["step"], r.get("loss"), r.get("val_loss")) for r in
            read_jsonl(run_dir / "metrics.jsonl")]


def test_a_two_process_run_on_slurm_stops_at_scancel_and_resumes_exactly(
        tmp_path, data_dir, slurm_cluster):
    here = config(tmp_path, data_dir, tmp_path / "here")
    assert run_make("train", env={"KCONFIG_CONFIG": str(here)}).returncode == 0
    [reference] = [d for d in (tmp_path / "here").iterdir() if d.name.startswith("tiny-")]

    results = tmp_path / "slurm"
    path = config(tmp_path, data_dir, results)
    env = {"KCONFIG_CONFIG": str(path), **slurm_cluster.env, "KGPT_FAULTS": "slow-steps"}
    first = run_make("train", "SLURM=1", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    job = re.search(r"as job (\d+) ", first.stdout)[1]
    run = results / reference.name  # the same configuration: the same folder name
    # Submitting again while it runs submits nothing.
    again = run_make("train", "SLURM=1", env=env)
    assert again.returncode == 0 and f"as Slurm job {job}: nothing submitted" in again.stdout
    wait_for(lambda: (run / "ckpt.pt").exists() and losses(run)[-1][0] >= 6, 90,
             "the run's first checkpoint", 0.5)
    slurm_cluster.run("scancel", job)  # every process of the job gets SIGTERM
    slurm_cluster.wait_gone(job, timeout=60)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary
    out = (results / "slurm" / f"{run.name}-{job}.out").read_text()
    assert "torchrun --nnodes=1 --rdzv_backend=c10d --rdzv_endpoint=" in out
    assert f"--rdzv_id={job}" in out and "x 2 processes" in out
    resumed = run_make("train", "SLURM=1", env={**env, "KGPT_FAULTS": ""})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    second = re.search(r"as job (\d+) ", resumed.stdout)[1]
    slurm_cluster.wait_gone(second, timeout=120)
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert "resuming" in (results / "slurm" / f"{run.name}-{second}.out").read_text()
    assert losses(run) == losses(reference)
