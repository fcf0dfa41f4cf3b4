"""Pruning registry: the one list behind CONFIG_PRUNING_METHOD and --pruning-method.

A pruner owns one boolean mask per target tensor (True = pruned) and is driven by
the training loop around each optimizer step:

    backward -> unscale -> pruner.before_step() -> clip -> optimizer.step()
             -> pruner.after_step(step)

``before_step`` accumulates gradient-based scores and zeroes the gradients of pruned
weights; ``after_step`` grows the masks on schedule and then zeroes pruned weights
and their optimizer state, so a pruned weight is exactly 0 after every step and
stays dead (masks only grow). Masks travel in checkpoints.

Sparsity follows Zhu & Gupta (2017): 0 until ``pruning_warmup`` steps, then a cubic
(or linear) ramp reaching ``target_sparsity`` at ``pruning_end`` of training, with
masks updated every ``pruning_frequency`` steps. Exactly ``round(s * n)`` weights
are pruned at sparsity ``s`` (ties broken by position), per tensor or over all
targets at once (``pruning_scope``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from gpt2.training.optimizers import OPTIMIZERS, is_hidden_matrix

SCHEDULE_HPARAMS = ("target_sparsity", "pruning_warmup", "pruning_end", "pruning_frequency",
                    "pruning_ramp", "pruning_scope", "prune_embeddings", "prune_norms_biases")
PRUNING_RAMPS = ("cubic", "linear")
PRUNING_SCOPES = ("layer", "global")
STATE_VARIANTS = ("hybrid", "bitter7")
EMBEDDING_NAMES = ("transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight")


def prune_targets(model: nn.Module, embeddings: bool = False,
                  norms_biases: bool = False) -> list[tuple[str, nn.Parameter]]:
    """The tensors pruning may zero: the Linear weights of attention and MLP in every
    block; embeddings (and an untied head) and 1-D tensors (LayerNorm gains, biases)
    only when asked. A tied head is the token embedding, listed once."""
    out = []
    for name, p in model.named_parameters():
        if name in EMBEDDING_NAMES:
            chosen = embeddings
        elif p.dim() < 2:
            chosen = norms_biases
        else:
            chosen = is_hidden_matrix(name, p)
        if chosen:
            out.append((name, p))
    return out


def sparsity_at(step: int, target: float, start: int, end: int, ramp: str) -> float:
    """Scheduled sparsity after ``step`` optimizer steps: 0 up to ``start``, then
    ``target * (1 - (1 - x)**3)`` (cubic) or ``target * x`` (linear) with
    x = (step - start) / (end - start), and ``target`` from ``end`` on."""
    if step <= start:
        return 0.0
    if step >= end:
        return target
    x = (step - start) / (end - start)
    return target * (1 - (1 - x) ** 3 if ramp == "cubic" else x)


def end_step(cfg, total_steps: int) -> int:
    return max(1, round(cfg.pruning_end * total_steps))


def schedule_problem(cfg, total_steps: int) -> str | None:
    """Why the pruning schedule cannot fit in ``total_steps``, or None."""
    end = end_step(cfg, total_steps)
    if cfg.pruning_warmup < end:
        return None
    return (f"pruning would start after step {cfg.pruning_warmup} but must reach its target "
            f"by step {end} (pruning_end={cfg.pruning_end:g} of {total_steps} steps); lower "
            "pruning_warmup or raise pruning_end")


def lowest(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of exactly ``k`` lowest entries of a 1-D tensor; ties at the
    threshold are taken in index order, so the count never overshoots."""
    n = scores.numel()
    if k <= 0:
        return torch.zeros(n, dtype=torch.bool, device=scores.device)
    if k >= n:
        return torch.ones(n, dtype=torch.bool, device=scores.device)
    threshold = torch.kthvalue(scores, k).values
    mask = scores < threshold
    need = k - int(mask.sum())
    if need > 0:
        ties = torch.nonzero(scores == threshold).flatten()[:need]
        mask[ties] = True
    return mask


