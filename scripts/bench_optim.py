#!/usr/bin/env python3
"""Step time and optimizer-state memory of every optimizer x pruning pair, relative
to dense AdamW, on one fixed model with random tokens (no dataset needed).

    make bench-optim                                  # CPU-sized default model
    make bench-optim BENCH_ARGS="--device cuda --model-size gpt2 --batch-size 16 \\
        --block-size 1024 --dtype bfloat16"

"state MB" counts every tensor the optimizer keeps per parameter plus what the
pruning method keeps (masks, movement scores); weights and gradients are the same
for every cell and are left out. Step time is forward + backward + pruning hooks +
optimizer step, median over the timed steps, with masks updated every
--pruning-frequency steps throughout. "opt ms" is the optimizer's own step within
it (median), the part where optimizers differ; "math ms" is the arithmetic a
method adds to an Adam-like step, timed on its own: Muon's Newton-Schulz iterations
on its stacks of block matrices.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import statistics
import sys
import time


import torch

from gpt2.config.argparser import Bounded, StrictArgumentParser
from gpt2.config.options import field_arg, resolve
from gpt2.model.gpt import GPT
from gpt2.model.build import model_config
from gpt2.config.sizes import MODEL_SIZE_CHOICES
from gpt2.runtime.device import setup_runtime
from gpt2.optim.algorithms.optimizers import build_optimizer, orthogonalize
from gpt2.config.choices import DTYPES, valid_pairs
from gpt2.config.registry import DEFAULT_OPTIMIZER, PRUNING_METHODS, PRUNING_SETTINGS
from gpt2.sparsity.algorithms.pruning import build_pruner
from gpt2.training.step import Learner, optimizer_step


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in a state value: itself, or those of a list (SOAP's factors)."""
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def state_bytes(optimizer: torch.optim.Optimizer, pruner) -> int:
    total = sum(t.numel() * t.element_size() for st in optimizer.state.values()
                for v in st.values() for t in _tensors(v))
    # the pruner's masks and scores (dicts of tensors by name); a generator's state or a
    # counter beside them (state pruning, SET, RigL) counts as what it holds
    for value in pruner.state_dict().values():
        tensors = _tensors(list(value.values()) if isinstance(value, dict) else value)
        total += sum(t.numel() * t.element_size() for t in tensors)
    return total


def timed_steps(optimizer: torch.optim.Optimizer, runtime, times: list[float]) -> None:
    """Record the duration of each of ``optimizer``'s own steps into ``times``."""
    inner = optimizer.step

    def step(*args, **kwargs):
        runtime.synchronize()
        t0 = time.perf_counter()
        out = inner(*args, **kwargs)
        runtime.synchronize()
        times.append(time.perf_counter() - t0)
        return out

    optimizer.step = step


def newton_schulz_ms(optimizer: torch.optim.Optimizer, runtime, repeats: int) -> float:
    """Median time of Newton-Schulz alone on what a Muon step orthogonalizes: each
    group's stacks of same-shaped matrices (random ones: the cost does not depend on
    the values)."""
    stacks = []
    for group in optimizer.param_groups:
        if not group.get("orthogonal"):
            continue
        shapes: dict[tuple[int, int], int] = {}
        for p in group["params"]:
            key = (p.size(-2) // group["split"], p.size(-1))
            shapes[key] = shapes.get(key, 0) + group["split"]
        stacks += [(torch.randn(n, *key, device=runtime.device), group["ns_steps"])
                   for key, n in shapes.items()]
    times = []
    for _ in range(repeats + 1):  # one untimed
        runtime.synchronize()
        t0 = time.perf_counter()
        for stack, steps in stacks:
            orthogonalize(stack, steps)
        runtime.synchronize()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times[1:])


def variants(method: str) -> tuple[str | None, ...]:
    """The choices of the setting whose cost varies (Pruning.variants), each a row;
    (None,): the method's one row."""
    name = PRUNING_METHODS[method].variants
    return tuple(PRUNING_SETTINGS[name][0].choices) if name else (None,)


