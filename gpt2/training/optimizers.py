"""Optimizer registry: the one list behind CONFIG_OPTIMIZER and --optimizer.

Weight decay follows one rule for every optimizer (see ``param_groups``), so a
comparison between optimizers never compares decay settings by accident.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decoupled decay on tensors with 2 or more dimensions (the Linear weights and,
    by the nanoGPT/GPT-2 convention, the embeddings); none on biases and LayerNorm
    gains. Tied weights appear once (named_parameters de-duplicates them)."""
    decay = [p for _, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_adamw(model: nn.Module, cfg, device_type: str) -> torch.optim.Optimizer:
    # The fused CUDA kernel does the whole update in one launch per parameter group.
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                             betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                             fused=device_type == "cuda")


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": build_adamw,
}


def build_optimizer(model: nn.Module, cfg, device_type: str) -> torch.optim.Optimizer:
    return OPTIMIZERS[cfg.optimizer](model, cfg, device_type)
