"""Data-parallel training across processes: torchrun's environment, PyTorch's DDP.

One process per GPU (or per CPU slot with the gloo backend), started by torchrun,
which sets RANK, LOCAL_RANK and WORLD_SIZE. Every process builds the same model
from the same seed; DDP averages gradients across them in backward.

The optimizer step is defined globally, so a run means the same thing on 1 or 8
processes: the gradient_accumulation micro-batches of a step are divided among the
processes (each runs accumulation / world of them, a contiguous block), so tokens
per optimizer step stay what the configuration says and the batches are exactly
those a single process would see. Only rank 0 prints, logs, plots and saves.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as torch_dist


@dataclass(frozen=True)
class Dist:
    """This process's place among the run's processes (one process: rank 0 of 1).
    Its methods are the collectives the trainer needs, which do nothing alone."""

    rank: int = 0
    local_rank: int = 0
    world: int = 1

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def micro_steps(self, accumulation: int) -> range:
        """This process's share of a step's micro-batch numbers."""
        share = accumulation // self.world
        return range(self.rank * share, (self.rank + 1) * share)

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """The mean of ``t`` over all processes (``t`` itself when alone)."""
        if not self.enabled:
            return t
        t = t.detach().clone()
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.SUM)
        return t / self.world

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return t
        t = t.detach().clone()
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.SUM)
        return t

    def any(self, flag: bool, device: str) -> bool:
        """True on every process when ``flag`` is true on any: all stop together."""
        if not self.enabled:
            return flag
        t = torch.tensor(int(flag), device=device)
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
        return bool(t.item())

    def any_later(self, flag: torch.Tensor) -> Callable[[], bool]:
        """``any`` for a flag the device is still computing: the reduction over the
        processes and the copy to the host are queued now, and the returned function
        reads the answer, waiting only for work queued before this call (on a GPU;
        the CPU computes as it goes). Every process must call it at the same point."""
        t = flag.to(torch.int32)
        if self.enabled:
            torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
        if t.device.type != "cuda":
            return lambda: bool(t.item())
        host = torch.empty((), dtype=torch.int32, pin_memory=True)
        host.copy_(t, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()

        def read() -> bool:
            copied.synchronize()
            return bool(host.item())
        return read

    def gather(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in rank order, on every process."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world
        torch_dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()

    def share(self, items: list) -> list[tuple[Any, bool]]:
        """This process's items (every world-th) as (item, counted), padded with
        uncounted repeats so every process runs the same number of forward passes:
        FSDP gathers weights in each one, all processes together."""
        mine = items[self.rank::self.world]
        pad = math.ceil(len(items) / self.world) - len(mine)
        return [(x, True) for x in mine] + [(items[0], False)] * pad


def accumulating(fwd: torch.nn.Module, model: torch.nn.Module, last: bool):
    """Context for one micro-step's forward and backward: gradients are reduced
    across processes only in a step's last one."""
    if isinstance(fwd, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext() if last else fwd.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # an FSDP module
        model.set_requires_gradient_sync(last)
    return contextlib.nullcontext()


def shard(model: torch.nn.Module, dist: Dist, device_type: str) -> None:
    """FSDP: each block, then the rest (embeddings, final norm, tied head), sharded
    across the processes. Weights stay float32; autocast computes in low precision."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device_type, (dist.world,))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def full_state(model, optimizer) -> tuple[dict, dict]:
    """Whole (unsharded) model and optimizer state of an FSDP model, on the CPU; every
    process must call it. The optimizer's is keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return (get_model_state_dict(model, options=options),
            get_optimizer_state_dict(model, optimizer, options=options))


def load_full_state(model, optimizer, model_state: dict, optimizer_state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)


def from_env(environ=os.environ) -> Dist:
    """The process's place in a torchrun job; a lone process when not under one."""
    world = int(environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    return Dist(rank=int(environ["RANK"]), local_rank=int(environ["LOCAL_RANK"]), world=world)


def init(dist: Dist, device_type: str) -> None:
    """Join the process group: NCCL between GPUs, gloo on the CPU."""
    if dist.enabled and not torch_dist.is_initialized():
        torch_dist.init_process_group("nccl" if device_type == "cuda" else "gloo")


def shutdown(dist: Dist) -> None:
    if dist.enabled and torch_dist.is_initialized():
        torch_dist.destroy_process_group()
