"""2:4 semi-structured sparse matmuls for the pruned Linear layers (CONFIG_SPARSE_KERNEL).

Once a 2:4 pruning run's masks are final (the end of its ramp), every pruned Linear
computes its forward product from a compressed copy of its masked weight, through
PyTorch's semi-structured sparse tensor (``torch.sparse.to_sparse_semi_structured``:
cuSPARSELt, or CUTLASS where cuSPARSELt is missing; NVIDIA Ampere and newer, 16-bit).
The backward products use the dense masked weight, so gradients are the dense model's.

Why not torchao's training path (``torchao.sparsity.training.SemiSparseLinear``): it
builds on the same tensor class, but recomputes its own mask every step (2:4 along
rows *and* columns of each 4x4 tile, so the transpose is 2:4 too and the backward can
be sparse), which differs from the mask the pruning method chose: the model would no
longer be the one the pruner and its tests describe. Here the compressed weight holds
exactly the pruner's mask; the price is that only the forward third of the Linear
FLOPs runs sparse. Expected gain: small (docs/optimizers-and-pruning.md lists others'
measurements); `make bench BENCH_ARGS="--sweep sparse_kernel=off,auto,on"` measures it.

Before the first step a run checks the kernel on each pruned weight shape (``decide``),
on a random 2:4 weight of the run's dtype and a micro-batch of rows: the compression
must work and the product must equal the dense one. ``auto`` (the default) also times
both and keeps a shape sparse only where the sparse forward, compression included, is
faster; ``on`` keeps every shape that passes and refuses to train when one fails. The
checkpoint holds the decision, so a resume runs the same kernels.

Results are those of the dense masked model up to the kernels' summation order.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpt2.errors import ConfigError
from gpt2.runtime.device import compiles

STRUCTURE = "2:4"  # the one structure the kernels run
HALF = ("bfloat16", "float16")
# The check's bound on |sparse - dense| / |dense| over a whole product: the two differ
# in summation order and rounding only (bfloat16 keeps 8 significant bits, a relative
# step of 2^-8 = 3.9e-3), while a product with the wrong weights is off by about
# sqrt(2) (two unrelated products of equal norm).
TOLERANCE = 2e-2
# auto keeps a shape sparse only when its forward is this much faster than the dense
# one: a tie within the timing's noise is not worth a different kernel.
MARGIN = 0.98


def problem(cfg, device_type: str, capability: tuple[int, int] | None = None) -> str | None:
    """Why the sparse kernel cannot run for ``cfg`` on ``device_type`` (None: it can).
    ``capability``: the CUDA device's compute capability (asked of torch when None)."""
    if cfg.pruning_method == "none" or cfg.pruning_structure != STRUCTURE:
        return (f"it needs 2:4 masks (CONFIG_PRUNING_STRUCTURE is "
                f"{cfg.pruning_structure if cfg.pruning_method != 'none' else 'off: no pruning'})")
    if device_type != "cuda":
        return (f"PyTorch has no semi-structured sparse kernel on {device_type}: "
                "only CUDA GPUs of the Ampere generation or newer")
    if cfg.dtype not in HALF:
        return f"the kernels are 16-bit: CONFIG_DTYPE is {cfg.dtype} (use bfloat16)"
    if cfg.parallel == "fsdp" and cfg.nproc_per_node > 1:
        return "FSDP shards the weights the kernel would compress (use DDP)"
    if cfg.sparse_kernel == "auto" and compiles(cfg.compile, device_type):
        # The sparse Linear runs as an eager island in the compiled graph (a graph
        # break at each one), a cost the per-shape timing cannot see.
        return ("the model is compiled (CONFIG_COMPILE), and kgpt has not measured the kernel "
                "inside a compiled graph: CONFIG_SPARSE_KERNEL_ON runs it there anyway, "
                "CONFIG_COMPILE_OFF lets auto time it")
    major, minor = capability or torch.cuda.get_device_capability()
    if major < 8:
        return f"this GPU is compute capability {major}.{minor}: 2:4 kernels need 8.0 (Ampere) or newer"
    # Every pruned weight's sides are multiples of n_embd; CUTLASS, the stricter of the
    # two backends, needs 32 rows and 64 columns at least, in multiples.
    if cfg.n_embd % 64:
        return f"n_embd {cfg.n_embd} is not a multiple of 64, which the kernels need"
    return None


