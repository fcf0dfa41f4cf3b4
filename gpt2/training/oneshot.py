"""One-shot pruning of a trained model: the baselines a during-training pruning result is
judged against (magnitude, Wanda, SparseGPT), each as its reference code computes it.

- magnitude: Wanda's repository, lib/prune.py ``prune_magnitude``: per tensor, every
  |w| at or below the k-th smallest (k = int(n * s)) is pruned; N:M keeps the N largest
  |w| of every M along each row.
- Wanda (Sun et al. 2023): locuslab/wanda lib/prune.py ``prune_wanda`` with
  lib/layerwrapper.py ``WrappedGPT``: score |w| * sqrt(mean over calibration tokens of
  x_j^2), the lowest int(cols * s) of each output row pruned (N:M: the lowest M - N
  of each group of M).
- SparseGPT (Frantar & Alistarh 2023): IST-DASLab/sparsegpt sparsegpt.py
  ``SparseGPT.add_batch`` / ``fasterprune``: the layer's Hessian 2/n X X^T from the
  calibration inputs, dampened by 1 % of its mean diagonal; columns are pruned in
  blocks of 128 by w^2 / [H^-1]_jj^2 and the rest of the row updated to make up the
  error (the optimal brain surgeon step), returning the reconstruction error.

As in both references the model is pruned block by block: a block's Linear layers see
inputs computed with the earlier blocks already pruned, and the layers of one block are
calibrated together, before any of them is pruned.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn

from gpt2.config.choices import ONESHOT_METHODS


def nm_lowest(scores: torch.Tensor, n_pruned: int, m: int) -> torch.Tensor:
    """Mask (True = pruned) of the ``n_pruned`` lowest scores of each group of ``m``
    consecutive columns of every row: the references' loop of ``topk(largest=False)``
    over column groups."""
    mask = torch.zeros_like(scores, dtype=torch.bool)
    for i in range(0, scores.shape[1], m):
        low = torch.topk(scores[:, i:i + m].float(), n_pruned, dim=1, largest=False)[1]
        mask.scatter_(1, i + low, True)
    return mask


def magnitude_mask(weight: torch.Tensor, sparsity: float,
                   nm: tuple[int, int] | None = None) -> torch.Tensor:
    """``prune_magnitude``: |w| <= the int(n * s)-th smallest |w| (ties pruned too)."""
    metric = weight.abs()
    if nm is not None:
        n, m = nm
        return nm_lowest(metric, m - n, m)
    thresh = torch.sort(metric.flatten())[0][int(weight.numel() * sparsity)]
    return metric <= thresh


class WandaStats:
    """``WrappedGPT``: the running mean over calibration tokens of each input feature's
    squared value (its ``scaler_row``), kept as the reference updates it."""

    def __init__(self, columns: int, device):
        self.scaler_row = torch.zeros(columns, device=device)
        self.nsamples = 0

    def add_batch(self, inp: torch.Tensor) -> None:
        if inp.dim() == 2:
            inp = inp.unsqueeze(0)
        tmp = inp.shape[0]
        inp = inp.reshape(-1, inp.shape[-1]).t().float()
        self.scaler_row *= self.nsamples / (self.nsamples + tmp)
        self.nsamples += tmp
        self.scaler_row += torch.norm(inp, p=2, dim=1) ** 2 / self.nsamples


def wanda_mask(weight: torch.Tensor, scaler_row: torch.Tensor, sparsity: float,
               nm: tuple[int, int] | None = None) -> torch.Tensor:
    """``prune_wanda``'s mask: |w| * sqrt(scaler_row), lowest per output row."""
    metric = weight.abs().float() * torch.sqrt(scaler_row.reshape(1, -1))
    if nm is not None:
        n, m = nm
        return nm_lowest(metric, m - n, m)
    mask = torch.zeros_like(metric, dtype=torch.bool)
    order = torch.sort(metric, dim=-1, stable=True)[1]
    mask.scatter_(1, order[:, :int(metric.shape[1] * sparsity)], True)
    return mask


