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


def spam_warmup_scale(step: int, reset_interval: int, warmup: int) -> float:
    """SPAM's re-warmup factor for 1-based ``step``, as the reference computes it: the
    step that resets the moments and the ``warmup - 1`` after it follow
    ``1 - 0.99 * (1 + cos(pi * k / (warmup + 1))) / 2`` for k = 0, 1, ... steps since
    the reset (0.01 at the reset itself), then 1. Before the first reset, and with
    resets or re-warmup off, it is 1 (the run's own warmup covers the start)."""
    if reset_interval <= 0 or warmup <= 0 or step < reset_interval:
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
      sign(g) * sqrt(threshold * v);
    * the Adam step uses the reference's arithmetic: step size
      lr * sqrt(1 - beta2^t) / (1 - beta1^t), denominator sqrt(v) + eps;
    * re-warmup: the step is scaled by :func:`spam_warmup_scale`.

    Weight decay follows the one decoupled rule of this module, like every optimizer.
    ``threshold=0`` disables clipping and ``reset_interval=0`` disables resets (and
    with them the re-warmup).
    """

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float,
                 threshold: float, reset_interval: int, warmup: int, clip_delay: int):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0,
                                      threshold=threshold, reset_interval=reset_interval,
                                      warmup=warmup, clip_delay=clip_delay, spam_step=0))

    def update_group(self, group, params):
        group["spam_step"] += 1
        t, interval, delay = group["spam_step"], group["reset_interval"], group["clip_delay"]
        reset = interval > 0 and t % interval == 0
        clip = group["threshold"] > 0 and t >= delay and (interval <= 0 or t % interval >= delay)
        scale = spam_warmup_scale(t, interval, group["warmup"])
        beta1, beta2 = group["betas"]
        for p in params:
            state = self.state[p]
            if "exp_avg" not in state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            m, v = state["exp_avg"], state["exp_avg_sq"]
            if reset:
                m.zero_()
                v.zero_()
            grad = p.grad
            if clip:
                limit = v * group["threshold"]
                grad = torch.where(grad.square() > limit, grad.sign() * limit.sqrt(), grad)
            state["step"] += 1
            m.lerp_(grad, 1 - beta1)
            v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step_size = (group["lr"] * math.sqrt(1 - beta2 ** state["step"])
                         / (1 - beta1 ** state["step"]))
            p.addcdiv_(m, v.sqrt().add_(group["eps"]), value=-step_size * scale)


# Newton-Schulz quintic coefficients from the Muon reference implementation
# (Jordan et al. 2024): they push every singular value into roughly [0.7, 1.2]
# within five iterations.
NS_COEFFS = (3.4445, -4.7750, 2.0315)
MUON_SCALES = ("shape", "moonlight")
# Moonlight (Liu et al. 2025) scales each orthogonalized update to this RMS times
# sqrt(max(rows, cols)), about what AdamW's updates have, so AdamW's learning rate and
# weight decay carry over.
MOONLIGHT_RMS = 0.2


def orthogonalize(g: torch.Tensor, steps: int) -> torch.Tensor:
    """Approximately U V^T for g = U S V^T, by Newton-Schulz iteration; a stack of
    matrices (..., rows, cols) is orthogonalized matrix by matrix. bfloat16 on GPUs as
    in the reference; float32 elsewhere (CPU bfloat16 matmuls are slow)."""
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


def muon_scale(rows: int, cols: int, how: str) -> float:
    """The factor on one orthogonalized (rows x cols) update: the reference's
    sqrt(max(1, rows/cols)), or Moonlight's 0.2 * sqrt(max(rows, cols))."""
    if how == "moonlight":
        return MOONLIGHT_RMS * max(rows, cols) ** 0.5
    return max(1.0, rows / cols) ** 0.5


class Muon(DecoupledOptimizer):
    """Muon (MomentUm Orthogonalized by Newton-schulz) for the 2-D weights inside
    the transformer blocks, AdamW for everything else (embeddings, head, biases,
    LayerNorm), as in the modded-nanogpt speedrun and the reference ``muon.py``.
    Groups with ``muon=True`` take the Muon step; the others take
    :func:`adam_update_`. A Muon group's ``split`` cuts each weight into that many
    matrices along its rows before orthogonalizing: the fused attention weight holds
    Q, K and V, which the reference keeps as three matrices."""

    def __init__(self, groups, lr: float, momentum: float, nesterov: bool, ns_steps: int,
                 betas: tuple[float, float], eps: float, scale: str = "shape"):
        super().__init__(groups, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      ns_steps=ns_steps, betas=betas, eps=eps, scale=scale,
                                      weight_decay=0.0, muon=False, split=1))

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
            rows, cols = p.size(-2) // group["split"], p.size(-1)
            update = orthogonalize(update.view(group["split"], rows, cols), group["ns_steps"])
            p.add_(update.view_as(p), alpha=-group["lr"] * muon_scale(rows, cols, group["scale"]))


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """2-D weights inside the transformer blocks: what Muon updates."""
    return p.dim() == 2 and ".h." in f".{name}"