def resolve(cfg, device_type: str, capability: tuple[int, int] | None = None
            ) -> tuple[bool, str]:
    """(use it, what to tell the user) for CONFIG_SPARSE_KERNEL on this device. ``on``
    where it cannot run is a ConfigError naming the reason."""
    if cfg.sparse_kernel == "off":
        return False, "sparse kernel off (CONFIG_SPARSE_KERNEL): dense matmuls on masked weights"
    why = problem(cfg, device_type, capability)
    if why is None:
        return True, ("sparse kernel: the pruned Linears' forward runs 2:4 semi-structured "
                      "once the masks are final, on the weight shapes where the check below "
                      "finds it right" + (" and faster" if cfg.sparse_kernel == "auto" else ""))
    if cfg.sparse_kernel == "on":
        raise ConfigError("sparse_kernel", f"CONFIG_SPARSE_KERNEL_ON, but {why}. Use "
                          "CONFIG_SPARSE_KERNEL_AUTO (sparse where it can be) or _OFF")
    return False, f"no sparse kernel used: {why}; the masks apply to dense matmuls"


def shape_text(shape) -> str:
    """A weight's shape as the log names it: "3072x768" (out x in)."""
    return f"{shape[0]}x{shape[1]}"


@dataclass(frozen=True)
class Verdict:
    """What the check found for one pruned weight shape (out_features, in_features)."""

    shape: tuple[int, int]
    sparse: bool
    why: str

    def line(self) -> str:
        return f"{shape_text(self.shape)}: {'sparse' if self.sparse else 'dense'} ({self.why})"


