"""PSGD-Kron (Li 2015-2024, "Preconditioned Stochastic Gradient Descent"; the Kron
preconditioner of lixilinx/psgd_torch), as ``kron_torch/kron.py`` of
evanatyourservice/kron_torch computes it with its defaults: the form the optimizer
benchmarks (Wen et al. 2025; modded-nanogpt's optimization track) ran.

For a weight of shape (m, n) it keeps a momentum and a factor per dimension: an upper
triangular Q (d x d, starting at the identity) for a dimension of at most
``max_triangular`` entries, a diagonal one (a vector) for longer dimensions and for 1-D
tensors. The step preconditions the bias-corrected momentum M:

    P = Q1^T Q1 M Q2^T Q2,   P <- P * min(1, 1.1 / rms(P)),   p <- p - lr * (P + wd * p)

(wd only on matrices: kgpt's decoupled rule, which the reference's formula is). The
factors are fitted, on steps a schedule picks, so that P's statistics match those of a
random probe: with V ~ N(0, I) and M perturbed by sqrt(float32 eps) * mean|M| * V,

    A = Q1 M Q2^T,   B = Q1^-T V Q2^-1,
    Q1 <- Q1 - lr_p * triu(A A^T - B B^T) / ||A A^T + B B^T|| * Q1   (the same for Q2)

with the norm a cheap lower bound of the spectral norm (a diagonal factor: its entries'
sums, divided by their maximum). The probe comes from torch's global generator, as in
the reference, so a checkpoint's random state resumes it exactly; one step in a hundred
of those that update also rebalances the factors' norms (the reference's
``random.Random(42)``, whose state kgpt checkpoints with the optimizer).

The update schedule: the preconditioner is fitted at every step for ``flat_steps``
steps, then with probability max(min_prob, exp(-0.001 * (step - flat_steps))), by a
counter that updates once its count reaches 1 / probability.
"""

from __future__ import annotations

import random

import torch

from gpt2.optim.algorithms.optimizer_base import DecoupledOptimizer

# The reference schedule's decay of the update probability per step, after the flat
# start (precond_update_prob_schedule's decay).
PROBABILITY_DECAY = 0.001


def update_probability(step: int, min_prob: float, flat_steps: int) -> torch.Tensor:
    """The chance that the 0-based ``step`` fits the preconditioner, in float32 as the
    reference computes it."""
    prob = torch.tensor(1.0) * torch.exp(-torch.tensor(PROBABILITY_DECAY)
                                         * (torch.tensor(float(step)) - torch.tensor(float(flat_steps))))
    return prob.clamp(min=min_prob, max=1.0)


def _spectral_lower_bound(a: torch.Tensor, largest: torch.Tensor) -> torch.Tensor:
    """A cheap lower bound of a symmetric matrix's spectral norm: one step of power
    iteration from its column of largest norm (``largest``: its largest entry)."""
    a = a / largest
    x = a[:, torch.argmax((a * a).sum(0))]
    x = x @ a
    x = x / x.norm()
    return (a @ x).norm() * largest


class Kron(DecoupledOptimizer):
    """PSGD-Kron; see the module's docstring. Decay is part of its step (the base
    class's decay step is not used)."""

    def __init__(self, params, lr: float, beta1: float, precond_lr: float,
                 max_triangular: int, min_prob: float, flat_steps: int):
        super().__init__(params, dict(lr=lr, beta1=beta1, precond_lr=precond_lr,
                                      max_triangular=max_triangular, weight_decay=0.0))
        self.min_prob, self.flat_steps = min_prob, flat_steps
        self.schedule_step = 0  # steps taken (the schedule's clock)
        self.update_counter = 0
        self.balance_rng = random.Random(42)

    def decay(self, group, params):
        """Inside the step, as the reference (update_group)."""

    def step(self, closure=None):
        prob = update_probability(self.schedule_step, self.min_prob, self.flat_steps)
        self.update_counter += 1
        self.fit = bool(torch.tensor(self.update_counter, dtype=torch.int32) >= 1 / prob)
        if self.fit:
            self.update_counter = 0
        self.schedule_step += 1
        self.balance = self.balance_rng.random() < 0.01 and self.fit
        return super().step(closure)

    def update_group(self, group, params):
        beta = group["beta1"]
        for p in params:
            state, g = self.state[p], p.grad
            if "factors" not in state:
                state["step"] = 0
                state["momentum_buffer"] = torch.zeros_like(g)
                state["factors"] = [
                    torch.eye(d, dtype=torch.float32, device=g.device)
                    if g.dim() >= 2 and 1 < d <= group["max_triangular"]
                    else torch.ones(d, dtype=torch.float32, device=g.device)
                    for d in g.shape]
            state["step"] += 1
            m = state["momentum_buffer"]
            m.mul_(beta).add_(g, alpha=1 - beta)
            debiased = m / (1 - beta ** state["step"])
            factors = state["factors"]
            if g.dim() > 1 and self.balance:
                _balance(factors)
            if self.fit:
                _fit(factors, debiased, group["precond_lr"])  # (perturbs ``debiased``)
            update = _precondition(factors, debiased)
            update.mul_(torch.clamp(1.1 / (update.square().mean().sqrt() + 1e-12), max=1.0))
            if group["weight_decay"] and p.dim() >= 2:
                update.add_(p, alpha=group["weight_decay"])
            p.add_(update, alpha=-group["lr"])

    def state_dict(self):
        out = super().state_dict()
        out["preconditioner"] = {"schedule_step": self.schedule_step,
                       "update_counter": self.update_counter,
                       "balance_rng": self.balance_rng.getstate()}
        return out

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        own = state_dict.pop("preconditioner")
        super().load_state_dict(state_dict)
        self.schedule_step, self.update_counter = own["schedule_step"], own["update_counter"]
        version, internal, gauss = own["balance_rng"]
        self.balance_rng.setstate((version, tuple(internal), gauss))