def bench_cell(args, optimizer: str, method: str, variant: str | None, runtime) -> dict:
    values = dict(model_size=args.model_size, block_size=args.block_size, device=args.device,
                  dtype=args.dtype, optimizer=optimizer, pruning_method=method,
                  max_iters=args.warmup + args.steps, warmup_iters=0, dropout=0.0)
    if args.model_size == "custom":
        values.update(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd)
    if method != "none":
        values.update(target_sparsity=0.5, pruning_warmup=0, pruning_end=1.0,
                      pruning_frequency=args.pruning_frequency)
    if variant:
        values[PRUNING_METHODS[method].variants] = variant
    cfg = resolve(values)
    torch.manual_seed(0)
    model = GPT(model_config(cfg)).to(runtime.device)
    opt = build_optimizer(model, cfg, runtime.device_type)
    pruner = build_pruner(model, opt, cfg, cfg.max_iters)
    opt_times: list[float] = []
    timed_steps(opt, runtime, opt_times)
    scaler = torch.amp.GradScaler(runtime.device_type, enabled=runtime.needs_grad_scaler)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50257, (args.batch_size, args.block_size), generator=gen)
    x = x.to(runtime.device)
    stream = itertools.repeat((x, x))
    times = []
    for step in range(args.warmup + args.steps):
        runtime.synchronize()
        t0 = time.perf_counter()
        optimizer_step(Learner(model, opt, scaler, pruner, runtime), stream, step + 1, cfg)
        runtime.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    muon = any(g.get("orthogonal") for g in opt.param_groups)
    return {"step_ms": 1000 * statistics.median(times),
            "opt_ms": 1000 * statistics.median(opt_times[args.warmup:]),
            "math_ms": newton_schulz_ms(opt, runtime, args.steps) if muon else None,
            "state_mb": state_bytes(opt, pruner) / 2**20, "params": model.num_params()}


def main(argv=None) -> int:
    parser = StrictArgumentParser(description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--model-size", default="custom", choices=MODEL_SIZE_CHOICES)
    parser.add_argument("--n-layer", type=field_arg("n_layer"), default=4)
    parser.add_argument("--n-head", type=field_arg("n_head"), default=4)
    parser.add_argument("--n-embd", type=field_arg("n_embd"), default=256)
    parser.add_argument("--block-size", type=field_arg("block_size"), default=128)
    parser.add_argument("--batch-size", type=field_arg("batch_size"), default=8)
    parser.add_argument("--steps", type=Bounded(int, 1, 10**6), default=10,
                        help="timed steps per cell")
    parser.add_argument("--warmup", type=Bounded(int, 0, 10**6), default=3,
                        help="untimed steps per cell")
    parser.add_argument("--pruning-frequency", type=field_arg("pruning_frequency"), default=5)
    parser.add_argument("--only", default="", help="comma-separated optimizers to run")
    parser.add_argument("--pruning", default="", help="comma-separated pruning methods to run")
    # `make bench-optim BENCH_ARGS="..."` passes its flags through the environment.
    args = parser.parse_args((sys.argv[1:] if argv is None else argv)
                             + shlex.split(os.environ.get("BENCH_ARGS", "")))

    runtime = setup_runtime(args.device, args.dtype, True, 0)
    args.device = runtime.device_type
    only = {o for o in args.only.split(",") if o}
    methods = {m for m in args.pruning.split(",") if m}
    cells = [(o, m, v) for o, m in valid_pairs() if (not only or o in only)
             and (not methods or m in methods)
             for v in variants(m)]
    if not cells:
        parser.error(f"no optimizer x pruning pair matches --only={args.only!r} "
                     f"--pruning={args.pruning!r}")
    # the reference first: the default optimizer, dense
    cells.sort(key=lambda c: c[:2] != (DEFAULT_OPTIMIZER, "none"))
    print(f"{runtime.name()} {args.dtype} | model {args.model_size} "
          f"{'' if args.model_size != 'custom' else f'{args.n_layer}L/{args.n_head}H/{args.n_embd} '}"
          f"| batch {args.batch_size} x {args.block_size} tokens | median of {args.steps} steps",
          flush=True)
    print(f"{'optimizer':<11} {'pruning':<17} {'step ms':>9} {'x ref':>8} {'opt ms':>8} "
          f"{'x ref':>8} {'math ms':>8} {'state MB':>9} {'x ref':>8}")
    # One untimed cell first: the first model built in a process pays one-off costs
    # (allocator growth, kernel selection) that would otherwise inflate the reference.
    bench_cell(argparse.Namespace(**{**vars(args), "steps": 1, "warmup": 1}), *cells[0], runtime)
    ref = None
    for optimizer, method, variant in cells:
        r = bench_cell(args, optimizer, method, variant, runtime)
        ref = ref or r
        name = f"{method}/{variant}" if variant else method
        math_ms = "" if r["math_ms"] is None else f"{r['math_ms']:.1f}"
        print(f"{optimizer:<11} {name:<17} {r['step_ms']:>9.1f} "
              f"{r['step_ms'] / ref['step_ms']:>8.2f} {r['opt_ms']:>8.1f} "
              f"{r['opt_ms'] / ref['opt_ms']:>8.2f} {math_ms:>8} {r['state_mb']:>9.1f} "
              f"{r['state_mb'] / ref['state_mb']:>8.2f}", flush=True)
    print(f"({ref['params']:,} parameters; the first row is the reference)")
    return 0


if __name__ == "__main__":
    from gpt2.processes import survive_lost_terminal

    survive_lost_terminal()  # (what it prints shows control characters, never sends them)
    sys.exit(main())
