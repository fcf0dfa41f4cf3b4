"""The pruning methods' code: the Pruner every method's is, and the pruners of the
methods of gpt2/sparsity/ (each module there declares its method and builds its
pruner from here).

A pruner owns one boolean mask per target tensor (True = pruned) and is driven by
the training loop around each optimizer step:

    backward -> unscale -> pruner.before_step() -> clip -> optimizer.step()
             -> pruner.after_step(step)

``before_step`` accumulates gradient-based scores and zeroes the gradients of pruned
weights; ``after_step`` grows the masks on schedule and then zeroes pruned weights,
so between steps (for checkpoints, evaluation, ``sparsity()`` and exports) a pruned
weight is exactly 0. ``after_step`` must follow every ``before_step``, also when the
grad scaler skips ``optimizer.step()``: it is what zeroes them again.

Magnitude and state pruning also zero a pruned weight's optimizer state when it is
pruned, and masks only grow: a pruned weight stays dead. Movement pruning follows its
reference (Sanh et al. 2020), where the weight matrix W stays dense, the forward pass
uses W * mask and pruned weights can come back: in ``before_step`` it puts the true
values of pruned weights (kept aside in ``kept``) back into the parameters, so that
``optimizer.step()`` moves them exactly as it moves the reference's dense W (no
gradient, but momentum and weight decay still act), and ``after_step`` sets the moved
values aside again. Their optimizer state is kept. CONFIG_MOVEMENT_FREEZE_PRUNED
instead freezes them and clears their state, as magnitude pruning does; that equals
the reference only under SGD without momentum or decay. Masks travel in checkpoints,
with movement's scores and kept values.

Sparsity follows Zhu & Gupta (2017): 0 until ``pruning_warmup`` steps, then a cubic
(or linear) ramp reaching ``target_sparsity`` at ``pruning_end`` of training, with
masks updated every ``pruning_frequency`` steps. Exactly ``round(s * n)`` weights
are pruned at sparsity ``s`` (ties broken by position), per tensor or over all
targets at once (``pruning_scope``). State pruning follows AdamWPrune's own
schedule, scope and threshold by default instead (StatePruning).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gpt2.config.choices import end_step, n_of_m
from gpt2.config.registry import PRUNING_METHODS
from gpt2.optim.algorithms.optimizer_base import is_hidden_matrix

# AdamWPrune's _kth_threshold_sampling draws 2 % of the scores.
STATE_SAMPLE_FRACTION = 0.02
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


def measured_sparsity(targets: list[tuple[str, torch.Tensor]]) -> float:
    """Fraction of the ``targets``' weights that are exactly zero."""
    zeros = torch.stack([(p == 0).sum() for _, p in targets]).sum()
    return zeros.item() / sum(p.numel() for _, p in targets)


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


def adamwprune_sparsity(step: int, target: float, start: int, end: int,
                        frequency: int) -> float | None:
    """The sparsity AdamWPrune's code (lib/optimizers.py, update_adamprune_masks)
    moves the masks to after optimizer step ``step`` (counted from 1), or None where
    it leaves them. Its GPT-2 trainer passes the iteration number, the steps taken
    before this one (i = step - 1): it updates when i > start and i is a multiple of
    ``frequency``, also after the ramp, to ``target * x**3`` with
    x = min(1, (i - start) / (end - start))."""
    i = step - 1
    if i <= start or i % frequency:
        return None
    x = min(1.0, (i - start) / (end - start))
    return target * x ** 3


