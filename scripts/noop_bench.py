#!/usr/bin/env python3
"""How long `make` takes to do nothing: `make bench-noop`.

Runs `make` (the .config's run, which must be complete) and `make data` (its data,
prepared) a few times each and prints the CPU seconds every run of them cost, user
and system, of make and all its processes together, and whether any of them imported
torch (found by Python's -X importtime, which every process inherits through
PYTHONPROFILEIMPORTTIME). CPU time, not wall time: on a loaded machine wall time
measures the load.

    make bench-noop        # after `make` has trained the .config's run
    python -m scripts.noop_bench --cells results/latest-matrix   # a matrix's cells

Then it runs a tiny matrix of its own (4 cells of a 29k-parameter model on tiny
Shakespeare's characters, 40 steps, in a temporary folder) twice, its CPU cells forked
by the runner's cell server as `make test-matrix` starts them and then as fresh
processes (KGPT_CELL_SERVER=0), and prints each cell's cost beyond its run: the
runner's wall time of the cell's process (status.json) less the run's own wall time
(summary.json: from building the model to the summary, evaluations included), what
starting Python, importing torch, reading the data and writing loss.png cost. With
``--cells`` it reads a matrix folder of yours instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gpt2 import REPO
from gpt2.run_folder import COMPLETED, read_summary


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(target: str, repeat: int) -> dict:
    """CPU seconds of ``make <target>`` per run, and whether torch was imported."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    env.pop("MAKEFLAGS", None)  # (run as its own make, not a sub-make of ours)
    times, torch_seen, outputs = [], False, []
    for _ in range(repeat):
        before = _cpu()
        proc = subprocess.run(["make", "--no-print-directory", target], cwd=REPO, env=env,
                              capture_output=True, text=True)
        times.append(_cpu() - before)
        if proc.returncode:
            raise SystemExit(f"`make {target}` failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        imports = [ln for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
        torch_seen |= any(ln.rstrip().endswith("| torch") for ln in imports)
        outputs.append("\n".join(ln for ln in proc.stdout.splitlines()))
    return {"target": target, "cpu_s": times, "median_cpu_s": statistics.median(times),
            "torch": torch_seen, "last_output": outputs[-1]}


def cell_overhead(folder: Path) -> list[tuple[str, float, float]]:
    """(cell, process wall s, run wall s) of every completed cell of a matrix folder."""
    status = json.loads((folder / "status.json").read_text())
    out = []
    for cell, entry in status.items():
        summary = read_summary(folder / "cells" / cell)
        if entry.get("status") == COMPLETED and summary and entry.get("wall_s") is not None:
            out.append((cell, entry["wall_s"], summary.wall_time_s))
    return out


# The tiny matrix the cell rows run: CPU cells of the tests' tiny model (tests/helpers.py).
TINY_MATRIX = """CONFIG_DATASET_SHAKESPEARE_CHAR=y
CONFIG_MODEL_SIZE_CUSTOM=y
CONFIG_N_LAYER=2
CONFIG_N_HEAD=2
CONFIG_N_EMBD=32
CONFIG_BLOCK_SIZE=32
CONFIG_BATCH_SIZE=4
CONFIG_MAX_ITERS=40
CONFIG_WARMUP_ITERS=3
CONFIG_EVAL_INTERVAL=20
CONFIG_EVAL_TOKENS=256
CONFIG_CHECKPOINT_INTERVAL=20
CONFIG_SAMPLE_TOKENS=0
CONFIG_DEVICE_CPU=y
CONFIG_DTYPE_FLOAT32=y
CONFIG_CPU_THREADS=1
CONFIG_DATA_WORKERS=0
CONFIG_MATRIX=y
CONFIG_MATRIX_OPTIMIZER_ADAMW=y
CONFIG_MATRIX_OPTIMIZER_SGD=y
CONFIG_MATRIX_PRUNING_NONE=y
CONFIG_MATRIX_PRUNING_MAGNITUDE=y
CONFIG_MATRIX_SPARSITIES="0.5"
CONFIG_PRUNING_WARMUP=5
CONFIG_PRUNING_FREQUENCY=5
"""
# Where the corpus may be on a machine without network (as make gpu-check looks).
CORPUS = ("data/shakespeare/input.txt", "data/shakespeare-char/input.txt",
          "../shared/data/tinyshakespeare.txt")


def tiny_matrix_overhead(server: bool) -> list[tuple[str, float, float]] | str:
    """(cell, process s, run s) of the tiny matrix's cells, run in a temporary folder;
    the reason instead when it cannot run."""
    corpus = next((REPO / c for c in CORPUS if (REPO / c).is_file()), None)
    if corpus is None:
        return "no tiny Shakespeare here (data/shakespeare/input.txt): skipped"
    with tempfile.TemporaryDirectory(prefix="kgpt-noop-") as tmp:
        config = Path(tmp) / "config"
        config.write_text(TINY_MATRIX + f'CONFIG_DATA_DIR="{tmp}/data"\n'
                          f'CONFIG_DATA_INPUT="{corpus.resolve()}"\n'
                          f'CONFIG_RESULTS_DIR="{tmp}/results"\n')
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "TRAIN_ARGS")}
        env.update(KCONFIG_CONFIG=str(config), KGPT_CELL_SERVER="1" if server else "0")
        for target in ("olddefconfig", "data", "test-matrix"):
            proc = subprocess.run(["make", "--no-print-directory", target], cwd=REPO, env=env,
                                  capture_output=True, text=True)
            if proc.returncode:
                return f"`make {target}` of the tiny matrix failed: {proc.stderr[-500:]}"
        (folder,) = (Path(tmp) / "results").glob("matrix-*")
        return cell_overhead(folder)


def print_cells(rows: list[tuple[str, float, float]]) -> None:
    for cell, process, run in rows:
        print(f"  {cell:<40} process {process:6.1f} s   run {run:6.1f} s   "
              f"beyond the run {process - run:5.2f} s")
    if rows:
        print(f"mean beyond the run: {statistics.fmean(p - r for _, p, r in rows):.2f} s "
              f"over {len(rows)} completed cells")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.noop_bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each target")
    parser.add_argument("--cells", type=Path, metavar="MATRIX_FOLDER",
                        help="print the cost of each cell of this matrix beyond its run")
    parser.add_argument("--no-matrix", action="store_true",
                        help="leave out the tiny matrix's cell rows")
    args = parser.parse_args(argv)
    if args.cells:
        print_cells(cell_overhead(args.cells))
        return 0
    for target in ("all", "data"):
        r = measure(target, args.repeat)
        said = r["last_output"].strip().splitlines()
        print(f"make {'' if target == 'all' else target:<5} CPU {r['median_cpu_s']:.2f} s "
              f"(median of {args.repeat}: {', '.join(f'{t:.2f}' for t in r['cpu_s'])}); "
              f"torch imported: {'yes' if r['torch'] else 'no'}; it said: "
              f"{said[0] if said else '(nothing)'}")
    if args.no_matrix:
        return 0
    for server, how in ((True, "forked by the cell server (make test-matrix's way)"),
                        (False, "each a fresh process (KGPT_CELL_SERVER=0)")):
        rows = tiny_matrix_overhead(server)
        print(f"a tiny matrix's CPU cells, {how}:")
        if isinstance(rows, str):
            print(f"  {rows}")
        else:
            print_cells(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
