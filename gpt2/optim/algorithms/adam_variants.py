"""Adam's descendants that the 2025 optimizer benchmarks compare: ADOPT, AdEMAMix,
MARS (its AdamW form) and cautious AdamW. Each follows its authors' reference code;
the docstrings say which file, and tests/optim/test_optimizer_references.py compares each
with a transcription of that code, step by step.
"""

from __future__ import annotations

import math

import torch

from gpt2.optim.algorithms.optimizer_base import DecoupledOptimizer, decay_, zero_state


class Adopt(DecoupledOptimizer):
    """ADOPT (Taniguchi et al. 2024, "ADOPT: Modified Adam Can Converge with Any
    beta2"), as the reference ``src/adopt/adopt.py`` of iShohei220/adopt computes it
    with ``decouple=True``. Its first step only measures the gradient (v <- g^2) and
    moves nothing, not even by decay. From then on, with t the steps taken before:

        p <- p * (1 - lr * wd)
        n <- clamp(g / max(sqrt(v), eps), -t^0.25, t^0.25)   (clip: the reference default)
        m <- beta1 * m + (1 - beta1) * n                      (no bias correction)
        p <- p - lr * m
        v <- beta2 * v + (1 - beta2) * g^2

    The gradient is normalised by the second moment of the steps *before* it, which
    is what lets any beta2 converge."""

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float,
                 clip: bool = True):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, clip=clip, weight_decay=0.0))

    def _state(self, p):
        state = self.state[p]
        zero_state(state, p, "exp_avg_sq", "exp_avg")
        return state

    def decay(self, group, params):
        decay_([p for p in params if self._state(p)["step"] > 0], group["lr"],
               group["weight_decay"])

    def update_group(self, group, params):
        beta1, beta2 = group["betas"]
        for p in params:
            state, g = self._state(p), p.grad
            v = state["exp_avg_sq"]
            if state["step"] == 0:
                v.addcmul_(g, g)
            else:
                normed = g / v.sqrt().clamp(min=group["eps"])
                if group["clip"]:
                    bound = state["step"] ** 0.25
                    normed.clamp_(-bound, bound)
                state["exp_avg"].lerp_(normed, 1 - beta1)
                p.add_(state["exp_avg"], alpha=-group["lr"])
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            state["step"] += 1


def mixing_alpha(step: int, alpha: float, warmup: int) -> float:
    """AdEMAMix's mixing weight at 1-based ``step``: a linear climb from 0 to
    ``alpha`` over ``warmup`` steps (the reference's linear_warmup_scheduler)."""
    return alpha * step / warmup if step < warmup else alpha


def slow_beta(step: int, beta3: float, beta1: float, warmup: int) -> float:
    """The slow EMA's decay at 1-based ``step``: from ``beta1`` to ``beta3`` with the
    half-life, not beta, growing linearly (the reference's
    linear_hl_warmup_scheduler), so the slow average starts as fast as the fast one."""
    if step >= warmup:
        return beta3

    def half_life(beta: float) -> float:
        return math.log(0.5) / math.log(beta + 1e-8) - 1

    a = step / warmup
    return 0.5 ** (1 / ((1 - a) * half_life(beta1) + a * half_life(beta3) + 1))


class AdEMAMix(DecoupledOptimizer):
    """AdEMAMix (Pagliardini, Ablin, Grangier 2024, "The AdEMAMix Optimizer: Better,
    Faster, Older"), as the reference ``pytorch/ademamix.py`` of apple/ml-ademamix
    computes it: Adam whose numerator adds ``alpha`` times a slow EMA of the
    gradients (decay ``beta3``, not bias-corrected) to the fast, bias-corrected one,

        p <- p - lr * ((m1 / (1 - beta1^t) + alpha * m2) / (sqrt(v / (1 - beta2^t)) + eps)
                       + wd * p)

    with alpha and beta3 warmed up over ``warmup`` steps (mixing_alpha,
    slow_beta). The reference's decay, wd * p inside the step, is the decoupled
    decay of kgpt's rule."""

    def __init__(self, params, lr: float, betas: tuple[float, float, float], alpha: float,
                 warmup: int, eps: float):
        super().__init__(params, dict(lr=lr, betas=betas, alpha=alpha, warmup=warmup, eps=eps,
                                      weight_decay=0.0))

    def update_group(self, group, params):
        beta1, beta2, beta3_final = group["betas"]
        for p in params:
            state, g = self.state[p], p.grad
            zero_state(state, p, "exp_avg", "exp_avg_slow", "exp_avg_sq")
            state["step"] += 1
            t = state["step"]
            alpha = mixing_alpha(t, group["alpha"], group["warmup"])
            beta3 = slow_beta(t, beta3_final, beta1, group["warmup"])
            m1, m2, v = state["exp_avg"], state["exp_avg_slow"], state["exp_avg_sq"]
            m1.lerp_(g, 1 - beta1)
            m2.lerp_(g, 1 - beta3)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(group["eps"])
            update = m1.div(1 - beta1 ** t).add_(m2, alpha=alpha).div_(denom)
            p.add_(update, alpha=-group["lr"])


