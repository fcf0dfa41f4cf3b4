"""What the optimizers written in kgpt share: the decay groups, the one decoupled
decay step, Adam's moments and step, and the base class whose ``step`` decays then
updates. optimizers.py (the registry) and the modules of the newer optimizers
(sign_descent.py, adam_variants.py) build on it; it imports none of them."""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
from torch import nn

from gpt2.config.methods import adam_fused


# Each parameter group's "lr_scale": the factor between the schedule's learning rate
# and the group's own. A builder sets it where a group peaks at another rate (Muon's
# matrices at their own rate); every other group gets 1.0. Only step.apply_learning_rate
# reads it.
LR_SCALE = "lr_scale"


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay tensors with 2 or more dimensions (the Linear weights and, by the
    nanoGPT/GPT-2 convention, the embeddings); never biases or LayerNorm gains.
    Tied weights appear once (named_parameters de-duplicates them)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """2-D weights inside the transformer blocks: what Muon updates."""
    return p.dim() == 2 and ".h." in f".{name}"


def aux_groups(model: nn.Module, cfg) -> tuple[list, list[dict]]:
    """Track 3's parameter groups (CONFIG_PARAM_GROUPS=track3): the 2-D weights inside
    the transformer blocks, for the caller to give its own rule, and one group each
    for the embedding tables, an untied head and the vectors (biases, norm gains), at
    the aux rates with the aux betas and decay. Each rate is the schedule's rate times
    the group's LR_SCALE (optimizers.py), so the schedule scales every one."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    blocks = [p for n, p in named if is_hidden_matrix(n, p)]
    head = [p for n, p in named if n == "lm_head.weight"]
    embeddings = [p for n, p in named
                  if p.dim() >= 2 and not is_hidden_matrix(n, p) and n != "lm_head.weight"]
    vectors = [p for n, p in named if p.dim() < 2]
    aux = {"betas": (cfg.aux_beta1, cfg.aux_beta2), "weight_decay": cfg.aux_weight_decay}
    rest = [{"params": ps, "lr": lr, LR_SCALE: lr / cfg.learning_rate, **aux}
            for ps, lr in ((embeddings, cfg.aux_embedding_lr), (head, cfg.aux_head_lr),
                           (vectors, cfg.aux_vector_lr))]
    return blocks, rest


def torch_adamw(model: nn.Module, cfg, device_type: str, amsgrad: bool = False):
    """torch's AdamW over ``model`` under ``cfg``'s rate, betas and decay (fused where
    gpt2/config/methods.py adam_fused says)."""
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                             betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, amsgrad=amsgrad,
                             fused=adam_fused(device_type, cfg))


@torch.no_grad()
def decay_(params: list[torch.Tensor], lr: float, weight_decay: float) -> None:
    """The decoupled decay step, for the optimizers written here (torch's AdamW and
    Adam(decoupled_weight_decay=True) do exactly this internally)."""
    if weight_decay and params:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)


def zero_state(state: dict, p: torch.Tensor, *names: str) -> None:
    """Create, on first use, a step count of 0 and a zero tensor shaped like ``p``
    for each of ``names`` (nothing if the first already exists)."""
    if names[0] not in state:
        state["step"] = 0
        for name in names:
            state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _moments(state: dict, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Adam's two moments of ``p``, created (zero, step count 0) on first use."""
    zero_state(state, p, "exp_avg", "exp_avg_sq")
    return state["exp_avg"], state["exp_avg_sq"]


