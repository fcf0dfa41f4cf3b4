"""What the training loop does when a step goes wrong: a NaN or infinite loss, or
the device running out of memory. Either way the run stops with the last good
checkpoint intact, a summary saying what happened, a distinct exit status, and
advice naming the settings to change (for memory, the estimator's:
memory.oom_advice).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # options.py reads NONFINITE_POLICIES from here: no import cycle
    from gpt2.config.options import Config

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


def is_out_of_memory(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "out of memory" in str(e).lower()
        and "CUDA" in str(e))