def _apply(factor: torch.Tensor, x: torch.Tensor, dim: int, transpose: bool = False,
           inverse: bool = False) -> torch.Tensor:
    """``factor`` (or its transpose, or inverse) applied along ``dim`` of ``x``: a
    diagonal one multiplies (divides) that dimension; a matrix F maps x -> F x along it."""
    if factor.dim() == 1:
        shape = [1] * x.dim()
        shape[dim] = -1
        f = factor.view(shape)
        return x / f if inverse else x * f
    moved = x.movedim(dim, 0)
    flat = moved.reshape(moved.shape[0], -1)
    f = factor.T if transpose else factor
    if inverse:  # F^-1 y: a triangular solve, with F upper triangular (F^T lower)
        out = torch.linalg.solve_triangular(f, flat, upper=not transpose)
    else:
        out = f @ flat
    return out.reshape(moved.shape).movedim(0, dim)


def _gram(x: torch.Tensor, dim: int, diagonal: bool) -> torch.Tensor:
    """x x^T contracted over every dimension but ``dim`` (its diagonal only, for a
    diagonal factor)."""
    flat = x.movedim(dim, 0).reshape(x.shape[dim], -1)
    return (flat * flat).sum(1) if diagonal else flat @ flat.T


def _fit(factors: list[torch.Tensor], m: torch.Tensor, precond_lr: float) -> None:
    """One fitting step of every factor on a random probe (in place; ``m`` gets the
    probe's small perturbation, as in the reference)."""
    v = torch.randn_like(m)
    eps = torch.tensor(torch.finfo(torch.float32).eps, dtype=m.dtype, device=m.device)
    m += eps.sqrt() * m.abs().mean() * v
    a, b = m, v
    for dim, f in enumerate(factors):  # A = Q1 M Q2^T; B = Q1^-T V Q2^-1
        a = _apply(f, a, dim)
        b = _apply(f, b, dim, transpose=True, inverse=True)
    tiny = torch.tensor(torch.finfo(torch.float32).tiny, dtype=m.dtype, device=m.device)
    for dim, f in enumerate(factors):
        diagonal = f.dim() == 1
        ga, gb = _gram(a, dim, diagonal), _gram(b, dim, diagonal)
        change, total = (ga - gb) * precond_lr, ga + gb
        largest = total.abs().max()
        if diagonal:
            change = change * f / largest.clamp(min=tiny)
        else:
            change = torch.triu(change)
            bound = _spectral_lower_bound(total, largest) if largest > 0 else largest
            change = (change / bound.clamp(min=tiny)) @ f
        f.sub_(change)


def _precondition(factors: list[torch.Tensor], m: torch.Tensor) -> torch.Tensor:
    """Q1^T Q1 M Q2^T Q2 (diagonal factors: q^2 along their dimension)."""
    out = m
    for dim, f in enumerate(factors):
        out = _apply(f, _apply(f, out, dim), dim, transpose=True)
    return out


def _balance(factors: list[torch.Tensor]) -> None:
    """Scale the factors to a common max-norm (their product unchanged)."""
    norms = torch.stack([f.abs().max() for f in factors])
    mean = norms.log().mean().exp()
    for f, n in zip(factors, norms):
        f.mul_(mean / n)