class SparseGPTStats:
    """``SparseGPT.add_batch``: H = 2/n sum x x^T over calibration tokens."""

    def __init__(self, columns: int, device):
        self.H = torch.zeros(columns, columns, device=device)
        self.nsamples = 0

    def add_batch(self, inp: torch.Tensor) -> None:
        if inp.dim() == 2:
            inp = inp.unsqueeze(0)
        tmp = inp.shape[0]
        inp = inp.reshape(-1, inp.shape[-1]).t()
        self.H *= self.nsamples / (self.nsamples + tmp)
        self.nsamples += tmp
        inp = math.sqrt(2 / self.nsamples) * inp.float()
        self.H += inp.matmul(inp.t())


def _upper_inverse_factor(H: torch.Tensor, percdamp: float) -> torch.Tensor:
    """U, upper triangular with U^T U = (H + damp I)^-1, damp = percdamp x H's mean
    diagonal: the rows of the inverse Hessian's Cholesky factor that SparseGPT's
    sequential updates read."""
    H = H + percdamp * torch.mean(torch.diag(H)) * torch.eye(H.shape[0], device=H.device)
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)


def sparsegpt_prune(weight: torch.Tensor, H: torch.Tensor, sparsity: float,
                    nm: tuple[int, int] | None = None, blocksize: int = 128,
                    percdamp: float = 0.01) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``fasterprune`` on a Linear's weight (rows = outputs): the pruned and updated
    weight, its mask (True = pruned) and the summed reconstruction error the reference
    prints, sum over rows of 1/2 sum_j (w_j - q_j)^2 / U_jj^2. ``H`` is not changed.

    Columns go left to right in blocks of ``blocksize``. Unstructured, a block's mask
    is chosen once from its weights as they stand when the block starts: the scores
    w^2 / U_jj^2 at or below the block's int(size * s)-th smallest. N:M, each group of
    M columns chooses its M - N lowest scores per row when the sweep reaches it (the
    weights by then updated). Each column's pruning error, divided by U_jj, is spread
    over the columns right of it through row j of U: within the block at once, beyond
    it when the block ends."""
    W = weight.detach().float().clone()
    H = H.clone()
    dead = torch.diag(H) == 0  # inputs never seen: their weights go
    H[dead, dead] = 1
    W[:, dead] = 0
    U = _upper_inverse_factor(H, percdamp)
    columns = W.shape[1]
    mask = torch.zeros_like(W, dtype=torch.bool)
    error = torch.zeros((), device=W.device)

    def score(cols: slice) -> torch.Tensor:
        return W[:, cols] ** 2 / torch.diag(U)[cols].reshape(1, -1) ** 2

    for start in range(0, columns, blocksize):
        stop = min(start + blocksize, columns)
        if nm is None:
            block_scores = score(slice(start, stop))
            k = int(block_scores.numel() * sparsity)
            mask[:, start:stop] = block_scores <= torch.sort(block_scores.flatten())[0][k]
        spread = torch.zeros(W.shape[0], stop - start, device=W.device)
        for j in range(start, stop):
            if nm is not None and (j - start) % nm[1] == 0:
                group = slice(j, j + nm[1])
                mask[:, group] = nm_lowest(score(group), nm[1] - nm[0], nm[1])
            w = W[:, j].clone()
            q = w.masked_fill(mask[:, j], 0.0)
            e = (w - q) / U[j, j]
            error += torch.sum((w - q) ** 2) / U[j, j] ** 2 / 2
            W[:, j] = q
            W[:, j + 1:stop] -= torch.outer(e, U[j, j + 1:stop])
            spread[:, j - start] = e
        W[:, stop:] -= spread @ U[start:stop, stop:]
    return W.to(weight.dtype), mask, float(error)


ONESHOT = ONESHOT_METHODS  # (the configuration's list: gpt2/config/choices.py)


@torch.no_grad()
def prune_blocks(model: nn.Module, blocks: Iterable[nn.Module], batches: list[torch.Tensor],
                 method: str, sparsity: float, nm: tuple[int, int] | None = None) -> dict:
    """Prune every Linear of each block in order, as the references do: calibrate a
    block's layers together on ``batches`` of token ids run through the model (the
    earlier blocks already pruned), then prune them. Returns {layer name: its mask} and,
    for SparseGPT, each layer's reconstruction error under "errors"."""
    if method not in ONESHOT:
        raise ValueError(f"one-shot method {method!r}: one of {', '.join(ONESHOT)}")
    names = {m: n for n, m in model.named_modules()}
    masks: dict[str, torch.Tensor] = {}
    errors: dict[str, float] = {}
    for block in blocks:
        layers = [m for m in block.modules() if isinstance(m, nn.Linear)]
        stats: dict[nn.Module, object] = {}
        if method != "magnitude":
            cls = WandaStats if method == "wanda" else SparseGPTStats
            stats = {lin: cls(lin.in_features, lin.weight.device) for lin in layers}
            hooks = [lin.register_forward_hook(
                lambda mod, inp, out: stats[mod].add_batch(inp[0].detach()))
                for lin in layers]
            try:
                for x in batches:
                    model(x)
            finally:
                for h in hooks:
                    h.remove()
        for lin in layers:
            name = names[lin] + ".weight"
            if method == "magnitude":
                mask = magnitude_mask(lin.weight, sparsity, nm)
            elif method == "wanda":
                mask = wanda_mask(lin.weight, stats[lin].scaler_row, sparsity, nm)
            else:
                new, mask, errors[name] = sparsegpt_prune(lin.weight, stats[lin].H, sparsity, nm)
                lin.weight.copy_(new)
            lin.weight.masked_fill_(mask, 0.0)
            masks[name] = mask
    return {"masks": masks, "errors": errors}


