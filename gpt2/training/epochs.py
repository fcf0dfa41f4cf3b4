"""Passes over the training split: what a run trained, what it plans, and the warning
past CONFIG_EPOCH_WARNING.

A comparison of optimizers or settings run for many passes over a small training
split mostly measures how well each one memorises it: GPT-2 124M over tiny
Shakespeare's 302k training tokens for 300 steps of 65,536 tokens is 65 passes. Training
warns at its start; `make memcheck` and `make test-matrix DRY_RUN=1` warn where the
data is prepared (its meta.json holds the split's size) and say the count is unknown
until `make data` where it is not.
"""

from __future__ import annotations

from typing import Iterable

from gpt2.config.options import Config
from gpt2.data.loader import read_meta, steps_for_epochs, train_windows
from gpt2.errors import DataError


def epochs(tokens: int, train_tokens: int) -> float:
    """Tokens trained over tokens in the training split."""
    return tokens / train_tokens if train_tokens else float("inf")


def planned_steps(cfg: Config, train_tokens: int) -> int:
    """The steps a run of ``cfg`` takes on a training split of ``train_tokens``
    (training's own rule, gpt2/training/step.py: max_iters and/or epochs)."""
    limits = [cfg.max_iters] if cfg.max_iters else []
    if cfg.epochs:
        limits.append(steps_for_epochs(cfg.epochs, train_windows(train_tokens, cfg.block_size),
                                       cfg.batch_size * cfg.gradient_accumulation))
    return min(limits)


def warning(cfg: Config, steps: int, train_tokens: int) -> str | None:
    """The warning for a run of ``steps`` steps past CONFIG_EPOCH_WARNING, or None."""
    planned = steps * cfg.tokens_per_step()
    passes = epochs(planned, train_tokens)
    if not cfg.epoch_warning or passes <= cfg.epoch_warning:
        return None
    return (f"warning: {steps:,} steps x {cfg.tokens_per_step():,} tokens = {planned:,} tokens "
            f"are {passes:,.1f} passes over the {train_tokens:,}-token training split of "
            f"{cfg.dataset}, more than CONFIG_EPOCH_WARNING={cfg.epoch_warning:g}: a "
            "comparison this long mostly measures overfitting. Train fewer steps or on a "
            "larger dataset (CONFIG_DATASET, e.g. wikitext103)")


def train_split_tokens(cfg: Config) -> int | None:
    """The prepared training split's size from meta.json, or None if not prepared."""
    try:
        return read_meta(cfg.data_dir, cfg.dataset)["train_tokens"]
    except DataError:
        return None


def unknown_note(cfg: Config) -> str:
    return (f"epochs: unknown until the {cfg.dataset} data is prepared (`make data`), which "
            "gives the training split's size")


def notes(cfgs: Iterable[Config]) -> list[str]:
    """Lines for a listing of runs (`make memcheck`, a matrix's DRY_RUN=1): their
    planned passes over their training splits, and a warning past the threshold."""
    cfgs = list(cfgs)
    sizes = {(c.data_dir, c.dataset): train_split_tokens(c) for c in cfgs}
    missing = [c for c in cfgs if sizes[c.data_dir, c.dataset] is None]
    if missing:
        return [unknown_note(missing[0])]
    planned = [(c, planned_steps(c, sizes[c.data_dir, c.dataset])) for c in cfgs]
    passes = [epochs(steps * c.tokens_per_step(), sizes[c.data_dir, c.dataset])
              for c, steps in planned]
    low, high = min(passes), max(passes)
    span = f"{low:,.2f}" if f"{low:,.2f}" == f"{high:,.2f}" else f"{low:,.2f} to {high:,.2f}"
    lines = [f"epochs: {span} passes over the training split"
             + (" per run" if len(cfgs) > 1 else "")]
    past = [(c, steps) for (c, steps), p in zip(planned, passes)
            if c.epoch_warning and p > c.epoch_warning]
    if past:
        c, steps = max(past, key=lambda cs: cs[1] * cs[0].tokens_per_step())
        lines.append(warning(c, steps, sizes[c.data_dir, c.dataset])
                     + (f" ({len(past)} of {len(cfgs)} runs)" if len(cfgs) > 1 else ""))
    return lines
