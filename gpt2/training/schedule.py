"""Learning-rate schedule: linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, min_lr: float, warmup: int, total: int, decay: bool) -> float:
    """Learning rate for the update with 0-based index ``step`` of ``total``.

    Warmup rises linearly and reaches ``lr`` on its last step; cosine decay then
    goes from ``lr`` (at step ``warmup``) towards ``min_lr`` (at step ``total``).
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    if not decay:
        return lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
