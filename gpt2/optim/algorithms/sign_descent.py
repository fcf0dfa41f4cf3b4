"""Optimizers that step by the sign of a momentum: Lion and Signum.

Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), as the
PyTorch package lion-pytorch 0.2.5 (lion_pytorch.py, update_fn) computes it, with
t counting steps and m starting at 0:

    p <- p * (1 - lr * wd)                        (decoupled decay, first)
    p <- p - lr * sign(beta1 * m + (1 - beta1) * g)
    m <- beta2 * m + (1 - beta2) * g

Signum (Bernstein et al. 2018, "signSGD") steps by the sign of the momentum it has
just updated: Lion with beta1 = beta2, which is how kgpt builds it.

Cautious Lion (Liang et al. 2024, "Cautious Optimizers", reference c_lion.py of
kyleliang919/C-Optim) keeps only the elements whose update agrees in sign with the
gradient, and scales the survivors by numel / (kept + 1) so the step's size stays
about the same. That scale is per tensor: a cautious optimizer needs whole tensors
(not FSDP's shards).

Lion keeps one tensor per parameter, half of Adam's state. Its steps are all +-lr
(times the cautious scale) on every element, so its learning rate is typically 3-10x
below AdamW's and its decay 3-10x above, keeping lr * wd alike (the paper's advice).
"""

from __future__ import annotations

import torch

from gpt2.optim.algorithms.optimizer_base import DecoupledOptimizer


class Lion(DecoupledOptimizer):
    """Lion, Signum (``betas=(b, b)``) and their cautious forms (``cautious=True``).
    The decay is the base class's decoupled step, as in the reference."""

    def __init__(self, params, lr: float, betas: tuple[float, float], cautious: bool = False):
        super().__init__(params, dict(lr=lr, betas=betas, cautious=cautious, weight_decay=0.0))

    def update_group(self, group, params):
        if not params:
            return
        beta1, beta2 = group["betas"]
        for p in params:
            state = self.state[p]
            if "exp_avg" not in state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        ms = [self.state[p]["exp_avg"] for p in params]
        grads = [p.grad for p in params]
        # sign(beta1 * m + (1 - beta1) * g), from a copy of m
        updates = torch._foreach_mul(ms, beta1)
        torch._foreach_add_(updates, grads, alpha=1 - beta1)
        torch._foreach_sign_(updates)
        if group["cautious"]:
            for u, g in zip(updates, grads):
                mask = (u * g > 0).to(g.dtype)
                u.mul_(mask * (mask.numel() / (mask.sum() + 1)))
        torch._foreach_add_(params, updates, alpha=-group["lr"])
        del updates
        torch._foreach_lerp_(ms, grads, 1 - beta2)