def time_ms(fn: Callable[[], object], device: torch.device, reps: int = 10) -> float:
    """Median milliseconds of ``fn`` after three untimed calls, the device synchronized
    around each call (CUDA runs asynchronously)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def check(shape: tuple[int, int], batch: tuple[int, int], dtype: torch.dtype,
          device: torch.device, timed: bool, bias: bool = False,
          clock: Callable | None = None) -> Verdict:
    """Check the kernel on a random 2:4 weight of ``shape`` through SparseLinear itself,
    on a random micro-batch of ``batch`` (sequences, positions): it must compress and
    compute the dense product; when ``timed``, it must also be faster (MARGIN),
    compression included, as it is in every training forward. Draws from a generator
    of its own: the run's random streams are left as they were."""
    out_f, in_f = shape
    gen = torch.Generator(device=device).manual_seed(0)
    w = torch.randn(out_f, in_f, generator=gen, device=device)
    keep = torch.rand(out_f, in_f // 4, 4, generator=gen, device=device).argsort(-1) < 2
    # (skip_init: nn.Linear's own initialization would draw from the global generator)
    dense = nn.utils.skip_init(nn.Linear, in_f, out_f, bias=bias, device=device, dtype=dtype)
    with torch.no_grad():
        dense.weight.copy_(w * keep.view(out_f, in_f))
        if bias:
            dense.bias.copy_(torch.randn(out_f, generator=gen, device=device))
    sparse = SparseLinear.of(dense)
    x = torch.randn(*batch, in_f, generator=gen, device=device).to(dtype)
    clock = clock or time_ms
    with torch.no_grad():
        want = dense(x)
        try:
            got = sparse(x)
        except Exception as e:  # (no cuSPARSELt/CUTLASS in this build, a shape refused...)
            first = (str(e).strip().splitlines() or [""])[0][:160]
            return Verdict(shape, False, f"the kernel failed: {type(e).__name__}: {first}")
        if got.shape != want.shape:
            return Verdict(shape, False, f"the kernel's product has shape {tuple(got.shape)}, "
                                         f"not {tuple(want.shape)}")
        # (the norms accumulate in float32 without float32 copies of the products)
        err = float(torch.linalg.vector_norm(got - want, dtype=torch.float32)
                    / torch.linalg.vector_norm(want, dtype=torch.float32).clamp_min(1e-30))
        if not err <= TOLERANCE:  # (a NaN fails too)
            return Verdict(shape, False, f"the kernel's product differs from the dense one by "
                                         f"{err:.1e} (relative; at most {TOLERANCE:g} expected)")
        if not timed:
            return Verdict(shape, True, f"checked: {err:.1e} from dense")
        sparse_ms = clock(lambda: sparse(x), device)
        dense_ms = clock(lambda: dense(x), device)
    timing = (f"{sparse_ms:.3f} ms sparse with compression vs {dense_ms:.3f} ms dense, "
              f"{batch[0] * batch[1]} rows")
    return Verdict(shape, sparse_ms < MARGIN * dense_ms, timing)


def agree(verdicts_by_process: list[list[Verdict]]) -> list[Verdict]:
    """One decision for all of a run's processes: a shape runs sparse only where every
    process found it so (each times its own GPU), with the first dissent's reason."""
    out = []
    for mine in zip(*verdicts_by_process):
        against = next((v for v in mine if not v.sparse), None)
        out.append(against or mine[0])
    return out


def decide(cfg, shapes: list[tuple[int, int]], dtype: torch.dtype, device: torch.device,
           gather: Callable[[list], list[list]] = lambda v: [v],
           clock: Callable | None = None) -> list[Verdict]:
    """Check each distinct pruned weight shape (``check``), timed under ``auto``; every
    process's verdicts ``gather``ed and ``agree``d. Under ``on`` a failed check is a
    ConfigError naming it."""
    timed = cfg.sparse_kernel == "auto"
    mine = [check(tuple(shape), (cfg.batch_size, cfg.block_size), dtype, device, timed,
                  cfg.bias, clock) for shape in sorted(set(map(tuple, shapes)))]
    verdicts = agree(gather(mine))
    if cfg.sparse_kernel == "on":
        failed = [v for v in verdicts if not v.sparse]
        if failed:
            raise ConfigError("sparse_kernel", "CONFIG_SPARSE_KERNEL_ON, but the check of the 2:4 "
                              f"kernel failed on this GPU: {failed[0].line()}. Use "
                              "CONFIG_SPARSE_KERNEL_AUTO (dense where it fails) or _OFF")
    return verdicts


def compress(weight: torch.Tensor) -> torch.Tensor:
    """The semi-structured (compressed 2:4) copy of a 16-bit weight whose every group
    of 4 along a row holds at most 2 nonzeros."""
    return torch.sparse.to_sparse_semi_structured(weight)


class _SparseForward(torch.autograd.Function):
    """y = x W^T + b with W compressed in the forward; dense W in the backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, pack):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, pack(weight), bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad @ weight
        grad_w = grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        grad_b = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None


class SparseLinear(nn.Linear):
    """An nn.Linear whose forward runs on the compressed copy of its (masked) weight.
    Holds the dense Linear's own Parameters, so the optimizer, the pruner and
    checkpoints see the same tensors under the same names."""

    pack = staticmethod(compress)  # (tests put a dense stand-in here on the CPU)

    @classmethod
    def of(cls, linear: nn.Linear) -> "SparseLinear":
        _run_eagerly_when_compiled()
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out.in_features, out.out_features = linear.in_features, linear.out_features
        out.weight, out.bias = linear.weight, linear.bias
        return out

    # An eager island in a compiled graph (CONFIG_SPARSE_KERNEL_ON with torch.compile):
    # the semi-structured tensor is made and used outside what the compiler traces
    # (marked so by _run_eagerly_when_compiled, before the first SparseLinear exists).
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Autocast's rule for linear, by hand: a custom Function is not cast for us.
        dtype = (torch.get_autocast_dtype(x.device.type)
                 if torch.is_autocast_enabled(x.device.type) else x.dtype)
        w = self.weight.to(dtype)
        b = None if self.bias is None else self.bias.to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            return _SparseForward.apply(x.to(dtype), w, b, self.pack)


def _run_eagerly_when_compiled() -> None:
    """Mark SparseLinear.forward for the compiler to leave alone (torch.compiler.disable),
    once. Not at import: the mark imports torch._dynamo, which costs as much again as
    torch itself (0.8 s), and every training process imports this module."""
    if not getattr(SparseLinear.forward, "_torchdynamo_disable", False):
        SparseLinear.forward = torch.compiler.disable(SparseLinear.forward)


def engage(model: nn.Module, weight_names: list[str],
           shapes: set[tuple[int, int]] | None = None) -> int:
    """Swap every Linear whose weight is one of ``weight_names`` (the pruning
    targets, e.g. ``transformer.h.0.mlp.c_fc.weight``), and of one of ``shapes`` when
    given (``decide``'s sparse ones), for a SparseLinear holding the same Parameters.
    Returns how many were swapped."""
    owners = {name.rsplit(".", 1)[0] for name in weight_names if name.endswith(".weight")}
    swapped = 0
    for name, module in list(model.named_modules()):
        if (name in owners and isinstance(module, nn.Linear)
                and not isinstance(module, SparseLinear)
                and (shapes is None or tuple(module.weight.shape) in shapes)):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, SparseLinear.of(module))
            swapped += 1
    return swapped