@torch.no_grad()
def adam_update_(params: list[torch.Tensor], grads: list[torch.Tensor], states: list[dict],
                 lr: float, betas: tuple[float, float], eps: float) -> None:
    """One Adam step on every tensor of ``params`` (bias-corrected, the arithmetic of
    torch's AdamW single-tensor path), as a few foreach operations over the whole
    list instead of a Python loop per tensor (the cost of a step is then its
    arithmetic, not the interpreter's). Each ``states[i]['step']`` counts the steps
    since that tensor's moments started."""
    if not params:
        return
    beta1, beta2 = betas
    ms, vs = zip(*(_moments(st, p) for st, p in zip(states, params)))
    ms, vs = list(ms), list(vs)
    for st in states:
        st["step"] += 1
    torch._foreach_lerp_(ms, grads, 1 - beta1)
    torch._foreach_mul_(vs, beta2)
    torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)
    steps = [st["step"] for st in states]
    denom = torch._foreach_sqrt(vs)
    torch._foreach_div_(denom, [math.sqrt(1 - beta2 ** t) for t in steps])
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, ms, denom, [-lr / (1 - beta1 ** t) for t in steps])


def _like(value, p: torch.Tensor) -> bool:
    """Whether a state value is a floating tensor of ``p``'s shape (as ``zeros_like(p)``
    makes moments), which follows ``p``'s dtype; step counts and scalars do not."""
    return torch.is_tensor(value) and value.is_floating_point() and value.shape == p.shape


class DecoupledOptimizer(torch.optim.Optimizer):
    """Base for the optimizers written here: ``step`` applies the decoupled decay
    to each group's parameters that have gradients, then ``update_group``."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with self._in_float32():
            for group in self.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                self.decay(group, params)
                self.update_group(group, params)
        return loss

    @contextlib.contextmanager
    def _in_float32(self) -> Iterator[None]:
        """Lower-precision parameters (bf16-table's token table) stepped in float32:
        each such parameter, its gradient and its state tensors are widened for the
        step and rounded back once after it, as torch's fused AdamW computes a
        bfloat16 parameter's step (track 3's). Stepped in their own dtype, a decay of
        1 - 0.7 x 0.001 would round away on a table of unit entries. The results go
        back into the tensors' own storage, so the parameter keeps its address (which
        CUDA graphs of a compiled model hold)."""
        narrow = [p for group in self.param_groups for p in group["params"]
                  if p.grad is not None and p.dtype.itemsize < 4]  # (float64 stays)
        kept = {}  # each one's own data, gradient and state tensors
        for p in narrow:
            state = self.state.get(p, {})
            kept[p] = (p.data, p.grad, {k: v for k, v in state.items() if _like(v, p)})
            p.data = p.data.float()
            p.grad = kept[p][1].float()
            self.state[p] = {k: v.float() if k in kept[p][2] else v for k, v in state.items()}
        try:
            yield
        finally:
            for p in narrow:
                data, grad, states = kept[p]
                data.copy_(p.data)  # (rounded once)
                grad.copy_(p.grad)
                p.data, p.grad = data, grad
                self.state[p] = {k: (states[k].copy_(v) if k in states else
                                     v.to(data.dtype) if _like(v, data) else v)
                                 for k, v in self.state[p].items()}

    def decay(self, group: dict, params: list[torch.Tensor]) -> None:
        """The decoupled decay of this step, before the update (ADOPT's reference
        skips it at its first step, which only measures the gradient)."""
        decay_(params, group["lr"], group["weight_decay"])

    def update_group(self, group: dict, params: list[torch.Tensor]) -> None:
        raise NotImplementedError


@contextlib.contextmanager
def evaluation_point(optimizer: torch.optim.Optimizer, pruner=None) -> Iterator[None]:
    """Where ``optimizer``'s model is evaluated: a point of its own where it keeps one
    (an ``averaged()`` context that moves the parameters there and back: Schedule-Free's
    average), with ``pruner``'s masks applied to it (movement pruning keeps a pruned
    weight's state, so an average of a pruned weight need not be 0); the parameters
    themselves for every other optimizer. The training loop and checkpoints ask this,
    not which optimizer runs."""
    averaged = getattr(optimizer, "averaged", None)
    if averaged is None:
        yield
        return
    with averaged():
        if pruner is not None:
            pruner.apply_masks()
        yield


def evaluates_elsewhere(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` evaluates its model at a point of its own (see
    evaluation_point): its checkpoints then keep the training point beside it."""
    return getattr(optimizer, "averaged", None) is not None