class Mars(DecoupledOptimizer):
    """MARS-AdamW (Yuan et al. 2024, "MARS: Unleashing the Power of Variance
    Reduction for Training Large Models"), its approximate form (``is_approx=True``,
    the reference default), as ``MARS/optimizers/mars.py`` of AGI-Arena/MARS computes
    it. For the matrices (groups with ``variance_reduced=True``), with g' the previous step's
    gradient (0 at the first):

        c <- g + gamma * beta1 / (1 - beta1) * (g - g');  c <- c / |c| if |c| > 1
        m <- beta1 * m + (1 - beta1) * c;  v <- beta2 * v + (1 - beta2) * c^2
        p <- p - lr * (wd * p + m / ((sqrt(v) / sqrt(1 - beta2^t) + eps) * (1 - beta1^t)))

    The other tensors (biases and norms) take plain AdamW, as in the reference
    (``optimize_1d=False``), with their own rate and betas. The norm |c| is the whole
    tensor's, so MARS needs whole tensors (not FSDP's shards)."""

    def __init__(self, groups, lr: float, betas: tuple[float, float], gamma: float,
                 adam_betas: tuple[float, float], eps: float):
        super().__init__(groups, dict(lr=lr, betas=betas, gamma=gamma, adam_betas=adam_betas,
                                      eps=eps, weight_decay=0.0, variance_reduced=False))

    def update_group(self, group, params):
        eps = group["eps"]
        beta1, beta2 = group["betas"] if group["variance_reduced"] else group["adam_betas"]
        for p in params:
            state, g = self.state[p], p.grad
            zero_state(state, p, "exp_avg", "exp_avg_sq",
                       *(("last_grad",) if group["variance_reduced"] else ()))
            state["step"] += 1
            t = state["step"]
            if group["variance_reduced"]:
                last = state["last_grad"]
                c = (g - last).mul_(group["gamma"] * beta1 / (1 - beta1)).add_(g)
                norm = torch.linalg.vector_norm(c)
                if norm > 1:
                    c.div_(norm)
                last.copy_(g)
            else:
                c = g
            m, v = state["exp_avg"], state["exp_avg_sq"]
            m.mul_(beta1).add_(c, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(c, c, value=1 - beta2)
            denom = v.sqrt().mul_(1 / math.sqrt(1 - beta2 ** t)).add_(eps).mul_(1 - beta1 ** t)
            p.add_(m / denom, alpha=-group["lr"])


class CautiousAdamW(DecoupledOptimizer):
    """Cautious AdamW (Liang et al. 2024, "Cautious Optimizers: Improving Training
    with One Line of Code"), as ``c_adamw.py`` of kyleliang919/C-Optim computes it:
    AdamW (eps added to sqrt(v), bias correction in the step size) whose update keeps
    only the elements where the momentum agrees in sign with the gradient, scaled by
    1 / max(kept fraction, 1e-3) of the tensor."""

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0))

    def update_group(self, group, params):
        beta1, beta2 = group["betas"]
        for p in params:
            state, g = self.state[p], p.grad
            zero_state(state, p, "exp_avg", "exp_avg_sq")
            state["step"] += 1
            t = state["step"]
            m, v = state["exp_avg"], state["exp_avg_sq"]
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = v.sqrt().add_(group["eps"])
            step_size = group["lr"] * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
            mask = (m * g > 0).to(g.dtype)
            mask.div_(mask.mean().clamp_(min=1e-3))
            p.addcdiv_(m * mask, denom, value=-step_size)