def sampled_kth(scores: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """AdamWPrune's threshold (_kth_threshold_sampling): the k-th smallest of 1-D
    ``scores`` estimated from a sample of 2 % of them, drawn with replacement, with k
    scaled to the sample's size."""
    n = scores.numel()
    size = max(1, int(n * STATE_SAMPLE_FRACTION))
    idx = torch.randint(0, n, (size,), device=scores.device, generator=generator)
    return torch.kthvalue(scores[idx], max(1, int(k * (size / n)))).values


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


def nm_candidates(ranked: dict[str, torch.Tensor], n: int, m: int) -> dict[str, torch.Tensor]:
    """The scores with all but each group's M - N lowest set to +inf, for N:M masks.

    A group is M consecutive entries of a flattened tensor, so M consecutive weights of
    a row (a Linear's input dimension: the rows' length is a multiple of M). Pruning
    the k lowest of what this returns prunes at most M - N per group at any k, and at
    k = (M - N) / M of the weights exactly M - N in every group: the ramp grows an N:M
    mask. Ties in a group go by position, as ``lowest`` breaks them."""
    out = {}
    for name, scores in ranked.items():
        groups = scores.view(-1, m)
        lowest_in_group = torch.sort(groups, dim=1, stable=True).indices[:, :m - n]
        candidate = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, lowest_in_group, True)
        out[name] = groups.masked_fill(~candidate, math.inf).flatten()
    return out


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
        self.nm = n_of_m(cfg.pruning_structure)  # (N, M), or None: unstructured
        self.pruned = {name: torch.zeros_like(p, dtype=torch.bool) for name, p in self.targets}

    # ---- hooks called by the training loop ---------------------------------------
    def structured_from(self) -> int:
        """The first step whose weights keep the final N:M pattern, so that a sparse
        kernel may compute with them (the trainer swaps the Linears then): the step
        after the ramp's end. Before it the weights are not yet N:M."""
        return self.end + 1

    def replaces_update(self, step: int) -> bool:
        """Whether the mask update of ``step`` takes the place of its weight update
        (RigL's reference); the training loop then skips the optimizer step."""
        return False

    @torch.no_grad()
    def before_step(self, step: int | None = None) -> None:
        self.accumulate()
        for name, p in self.targets:
            if p.grad is not None:
                p.grad.masked_fill_(self.pruned[name], 0.0)

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        # After the ramp the masks only change where pruned weights can come back.
        if (self.start < step and (step <= self.end or self.regrows)
                and ((step - self.start) % self.frequency == 0 or step == self.end)):
            self.update_masks(sparsity_at(step, self.target, self.start, self.end, self.ramp))
        # Optimizers like Muon spread an update over the whole matrix, so the mask
        # is enforced on the weights after every step, not only at updates.
        self.apply_masks()

    @torch.no_grad()
    def apply_masks(self) -> None:
        """Zero the pruned weights (also of a point the optimizer evaluates at, such as
        Schedule-Free's average, whose state is not cleared by every method)."""
        for name, p in self.targets:
            if name in self.pruned:
                p.masked_fill_(self.pruned[name], 0.0)

    def accumulate(self) -> None:
        """Score bookkeeping that needs every step's gradients (movement)."""

    def scores(self) -> dict[str, torch.Tensor]:
        """Importance per target; the lowest are pruned."""
        raise NotImplementedError

    # ---- masks -------------------------------------------------------------------
    # Whether a pruned weight can come back when its score rises again (movement);
    # otherwise pruned weights rank below everything alive and stay pruned.
    regrows = False
    # Whether a weight's optimizer state is zeroed when it is pruned (not in
    # movement's reference, where the dense weight keeps its state).
    clears_state = True

    def masks_changed(self, old: dict[str, torch.Tensor]) -> None:
        """Called after a mask update, before the newly pruned weights are zeroed."""

    @torch.no_grad()
    def update_masks(self, sparsity: float) -> None:
        scores = self.scores()
        ranked = {name: (s.float() if self.regrows else
                         s.float().masked_fill(self.pruned[name], -math.inf)).flatten()
                  for name, s in scores.items()}
        old = dict(self.pruned)
        if self.nm is not None:
            ranked = nm_candidates(ranked, *self.nm)
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
        self.masks_changed(old)
        for name, p in self.targets:
            p.masked_fill_(self.pruned[name], 0.0)
            # Momentum and second moments of a pruned weight are cleared, so it
            # cannot be pushed back to life by stale optimizer state.
            if self.clears_state:
                self.clear_state(p, self.pruned[name])

    def clear_state(self, p: torch.Tensor, where: torch.Tensor) -> None:
        """Zero ``p``'s optimizer state at ``where`` (each tensor shaped like ``p``):
        not where the state is not indexed like the weights (SOAP's moments live in a
        rotated basis)."""
        if not getattr(self.optimizer, "state_in_weight_coordinates", True):
            return
        for value in self.optimizer.state.get(p, {}).values():
            if torch.is_tensor(value) and value.shape == p.shape:
                value.masked_fill_(where, 0)

    def sparsity(self) -> float:
        """Fraction of target weights that are exactly zero, measured on the weights."""
        return measured_sparsity(self.targets)

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

    def before_step(self, step: int | None = None) -> None:
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
    """Sanh et al. (2020), hard movement pruning, as its reference code (the
    movement-pruning example of Hugging Face transformers, emmental's MaskedLinear)
    behaves. There the weight W stays dense and the forward pass uses
    W' = W * TopK(S). The straight-through estimator gives the scores
    dL/dS = dL/dW' * W for every weight, pruned ones included; S is the accumulated
    -W * dL/dW' (the paper's Eq. 7; its learning rate does not change the ranking).
    W's own gradient is dL/dW' * mask, 0 where pruned, but the optimizer still steps
    all of W: a pruned weight keeps its optimizer state, and momentum and weight
    decay go on moving it (not under plain SGD). A mask update keeps the top of S, so
    a weight pruned earlier comes back when its score climbs again, with the value
    it has drifted to and its state.

    Here a pruned weight is 0 in the parameter between steps (what the forward pass,
    ``sparsity()``, checkpoints and exports see) and its true value is kept aside in
    ``kept``. ``before_step`` writes the kept values back into the parameters (their
    gradients are zeroed), so ``optimizer.step()`` moves them as it moves the
    reference's W, Muon's whole-matrix update included; ``after_step`` keeps the
    moved values aside and zeroes them again, also after a step the grad scaler
    skipped (then nothing moved). Their optimizer state is never cleared.

    With ``freeze`` a pruned weight is frozen instead: its kept value
    does not change and its optimizer state is zeroed when it is pruned, so it comes
    back with the value it had when pruned and fresh state (kgpt's rule before it
    followed the reference; the same as the reference only under SGD without momentum
    or weight decay)."""

    regrows = True

    def __init__(self, model, optimizer, cfg, total_steps, freeze: bool = False):
        super().__init__(model, optimizer, cfg, total_steps)
        self.freeze = freeze
        self.clears_state = self.freeze
        # the accumulated -w * dL/dw' of every target weight: its score
        self.accumulated = {name: torch.zeros_like(p, dtype=torch.float32)
                            for name, p in self.targets}
        self.kept = {name: torch.zeros_like(p) for name, p in self.targets}
        # True from before_step to after_step while the parameters hold the kept
        # values of pruned weights (the reference's dense W).
        self.dense = False

    @torch.no_grad()
    def before_step(self, step=None):
        if not self.freeze:
            for name, p in self.targets:
                p.copy_(torch.where(self.pruned[name], self.kept[name], p))
            self.dense = True
        super().before_step(step)

    @torch.no_grad()
    def after_step(self, step):
        if self.dense:
            # What the optimizer made of the pruned weights is their true value now.
            for name, p in self.targets:
                self.kept[name] = torch.where(self.pruned[name], p, self.kept[name])
            self.dense = False
        super().after_step(step)  # zeroes every pruned weight, whatever happened

    def accumulate(self):
        for name, p in self.targets:
            if p.grad is not None:
                w = p.detach() if self.dense else torch.where(self.pruned[name],
                                                              self.kept[name], p.detach())
                step = -(w.float() * p.grad.float())
                # A step that overflowed in fp16 (and that the grad scaler will skip)
                # must not poison the running scores.
                self.accumulated[name] += torch.nan_to_num(step, nan=0.0, posinf=0.0,
                                                           neginf=0.0)

    def masks_changed(self, old):
        # Newly pruned weights are set aside; returning ones get their kept value back
        # (after before_step the parameter holds it already).
        for name, p in self.targets:
            newly, back = self.pruned[name] & ~old[name], old[name] & ~self.pruned[name]
            self.kept[name] = torch.where(newly, p.detach(), self.kept[name])
            p.copy_(torch.where(back, self.kept[name], p.detach()))

    def scores(self):
        return self.accumulated

    def state_dict(self):
        return {**super().state_dict(),
                "accumulated": {name: s.clone() for name, s in self.accumulated.items()},
                "kept": {name: s.clone() for name, s in self.kept.items()}}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        for key in ("accumulated", "kept"):
            for name, s in state[key].items():
                getattr(self, key)[name] = s.to(self.accumulated[name].device)


