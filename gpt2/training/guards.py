"""What the training loop does when a step goes wrong: a NaN or infinite loss, or
the device running out of memory. Either way the run stops with the last good
checkpoint intact, a summary saying what happened, a distinct exit status, and
advice naming the settings to change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # options.py reads NONFINITE_POLICIES from here: no import cycle
    from gpt2.config.options import Config
    from gpt2.training import memory

# CONFIG_NONFINITE: what a step with a non-finite loss does.
NONFINITE_POLICIES: tuple[str, ...] = ("stop", "skip")


class NonFiniteLoss(Exception):
    """Training stopped before applying an update computed from a NaN/inf loss."""

    def __init__(self, step: int, value: float, skipped_in_a_row: int = 0):
        self.step, self.value, self.skipped_in_a_row = step, value, skipped_in_a_row
        super().__init__(f"non-finite loss ({value}) at step {step}")


def nonfinite_advice(cfg: Config, err: NonFiniteLoss, ckpt_step: int | None) -> str:
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


def oom_advice(cfg: Config, device_type: str, predicted: memory.Estimate,
               budget: memory.Budget, step: int, ckpt_step: int | None,
               peak_mb: float | None, world: int = 1) -> str:
    """The message for a run that ran out of device memory: the estimator's
    breakdown, then the settings that lower the peak, each with its prediction."""
    import dataclasses

    from gpt2.training import memory

    def predicted_for(other: Config) -> str:
        est = memory.estimate(other, device_type, runtime_bytes=budget.runtime_bytes)
        return f"predicted {memory.gib(est.peak)}, was {memory.gib(predicted.peak)}"

    tries = []
    per_step = cfg.batch_size * cfg.gradient_accumulation
    smaller = [b for b in range(cfg.batch_size // 2, 0, -1)
               if per_step % b == 0 and (per_step // b) % world == 0]
    if smaller:
        b = smaller[0]
        other = dataclasses.replace(cfg, batch_size=b, gradient_accumulation=per_step // b)
        tries.append(f"CONFIG_BATCH_SIZE={b} CONFIG_GRADIENT_ACCUMULATION={per_step // b}: "
                     f"the same {cfg.tokens_per_step():,} tokens per step "
                     f"({predicted_for(other)})")
    for setting, other in memory.savers(cfg):
        tries.append(f"{setting} ({predicted_for(other)})")
    tries.append("CONFIG_MEMORY_BUDGET_MB set to what this device really has free for "
                 "training: the memory check and CONFIG_AUTO_BATCH then plan with it")
    measured = f"; measured peak before it {peak_mb:,.0f} MB" if peak_mb else ""
    kept = (f"The checkpoint of step {ckpt_step} is intact. A changed batch or memory "
            "setting starts its own run folder (the settings that change the computation "
            "are part of the run's hash)." if ckpt_step is not None else
            "No checkpoint had been written yet.")
    return (f"out of memory in step {step} on {device_type}{measured}. The estimate for this "
            f"configuration:\n{memory.breakdown(predicted, budget)}\nTry:\n"
            + "\n".join(f"  - {t}" for t in tries)
            + f"\n{kept}\n(`make memcheck` prints the full table.)")


def is_out_of_memory(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "out of memory" in str(e).lower()
        and "CUDA" in str(e))
