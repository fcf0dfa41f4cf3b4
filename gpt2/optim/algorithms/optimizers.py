"""The optimizers' code, one builder for each name behind CONFIG_OPTIMIZER and --optimizer.

Fairness rule: weight decay is decoupled (``p <- p * (1 - lr * wd)`` before the
update, never added to the gradient) and applies to the same tensors, those with 2
or more dimensions, for every optimizer. A comparison between optimizers therefore
never compares decay settings by accident; ``tests/optim/test_optimizers.py`` checks the
rule for each entry. SOAP (after its update) and Schedule-Free (at y, inside its
step) keep their references' conventions, on the same tensors.

Each optimizer is a module of gpt2/optim/ that declares everything about it (its
settings, grids, memory and builder: gpt2/config/methods.py). The code of SGD's
wrapper, SPAM and Muon is here; the 2025 benchmark set lives
in modules of its own: sign_descent.py (Lion, Signum), adam_variants.py (ADOPT,
AdEMAMix, MARS, cautious AdamW), soap.py, kron.py (PSGD-Kron), schedule_free.py and
polar_express.py (Muon's alternative coefficients), all on optimizer_base.py.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gpt2.config.registry import OPTIMIZERS
from gpt2.optim.algorithms import polar_express
from gpt2.optim.algorithms.optimizer_base import (LR_SCALE, DecoupledOptimizer, _moments,
                                                 adam_update_, decay_)


# ---- thin wrappers of torch optimizers ------------------------------------------

class SGDW(torch.optim.SGD):
    """torch SGD (momentum, optional Nesterov) with decoupled decay: torch's own
    ``weight_decay`` would add wd*p to the gradient (L2) and feed it to momentum."""

    @torch.no_grad()
    def step(self, closure=None):
        saved = []
        for group in self.param_groups:
            decay_([p for p in group["params"] if p.grad is not None], group["lr"],
                   group["weight_decay"])
            saved.append(group["weight_decay"])
            group["weight_decay"] = 0.0
        try:
            return super().step(closure)
        finally:
            for group, wd in zip(self.param_groups, saved):
                group["weight_decay"] = wd


def spam_warmup_scale(step: int, reset_interval: int, warmup: int) -> float:
    """SPAM's re-warmup factor for 1-based ``step``, as the reference computes it: the
    step that resets the moments and the ``warmup - 1`` after it follow
    ``1 - 0.99 * (1 + cos(pi * k / (warmup + 1))) / 2`` for k = 0, 1, ... steps since
    the reset (0.01 at the reset itself), then 1. Before the first reset, and with
    resets or re-warmup off, it is 1 (the run's own warmup covers the start).

    The reference restarts the re-warmup at the end of the step before a reset, so a
    reset at step 1 (``reset_interval=1``) has none: step 1 is at full rate there."""
    if reset_interval <= 0 or warmup <= 0 or step < max(reset_interval, 2):
        return 1.0
    k = step % reset_interval
    return 1 - 0.99 * (1 + math.cos(math.pi * k / (warmup + 1))) / 2 if k < warmup else 1.0


class AdamWSpam(DecoupledOptimizer):
    """SPAM (Huang et al. 2025, "SPAM: Spike-Aware Adam with Momentum Reset"), as its
    reference code (``SPAM.py`` of the authors' SPAM-Optimizer repository) computes
    it. With t the 1-based step:

    * momentum reset: when t is a multiple of ``reset_interval`` both moments are
      zeroed before the step; the bias-correction count goes on (it is not reset);
    * spike clipping: from step ``clip_delay`` on, and not in the first
      ``clip_delay`` steps after a reset (while v re-accumulates), an element with
      g^2 > ``threshold`` * v (v from the previous step) is replaced by
      sign(g) * sqrt(threshold * v). Only where v > 0, unless ``clip_unseen``: an
      element whose v is exactly 0 has no history to call its gradient a spike
      against. The reference clips it to 0 as well, and since its v then stays 0,
      every later gradient too: a weight that grows back (movement pruning) with
      its state cleared, or zeroed by a reset while it was pruned, never learns
      again until the next reset;
    * the Adam step uses the reference's arithmetic: step size
      lr * sqrt(1 - beta2^t) / (1 - beta1^t), denominator sqrt(v) + eps;
    * re-warmup: the step is scaled by :func:`spam_warmup_scale`.

    Weight decay follows the one decoupled rule of this module, like every optimizer.
    ``threshold=0`` disables clipping and ``reset_interval=0`` disables resets (and
    with them the re-warmup).
    """

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float,
                 threshold: float, reset_interval: int, warmup: int, clip_delay: int,
                 clip_unseen: bool = False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0,
                                      threshold=threshold, reset_interval=reset_interval,
                                      warmup=warmup, clip_delay=clip_delay,
                                      clip_unseen=clip_unseen, spam_step=0))

    def update_group(self, group, params):
        group["spam_step"] += 1
        t, interval, delay = group["spam_step"], group["reset_interval"], group["clip_delay"]
        reset = interval > 0 and t % interval == 0
        clip = group["threshold"] > 0 and t >= delay and (interval <= 0 or t % interval >= delay)
        scale = spam_warmup_scale(t, interval, group["warmup"])
        beta1, beta2 = group["betas"]
        if not params:
            return
        states = [self.state[p] for p in params]
        ms, vs = (list(x) for x in zip(*(_moments(st, p) for st, p in zip(states, params))))
        if reset:
            torch._foreach_zero_(ms)
            torch._foreach_zero_(vs)
        grads = [p.grad for p in params]
        if clip:
            # The reference replaces g where g^2 > threshold * v by sign(g) *
            # sqrt(threshold * v): the same as clamping g to +-sqrt(threshold * v)
            # (elements exactly at the bound agree; tests compare with SPAM.py).
            bound = torch._foreach_mul(vs, group["threshold"])
            if not group["clip_unseen"]:
                # v == 0: no bound (one tensor's mask at a time, a byte per element)
                for b, v in zip(bound, vs):
                    b.masked_fill_(v == 0, math.inf)
            torch._foreach_sqrt_(bound)
            grads = torch._foreach_minimum(grads, bound)
            torch._foreach_neg_(bound)
            torch._foreach_maximum_(grads, bound)
            del bound
        for st in states:
            st["step"] += 1
        torch._foreach_lerp_(ms, grads, 1 - beta1)
        torch._foreach_mul_(vs, beta2)
        torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)
        del grads
        # The reference's arithmetic: eps added to sqrt(v) before the bias correction,
        # which goes into the step size instead.
        denom = torch._foreach_sqrt(vs)
        torch._foreach_add_(denom, group["eps"])
        torch._foreach_addcdiv_(params, ms, denom, [
            -group["lr"] * math.sqrt(1 - beta2 ** st["step"]) / (1 - beta1 ** st["step"]) * scale
            for st in states])


# Newton-Schulz quintic coefficients from the Muon reference implementation
# (Jordan et al. 2024): they push every singular value into roughly [0.7, 1.2]
# within five iterations.
NS_COEFFS = (3.4445, -4.7750, 2.0315)
# modded-nanogpt's track 3 (train_gpt_simple.py): the polynomial 2x - 1.5x^3 + 0.5x^5,
# whose fixed point 1 every singular value in (0, 1] converges to (slowly: it runs 12
# iterations, "not optimizing for wallclock speed").
TRACK3_NS_COEFFS = (2.0, -1.5, 0.5)
# Moonlight (Liu et al. 2025) scales each orthogonalized update to this RMS times
# sqrt(max(rows, cols)), about what AdamW's updates have, so AdamW's learning rate and
# weight decay carry over.
MOONLIGHT_RMS = 0.2


def orthogonalize(g: torch.Tensor, steps: int, coefficients: str = "jordan") -> torch.Tensor:
    """Approximately U V^T for g = U S V^T, by Newton-Schulz iteration; a stack of
    matrices (..., rows, cols) is orthogonalized matrix by matrix, with one batched
    matmul per product. bfloat16 on GPUs as in the reference; float32 elsewhere (CPU
    bfloat16 matmuls are slow). ``coefficients``: Muon's one quintic, repeated
    ("jordan"), or Polar Express's one per iteration (after dividing by 1.01 times
    the norm, as its reference)."""
    if coefficients == "polar-express":
        quintics, margin = polar_express.schedule(steps), polar_express.NORM_MARGIN
    else:
        quintics = [TRACK3_NS_COEFFS if coefficients == "track3" else NS_COEFFS] * steps
        margin = 1.0
    shape = g.shape
    x = g.to(torch.bfloat16 if g.is_cuda else torch.float32).reshape(-1, *shape[-2:])
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * margin + 1e-7)
    for a, b, c in quintics:
        s = x @ x.mT
        # a * x + (b * s + c * s @ s) @ x, the reference's step, with the outer sum
        # fused into the matmul (one stack-sized temporary instead of three)
        x = torch.baddbmm(x, torch.baddbmm(s, s, s, beta=b, alpha=c), x, beta=a)
    if tall:
        x = x.mT
    return x.to(g.dtype).reshape(shape)


def orthogonal_scale(rows: int, cols: int, how: str) -> float:
    """The factor on one orthogonalized (rows x cols) update: the reference's
    sqrt(max(1, rows/cols)), or Moonlight's 0.2 * sqrt(max(rows, cols))."""
    if how == "moonlight":
        return MOONLIGHT_RMS * max(rows, cols) ** 0.5
    return max(1.0, rows / cols) ** 0.5


class Muon(DecoupledOptimizer):
    """Muon (MomentUm Orthogonalized by Newton-schulz) for the 2-D weights inside
    the transformer blocks, AdamW for everything else (embeddings, head, biases,
    LayerNorm), as in the modded-nanogpt speedrun and the reference ``muon.py``.
    Groups with ``orthogonal=True`` take the Muon step; the others take
    :func:`adam_update_`. A Muon group's ``split`` cuts each weight into that many
    matrices along its rows before orthogonalizing: the fused attention weight holds
    Q, K and V, which the reference keeps as three matrices."""

    def __init__(self, groups, lr: float, momentum: float, nesterov: bool, ns_steps: int,
                 betas: tuple[float, float], eps: float, scale: str = "shape",
                 coefficients: str = "jordan", normuon_beta2: float | None = None):
        super().__init__(groups, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      ns_steps=ns_steps, betas=betas, eps=eps, scale=scale,
                                      coefficients=coefficients, normuon_beta2=normuon_beta2,
                                      weight_decay=0.0, orthogonal=False, split=1))

    def update_group(self, group, params):
        if not params:
            return
        states = [self.state[p] for p in params]
        grads = [p.grad for p in params]
        if not group["orthogonal"]:
            adam_update_(params, grads, states, group["lr"], group["betas"], group["eps"])
            return
        for st, p in zip(states, params):
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = torch.zeros_like(p)
        bufs, beta = [st["momentum_buffer"] for st in states], group["momentum"]
        torch._foreach_lerp_(bufs, grads, 1 - beta)
        # Matrices of one shape are orthogonalized together, as one stack (a batched
        # matmul per Newton-Schulz product instead of one per matrix).
        by_shape: dict[tuple[int, int], list[int]] = {}
        for i, p in enumerate(params):
            by_shape.setdefault((p.size(-2) // group["split"], p.size(-1)), []).append(i)
        for (rows, cols), members in by_shape.items():
            stack = torch.stack([grads[i] if group["nesterov"] else bufs[i] for i in members])
            if group["nesterov"]:  # g.lerp(buf, beta), in place on the stacked copies
                torch._foreach_lerp_(list(stack.unbind(0)), [bufs[i] for i in members], beta)
            update = orthogonalize(stack.view(len(members), -1, rows, cols), group["ns_steps"],
                                   group["coefficients"])
            del stack
            if group["normuon_beta2"] is not None:
                self._normuon([states[i] for i in members], [params[i] for i in members],
                              update, group["normuon_beta2"])
            torch._foreach_add_([params[i] for i in members],
                                [u.reshape(params[i].shape)
                                 for i, u in zip(members, update.unbind(0))],
                                alpha=-group["lr"] * orthogonal_scale(rows, cols, group["scale"]))


    @staticmethod
    def _normuon(states: list[dict], params: list[torch.Tensor], update: torch.Tensor,
                 beta2: float) -> None:
        """NorMuon (Li et al. 2025, reference normuon.py of zichongli5/NorMuon): each
        row of an orthogonalized update is divided by the square root of an EMA of its
        mean square, then the matrix is scaled back to the norm it had. In place on
        ``update`` (members, split, rows, cols); one (rows, 1) EMA per weight."""
        for st, p in zip(states, params):
            if "second_momentum_buffer" not in st:
                st["second_momentum_buffer"] = torch.zeros_like(p[..., 0:1])
        for st, u in zip(states, update.unbind(0)):
            buf = st["second_momentum_buffer"].view(*u.shape[:-1], 1)
            norm = u.norm(dim=(-2, -1), keepdim=True)
            buf.lerp_((u * u).mean(dim=-1, keepdim=True), 1 - beta2)
            u.mul_(1 / buf.sqrt().add_(1e-10))
            u.mul_(norm / u.norm(dim=(-2, -1), keepdim=True).add_(1e-10))


def is_fused_qkv(name: str) -> bool:
    return name.endswith("attn.c_attn.weight")


def build_optimizer(model: nn.Module, cfg, device_type: str,
                    total_steps: int | None = None) -> torch.optim.Optimizer:
    """The optimizer of ``cfg`` over ``model``'s parameters; ``total_steps``, the run's
    length, for those whose settings span it (AdEMAMix's warmup)."""
    optimizer = OPTIMIZERS[cfg.optimizer].build(model, cfg, device_type, total_steps)
    for group in optimizer.param_groups:
        group.setdefault(LR_SCALE, 1.0)
    return optimizer
