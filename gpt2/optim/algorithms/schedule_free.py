"""Schedule-Free AdamW (Defazio et al. 2024, "The Road Less Scheduled"), from Meta's
reference package ``schedulefree`` (pinned in requirements.txt), which kgpt runs as
it is rather than carrying a copy.

The method keeps two sequences: z, stepped by AdamW-normalised gradients, and x, an
average of the z's weighted by (step^r * peak lr^2). The gradient is taken at
y = (1 - beta1) z + beta1 x, which is what the model's parameters hold while it
trains; the average x is the model to evaluate and keep. So:

* every evaluation (validation loss, samples, HellaSwag) runs at x, inside
  optimizer_base.evaluation_point (its ``averaged`` context), which puts y back bit for bit afterwards (the package's
  own eval()/train() go there and back by interpolation, which rounds);
* a checkpoint's ``model`` holds x, what evaluate, generate and export read, and its
  ``train_weights`` hold y, what a resume continues from exactly.

Decay follows the reference: wd * y is added to the normalised gradient, so it acts
on z and through it on x and y. The learning rate is the run's schedule: by default
its warmup and then constant (no decay, the method's point), which is what the
package's own warmup_steps computes too.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from schedulefree import AdamWScheduleFree


class ScheduleFreeAdamW(AdamWScheduleFree):
    """The reference optimizer, in training mode from the start, with the averaged
    point available for evaluation."""

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=0.0, warmup_steps=0)
        self.train()

    @contextlib.contextmanager
    @torch.no_grad()
    def averaged(self) -> Iterator[None]:
        """The parameters hold x inside, y again after (exactly)."""
        saved = []
        for group in self.param_groups:
            beta1 = group["betas"][0]
            for p in group["params"]:
                z = self.state[p].get("z")
                if z is None:  # no step yet: x = y = z
                    continue
                saved.append((p, p.detach().clone()))
                p.lerp_(z, 1 - 1 / beta1)
        try:
            yield
        finally:
            for p, y in saved:
                p.copy_(y)
