#!/usr/bin/env python3
"""Is stop-and-resume exact on this machine? `make resume-check`.

Trains the configured run twice in a scratch folder: once straight through, once
stopped after step --stop-at (a fresh process) and resumed. Prints the largest
difference between the two in losses, weights and optimizer state. On the CPU and
in float32 they are equal to the last bit (tests/test_reliability.py holds that);
on a GPU, kernels that add in a varying order (atomics in backward, autotuned
compiled kernels) may leave rounding-size differences, which this measures.

    make resume-check TRAIN_ARGS="--max-iters=40"        # stops at 20 (half), resumes
    make resume-check CHECK_ARGS="--stop-at 7 --control"  # and two straight runs compared
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from gpt2 import REPO, processes


def _train(argv: list[str], results: Path, *extra: str) -> int:
    """One training run; it checkpoints and stops if this script dies (Ctrl-C, kill)."""
    cmd = [sys.executable, str(REPO / "gpt2" / "train.py"), *argv,
           f"--results-dir={results}", *extra]
    return processes.start(cmd, cwd=REPO, stdout=subprocess.DEVNULL).wait()


def _run_dir(results: Path) -> Path:
    (run,) = [p for p in results.iterdir() if p.is_dir() and p.name != "latest"]
    return run


def _rows(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def compare(a: Path, b: Path) -> dict:
    import torch

    ra, rb = _rows(a), _rows(b)
    out = {"steps_compared": len(ra), "same_steps": ra.keys() == rb.keys()}
    for key in ("train_loss", "val_loss"):
        diffs = [abs(ra[s][key] - rb[s][key]) for s in ra
                 if s in rb and ra[s].get(key) is not None and rb[s].get(key) is not None]
        out[f"max_{key}_diff"] = max(diffs, default=None)
    sa = torch.load(a / "ckpt.pt", weights_only=True)
    sb = torch.load(b / "ckpt.pt", weights_only=True)
    out["max_weight_diff"] = max((sa["model"][k].float() - v.float()).abs().max().item()
                                 for k, v in sb["model"].items())
    moments = [(x, sb["optimizer"]["state"][p][n]) for p, slots in sa["optimizer"]["state"].items()
               for n, x in slots.items() if torch.is_tensor(x) and x.numel() > 1]
    out["max_optimizer_state_diff"] = max(((x.float() - y.float()).abs().max().item()
                                           for x, y in moments), default=0.0)
    out["exact"] = out["same_steps"] and all(
        out[k] == 0 for k in ("max_train_loss_diff", "max_val_loss_diff", "max_weight_diff",
                              "max_optimizer_state_diff") if out[k] is not None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/resume_check.py", allow_abbrev=False,
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--stop-at", type=int, help="stop after this step (default: half of "
                        "--max-iters)")
    parser.add_argument("--control", action="store_true",
                        help="also train a second straight run and print its differences "
                        "from the first: the machine's run-to-run noise, which a resume "
                        "cannot be expected to beat")
    parser.add_argument("--keep", metavar="DIR", help="train in DIR and keep it (default: a "
                        "temporary folder, removed)")
    parser.add_argument("train_args", nargs=argparse.REMAINDER,
                        help="train.py flags (after --), as make passes them")
    args = parser.parse_args(argv)
    train_argv = [a for a in args.train_args if a != "--"]
    if args.stop_at is None:
        iters = [int(a.split("=", 1)[1]) for a in train_argv if a.startswith("--max-iters=")]
        if not iters or iters[-1] < 2:
            parser.error("give --stop-at (CHECK_ARGS=\"--stop-at N\"): no --max-iters of 2 or "
                         "more to halve")
        args.stop_at = iters[-1] // 2
    with tempfile.TemporaryDirectory(prefix="kgpt-resume-") as tmp:
        root = Path(args.keep or tmp)
        straight, resumed = root / "straight", root / "resumed"
        print(f"resume-check: straight run, then stop at step {args.stop_at} and resume "
              f"({shlex.join(train_argv[-6:])} ...)", flush=True)
        if _train(train_argv, straight):
            print("error: the straight run failed; run it with `make` to see why",
                  file=sys.stderr)
            return 1
        rc = _train(train_argv, resumed, f"--stop-at-step={args.stop_at}")
        if rc != 130:
            print(f"error: the run to be stopped ended with status {rc}, not 130",
                  file=sys.stderr)
            return 1
        if _train(train_argv, resumed):
            print("error: the resumed run failed", file=sys.stderr)
            return 1
        result = compare(_run_dir(straight), _run_dir(resumed))
        control = None
        if args.control:
            again = root / "straight-again"
            if _train(train_argv, again):
                print("error: the second straight run failed", file=sys.stderr)
                return 1
            control = compare(_run_dir(straight), _run_dir(again))
    print(f"  {'':<26}{'resumed vs straight':>22}" + (f"{'straight vs straight':>22}"
                                                      if control else ""))
    for key, value in result.items():
        print(f"  {key:<26}{value!s:>22}" + (f"{control[key]!s:>22}" if control else ""))
    print("exact: resuming changed nothing" if result["exact"] else
          "not exact: see the differences above")
    return 0 if os.environ.get("KGPT_RESUME_CHECK_STRICT") != "1" or result["exact"] else 1


if __name__ == "__main__":
    from gpt2.processes import survive_lost_terminal

    survive_lost_terminal()  # (what it prints shows control characters, never sends them)
    sys.exit(main())
