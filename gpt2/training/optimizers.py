"""Optimizer registry: the one list behind CONFIG_OPTIMIZER and --optimizer.

Fairness rule: weight decay is decoupled (``p <- p * (1 - lr * wd)`` before the
update, never added to the gradient) and applies to the same tensors, those with 2
or more dimensions, for every optimizer. A comparison between optimizers therefore
never compares decay settings by accident; ``tests/test_optimizers.py`` checks the
rule for each entry.

Each entry names the Config fields it reads (``hparams``): Kconfig shows exactly
those symbols for it, train.py refuses the others, and summary.json records them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

ADAM_HPARAMS = ("beta1", "beta2", "adam_eps")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay tensors with 2 or more dimensions (the Linear weights and, by the
    nanoGPT/GPT-2 convention, the embeddings); never biases or LayerNorm gains.
    Tied weights appear once (named_parameters de-duplicates them)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


@torch.no_grad()
def decay_(params: list[torch.Tensor], lr: float, weight_decay: float) -> None:
    """The decoupled decay step, for the optimizers written here (torch's AdamW and
    Adam(decoupled_weight_decay=True) do exactly this internally)."""
    if weight_decay and params:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)


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


def build_sgd(model, cfg, device_type):
    return SGDW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                momentum=cfg.sgd_momentum, nesterov=cfg.sgd_nesterov)


def build_adam(model, cfg, device_type):
    return torch.optim.Adam(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                            betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                            decoupled_weight_decay=True, fused=device_type == "cuda")


def build_adamw(model, cfg, device_type, amsgrad: bool = False):
    # The fused CUDA kernel does the whole update in one launch per parameter group.
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                             betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, amsgrad=amsgrad,
                             fused=device_type == "cuda")


def build_adamwadv(model, cfg, device_type):
    return build_adamw(model, cfg, device_type, amsgrad=True)


# ---- optimizers written here ----------------------------------------------------

@torch.no_grad()
def adam_update_(p: torch.Tensor, grad: torch.Tensor, state: dict, lr: float,
                 betas: tuple[float, float], eps: float) -> None:
    """One Adam step on ``p`` (bias-corrected, the same arithmetic as torch's AdamW
    single-tensor path). ``state['step']`` counts steps since the moments started."""
    if "exp_avg" not in state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    beta1, beta2 = betas
    state["step"] += 1
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias1 = 1 - beta1 ** state["step"]
    bias2_sqrt = math.sqrt(1 - beta2 ** state["step"])
    denom = (v.sqrt() / bias2_sqrt).add_(eps)
    p.addcdiv_(m, denom, value=-lr / bias1)


class DecoupledOptimizer(torch.optim.Optimizer):
    """Base for the optimizers written here: ``step`` applies the decoupled decay
    to each group's parameters that have gradients, then ``update_group``."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            decay_(params, group["lr"], group["weight_decay"])
            self.update_group(group, params)
        return loss

    def update_group(self, group: dict, params: list[torch.Tensor]) -> None:
        raise NotImplementedError


def spam_lr_factor(step: int, reset_interval: int, warmup: int) -> float:
    """SPAM's re-warmup: after each momentum reset the learning rate climbs back
    along a half cosine over ``warmup`` steps. ``step`` is 1-based; there is no
    re-warmup before the first reset (the run's own warmup covers the start)."""
    if reset_interval <= 0 or warmup <= 0 or step <= reset_interval:
        return 1.0
    k = (step - 1) % reset_interval + 1  # steps since the last reset, this one included
    return 0.5 * (1 - math.cos(math.pi * k / warmup)) if k < warmup else 1.0