class HeldMasks:
    """The pruner of a fine-tune after one-shot pruning (step.optimizer_step's
    ``pruner``): the one-shot masks stay as they are. Pruned weights get no gradient
    and are zeroed again after every step, since decoupled weight decay or an update
    spread over the whole matrix (Muon) would otherwise move them."""

    def __init__(self, model: nn.Module, masks: dict[str, torch.Tensor]):
        self.held = [(p, masks[name]) for name, p in model.named_parameters() if name in masks]
        if len(self.held) != len(masks):
            raise ValueError("masks name weights the model does not have")

    def replaces_update(self, step: int) -> bool:
        return False

    @torch.no_grad()
    def before_step(self, step: int | None = None) -> None:
        for p, mask in self.held:
            if p.grad is not None:
                p.grad.masked_fill_(mask, 0.0)

    @torch.no_grad()
    def apply_masks(self) -> None:
        for p, mask in self.held:
            p.masked_fill_(mask, 0.0)

    def after_step(self, step: int) -> None:
        self.apply_masks()


def finetune(model: nn.Module, cfg, runtime, masks: dict[str, torch.Tensor], stream,
             steps: int, lr: float) -> list[float]:
    """Train the pruned ``model`` for ``steps`` optimizer steps of ``cfg``'s optimizer
    (fresh state, constant rate ``lr``) on batches from ``stream``, its masks held.
    Returns each step's training loss. The model is left at the point the optimizer
    is evaluated at (Schedule-Free's average), masked."""
    from gpt2.optim.algorithms.optimizers import build_optimizer
    from gpt2.optim.algorithms.optimizer_base import evaluation_point
    from gpt2.training.step import Learner, apply_learning_rate, optimizer_step

    optimizer = build_optimizer(model, cfg, runtime.device_type, steps)
    apply_learning_rate(optimizer, lr)
    scaler = torch.amp.GradScaler(runtime.device_type, enabled=runtime.needs_grad_scaler)
    held = HeldMasks(model, masks)
    learner = Learner(model, optimizer, scaler, held, runtime)
    model.train()
    losses = [float(optimizer_step(learner, stream, step, cfg)[0])
              for step in range(1, steps + 1)]
    model.eval()
    with evaluation_point(optimizer, held):
        final = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p, value in zip(model.parameters(), final):
            p.copy_(value)
    return losses
