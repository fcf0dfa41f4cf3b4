#!/usr/bin/env python3
"""`make bench`: how fast the configured model trains on this machine.

Runs the configuration's real optimizer step (the trainer's own function: forward,
backward, accumulation, clipping, pruning hooks, optimizer) on random tokens for
--warmup untimed steps and then --steps timed ones, and reports what compares across
machines: tokens/s, model FLOPs per token (6N + 12LHQT), achieved FLOP/s, MFU against
the device's dense peak (GPUs in gpt2/estimates/flops.py), peak memory and the spread
of step times. Prints them and writes them as JSON into <results>/bench/, one new file
per measurement.

    make bench                                   # the .config as it is
    make bench BENCH_ARGS="--steps 50 --warmup 10"
    make bench TRAIN_ARGS="--batch-size 32 --compile on"
    make bench BENCH_ARGS="--sweep batch_size=8,16,32 --sweep compile_mode=default,max-autotune"

--sweep SETTING=V1,V2,... (repeatable) measures every combination, each in a process of
its own (a fresh peak-memory count, compile cache and allocator), prints one row per
combination and the fastest, and writes them all to one JSON file. Sweeping batch_size
keeps the sequences per optimizer step: gradient_accumulation becomes
(batch_size x gradient_accumulation) / batch_size, and a size that does not divide
them is skipped with a note. A combination that runs out of memory, or is predicted
not to fit, is a row saying so; the sweep goes on.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


import torch

from gpt2.config.argparser import Bounded, StrictArgumentParser
from gpt2.names import flag, switch_flag
from gpt2.config.options import (TRAIN, add_arguments, applies, config_from_namespace,
                                 field_type, fields, opt)
from gpt2.errors import ConfigError
from gpt2.model.gpt import GPT
from gpt2.model.build import model_config
from gpt2.estimates import memory
from gpt2.sparsity.algorithms import sparse_kernel
from gpt2.runtime.device import compile_counts, compiled, setup_runtime
from gpt2.optim.algorithms.optimizers import build_optimizer
from gpt2.sparsity.algorithms.pruning import build_pruner
from gpt2.training.provenance import git_commit
from gpt2.storage import own_folder, write_text_atomic
from gpt2.estimates.flops import speed_figures
from gpt2.training.step import Learner, apply_learning_rate, optimizer_step


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] \
        if len(values) > 1 else values[0]


def measure(cfg, steps: int, warmup: int) -> dict:
    runtime = setup_runtime(cfg.device, cfg.dtype, cfg.tf32, cfg.cpu_threads,
                            attention=cfg.attention_backend, dropout=cfg.dropout)
    # Training's own memory check (and auto batch) before anything is allocated.
    cfg, predicted, _ = memory.check(cfg, runtime.device_type)
    torch.manual_seed(cfg.seed)
    model = GPT(model_config(cfg)).to(runtime.device)
    optimizer = build_optimizer(model, cfg, runtime.device_type)
    apply_learning_rate(optimizer, cfg.learning_rate)
    # The run's own pruning schedule: the masks update at the steps they would in training.
    pruner = build_pruner(model, optimizer, cfg, max(cfg.max_iters, warmup + steps))
    scaler = torch.amp.GradScaler(runtime.device_type, enabled=runtime.needs_grad_scaler)
    sparse = None
    if applies(cfg, "sparse_kernel"):
        # 2:4: dense and sparse kernels compare on the same model, its masks final from
        # the first step (the kernel needs them so, and no step pays for an update).
        used, note = sparse_kernel.resolve(cfg, runtime.device_type)
        pruner.update_masks(cfg.target_sparsity)
        pruner.start = pruner.end = 0
        checks, shapes = [], None
        if used:  # the trainer's own check (timed under auto): the shapes it would run sparse
            verdicts = sparse_kernel.decide(cfg, [tuple(p.shape) for _, p in pruner.targets],
                                            runtime.torch_dtype, torch.device(runtime.device))
            checks = [v.line() for v in verdicts]
            shapes = {v.shape for v in verdicts if v.sparse}
        layers = sparse_kernel.engage(model, [n for n, _ in pruner.targets], shapes) if used else 0
        sparse = {"used": layers > 0, "note": note, "layers": layers, "checks": checks}
    compiles = runtime.compiles(cfg.compile)
    fwd = compiled(model, cfg.compile_mode, cfg.compile_backend) if compiles else model
    gen = torch.Generator().manual_seed(cfg.seed)
    x, y = (torch.randint(0, 50257, (cfg.batch_size, cfg.block_size), generator=gen)
            .to(runtime.device) for _ in range(2))
    stream = itertools.repeat((x, y))  # speed does not depend on which tokens
    learner = Learner(model, optimizer, scaler, pruner, runtime)
    times = []
    before = compile_counts()
    warm = before
    for i in range(warmup + steps):
        if i == warmup:
            runtime.reset_peak_memory()  # steady state: compile and first-step allocations done
            warm = compile_counts()
        runtime.synchronize()
        t0 = time.perf_counter()
        optimizer_step(learner, stream, i + 1, cfg, fwd)
        runtime.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if sparse is not None:
        sparse["sparsity"] = pruner.sparsity()
    after = compile_counts()
    # Graphs compiled once warm are recompiles: each costs a compile inside the timing.
    compile_record = None if not compiles else {
        "backend": cfg.compile_backend, "mode": cfg.compile_mode,
        "graphs": after["graphs"] - before["graphs"],
        "graph_breaks": after["graph_breaks"] - before["graph_breaks"],
        "recompiles_timed": after["graphs"] - warm["graphs"]}
    median = statistics.median(times)
    tokens_per_sec = cfg.tokens_per_step() / median
    return {
        "device": runtime.name(), "dtype": cfg.dtype, "compile": compiles,
        "compiled": compile_record,
        "n_params": model.num_params(), "tokens_per_step": cfg.tokens_per_step(),
        "steps": steps, "warmup": warmup, "tokens_per_sec": tokens_per_sec,
        **speed_figures(model, cfg, runtime.device_type, runtime.name(), tokens_per_sec),
        "peak_memory_mb": runtime.peak_memory_mb(),
        "predicted_peak_memory_mb": predicted.peak / memory.MiB,
        "sparse_kernel": sparse,
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
        f"{r['predicted_peak_memory_mb']:,.0f} MB"
        f"{memory.COMPILED_BOUND if r['compile'] else ''}"
        f" | micro-batch {r['micro_batch']} x "
        f"{r['gradient_accumulation']}",
        *([] if not r.get("compiled") else [
            f"compile  {r['compiled']['backend']}, mode {r['compiled']['mode']} | graphs "
            f"{r['compiled']['graphs']}, graph breaks {r['compiled']['graph_breaks']}, "
            f"compiled while timed {r['compiled']['recompiles_timed']}"]),
        *([] if not r.get("sparse_kernel") else [
            f"sparse   2:4 kernel on {r['sparse_kernel']['layers']} Linear layers' forward"
            if r["sparse_kernel"]["used"] else f"sparse   {r['sparse_kernel']['note']}",
            *(f"         {line}" for line in r["sparse_kernel"].get("checks", []))]),
        f"json     {path}",
    ])


def parse_sweeps(parser: argparse.ArgumentParser, texts: list[str]) -> dict[str, list[str]]:
    """``["batch_size=8,16", ...]`` -> {"batch_size": ["8", "16"]}; a setting that is
    not a training setting, or one given twice, is a usage error."""
    known = {f.name for f in fields(TRAIN)}
    sweeps: dict[str, list[str]] = {}
    for text in texts:
        name, _, values = text.partition("=")
        name = name.strip().replace("-", "_").removeprefix("config_").lower()
        if name not in known:
            parser.error(f"--sweep {text!r}: {name!r} is not a training setting "
                         "(write a field name such as batch_size or compile_mode)")
        if name in sweeps:
            parser.error(f"--sweep {name} is given twice")
        sweeps[name] = [v.strip() for v in values.split(",") if v.strip()]
        if not sweeps[name]:
            parser.error(f"--sweep {text!r}: list the values, e.g. {name}=8,16")
        if field_type(name) is bool:
            unknown = [v for v in sweeps[name] if v.lower() not in SWITCH_WORDS]
            if unknown:
                parser.error(f"--sweep {text!r}: {name} is on or off: write {name}=n,y")
            sweeps[name] = [SWITCH_WORDS[v.lower()] for v in sweeps[name]]
    return sweeps


# How a swept on/off setting may be written; recorded as .config writes it.
SWITCH_WORDS = {**dict.fromkeys(("y", "yes", "true", "on", "1"), "y"),
                **dict.fromkeys(("n", "no", "false", "off", "0"), "n")}


def setting_flag(name: str, value: str) -> str:
    """The command-line flag that sets one swept value."""
    if field_type(name) is bool:
        return switch_flag(name, value == "y")
    return f"{flag(name)}={value}"


def combinations(sweeps: dict[str, list[str]], cfg) -> list[dict[str, str]]:
    """Every combination of the swept values, batch sizes adjusted to the sequences
    per step (see the module docstring); skipped ones carry a "skipped" note."""
    out = []
    for values in itertools.product(*sweeps.values()):
        combo = dict(zip(sweeps, values))
        if "batch_size" in combo and "gradient_accumulation" not in combo:
            sequences = cfg.batch_size * cfg.gradient_accumulation
            try:
                batch = int(combo["batch_size"])
            except ValueError:
                batch = 0
            if batch > 0 and sequences % batch == 0:
                combo["gradient_accumulation"] = str(sequences // batch)
            elif batch > 0:
                combo["skipped"] = (f"{batch} does not divide the {sequences} sequences per "
                                    "step")
        out.append(combo)
    return out


def sweep(argv: list[str], cfg, sweeps: dict[str, list[str]], args) -> int:
    """Measure every combination in a child process of this script; print the table
    and the fastest. Returns 0 when at least one combination was measured."""
    rows = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = Path(cfg.results_dir) / "bench"
    combos = combinations(sweeps, cfg)
    print(f"sweep    {' x '.join(f'{k} ({len(v)})' for k, v in sweeps.items())}: "
          f"{len(combos)} combinations, each in its own process", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i, combo in enumerate(combos):
            label = " ".join(f"{k}={v}" for k, v in combo.items() if k != "skipped")
            if "skipped" in combo:
                rows.append({"settings": combo, "status": "skipped", "note": combo["skipped"]})
                print(f"  {label}: skipped ({combo['skipped']})", flush=True)
                continue
            flags = [setting_flag(k, v) for k, v in combo.items()]
            path = Path(tmp) / f"{i}.json"
            proc = subprocess.run(
                [sys.executable, "-m", "scripts.bench", *in_force(argv, combo), *flags,
                 f"--steps={args.steps}", f"--warmup={args.warmup}", f"--json={path}"],
                env={**os.environ, "BENCH_ARGS": ""}, capture_output=True, text=True)
            if proc.returncode == 0 and path.exists():
                r = json.loads(path.read_text())
                rows.append({"settings": combo, "status": "measured", **r})
                mfu = f"{r['mfu']:.1%} MFU" if r["mfu"] is not None else "MFU n/a"
                print(f"  {label}: {r['tokens_per_sec']:,.0f} tokens/s | {mfu} | step "
                      f"{r['step_time_s']['median'] * 1e3:.1f} ms | peak "
                      f"{r['peak_memory_mb']:,.0f} MB", flush=True)
                continue
            text = (proc.stderr or proc.stdout).strip().splitlines()
            said = proc.stderr + proc.stdout
            # (the memory check's refusal also says "would run out of memory": it is a
            # prediction, not a failure, and the note must tell them apart)
            refused = re.search(r"predicted peak memory (\S+ \S+) exceeds the budget (\S+ \S+)",
                                said)
            why = (f"predicted not to fit: {refused[1]} against {refused[2]}" if refused else
                   "out of memory" if "out of memory" in said.lower()
                   else text[-1] if text else f"exit status {proc.returncode}")
            rows.append({"settings": combo, "status": "failed", "note": why})
            print(f"  {label}: not measured ({why})", flush=True)
    measured = [r for r in rows if r["status"] == "measured"]
    path = Path(args.json) if args.json else out_dir / (
        f"sweep-{cfg.run_name}-{cfg.config_hash()}-{stamp}.json")
    own_folder(path.parent)
    write_text_atomic(path, json.dumps({"sweeps": sweeps, "rows": rows}, indent=2) + "\n")
    if not measured:
        print(f"error: no combination could be measured (json {path})", file=sys.stderr)
        return 1
    best = max(measured, key=lambda r: r["tokens_per_sec"])
    flags = " ".join(setting_flag(k, v) for k, v in best["settings"].items())
    print(f"best     {flags}: {best['tokens_per_sec']:,.0f} tokens/s (make bench "
          f"TRAIN_ARGS=\"{flags}\")")
    print(f"json     {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = StrictArgumentParser(prog="scripts/bench.py", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, TRAIN)
    bench = parser.add_argument_group("benchmark")
    bench.add_argument("--steps", type=Bounded(int, 1, 10**6), default=20,
                       help="timed optimizer steps")
    bench.add_argument("--warmup", type=Bounded(int, 0, 10**6), default=5,
                       help="untimed steps first "
                       "(compilation, allocator growth)")
    bench.add_argument("--json", metavar="PATH", help="where to write the figures (default "
                       "<results>/bench/<run>-<hash>-<device>-<time>.json)")
    bench.add_argument("--sweep", action="append", default=[], metavar="SETTING=V1,V2",
                       help="measure each value of a training setting (repeatable: every "
                       "combination)")
    # `make bench BENCH_ARGS="..."` passes its flags through the environment.
    given = (sys.argv[1:] if argv is None else argv) + shlex.split(os.environ.get("BENCH_ARGS",
                                                                                   ""))
    args = parser.parse_args(given)
    sweeps = parse_sweeps(parser, args.sweep)
    try:
        cfg = config_from_namespace(args, TRAIN)
        if sweeps:
            return sweep(without_bench_flags(given), cfg, sweeps, args)
        r = measure(cfg, args.steps, args.warmup)
    except ConfigError as e:  # a bad value, or a config predicted not to fit
        print(f"error: {e}", file=sys.stderr)
        return 2
    device = re.sub(r"[^A-Za-z0-9]+", "-", r["device"].split("(")[0]).strip("-").lower()
    path = Path(args.json) if args.json else Path(cfg.results_dir) / "bench" / (
        f"{cfg.run_name}-{cfg.config_hash()}-{device}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    own_folder(path.parent)
    write_text_atomic(path, json.dumps(r, indent=2) + "\n")
    print(report(r, path))
    return 0


def in_force(argv: list[str], combo: dict[str, str]) -> list[str]:
    """``argv`` less the flags of settings that a combination takes out of force:
    sweeping compile=off,on leaves CONFIG_COMPILE_MODE nothing to do in the off row,
    and train.py refuses a setting given where it does nothing."""
    dropped = {flag(f.name) for f in fields()
               if any(name in combo and combo[name] not in values
                      for name, values in opt(f.name).when)}
    return [a for a in argv if a.split("=", 1)[0] not in dropped]


def without_bench_flags(argv: list[str]) -> list[str]:
    """``argv`` less the benchmark's own flags (--sweep, --steps, --warmup, --json),
    whichever spelling: the training settings every combination starts from."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--sweep", "--steps", "--warmup", "--json"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


if __name__ == "__main__":
    from gpt2.processes import survive_lost_terminal

    survive_lost_terminal()  # (what it prints shows control characters, never sends them)
    sys.exit(main())
