"""Measuring a model while it trains: validation loss, text samples, HellaSwag.

None of these moves the training random generators (sampling has its own), so an
evaluation never changes the losses that follow it, and exact resume holds.

With several processes each function shares its work among them and every process
must call it. ``stopping()`` true between batches abandons the evaluation by raising
Interrupted; that is offered to a single process only, since with several each must
reach the same collective calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from gpt2.config.options import Config
from gpt2.data.loader import ValBatches
from gpt2.data.tokenizer import tokenizer_for
from gpt2.eval import hellaswag
from gpt2.model.gpt import GPT
from gpt2.runtime.device import Runtime
from gpt2.runtime.distributed import Dist

HELLASWAG_COUNTS = ("correct", "correct_norm", "examples")
HELLASWAG_GROUP = 64  # examples between two looks at stopping()


class Interrupted(Exception):
    """A stop request arrived during an evaluation, which is abandoned (and redone
    on resume) rather than finished first. ``row``: the metrics row of the step whose
    evaluation was cut short, set by the trainer."""

    def __init__(self, row: dict[str, Any] | None = None, progress: str = ""):
        super().__init__("evaluation interrupted")
        self.row = row
        self.progress = progress  # how far it got, e.g. "37 of 2,000 validation batches"

    def with_row(self, row: dict[str, Any]) -> Interrupted:
        return Interrupted(row, self.progress)


@dataclass(frozen=True)
class Cadence:
    """Which evaluations a finished step is due: the validation loss every
    ``eval_interval`` steps, every ``late_interval`` (when set) from the closing
    ``late_fraction`` of the run on (track 3's: every 125, then every 25 from 90 %,
    tested against its train_gpt_simple.py), and at the last; HellaSwag (when it has
    examples) every
    ``hellaswag_interval`` and at the last. ``on_interval``: an evaluation fell on an
    interval, after which the CPU's freed memory is handed back (the extra one at the
    last step needs no such care: the run ends)."""

    eval_interval: int
    hellaswag_interval: int
    last_step: int
    hellaswag: bool  # there are examples to score
    late_interval: int = 0
    late_fraction: float = 0.1

    def interval(self, step: int) -> int:
        """The validation interval in force at ``step``."""
        late = self.late_interval and step >= (1 - self.late_fraction) * self.last_step
        return self.late_interval if late else self.eval_interval

    def validates(self, step: int) -> bool:
        return step % self.interval(step) == 0 or step == self.last_step

    def scores(self, step: int) -> bool:
        return self.hellaswag and (step % self.hellaswag_interval == 0
                                   or step == self.last_step)

    def on_interval(self, step: int) -> bool:
        return step % self.interval(step) == 0 or (
            self.hellaswag and step % self.hellaswag_interval == 0)


@dataclass(frozen=True)
class Validation:
    """One evaluation of the validation set: the mean loss per token, its standard
    error over windows (None with a single window), and how much was scored."""

    loss: float
    se: float | None
    windows: int
    tokens: int


@torch.no_grad()
def validation_loss(model: torch.nn.Module, val: ValBatches, runtime: Runtime,
                    dist: Dist = Dist(), stopping: Callable[[], bool] | None = None
                    ) -> Validation:
    """Mean loss over the validation windows; each process takes every world-th batch.

    Every window holds block_size tokens, so the mean per window is the mean per
    token, however the windows fall into batches (the last may be short). The
    standard error is the per-window losses' standard deviation over the square
    root of their count; neighbouring windows of one document are correlated, so it
    understates the error of the loss as an estimate of the whole distribution's,
    but it is the right scale for how much the choice of windows moves it."""
    model.eval()
    share = dist.share(list(range(len(val))))
    losses = []
    for done, (i, counted) in enumerate(share):
        if stopping is not None and stopping():
            model.train()
            raise Interrupted(progress=f"{done:,} of {len(share):,} validation batches")
        x, y = val.batch(i)
        with runtime.autocast():
            per_window = model(torch.from_numpy(x).to(runtime.device),
                               torch.from_numpy(y).to(runtime.device), per_window=True)[1]
        if counted:
            losses.append(per_window.float())
    model.train()
    # Sums in float64 on the CPU (one copy at the end, not one per batch), then over
    # the processes: the count, the sum and the sum of squares.
    mine = torch.cat(losses).cpu().double() if losses else torch.zeros(0, dtype=torch.float64)
    totals = torch.stack([torch.tensor(float(len(mine)), dtype=torch.float64), mine.sum(),
                          (mine * mine).sum()])
    if dist.enabled:
        totals = dist.sum(totals.to(runtime.device)).cpu()
    n, total, squares = totals.tolist()
    mean = total / n
    var = max(squares - n * mean * mean, 0.0) / (n - 1) if n > 1 else None
    se = math.sqrt(var / n) if var is not None else None
    return Validation(loss=mean, se=se, windows=int(n), tokens=int(n) * val.block_size)


def sample(model: GPT, cfg: Config, runtime: Runtime, seed: int, prompt: str | None = None,
           max_new_tokens: int | None = None) -> str:
    """Text continuation of the prompt (CONFIG_SAMPLE_PROMPT unless given), from a
    generator of its own seeded with ``seed``."""
    prompt = cfg.sample_prompt if prompt is None else prompt
    tokenizer = tokenizer_for(cfg.dataset)
    ids = tokenizer.encode(prompt) if prompt else list(tokenizer.start)
    n = cfg.sample_tokens if max_new_tokens is None else max_new_tokens
    generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    with runtime.autocast():
        out = model.generate(torch.tensor([ids], device=runtime.device), n,
                             temperature=cfg.sample_temperature, top_k=cfg.sample_top_k,
                             generator=generator)
    model.train(was_training)
    return prompt + tokenizer.decode(out[0, len(ids):].tolist())


def hellaswag_scores(model: GPT, examples: list, runtime: Runtime, dist: Dist = Dist(),
                     stopping: Callable[[], bool] | None = None) -> dict[str, Any]:
    """HellaSwag acc and acc_norm, the examples shared among processes."""
    share = dist.share(examples)
    totals = dict.fromkeys(HELLASWAG_COUNTS, 0)
    for i in range(0, len(share), HELLASWAG_GROUP):
        if stopping is not None and stopping():
            raise Interrupted(progress=f"{i:,} of {len(share):,} HellaSwag examples")
        counts = hellaswag.count_correct(model, share[i:i + HELLASWAG_GROUP], runtime.device,
                                         runtime.autocast)
        totals = {k: totals[k] + counts[k] for k in HELLASWAG_COUNTS}
    summed = dist.sum(torch.tensor([totals[k] for k in HELLASWAG_COUNTS],
                                   device=runtime.device))
    return hellaswag.accuracies(dict(zip(HELLASWAG_COUNTS, map(int, summed.tolist()))))
