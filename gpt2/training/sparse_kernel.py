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
measurements); `make bench BENCH_ARGS="--sweep sparse_kernel=off,on"` measures it.

Results are those of the dense masked model up to the kernels' summation order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpt2.errors import ConfigError

STRUCTURE = "2:4"  # the one structure the kernels run
HALF = ("bfloat16", "float16")


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
                      "once the masks are final")
    if cfg.sparse_kernel == "on":
        raise ConfigError("sparse_kernel", f"CONFIG_SPARSE_KERNEL_ON, but {why}. Use "
                          "CONFIG_SPARSE_KERNEL_AUTO (sparse where it can be) or _OFF")
    return False, f"no sparse kernel used: {why}; the masks apply to dense matmuls"


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
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out.in_features, out.out_features = linear.in_features, linear.out_features
        out.weight, out.bias = linear.weight, linear.bias
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Autocast's rule for linear, by hand: a custom Function is not cast for us.
        dtype = (torch.get_autocast_dtype(x.device.type)
                 if torch.is_autocast_enabled(x.device.type) else x.dtype)
        w = self.weight.to(dtype)
        b = None if self.bias is None else self.bias.to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            return _SparseForward.apply(x.to(dtype), w, b, self.pack)


def engage(model: nn.Module, weight_names: list[str]) -> int:
    """Swap every Linear whose weight is one of ``weight_names`` (the pruning
    targets, e.g. ``transformer.h.0.mlp.c_fc.weight``) for a SparseLinear holding the
    same Parameters. Returns how many were swapped."""
    owners = {name.rsplit(".", 1)[0] for name in weight_names if name.endswith(".weight")}
    swapped = 0
    for name, module in list(model.named_modules()):
        if name in owners and type(module) is nn.Linear:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, SparseLinear.of(module))
            swapped += 1
    return swapped

