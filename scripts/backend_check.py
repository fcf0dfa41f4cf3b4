#!/usr/bin/env python3
"""Do the local runner and the Slurm backend get the same matrix results?

Runs one matrix preset twice from scratch, each into a results folder of its own:
with the local runner, then with the Slurm backend on the local test cluster
(scripts/slurm_cluster.py, started if it is not up), and compares the two
summary.csv files column by column. Speed, wall time and peak memory are
measurements of the machine, not results, and are only shown.

    python -m scripts.backend_check                       # the CPU matrix preset
    python -m scripts.backend_check --preset gpt2-shakespeare-tune-cpu --slurm-cpus 2

Exit status 0 when every other column is equal in every cell. Needs root and
Debian's slurmctld slurmd slurm-client munge (as the local cluster does); on the
2-core machine the CPU matrix preset takes about 20 minutes per backend.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

from gpt2 import REPO
from gpt2.config import kconfig
from gpt2.matrix.plan import plan_from_dotconfig
from scripts import slurm_cluster

# Columns that measure the machine rather than the training: allowed to differ.
MEASURED = ("tokens_per_sec", "wall_time_s", "peak_memory_mb")


def make(*args: str, config: Path, env: dict[str, str] | None = None) -> None:
    cmd = ["make", "--no-print-directory", f"PYTHON={sys.executable}", *args]
    proc = subprocess.run(cmd, cwd=REPO, env={**(env or os.environ),
                                              "KCONFIG_CONFIG": str(config)})
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(args)}` failed (exit {proc.returncode})")


def run_backend(preset: str, out: Path, backend: str, settings: str,
                env: dict[str, str] | None = None) -> tuple[Path, float]:
    """The preset's matrix, trained from scratch under ``out``/``backend``: its
    folder and the seconds `make test-matrix` took."""
    config = out / f"{backend}.config"
    results = out / backend
    make(f"defconfig-{preset}", config=config)
    make("setconfig", f"SET=RESULTS_DIR={results} MATRIX_BACKEND={backend} {settings}".strip(),
         config=config)
    folder = plan_from_dotconfig(kconfig.load(config), []).folder
    if folder.exists():
        raise SystemExit(f"{folder} exists: give --out a new folder, so that both backends "
                         "train every cell")
    start = time.monotonic()
    make("test-matrix", config=config, env=env)
    return folder, time.monotonic() - start


def read(folder: Path) -> list[dict[str, str]]:
    with open(folder / "summary.csv") as f:
        return list(csv.DictReader(f))


def compare(a: list[dict[str, str]], b: list[dict[str, str]]) -> list[str]:
    """Every difference outside MEASURED, as lines; empty when the two agree."""
    if [r["cell"] for r in a] != [r["cell"] for r in b]:
        return [f"cells differ: {[r['cell'] for r in a]} vs {[r['cell'] for r in b]}"]
    if list(a[0]) != list(b[0]):
        return [f"columns differ: {list(a[0])} vs {list(b[0])}"]
    return [f"{x['cell']}: {k} {x[k]!r} vs {y[k]!r}" for x, y in zip(a, b)
            for k in x if k not in MEASURED and x[k] != y[k]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="gpt2-shakespeare-matrix-cpu")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "backend-check")
    parser.add_argument("--slurm-cpus", type=int, default=os.cpu_count() or 1,
                        help="CONFIG_SLURM_CPUS of the Slurm run (default: every core, "
                             "as the local runner's one cell at a time has)")
    parser.add_argument("--cluster", type=Path, default=slurm_cluster.DEFAULT_DIR,
                        help="state folder of the local test cluster")
    args = parser.parse_args(argv)
    problem = slurm_cluster.cannot_run()
    if problem:
        raise SystemExit(problem)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    local, local_s = run_backend(args.preset, args.out, "local", "")
    print(slurm_cluster.start(args.cluster))
    slurm, slurm_s = run_backend(args.preset, args.out, "slurm",
                                 f"SLURM_CPUS={args.slurm_cpus}",
                                 env=slurm_cluster.env(args.cluster))
    a, b = read(local), read(slurm)
    print(f"\nlocal  {local} ({local_s / 60:.1f} min)\nslurm  {slurm} ({slurm_s / 60:.1f} min)")
    print(f"{'cell':<36} {'status':<10} {'val loss':>9} {'local tok/s':>12} {'slurm tok/s':>12}")
    for x, y in zip(a, b):
        print(f"{x['cell']:<36} {y['status']:<10} {y['final_val_loss']:>9.9} "
              f"{x['tokens_per_sec']:>12.8} {y['tokens_per_sec']:>12.8}")
    differences = compare(a, b)
    if differences:
        print(f"\n{len(differences)} difference(s) outside {', '.join(MEASURED)}:")
        print("\n".join(f"  {d}" for d in differences))
        return 1
    print(f"\nsummary.csv: {len(a)} cells, equal in every column but {', '.join(MEASURED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