# The constant AdamWPrune adds in its scores (lib/optimizers.py), whatever Adam's eps.
STATE_SCORE_EPS = 1e-8


def state_score(variant: str, w: torch.Tensor, m: torch.Tensor,
                v: torch.Tensor) -> torch.Tensor:
    """Importance from AdamW's moments, as AdamWPrune's code computes it:
    ``hybrid`` (its bitter0) |w * m| * |w| / (sqrt(v) + 1e-8), and ``bitter7``
    |w| * (|v| + 1e-8)^(1/4). (AdamWPrune's README writes bitter7 as
    |w| * (v^(1/4) + eps); the code is what produced its published numbers.)"""
    w, m, v = w.float(), m.float(), v.float()
    if variant == "hybrid":
        return (w * m).abs() * (w.abs() / (v.sqrt() + STATE_SCORE_EPS))
    if variant == "bitter7":
        return w.abs() * (v.abs() + STATE_SCORE_EPS) ** 0.25
    raise ValueError(f"unknown state pruning variant {variant!r}")


def with_head(model: nn.Module,
              targets: list[tuple[str, nn.Parameter]]) -> list[tuple[str, nn.Parameter]]:
    """``targets`` and, last, the output head's weight unless it is among them (a
    tied head is the token embedding, under that name). AdamWPrune prunes every
    nn.Linear, the head included, in module order: the blocks, then the head."""
    head = dict(model.named_parameters(remove_duplicate=False)).get("lm_head.weight")
    if head is None or any(p is head for _, p in targets):
        return targets
    return targets + [next((n, p) for n, p in model.named_parameters() if p is head)]


