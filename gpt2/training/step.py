"""One optimizer step and what feeds it: the batch stream, the learning rate, the
number of steps. The training loop, `make bench`, `make bench-optim` and the memory
tables all step through ``optimizer_step``, so they measure the same work.
"""

from __future__ import annotations

import collections
import concurrent.futures
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from gpt2.config.options import Config
from gpt2.data.loader import TrainBatches
from gpt2.model.gpt import GPT
from gpt2.runtime import distributed
from gpt2.training import guards
from gpt2.runtime.device import Runtime
from gpt2.optim.algorithms.optimizers import LR_SCALE


@dataclass
class Learner:
    """What an optimizer step works on: the model, its optimizer, grad scaler and
    pruner, on a device (state.TrainState holds the same, and more)."""

    model: GPT
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    pruner: Any
    runtime: Runtime



def apply_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Apply the schedule's rate for this step to every group, each at its scale
    (optimizers.LR_SCALE, which the optimizer builders set; only this reads it)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group[LR_SCALE]


def total_steps(cfg: Config, batches: TrainBatches) -> int:
    """max_iters and/or epochs: whichever ends training first."""
    limits = []
    if cfg.max_iters:
        limits.append(cfg.max_iters)
    if cfg.epochs:
        limits.append(batches.steps_for_epochs(cfg.epochs))
    return min(limits)


def batch_stream(batches: TrainBatches, start: int, stop: int, workers: int,
                 runtime: Runtime, micro_steps: range | None = None
                 ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches for steps [start, stop) in order, prepared ahead by worker threads.
    ``micro_steps``: the micro-batches of each step this process trains on (all of
    them unless the step is shared among processes)."""
    pin = runtime.device_type == "cuda"
    micros = range(batches.accumulation) if micro_steps is None else micro_steps

    def make(key: tuple[int, int]):
        x, y = (torch.from_numpy(a) for a in batches.get(*key))
        return (x.pin_memory(), y.pin_memory()) if pin else (x, y)

    keys = ((s, m) for s in range(start, stop) for m in micros)
    if workers == 0:
        for key in keys:
            x, y = make(key)
            yield x.to(runtime.device), y.to(runtime.device)
        return
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="batches") as pool:
        ahead: collections.deque = collections.deque()
        for key in keys:
            ahead.append(pool.submit(make, key))
            if len(ahead) > 2 * workers:
                x, y = ahead.popleft().result()
                yield x.to(runtime.device, non_blocking=pin), y.to(runtime.device,
                                                                   non_blocking=pin)
        while ahead:
            x, y = ahead.popleft().result()
            yield x.to(runtime.device, non_blocking=pin), y.to(runtime.device, non_blocking=pin)


def optimizer_step(learner: Learner, stream: Iterator, step: int, cfg: Config,
                   fwd: torch.nn.Module | None = None, micro_steps: int | None = None,
                   finite: Callable[[torch.Tensor], Callable[[], bool]] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step (``step`` counts from 1) of ``learner`` (a Learner or a
    TrainState) over gradient_accumulation micro-batches from ``stream``. Returns the
    mean loss and the gradient norm before clipping, both left on the device.

    ``fwd`` runs the forward pass: the model by default, or the model compiled or
    wrapped. With several processes (``fwd`` a DistributedDataParallel, or the model
    sharded by FSDP) this process runs ``micro_steps`` of them and gradients are
    reduced across processes only in the last backward.

    ``finite(loss)`` queues the check that the step's loss is finite and returns the
    function that reads the answer. It is queued after the last forward and read after
    the last backward, so the host waits for the forward only while the device runs
    the backward: no drained queue (the device idle) between backward and update. A
    false answer (a NaN or infinite loss) raises guards.NonFiniteLoss before anything
    is updated, the gradients cleared."""
    model, optimizer, scaler, pruner = (learner.model, learner.optimizer, learner.scaler,
                                        learner.pruner)
    # `is None`, not `or`: a compiled model (torch.compile's OptimizedModule) refuses
    # bool(), which Python asks of `or` through __len__.
    runtime, fwd = learner.runtime, learner.model if fwd is None else fwd
    n = cfg.gradient_accumulation if micro_steps is None else micro_steps
    loss_sum = torch.zeros((), device=runtime.device)
    for i in range(n):
        x, y = next(stream)
        with distributed.accumulating(fwd, model, last=i == n - 1):
            with runtime.autocast():
                # Index, don't unpack: a name bound to the logits would keep the
                # whole (tokens x vocab) tensor alive through backward.
                loss = fwd(x, y)[1]
            loss = loss / n
            loss_sum += loss.detach()  # stays on device: no sync per micro-step
            if finite is not None and i == n - 1:
                is_finite = finite(loss_sum)
            scaler.scale(loss).backward()
    if finite is not None and not is_finite():
        optimizer.zero_grad(set_to_none=True)
        raise guards.NonFiniteLoss(step, loss_sum.item())
    grad_norm = None
    scaler.unscale_(optimizer)  # true gradients for clipping and pruning scores
    pruner.before_step(step)  # pruned weights get no gradient (nor clip-norm share)
    if cfg.grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if hasattr(grad_norm, "full_tensor"):  # FSDP: a sharded (DTensor) norm
            grad_norm = grad_norm.full_tensor()
    if not pruner.replaces_update(step):  # (RigL: this step's update is a mask update)
        scaler.step(optimizer)
    scaler.update()
    pruner.after_step(step)
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def nonfinite_advice(cfg: Config, err: guards.NonFiniteLoss, ckpt_step: int | None) -> str:
    """The message for a run stopped by a non-finite loss."""
    if err.skipped_in_a_row:
        what = (f"the loss was not finite ({err.value}) for {err.skipped_in_a_row} steps in a "
                f"row, the last at step {err.step} (CONFIG_NONFINITE_MAX_SKIPS="
                f"{cfg.nonfinite_max_skips})")
    else:
        what = (f"the loss of step {err.step} is {err.value}; the step's update was not "
                "applied")
    tries = [f"a lower CONFIG_LEARNING_RATE (now {cfg.learning_rate:g}) or a longer "
             f"CONFIG_WARMUP_ITERS (now {cfg.warmup_iters})"]
    if cfg.grad_clip == 0:
        tries.append("CONFIG_GRAD_CLIP=\"1.0\" (clipping is off)")
    if cfg.dtype == "float16":
        tries.append("CONFIG_DTYPE_BFLOAT16=y (float16 overflows where bfloat16 does not)")
    if cfg.nonfinite == "stop":
        tries.append("CONFIG_NONFINITE_SKIP=y to skip such steps and go on: it resumes this "
                     "run from its checkpoint (the policy is not part of the run's hash)")
    kept = (f"The checkpoint of step {ckpt_step} is kept; `make` (the same command) resumes "
            "from it." if ckpt_step is not None else
            "No checkpoint was written before it; the run starts over when run again.")
    return (f"stopped: {what}.\n{kept}\nTry:\n" + "\n".join(f"  - {t}" for t in tries))
