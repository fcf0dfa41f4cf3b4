"""The tiny test matrix and what its tests read back, shared by the local runner's tests
(test_matrix_run.py) and the Slurm backend's (test_slurm_matrix.py)."""

from __future__ import annotations

import csv
from pathlib import Path

from helpers import run_target
from gpt2.config import kconfig
from gpt2.matrix.plan import plan_from_dotconfig

CELLS = ["adamw-none-seed1337", "adamw-magnitude-50-seed1337", "adamwprune-none-seed1337",
         "adamwprune-state-50-seed1337"]
# Columns that must not depend on how often the matrix was stopped (speed and wall
# time do).
STABLE = ("cell", "optimizer", "pruning", "target_sparsity", "final_sparsity", "seed", "status",
          "final_val_loss", "best_val_loss", "final_val_ppl", "config_hash")
# (no lr_sweep.png: the tiny matrix has no learning-rate grid, and a plot with nothing
# to show is not drawn)
PLOTS = {"val_loss.png", "val_loss_tokens_time.png", "ppl_heatmap.png",
         "ppl_vs_sparsity.png", "sparsity_vs_step.png", "throughput_memory.png",
         "lr_schedule.png"}


def tiny_matrix(tmp: Path, data_dir: Path, max_iters: int = 40, extra: str = "") -> Path:
    """A 4-cell matrix .config (2 optimizers x their valid methods at 50 %); ``extra``
    lines are added to it. Characters, not GPT-2's tokens (helpers.TINY_DATASET), so
    AdamWPrune's threshold is the exact one: a 2 % sample of the small model's 27k
    scores lands 0.03 from the target, where the matrix's tests check 0.001."""
    config = tmp / "config"
    config.write_text(f"""CONFIG_DATASET_SHAKESPEARE_CHAR=y
CONFIG_MODEL_SIZE_CUSTOM=y
CONFIG_N_LAYER=2
CONFIG_N_HEAD=2
CONFIG_N_EMBD=32
CONFIG_BLOCK_SIZE=32
CONFIG_BATCH_SIZE=4
CONFIG_MAX_ITERS={max_iters}
CONFIG_LEARNING_RATE="3e-3"
CONFIG_MIN_LR="3e-4"
CONFIG_WARMUP_ITERS=3
CONFIG_EVAL_INTERVAL=10
CONFIG_EVAL_TOKENS=256
CONFIG_LOG_INTERVAL=5
CONFIG_CHECKPOINT_INTERVAL=5
CONFIG_SAMPLE_TOKENS=0
CONFIG_DEVICE_CPU=y
CONFIG_DTYPE_FLOAT32=y
CONFIG_CPU_THREADS=1
CONFIG_DATA_WORKERS=0
CONFIG_DATA_DIR="{data_dir}"
CONFIG_RESULTS_DIR="{tmp / 'results'}"
CONFIG_RUN_NAME="tiny"
CONFIG_PRUNING_WARMUP=5
CONFIG_PRUNING_FREQUENCY=5
CONFIG_MATRIX=y
CONFIG_MATRIX_OPTIMIZER_ADAMW=y
CONFIG_MATRIX_OPTIMIZER_ADAMWPRUNE=y
CONFIG_MATRIX_PRUNING_NONE=y
CONFIG_MATRIX_PRUNING_MAGNITUDE=y
CONFIG_MATRIX_PRUNING_STATE=y
CONFIG_MATRIX_SPARSITIES="0.5"
CONFIG_STATE_THRESHOLD_EXACT=y
{extra}""")
    # A complete .config, as `make olddefconfig` would leave it.
    proc = run_target("olddefconfig", env={"KCONFIG_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stderr
    return config


def folder_of(config: Path) -> Path:
    return plan_from_dotconfig(kconfig.load(config), []).folder


def run_matrix(config: Path, *make_args: str, env: dict | None = None):
    """`make test-matrix` on ``config``, its bridge in this process (helpers.run_target);
    the runner starts the cells as processes (or forks them from its cell server), so
    what is tested of them is as through make. The tests of a runner that is killed or
    stopped start the bridge as a process of its own (test_matrix_run._start)."""
    return run_target("test-matrix", *make_args,
                      env={"KCONFIG_CONFIG": str(config), **(env or {})})


def read_csv(folder: Path) -> list[dict]:
    with open(folder / "summary.csv") as f:
        return list(csv.DictReader(f))


def stable(rows: list[dict]) -> list[tuple]:
    return [tuple(r[k] for k in STABLE) for r in rows]
