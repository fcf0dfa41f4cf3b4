"""The output head and cross-entropy fused: gradients computed during forward.

With ``loss_fused`` (CONFIG_LOSS_FUSED) the head and the loss run ``chunk`` tokens at
a time, as the chunked loss does, but each chunk's gradient is worked out while its
logits are at hand: softmax minus the one-hot target, multiplied back through the
head to give the gradients of the hidden states and of the head's weight. Backward
then only scales what forward left behind. Against the chunked loss that saves one
of the head's three matmuls per chunk (the recomputation of the logits), and the
(tokens x vocabulary) logits are never held whole, as there. The idea is the one of
Liger-Kernel's FusedLinearCrossEntropy, written here in plain torch.

What is computed is the same cross-entropy and the same gradients; only the order of
floating-point sums differs (the head's gradient is summed chunk by chunk in float32).
Under autocast every matmul runs in the autocast precision, as the unfused head's
forward and backward do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mean cross-entropy of ``x @ weight.T + bias`` (x: tokens x C, weight: vocab x C)
    against ``targets``, ``chunk`` tokens at a time. Without gradients (evaluation)
    nothing beyond the loss is computed."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, weight, bias)):
        return _LinearCrossEntropy.apply(x, weight, bias, targets, chunk)
    total = sum(F.cross_entropy(F.linear(x[i:i + chunk], weight, bias).float(),
                                targets[i:i + chunk], reduction="sum")
                for i in range(0, x.size(0), chunk))
    return total / x.size(0)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, targets, chunk):
        n = x.size(0)
        low = (torch.get_autocast_dtype(x.device.type)
               if torch.is_autocast_enabled(x.device.type) else None)
        loss = torch.zeros((), device=x.device, dtype=torch.float32)
        grad_x = torch.empty_like(x) if x.requires_grad else None
        # float32 sums over chunks, whatever the autocast precision of each matmul
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if weight.requires_grad else None
        grad_b = (torch.zeros_like(bias, dtype=torch.float32)
                  if bias is not None and bias.requires_grad else None)
        for i in range(0, n, chunk):
            xs, ts = x[i:i + chunk], targets[i:i + chunk]
            # One float32 (chunk x vocab) buffer, turned in place from logits into
            # their gradient: softmax(logits) - onehot(target), which is
            # d(sum of the chunk's losses)/d(logits).
            g = F.linear(xs, weight, bias).float()
            picked = g.gather(1, ts[:, None])
            top = g.amax(dim=-1, keepdim=True)
            total = g.sub_(top).exp_().sum(dim=-1, keepdim=True)
            loss += (top + total.log() - picked).sum()  # log-sum-exp minus the target's logit
            g.div_(total)
            g[torch.arange(g.size(0), device=g.device), ts] -= 1
            if low is not None:
                # As the unfused head's backward casts the logits' gradient for its
                # matmuls; cast once here, and the float32 buffer is freed.
                g = g.to(low)
            if grad_x is not None:
                grad_x[i:i + chunk] = g @ weight
            if grad_w is not None:
                if low is None:
                    grad_w.addmm_(g.t(), xs)  # no (vocab x C) temporary
                else:  # the matmul in the autocast precision, the sum in float32
                    grad_w += g.t() @ xs
            if grad_b is not None:
                grad_b += g.sum(0)
            del g
        ctx.n = n
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.grads = (grad_x, grad_w, grad_b)
        return loss / n

    @staticmethod
    def backward(ctx, grad_loss):
        scale = grad_loss / ctx.n  # the mean, times whatever scaled the loss
        grads, ctx.grads = ctx.grads, None  # freed once handed over
        grad_x, grad_w, grad_b = (None if g is None else g.mul_(scale).to(dtype)
                                  for g, dtype in zip(grads, ctx.dtypes))
        return grad_x, grad_w, grad_b, None, None
