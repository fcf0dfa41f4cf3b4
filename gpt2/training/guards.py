"""The two ways a step goes wrong that a run survives: a NaN or infinite loss, and
the device running out of memory. Either way the run stops with the last good
checkpoint intact, a summary saying what happened, a distinct exit status, and
advice naming the settings to change (step.nonfinite_advice, memory.oom_advice).

What CONFIG_NONFINITE offers is in gpt2/config/choices.py (NONFINITE_POLICIES).
"""

from __future__ import annotations

import torch


class NonFiniteLoss(Exception):
    """Training stopped before applying an update computed from a NaN/inf loss."""

    def __init__(self, step: int, value: float, skipped_in_a_row: int = 0):
        self.step, self.value, self.skipped_in_a_row = step, value, skipped_in_a_row
        super().__init__(f"non-finite loss ({value}) at step {step}")


def is_out_of_memory(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "out of memory" in str(e).lower()
        and "CUDA" in str(e))
