#!/usr/bin/env python3
"""`make bench`: how fast the configured model trains on this machine.

Runs the configuration's real optimizer step (the trainer's own function: forward,
backward, accumulation, clipping, pruning hooks, optimizer) on random tokens for
--warmup untimed steps and then --steps timed ones, and reports what compares across
machines: tokens/s, model FLOPs per token (6N + 12LHQT), achieved FLOP/s, MFU against
the device's dense peak (GPUs in gpt2/training/flops.py), peak memory and the spread
of step times. Prints them and writes them as JSON into <results>/bench/, one new file
per measurement.

    make bench                                   # the .config as it is
    make bench BENCH_ARGS="--steps 50 --warmup 10"
    make bench TRAIN_ARGS="--batch-size 32 --compile on"
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import statistics
import sys
import time
from pathlib import Path


import torch

from gpt2.config.argparser import StrictArgumentParser
from gpt2.config.options import TRAIN, add_arguments, config_from_namespace
from gpt2.errors import ConfigError
from gpt2.model.gpt import GPT
from gpt2.training import memory
from gpt2.training.device import setup_runtime
from gpt2.training.optimizers import build_optimizer
from gpt2.training.pruning import build_pruner
from gpt2.training.runs import git_commit
from gpt2.storage import write_text_atomic
from gpt2.training.flops import speed_figures
from gpt2.training.step import apply_learning_rate, optimizer_step


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] \
        if len(values) > 1 else values[0]


def measure(cfg, steps: int, warmup: int) -> dict:
    runtime = setup_runtime(cfg.device, cfg.dtype, cfg.tf32, cfg.cpu_threads)
    # Training's own memory check (and auto batch) before anything is allocated.
    cfg, predicted, _ = memory.check(cfg, runtime.device_type)
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.gpt_config()).to(runtime.device)
    optimizer = build_optimizer(model, cfg, runtime.device_type)
    apply_learning_rate(optimizer, cfg.learning_rate)
    # The run's own pruning schedule: the masks update at the steps they would in training.
    pruner = build_pruner(model, optimizer, cfg, max(cfg.max_iters, warmup + steps))
    scaler = torch.amp.GradScaler(runtime.device_type, enabled=runtime.needs_grad_scaler)
    fwd = torch.compile(model) if runtime.compiles(cfg.compile) else model
    gen = torch.Generator().manual_seed(cfg.seed)
    x, y = (torch.randint(0, 50257, (cfg.batch_size, cfg.block_size), generator=gen)
            .to(runtime.device) for _ in range(2))
    stream = itertools.repeat((x, y))  # speed does not depend on which tokens
    times = []
    for i in range(warmup + steps):
        if i == warmup:
            runtime.reset_peak_memory()  # steady state: compile and first-step allocations done
        runtime.synchronize()
        t0 = time.perf_counter()
        optimizer_step(fwd, model, optimizer, scaler, pruner, stream, cfg, runtime, i + 1)
        runtime.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    tokens_per_sec = cfg.tokens_per_step() / median
    return {
        "device": runtime.name(), "dtype": cfg.dtype, "compile": runtime.compiles(cfg.compile),
        "n_params": model.num_params(), "tokens_per_step": cfg.tokens_per_step(),
        "steps": steps, "warmup": warmup, "tokens_per_sec": tokens_per_sec,
        **speed_figures(model, cfg, runtime.device_type, runtime.name(), tokens_per_sec),
        "peak_memory_mb": runtime.peak_memory_mb(),
        "predicted_peak_memory_mb": predicted.peak / memory.MiB,
        "micro_batch": cfg.batch_size, "gradient_accumulation": cfg.gradient_accumulation,
        "step_time_s": {"median": median, "p10": quantile(times, 0.1),
                        "p90": quantile(times, 0.9), "min": min(times), "max": max(times),
                        "std": statistics.stdev(times) if len(times) > 1 else 0.0},
        "step_times_s": times, "config": cfg.to_dict(), "config_hash": cfg.config_hash(),
        "torch_version": torch.__version__, "git_commit": git_commit(),
    }


def report(r: dict, path: Path) -> str:
    t = r["step_time_s"]
    achieved = r["achieved_tflops"]
    flops = (f"{achieved:.1f} TFLOP/s" if achieved >= 1 else f"{achieved * 1e3:.1f} GFLOP/s")
    mfu = (f"MFU {r['mfu']:.1%} of {r['peak_tflops']:g} TFLOP/s" if r["mfu"] is not None
           else "MFU n/a (no known peak for this device)")
    return "\n".join([
        f"bench    {r['device']} {r['dtype']}{' compiled' if r['compile'] else ''} | "
        f"{r['n_params']:,} params | {r['tokens_per_step']:,} tokens/step",
        f"speed    {r['tokens_per_sec']:,.0f} tokens/s (median of {r['steps']} steps after "
        f"{r['warmup']} warm-up)",
        f"flops    {r['flops_per_token']:,.0f} per token | {flops} | {mfu}",
        f"steps    median {t['median'] * 1e3:.1f} ms | p10 {t['p10'] * 1e3:.1f} | p90 "
        f"{t['p90'] * 1e3:.1f} | spread (p90-p10)/median "
        f"{(t['p90'] - t['p10']) / t['median']:.1%}",
        f"memory   peak {r['peak_memory_mb']:,.0f} MB | predicted "
        f"{r['predicted_peak_memory_mb']:,.0f} MB | micro-batch {r['micro_batch']} x "
        f"{r['gradient_accumulation']}",
        f"json     {path}",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = StrictArgumentParser(prog="scripts/bench.py", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, TRAIN)
    bench = parser.add_argument_group("benchmark")
    bench.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    bench.add_argument("--warmup", type=int, default=5, help="untimed steps first "
                       "(compilation, allocator growth)")
    bench.add_argument("--json", metavar="PATH", help="where to write the figures (default "
                       "<results>/bench/<run>-<hash>-<device>-<time>.json)")
    # `make bench BENCH_ARGS="..."` passes its flags through the environment.
    args = parser.parse_args((sys.argv[1:] if argv is None else argv)
                             + shlex.split(os.environ.get("BENCH_ARGS", "")))
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be at least 1 and --warmup at least 0")
    try:
        cfg = config_from_namespace(args, TRAIN)
        r = measure(cfg, args.steps, args.warmup)
    except ConfigError as e:  # a bad value, or a config predicted not to fit
        print(f"error: {e}", file=sys.stderr)
        return 2
    device = re.sub(r"[^A-Za-z0-9]+", "-", r["device"].split("(")[0]).strip("-").lower()
    path = Path(args.json) if args.json else Path(cfg.results_dir) / "bench" / (
        f"{cfg.run_name}-{cfg.config_hash()}-{device}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(r, indent=2) + "\n")
    print(report(r, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
