"""Memory-mapped token files and the deterministic batch plan.

Training batches are a pure function of (seed, step, micro-step): each epoch is a
seeded permutation of non-overlapping windows at a seeded offset. So the data
position after k steps is "k steps' worth of samples", restored exactly on resume
without storing any sampler state, and epochs mean what they say.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from gpt2.data.prepare import DataError


def open_split(data_dir: str | Path, dataset: str, split: str) -> np.memmap:
    folder = Path(data_dir) / dataset
    path = folder / f"{split}.bin"
    hint = (f"run `make data` (or `python gpt2/prepare_data.py --dataset {dataset} "
            f"--data-dir {data_dir}`)")
    if not (folder / "meta.json").is_file() or not path.is_file():
        raise DataError(f"{path} is missing: the {dataset} dataset is not prepared; {hint}")
    meta = json.loads((folder / "meta.json").read_text())
    expected = 2 * meta.get(f"{split}_tokens", -1)
    if path.stat().st_size != expected:
        raise DataError(f"{path} has {path.stat().st_size} bytes, meta.json says {expected}: "
                        f"the file is truncated or stale; delete {folder} and {hint}")
    return np.memmap(path, dtype=np.uint16, mode="r")


def data_fingerprint(data_dir: str | Path, dataset: str) -> str:
    """Identifies the prepared data a run trained on (checked on resume)."""
    meta = json.loads((Path(data_dir) / dataset / "meta.json").read_text())
    return f"{meta['source_sha256'][:16]}:{meta['train_tokens']}:{meta['val_fraction']}"


class TrainBatches:
    """Batches for optimizer step ``step`` and micro-step ``micro``."""

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int,
                 accumulation: int, seed: int):
        self.tokens, self.block_size, self.batch_size = tokens, block_size, batch_size
        self.accumulation, self.seed = accumulation, seed
        # Windows of block_size+1 tokens (inputs plus shifted targets); one block of
        # slack lets each epoch start at a different offset.
        self.windows = (len(tokens) - 1 - block_size) // block_size
        if self.windows < 1:
            raise DataError(f"the training split has {len(tokens)} tokens, fewer than two "
                            f"blocks of {block_size}: use a smaller CONFIG_BLOCK_SIZE or "
                            "more data")

    @property
    def samples_per_step(self) -> int:
        return self.batch_size * self.accumulation

    def steps_for_epochs(self, epochs: float) -> int:
        return max(1, math.ceil(epochs * self.windows / self.samples_per_step))

    @lru_cache(maxsize=2)
    def _epoch(self, epoch: int) -> tuple[int, np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        return int(rng.integers(self.block_size)), rng.permutation(self.windows)

    def starts(self, step: int, micro: int) -> np.ndarray:
        first = (step * self.accumulation + micro) * self.batch_size
        out = np.empty(self.batch_size, dtype=np.int64)
        for i, sample in enumerate(range(first, first + self.batch_size)):
            epoch, index = divmod(sample, self.windows)
            offset, perm = self._epoch(epoch)
            out[i] = offset + perm[index] * self.block_size
        return out

    def get(self, step: int, micro: int) -> tuple[np.ndarray, np.ndarray]:
        return windows(self.tokens, self.starts(step, micro), self.block_size)


class ValBatches:
    """A fixed validation set: the same windows at every evaluation."""

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, batches: int):
        span = len(tokens) - 1 - block_size
        if span < 0:
            raise DataError(f"the validation split has {len(tokens)} tokens, fewer than one "
                            f"block of {block_size}+1: use a smaller CONFIG_BLOCK_SIZE or a "
                            "larger CONFIG_VAL_FRACTION")
        starts = np.linspace(0, span, batches * batch_size).astype(np.int64)
        self.batches = [windows(tokens, s, block_size) for s in starts.reshape(batches, -1)]


def windows(tokens: np.ndarray, starts: np.ndarray, block_size: int):
    idx = starts[:, None] + np.arange(block_size + 1)[None, :]
    chunk = tokens[idx].astype(np.int64)
    return chunk[:, :-1], chunk[:, 1:]