class AdamWSpam(DecoupledOptimizer):
    """SPAM (Huang et al. 2025, "SPAM: Spike-Aware Adam with Momentum Reset").

    On top of AdamW:
    * spike clipping: an element whose squared gradient exceeds ``threshold`` times
      the second moment from the previous step is clipped to
      ``sign(g) * sqrt(threshold * v)``. Elements with v = 0 (no history yet: after
      a start or a reset, or an embedding row whose token has not appeared) are left
      alone; the published rule would clip them to 0 and freeze them there;
    * momentum reset: both moments are zeroed every ``reset_interval`` steps;
    * re-warmup: after each reset the step size follows a cosine ramp over
      ``warmup`` steps (see :func:`spam_lr_factor`).
    ``threshold=0`` disables clipping and ``reset_interval=0`` disables resets, which
    leaves exactly AdamW.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float,
                 threshold: float, reset_interval: int, warmup: int):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0,
                                      threshold=threshold, reset_interval=reset_interval,
                                      warmup=warmup, spam_step=0))

    def update_group(self, group, params):
        group["spam_step"] += 1
        t, interval = group["spam_step"], group["reset_interval"]
        reset = interval > 0 and t > 1 and (t - 1) % interval == 0
        lr = group["lr"] * spam_lr_factor(t, interval, group["warmup"])
        for p in params:
            state = self.state[p]
            if reset and "exp_avg" in state:
                state["exp_avg"].zero_()
                state["exp_avg_sq"].zero_()
                state["step"] = 0
            grad = p.grad
            if group["threshold"] > 0 and state.get("step", 0) > 0:
                limit = state["exp_avg_sq"] * group["threshold"]
                # v == 0 means no history to call a spike against (an embedding row
                # not yet seen, or a fresh reset); clipping it would freeze it at 0.
                spike = (grad.square() > limit) & (limit > 0)
                grad = torch.where(spike, grad.sign() * limit.sqrt(), grad)
            adam_update_(p, grad, state, lr, group["betas"], group["eps"])


# Newton-Schulz quintic coefficients from the Muon reference implementation
# (Jordan et al. 2024): they push every singular value into roughly [0.7, 1.2]
# within five iterations.
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def orthogonalize(g: torch.Tensor, steps: int) -> torch.Tensor:
    """Approximately U V^T for g = U S V^T, by Newton-Schulz iteration. bfloat16 on
    GPUs as in the reference; float32 elsewhere (CPU bfloat16 matmuls are slow)."""
    a, b, c = NS_COEFFS
    x = g.to(torch.bfloat16 if g.is_cuda else torch.float32)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        s = x @ x.mT
        x = a * x + (b * s + c * s @ s) @ x
    if tall:
        x = x.mT
    return x.to(g.dtype)


class Muon(DecoupledOptimizer):
    """Muon (MomentUm Orthogonalized by Newton-schulz) for the 2-D weights inside
    the transformer blocks, AdamW for everything else (embeddings, head, biases,
    LayerNorm), as in the modded-nanogpt speedrun. Groups with ``muon=True`` take
    the Muon step; the others take :func:`adam_update_`."""

    def __init__(self, groups, lr: float, momentum: float, nesterov: bool, ns_steps: int,
                 betas: tuple[float, float], eps: float):
        super().__init__(groups, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      ns_steps=ns_steps, betas=betas, eps=eps,
                                      weight_decay=0.0, muon=False))

    def update_group(self, group, params):
        for p in params:
            state = self.state[p]
            if not group["muon"]:
                adam_update_(p, p.grad, state, group["lr"], group["betas"], group["eps"])
                continue
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf, beta = state["momentum_buffer"], group["momentum"]
            buf.lerp_(p.grad, 1 - beta)
            update = p.grad.lerp(buf, beta) if group["nesterov"] else buf
            update = orthogonalize(update, group["ns_steps"])
            # Scale so that tall and wide matrices get comparable RMS updates.
            scale = max(1.0, p.size(-2) / p.size(-1)) ** 0.5
            p.add_(update, alpha=-group["lr"] * scale)


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """2-D weights inside the transformer blocks: what Muon updates."""
    return p.dim() == 2 and ".h." in f".{name}"


def build_muon(model, cfg, device_type):
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    hidden = [p for n, p in named if is_hidden_matrix(n, p)]
    other2d = [p for n, p in named if not is_hidden_matrix(n, p) and p.dim() >= 2]
    vectors = [p for n, p in named if p.dim() < 2]
    groups = [
        # lr_scale: the trainer's schedule multiplies each group's peak rate by it, so
        # Muon's peak is muon_lr while the AdamW groups peak at learning_rate.
        {"params": hidden, "muon": True, "weight_decay": cfg.weight_decay,
         "lr": cfg.muon_lr, "lr_scale": cfg.muon_lr / cfg.learning_rate},
        {"params": other2d, "weight_decay": cfg.weight_decay},
        {"params": vectors, "weight_decay": 0.0},
    ]
    return Muon([g for g in groups if g["params"]], lr=cfg.learning_rate,
                momentum=cfg.muon_momentum, nesterov=cfg.muon_nesterov,
                ns_steps=cfg.muon_ns_steps, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


def build_adamwspam(model, cfg, device_type):
    return AdamWSpam(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                     betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                     threshold=cfg.spam_threshold, reset_interval=cfg.spam_reset_interval,
                     warmup=cfg.spam_warmup)


# ---- the registry ---------------------------------------------------------------

@dataclass(frozen=True)
class OptimizerSpec:
    build: Callable[..., torch.optim.Optimizer]  # (model, cfg, device_type)
    summary: str
    hparams: tuple[str, ...]  # Config fields read besides learning_rate and weight_decay
    # The pruning methods it can be paired with; None: every method that does not
    # demand a particular optimizer (see gpt2/training/pruning.py).
    pruning: tuple[str, ...] | None = None
    # Its update treats each weight element on its own, so it runs on FSDP's shards.
    elementwise: bool = True
    # float32 state values it keeps per parameter, as (block matrices, everything
    # else) under a config: what the memory estimator counts (gpt2/training/memory.py;
    # tests/test_memory.py checks it against the real state of every entry).
    state_floats: Callable[..., tuple[int, int]] = lambda cfg: (2, 2)
    # Bytes of temporaries its step allocates, from (device type, parameters, elements
    # of the largest parameter). Default: torch's Adam family, fused on CUDA (no
    # temporaries), one tensor at a time on the CPU (two float32 temporaries).
    step_scratch: Callable[[str, int, int], int] = (
        lambda device, params, largest: 0 if device == "cuda" else 8 * largest)


OPTIMIZERS: dict[str, OptimizerSpec] = {
    "sgd": OptimizerSpec(build_sgd, "SGD with momentum, optional Nesterov",
                         ("sgd_momentum", "sgd_nesterov"),
                         state_floats=lambda cfg: (1, 1) if cfg.sgd_momentum else (0, 0),
                         # foreach on CUDA: Nesterov's update is one new tensor per param
                         step_scratch=lambda device, params, largest: (
                             4 * params if device == "cuda" else 8 * largest)),
    "adam": OptimizerSpec(build_adam, "Adam (decay decoupled, as for every optimizer)",
                          ADAM_HPARAMS),
    "adamw": OptimizerSpec(build_adamw, "AdamW, fused on CUDA", ADAM_HPARAMS),
    "adamwadv": OptimizerSpec(build_adamwadv, "AdamW with AMSGrad", ADAM_HPARAMS,
                              state_floats=lambda cfg: (3, 3)),  # + max of v
    "adamwspam": OptimizerSpec(build_adamwspam, "AdamW with SPAM spike clipping, momentum "
                               "reset and re-warmup",
                               ADAM_HPARAMS + ("spam_threshold", "spam_reset_interval",
                                               "spam_warmup"),
                               # spike test and clip: ~4 float32 temporaries and masks
                               step_scratch=lambda device, params, largest: 18 * largest),
    "adamwprune": OptimizerSpec(build_adamw, "AdamW whose moments drive state pruning",
                                ADAM_HPARAMS, pruning=("none", "state")),
    "muon": OptimizerSpec(build_muon, "Muon on block matrices, AdamW on the rest",
                          ADAM_HPARAMS + ("muon_lr", "muon_momentum", "muon_nesterov",
                                          "muon_ns_steps"),
                          elementwise=False,  # Newton-Schulz needs whole matrices
                          state_floats=lambda cfg: (1, 2),  # momentum; AdamW elsewhere
                          # its AdamW part on the embeddings (Newton-Schulz works on
                          # the smaller block matrices)
                          step_scratch=lambda device, params, largest: 9 * largest),
}


def build_optimizer(model: nn.Module, cfg, device_type: str) -> torch.optim.Optimizer:
    optimizer = OPTIMIZERS[cfg.optimizer].build(model, cfg, device_type)
    for group in optimizer.param_groups:
        group.setdefault("lr_scale", 1.0)
    return optimizer


def hparams(cfg) -> dict:
    """The optimizer settings a run used, for summary.json."""
    names = ("learning_rate", "min_lr", "weight_decay") + OPTIMIZERS[cfg.optimizer].hparams
    return {name: getattr(cfg, name) for name in names}