class StatePruning(Pruner):
    """State pruning with AdamWPrune's scores: the optimizer's own first and second
    moments rank the weights, so pruning costs no extra memory for scores.

    By default (the builder, gpt2/sparsity/, passes the method's settings) it follows
    the rest of AdamWPrune's code too (lib/optimizers.py, update_adamprune_masks, as
    its GPT-2 trainer calls it): the schedule of ``adamwprune_sparsity`` (``ramp``
    None), one threshold over all targets (``scope`` "global") estimated from a 2 %
    sample with every score at or below it pruned (``threshold`` "sampled"), and the
    output head among the targets (``prune_head``). The sample comes from a generator
    of its own, seeded with the run's seed and kept in checkpoints (the reference
    draws from torch's global generator). A pruned weight is 0 with zero moments, so
    its score is 0 and it stays pruned, as in the reference. The alternatives are
    kgpt's rules for the other methods: the ``cubic`` or ``linear`` ramp of
    ``sparsity_at``, per-tensor ranking, exactly ``round(s * n)`` pruned; with any of
    them a run is not AdamWPrune's."""

    def __init__(self, model, optimizer, cfg, total_steps, variant: str, ramp: str | None,
                 scope: str, threshold: str, prune_head: bool):
        super().__init__(model, optimizer, cfg, total_steps)
        self.variant = variant
        self.ramp = ramp  # None: AdamWPrune's own schedule
        self.scope, self.threshold = scope, threshold
        if prune_head:
            self.targets = with_head(model, self.targets)
            for name, p in self.targets:
                self.pruned.setdefault(name, torch.zeros_like(p, dtype=torch.bool))
        device = self.targets[0][1].device
        self.generator = torch.Generator(device=device).manual_seed(cfg.seed)

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        if self.ramp is not None:
            return super().after_step(step)
        sparsity = adamwprune_sparsity(step, self.target, self.start, self.end,
                                       self.frequency)
        if sparsity is not None:
            self.update_masks(sparsity)
        for name, p in self.targets:
            p.masked_fill_(self.pruned[name], 0.0)

    @torch.no_grad()
    def update_masks(self, sparsity: float) -> None:
        if self.threshold == "exact" or self.nm is not None:
            return super().update_masks(sparsity)
        # A pruned weight's score is 0 in the reference (its weight is 0); it is
        # made so here whatever the weight holds, so it never outranks a live one.
        # (The scores are fresh tensors: filled in place.)
        scores = {name: s.float().masked_fill_(self.pruned[name], 0.0).flatten()
                  for name, s in self.scores().items()}
        names = [name for name, _ in self.targets]
        for group in ([names] if self.scope == "global" else [[n] for n in names]):
            flat = torch.cat([scores[n] for n in group]) if len(group) > 1 else scores[group[0]]
            k = int(sparsity * flat.numel())
            if k <= 0:
                continue
            threshold = sampled_kth(flat, k, self.generator)
            del flat
            for n in group:
                # AdamWPrune keeps `importance > threshold`: ties at it are pruned.
                gone = (scores[n] > threshold).logical_not_()
                self.pruned[n] = gone.logical_or_(self.pruned[n].flatten()).view_as(
                    self.pruned[n])
        for name, p in self.targets:
            p.masked_fill_(self.pruned[name], 0.0)
            self.clear_state(p, self.pruned[name])

    def state_dict(self):
        return {**super().state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if "generator" in state:  # (checkpoints from before it had one: as seeded)
            self.generator.set_state(state["generator"].clone().cpu())

    def scores(self):
        out = {}
        for name, p in self.targets:
            state = self.optimizer.state.get(p, {})
            if "exp_avg" not in state:  # no step taken yet: fall back to magnitude
                out[name] = p.detach().abs()
                continue
            out[name] = state_score(self.variant, p.detach(), state["exp_avg"],
                                    state["exp_avg_sq"])
        return out


# ---- dynamic sparse training ------------------------------------------------------

# RigL's code adds N(0, 1e-5) to the drop scores to break ties at random.
DST_NOISE_STD = 1e-5


def dst_drop_fraction(iteration: int, initial: float, anneal: str, begin: int,
                      end: int) -> float:
    """The fraction dropped at ``iteration`` (optimizer steps taken before it), as RigL's
    code (sparse_optimizers.py, get_drop_fraction): constant, or TensorFlow's
    cosine_decay of the *global step* over ``end - begin`` steps,
    initial * (1 + cos(pi * min(t, end - begin) / (end - begin))) / 2. (The step is
    not counted from ``begin``: a late start begins part-way down the cosine.)"""
    if anneal == "constant":
        return initial
    span = max(end - begin, 1)
    return initial * 0.5 * (1 + math.cos(math.pi * min(iteration, span) / span))


def dst_update(alive: torch.Tensor, score_drop: torch.Tensor, score_grow: torch.Tensor,
               fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One drop-and-grow of a tensor, as RigL's ``_get_update_op``: of the ``n`` live
    weights, ``int(n * fraction)`` are dropped (the rest, the highest ``score_drop``,
    kept) and as many grown, the highest ``score_grow`` among those not kept (a weight
    just dropped may come straight back). Returns (the new live mask, the weights
    that are new: grown and not live before). Ties go to the lower index, as
    TensorFlow's top_k."""
    flat_alive = alive.flatten()
    n_ones = int(flat_alive.sum())
    n_prune = int(n_ones * fraction)
    n_keep = n_ones - n_prune
    order = torch.sort(score_drop.flatten().float(), descending=True, stable=True).indices
    kept = torch.zeros_like(flat_alive)
    kept[order[:n_keep]] = True
    grow = score_grow.flatten().float()
    lifted = torch.where(kept, grow.min() - 1, grow)
    order = torch.sort(lifted, descending=True, stable=True).indices
    grown = torch.zeros_like(flat_alive)
    grown[order[:n_prune]] = True
    new = grown & ~flat_alive
    return (kept | grown).view_as(alive), new.view_as(alive)


class DynamicSparsity(Pruner):
    """SET and RigL as RigL's reference code runs them (google-research/rigl,
    sparse_optimizers.py: SparseSETOptimizer, SparseRigLOptimizer, ``_get_update_op``).

    The sparsity is the target's from the first mask on: a random mask with exactly
    round(s * n) of each tensor pruned before the first step (``pruning_warmup`` 0, the
    reference's random mask), or the smallest |w| after a dense warmup. Then at the
    iterations ``begin + k * frequency`` up to ``end`` (``begin`` = the warmup, ``end``
    = ``pruning_end`` of training; iterations count the steps taken before, as the
    reference's global step), each tensor drops the ``int(n * f)`` live weights of
    smallest |w| (plus N(0, 1e-5) noise, the reference's tie-break, from a generator
    of the pruner's own, seeded with the run's seed and kept in checkpoints) and
    grows as many: SET at random, RigL where |gradient| is largest. The gradient is
    that of the masked weights, dL/d(w * mask), which the forward pass gives pruned
    weights too: the one kgpt's backward computes before pruned gradients are
    cleared. A grown weight starts at 0 with its optimizer state at 0
    (``grow_init='zeros'``, the reference's momentum reset); a weight dropped and
    grown back at once keeps both. RigL's update takes the place of its iteration's
    weight update (the reference runs the optimizer only on other iterations):
    ``replaces_update``; SET's follows it."""

    regrows = True
    grows_by_gradient = False

    def __init__(self, model, optimizer, cfg, total_steps):
        super().__init__(model, optimizer, cfg, total_steps)
        self.initial, self.anneal = cfg.dst_drop_fraction, cfg.dst_drop_anneal
        device = self.targets[0][1].device
        self.generator = torch.Generator(device=device).manual_seed(cfg.seed)
        self.last_update = -self.frequency  # the reference's last_mask_update_step
        self.grads: dict[str, torch.Tensor] = {}
        self.sparse = False  # whether the first mask is in place
        if self.start == 0:
            self.random_masks()

    def is_update(self, step: int) -> bool:
        """Whether the iteration that ends with optimizer step ``step`` updates the masks."""
        i = step - 1
        return self.start <= i <= self.end and self.last_update + self.frequency <= i

    def replaces_update(self, step: int) -> bool:
        return self.grows_by_gradient and self.sparse and self.is_update(step)

    @torch.no_grad()
    def random_masks(self) -> None:
        """The reference's random initial mask: exactly round(s * n) of each tensor."""
        for name, p in self.targets:
            k = round(self.target * p.numel())
            order = torch.randperm(p.numel(), generator=self.generator, device=p.device)
            mask = torch.zeros(p.numel(), dtype=torch.bool, device=p.device)
            mask[order[:k]] = True
            self.pruned[name] = mask.view_as(p)
        self.sparse = True
        self.apply_masks()

    def before_step(self, step: int | None = None) -> None:
        if self.grows_by_gradient and self.sparse and step is not None and self.is_update(step):
            # |dL/d(w * mask)| of every weight, pruned ones included, before it is cleared
            self.grads = {name: p.grad.detach().abs().float() for name, p in self.targets
                          if p.grad is not None}
        super().before_step(step)

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        if not self.sparse and step == self.start:
            # the dense warmup ends: the smallest |w| go, to the target at once
            self.update_masks(self.target)
            self.sparse = True
        elif self.sparse and self.is_update(step):
            self.last_update = step - 1
            fraction = dst_drop_fraction(step - 1, self.initial, self.anneal, self.start,
                                         self.end)
            for name, p in self.targets:
                alive = ~self.pruned[name]
                noise = torch.randn(p.shape, generator=self.generator, device=p.device)
                score_drop = (p.detach() * alive).abs().float() + noise * DST_NOISE_STD
                score_grow = self.grow_scores(name, p)
                alive, new = dst_update(alive, score_drop, score_grow, fraction)
                self.pruned[name] = ~alive
                p.masked_fill_(new, 0.0)
                self.clear_state(p, new)
            self.grads = {}
        self.apply_masks()

    def grow_scores(self, name: str, p: torch.Tensor) -> torch.Tensor:
        return torch.rand(p.shape, generator=self.generator, device=p.device)

    def scores(self):
        return {name: p.detach().abs() for name, p in self.targets}

    def state_dict(self):
        return {**super().state_dict(), "generator": self.generator.get_state(),
                "last_update": self.last_update, "sparse": self.sparse}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.generator.set_state(state["generator"].clone().cpu())
        self.last_update = int(state["last_update"])
        self.sparse = bool(state["sparse"])


class SET(DynamicSparsity):
    """Sparse Evolutionary Training (Mocanu et al. 2018): regrowth at random."""


class RigL(DynamicSparsity):
    """Rigging the Lottery (Evci et al. 2020): regrowth by |gradient|."""

    grows_by_gradient = True

    def grow_scores(self, name, p):
        return self.grads[name]


def build_pruner(model, optimizer, cfg, total_steps: int) -> Pruner:
    """The pruner of ``cfg``'s method (its module in gpt2/sparsity/ builds it)."""
    return PRUNING_METHODS[cfg.pruning_method].build(model, optimizer, cfg, total_steps)
