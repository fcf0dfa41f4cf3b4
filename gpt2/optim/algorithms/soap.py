"""SOAP (Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo using Adam"), as
the authors' reference ``soap.py`` (nikhilvyas/SOAP) computes it with its defaults
(no dimension merging, no 1-D preconditioning, no gradient normalisation, bias
correction on).

For each dimension of a weight of at most ``max_dim`` entries SOAP keeps Shampoo's
factor, an EMA of G G^T (rows) or G^T G (columns) with decay beta2, and its
eigenbasis Q. Adam runs in the rotated space: the gradient is projected,
Q_rows^T G Q_cols, both moments live there, and the normalised step is projected back.
The bases are found by an eigendecomposition at the first step, then refreshed every
``frequency`` steps by one power iteration and a QR decomposition (the second moment's
entries are reordered with the estimated eigenvalues). A dimension longer than
``max_dim`` (the token table's 50,304 rows) is left unrotated, and 1-D tensors take
plain Adam.

As in the reference: the first step only measures (it sets up the factors and bases;
nothing moves), and the decoupled decay comes after the update, p <- p * (1 - lr * wd)
once p has stepped. Its moments are in rotated coordinates, so a pruning method must
not clear them element by element (``state_in_weight_coordinates``).
"""

from __future__ import annotations

import math

import torch

from gpt2.optim.algorithms.optimizer_base import DecoupledOptimizer, decay_


def _rotate(x: torch.Tensor, bases: list, back: bool = False) -> torch.Tensor:
    """Project ``x`` on the bases (dimension by dimension: contract the leading
    dimension with Q, or move it last where it has none), or back with Q^T."""
    for q in bases:
        if q is None:
            x = x.permute(*range(1, x.dim()), 0)
        else:
            x = torch.tensordot(x, q, dims=([0], [1 if back else 0]))
    return x


class Soap(DecoupledOptimizer):
    """SOAP; see the module's docstring."""

    # Its moments are not indexed like the weights (pruning.Pruner reads this).
    state_in_weight_coordinates = False

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float,
                 frequency: int, max_dim: int):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, frequency=frequency,
                                      max_dim=max_dim, weight_decay=0.0))

    def decay(self, group, params):
        """After the update instead (update_group), as the reference."""

    def update_group(self, group, params):
        beta1, beta2 = group["betas"]
        for p in params:
            state, g = self.state[p], p.grad
            if "bases" not in state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(g)
                state["exp_avg_sq"] = torch.zeros_like(g)
                dims = g.shape if g.dim() > 1 else ()  # 1-D: no factor (plain Adam)
                state["factors"] = [torch.zeros(n, n, device=g.device, dtype=g.dtype)
                                    if n <= group["max_dim"] else None for n in dims] or [None]
                state["bases"] = None
                self._refresh(state, g, beta2, group)
                continue  # the first gradient only shapes the bases
            projected = _rotate(g, state["bases"])
            state["step"] += 1
            t = state["step"]
            m, v = state["exp_avg"], state["exp_avg_sq"]
            m.mul_(beta1).add_(projected, alpha=1 - beta1)
            v.mul_(beta2).add_(projected.square(), alpha=1 - beta2)
            denom = v.sqrt().add_(group["eps"])
            step_size = group["lr"] * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
            p.add_(_rotate(m / denom, state["bases"], back=True), alpha=-step_size)
            decay_([p], group["lr"], group["weight_decay"])
            self._refresh(state, g, beta2, group)

    @staticmethod
    def _refresh(state: dict, g: torch.Tensor, beta2: float, group: dict) -> None:
        """The reference's update_preconditioner: the factors take this gradient, the
        bases are computed (first step) or refreshed (every ``frequency`` steps), and
        the first moment follows them into the new basis."""
        bases = state["bases"]
        if bases is not None:
            state["exp_avg"] = _rotate(state["exp_avg"], bases, back=True)
        for i, factor in enumerate(state["factors"]):
            if factor is not None:
                others = [d for d in range(g.dim()) if d != i]
                factor.lerp_(torch.tensordot(g, g, dims=(others, others)), 1 - beta2)
        if bases is None:
            state["bases"] = [None if f is None else _eigenbasis(f) for f in state["factors"]]
        elif state["step"] > 0 and state["step"] % group["frequency"] == 0:
            state["bases"] = _power_qr(state, bases)
        if state["step"] > 0:
            state["exp_avg"] = _rotate(state["exp_avg"], state["bases"])


def _eigenbasis(factor: torch.Tensor) -> torch.Tensor:
    """Eigenvectors of a factor, largest eigenvalue first."""
    eye = torch.eye(factor.shape[0], device=factor.device, dtype=factor.dtype)
    try:
        _, q = torch.linalg.eigh(factor + 1e-30 * eye)
    except RuntimeError:  # as the reference: retry in float64
        _, q = torch.linalg.eigh(factor.double() + 1e-30 * eye.double())
        q = q.to(factor.dtype)
    return torch.flip(q, [1])


def _power_qr(state: dict, bases: list) -> list:
    """One power iteration from the current bases and a QR decomposition, the
    bases' columns (and the second moment's entries with them) first sorted by the
    eigenvalues they estimate."""
    v = state["exp_avg_sq"]
    out = []
    for i, (factor, q) in enumerate(zip(state["factors"], bases)):
        if factor is None:
            out.append(None)
            continue
        order = torch.argsort(torch.diag(q.T @ factor @ q), descending=True)
        v = v.index_select(i, order)
        new, _ = torch.linalg.qr(factor @ q[:, order])
        out.append(new)
    state["exp_avg_sq"] = v
    return out