class Pruner:
    """Schedule, masks and enforcement; subclasses supply ``scores``."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, cfg,
                 total_steps: int):
        self.optimizer = optimizer
        self.targets = prune_targets(model, cfg.prune_embeddings, cfg.prune_norms_biases)
        if not self.targets:
            raise ValueError("pruning has no target tensors")
        self.target = cfg.target_sparsity
        self.start, self.end = cfg.pruning_warmup, end_step(cfg, total_steps)
        self.frequency, self.ramp = cfg.pruning_frequency, cfg.pruning_ramp
        self.scope = cfg.pruning_scope
        self.pruned = {name: torch.zeros_like(p, dtype=torch.bool) for name, p in self.targets}

    # ---- hooks called by the training loop ---------------------------------------
    @torch.no_grad()
    def before_step(self) -> None:
        self.accumulate()
        for name, p in self.targets:
            if p.grad is not None:
                p.grad.masked_fill_(self.pruned[name], 0.0)

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        if self.start < step <= self.end and ((step - self.start) % self.frequency == 0
                                               or step == self.end):
            self.update_masks(sparsity_at(step, self.target, self.start, self.end, self.ramp))
        for name, p in self.targets:
            # Optimizers like Muon spread an update over the whole matrix, so the mask
            # is enforced on the weights after every step, not only at updates.
            p.masked_fill_(self.pruned[name], 0.0)

    def accumulate(self) -> None:
        """Score bookkeeping that needs every step's gradients (movement)."""

    def scores(self) -> dict[str, torch.Tensor]:
        """Importance per target; the lowest are pruned."""
        raise NotImplementedError

    # ---- masks -------------------------------------------------------------------
    @torch.no_grad()
    def update_masks(self, sparsity: float) -> None:
        scores = self.scores()
        # Pruned weights stay pruned: they rank below everything alive.
        ranked = {name: s.float().masked_fill(self.pruned[name], -math.inf).flatten()
                  for name, s in scores.items()}
        if self.scope == "global":
            flat = torch.cat([ranked[name] for name, _ in self.targets])
            mask = lowest(flat, round(sparsity * flat.numel()))
            offset = 0
            for name, p in self.targets:
                self.pruned[name] = mask[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        else:
            for name, p in self.targets:
                self.pruned[name] = lowest(ranked[name],
                                           round(sparsity * p.numel())).view_as(p)
        for name, p in self.targets:
            p.masked_fill_(self.pruned[name], 0.0)
            # Momentum and second moments of a pruned weight are cleared, so it
            # cannot be pushed back to life by stale optimizer state.
            for value in self.optimizer.state.get(p, {}).values():
                if torch.is_tensor(value) and value.shape == p.shape:
                    value.masked_fill_(self.pruned[name], 0)

    def sparsity(self) -> float:
        """Fraction of target weights that are exactly zero, measured on the weights."""
        zeros = torch.stack([(p == 0).sum() for _, p in self.targets]).sum()
        return zeros.item() / sum(p.numel() for _, p in self.targets)

    def state_dict(self) -> dict:
        return {"pruned": {name: m.clone() for name, m in self.pruned.items()}}

    def load_state_dict(self, state: dict) -> None:
        for name, mask in state["pruned"].items():
            self.pruned[name] = mask.to(self.pruned[name].device)


class NoPruning(Pruner):
    """Dense training; ``sparsity`` still measures the default targets."""

    def __init__(self, model, optimizer, cfg, total_steps):
        self.optimizer = optimizer
        self.targets = prune_targets(model)
        self.target = 0.0
        self.pruned = {}

    def before_step(self) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class MagnitudePruning(Pruner):
    """Zhu & Gupta (2017): the smallest |w| go first."""

    def scores(self):
        return {name: p.detach().abs() for name, p in self.targets}


class MovementPruning(Pruner):
    """Sanh et al. (2020), hard movement pruning: S accumulates -w * dL/dw at every
    step and the lowest S are pruned, i.e. the weights moving toward zero."""

    def __init__(self, *args):
        super().__init__(*args)
        self.movement = {name: torch.zeros_like(p, dtype=torch.float32)
                         for name, p in self.targets}

    def accumulate(self):
        for name, p in self.targets:
            if p.grad is not None:
                step = -(p.detach().float() * p.grad.float())
                # A step that overflowed in fp16 (and that the grad scaler will skip)
                # must not poison the running scores.
                self.movement[name] += torch.nan_to_num(step, nan=0.0, posinf=0.0,
                                                        neginf=0.0)

    def scores(self):
        return self.movement

    def state_dict(self):
        return {**super().state_dict(),
                "movement": {name: s.clone() for name, s in self.movement.items()}}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        for name, s in state["movement"].items():
            self.movement[name] = s.to(self.movement[name].device)


def state_score(variant: str, w: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                eps: float) -> torch.Tensor:
    """Importance from AdamW's moments: ``hybrid`` w^2 |m| / (sqrt(v) + eps),
    ``bitter7`` |w| (v^(1/4) + eps)."""
    w, m, v = w.float(), m.float(), v.float()
    if variant == "hybrid":
        return w.square() * m.abs() / (v.sqrt() + eps)
    if variant == "bitter7":
        return w.abs() * (v.sqrt().sqrt() + eps)
    raise ValueError(f"unknown state pruning variant {variant!r}")


class StatePruning(Pruner):
    """AdamWPrune: the optimizer's own first and second moments rank the weights, so
    pruning costs no extra memory for scores."""

    def __init__(self, model, optimizer, cfg, total_steps):
        super().__init__(model, optimizer, cfg, total_steps)
        self.variant, self.eps = cfg.pruning_variant, cfg.adam_eps

    def scores(self):
        out = {}
        for name, p in self.targets:
            state = self.optimizer.state.get(p, {})
            if "exp_avg" not in state:  # no step taken yet: fall back to magnitude
                out[name] = p.detach().abs()
                continue
            out[name] = state_score(self.variant, p.detach(), state["exp_avg"],
                                    state["exp_avg_sq"], self.eps)
        return out


# ---- the registry ---------------------------------------------------------------

@dataclass(frozen=True)
class PruningSpec:
    build: Callable[..., Pruner]  # (model, optimizer, cfg, total_steps)
    summary: str
    hparams: tuple[str, ...]  # Config fields it reads
    optimizer: str | None = None  # the one optimizer it works with; None: any


PRUNING_METHODS: dict[str, PruningSpec] = {
    "none": PruningSpec(NoPruning, "dense training", ()),
    "magnitude": PruningSpec(MagnitudePruning, "smallest |w| (Zhu & Gupta 2017)",
                             SCHEDULE_HPARAMS),
    "movement": PruningSpec(MovementPruning, "accumulated -w*grad (Sanh et al. 2020)",
                            SCHEDULE_HPARAMS),
    "state": PruningSpec(StatePruning, "AdamW moments (needs optimizer adamwprune)",
                         SCHEDULE_HPARAMS + ("pruning_variant",), optimizer="adamwprune"),
}


def pair_problem(optimizer: str, method: str) -> str | None:
    """Why an optimizer and a pruning method cannot be combined, or None."""
    needs = PRUNING_METHODS[method].optimizer
    if needs is not None and needs != optimizer:
        return f"pruning method {method!r} works only with optimizer {needs!r}"
    allowed = OPTIMIZERS[optimizer].pruning
    if allowed is not None and method not in allowed:
        return (f"optimizer {optimizer!r} works only with pruning method "
                f"{' or '.join(repr(a) for a in allowed)}")
    return None


def valid_pairs() -> list[tuple[str, str]]:
    return [(o, m) for o in OPTIMIZERS for m in PRUNING_METHODS if pair_problem(o, m) is None]


def build_pruner(model, optimizer, cfg, total_steps: int) -> Pruner:
    return PRUNING_METHODS[cfg.pruning_method].build(model, optimizer, cfg, total_steps)
