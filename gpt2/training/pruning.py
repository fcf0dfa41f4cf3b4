"""Pruning registry: the one list behind CONFIG_PRUNING_METHOD and --pruning-method.

``none`` is the only method so far; a method is an object with ``step(step)``
(update masks, called after each optimizer step) and ``state_dict``/``load_state_dict``
(so masks travel in checkpoints).
"""

from __future__ import annotations

from typing import Callable


class NoPruning:
    def step(self, step: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


PRUNING_METHODS: dict[str, Callable[..., object]] = {
    "none": lambda model, optimizer, cfg: NoPruning(),
}


def build_pruner(model, optimizer, cfg):
    return PRUNING_METHODS[cfg.pruning_method](model, optimizer, cfg)
