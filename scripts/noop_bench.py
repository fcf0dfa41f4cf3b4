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

With ``--cells`` it reads a matrix folder instead: each cell's process wall time (the
runner's status.json), its run's own wall time (summary.json: from building the
model to the summary, evaluations included) and the difference, the cost of a cell
beyond its run: starting Python, importing torch, reading the data, and what comes
after the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.noop_bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each target")
    parser.add_argument("--cells", type=Path, metavar="MATRIX_FOLDER",
                        help="print the cost of each cell of this matrix beyond its run")
    args = parser.parse_args(argv)
    if args.cells:
        rows = cell_overhead(args.cells)
        for cell, process, run in rows:
            print(f"  {cell:<40} process {process:6.1f} s   run {run:6.1f} s   "
                  f"beyond the run {process - run:5.2f} s")
        if rows:
            print(f"mean beyond the run: {statistics.fmean(p - r for _, p, r in rows):.2f} s "
                  f"over {len(rows)} completed cells")
        return 0
    for target in ("all", "data"):
        r = measure(target, args.repeat)
        said = r["last_output"].strip().splitlines()
        print(f"make {'' if target == 'all' else target:<5} CPU {r['median_cpu_s']:.2f} s "
              f"(median of {args.repeat}: {', '.join(f'{t:.2f}' for t in r['cpu_s'])}); "
              f"torch imported: {'yes' if r['torch'] else 'no'}; it said: "
              f"{said[0] if said else '(nothing)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