def is_fused_qkv(name: str) -> bool:
    return name.endswith("attn.c_attn.weight")


def build_muon(model, cfg, device_type):
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    hidden = [(n, p) for n, p in named if is_hidden_matrix(n, p)]
    other2d = [p for n, p in named if not is_hidden_matrix(n, p) and p.dim() >= 2]
    vectors = [p for n, p in named if p.dim() < 2]
    # Moonlight's scale lets the matrices share AdamW's rate and decay; otherwise they
    # have their own (the reference's lr 0.02 is ~30x AdamW's).
    moonlight = cfg.muon_scale == "moonlight"
    lr = cfg.learning_rate if moonlight else cfg.muon_lr
    decay = cfg.weight_decay if moonlight else cfg.muon_weight_decay
    # LR_SCALE: the schedule's rate times it is each group's rate, so Muon's peak is
    # its own while the AdamW groups peak at learning_rate.
    matrices = {"muon": True, "weight_decay": decay, "lr": lr,
                LR_SCALE: lr / cfg.learning_rate}
    split = 3 if cfg.muon_split_qkv else 1
    groups = [
        {"params": [p for n, p in hidden if is_fused_qkv(n)], **matrices, "split": split},
        {"params": [p for n, p in hidden if not is_fused_qkv(n)], **matrices},
        {"params": other2d, "weight_decay": cfg.weight_decay},
        {"params": vectors, "weight_decay": 0.0},
    ]
    return Muon([g for g in groups if g["params"]], lr=cfg.learning_rate,
                momentum=cfg.muon_momentum, nesterov=cfg.muon_nesterov,
                ns_steps=cfg.muon_ns_steps, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                scale=cfg.muon_scale)


def build_adamwspam(model, cfg, device_type):
    return AdamWSpam(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                     betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                     threshold=cfg.spam_threshold, reset_interval=cfg.spam_reset_interval,
                     warmup=cfg.spam_warmup, clip_delay=cfg.spam_clip_delay)


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
    # The settings a tuning matrix varies for it (gpt2/config/matrix.py GRIDS): its own
    # learning rate and weight decay under a config.
    tuned: Callable[..., dict[str, str]] = (
        lambda cfg: {"lr": "learning_rate", "wd": "weight_decay"})


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
                                               "spam_warmup", "spam_clip_delay"),
                               # spike test and clip: ~4 float32 temporaries and masks
                               step_scratch=lambda device, params, largest: 18 * largest),
    "adamwprune": OptimizerSpec(build_adamw, "AdamW whose moments drive state pruning",
                                ADAM_HPARAMS, pruning=("none", "state")),
    "muon": OptimizerSpec(build_muon, "Muon on block matrices, AdamW on the rest",
                          ADAM_HPARAMS + ("muon_lr", "muon_weight_decay", "muon_momentum",
                                          "muon_nesterov", "muon_ns_steps", "muon_split_qkv",
                                          "muon_scale"),
                          elementwise=False,  # Newton-Schulz needs whole matrices
                          state_floats=lambda cfg: (1, 2),  # momentum; AdamW elsewhere
                          # its AdamW part on the embeddings (Newton-Schulz works on
                          # the smaller block matrices)
                          step_scratch=lambda device, params, largest: 9 * largest,
                          # the block matrices' own rate and decay (AdamW's for the rest
                          # stay as configured); Moonlight's scale shares AdamW's
                          tuned=lambda cfg: (
                              {"lr": "muon_lr", "wd": "muon_weight_decay"}
                              if cfg.muon_scale == "shape"
                              else {"lr": "learning_rate", "wd": "weight_decay"})),
}


# Each parameter group's "lr_scale": the factor between the schedule's learning rate
# and the group's own. A builder sets it where a group peaks at another rate (Muon's
# matrices at muon_lr); every other group gets 1.0. Only step.apply_learning_rate
# reads it.
LR_SCALE = "lr_scale"


def build_optimizer(model: nn.Module, cfg, device_type: str) -> torch.optim.Optimizer:
    optimizer = OPTIMIZERS[cfg.optimizer].build(model, cfg, device_type)
    for group in optimizer.param_groups:
        group.setdefault(LR_SCALE, 1.0)
    return optimizer


def hparams(cfg) -> dict:
    """The optimizer settings a run used, for summary.json."""
    names = ("learning_rate", "min_lr", "weight_decay") + OPTIMIZERS[cfg.optimizer].hparams
    return {name: getattr(cfg, name) for name in names}
