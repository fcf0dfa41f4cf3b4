"""The prepared splits, and the deterministic batch plan.

Training batches are a pure function of (seed, sample index): each epoch visits
every non-overlapping window of the training tokens once, at a seeded offset, in a
seeded order. The order is shuffled in two levels so that it costs the same small
memory for a 300k-token corpus and a 10B-token one: the windows are grouped into
chunks of CHUNK_WINDOWS, the chunks are visited in a random order, and the windows
inside each chunk in a random order of their own. The data position is therefore
just "the next sample index": it is saved in every checkpoint and a resume
continues with the next unseen batch.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np

from gpt2 import storage
from gpt2.checksums import sha256_file
from gpt2.data.shards import (DATA_FORMAT_VERSION, KGPT, DataError, TokenSequence,
                              meta_problem, open_shards)
from gpt2.data.tokenizer import tokenizer_for
from gpt2.config.datasets import sequential

CHUNK_WINDOWS = 1 << 16


def _hint(data_dir, dataset: str) -> str:
    return (f"run `make data` (or `python gpt2/prepare_data.py --dataset {dataset} "
            f"--data-dir {data_dir}`)")


def read_meta(data_dir: str | Path, dataset: str) -> dict:
    """meta.json, checked to have every field training reads, of its type: one that
    does not is refused as damaged (never a KeyError deep in training)."""
    folder = Path(data_dir) / dataset
    data = storage.read_regular(folder / "meta.json")
    if data is None and not (folder / "meta.json").exists():
        raise DataError(f"{folder / 'meta.json'} is missing: the {dataset} dataset is not "
                        f"prepared; {_hint(data_dir, dataset)}")
    if data is None:
        raise DataError(f"{folder / 'meta.json'} cannot be read (not a regular file, or not "
                        f"this user's to read); {_hint(data_dir, dataset)}")
    try:
        meta = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, or not even text
        raise DataError(f"{folder / 'meta.json'} is damaged; {_hint(data_dir, dataset)}") from None
    if isinstance(meta, dict) and meta.get("format_version") != DATA_FORMAT_VERSION:
        raise DataError(f"{folder} was prepared by another kgpt version (data format "
                        f"{meta.get('format_version')}, this one reads {DATA_FORMAT_VERSION}); "
                        f"{_hint(data_dir, dataset)}")
    problem = meta_problem(meta)
    if problem:
        raise DataError(f"{folder / 'meta.json'} is damaged ({problem}); "
                        f"{_hint(data_dir, dataset)}, or delete {folder} and prepare it again")
    wanted = tokenizer_for(dataset)
    if meta.get("tokenizer") != wanted.name:
        # (tokens of another vocabulary would index another table, or past this one)
        raise DataError(f"{folder} holds tokens of another tokenizer ({meta.get('tokenizer')!r}) "
                        f"than {dataset}'s ({wanted.label}); {_hint(data_dir, dataset)} to "
                        "prepare it again")
    return meta


def shard_folder(data_dir: str | Path, dataset: str, meta: dict) -> Path:
    """Where a prepared dataset's shards are: its own folder, or, for shards read in
    place (gpt2/config/datasets.py ShardFolder), the folder meta.json names."""
    return Path(meta["source_dir"]) if "source_dir" in meta else Path(data_dir) / dataset


def open_split(data_dir: str | Path, dataset: str, split: str) -> TokenSequence:
    """One split's shards, checked against meta.json: missing, foreign, truncated or
    resized shards are refused with the file's name and what to run."""
    meta = read_meta(data_dir, dataset)
    folder = shard_folder(data_dir, dataset, meta)
    shards = meta["splits"][split]["shards"]
    return open_shards([folder / s["file"] for s in shards], _hint(data_dir, dataset),
                       [s["tokens"] for s in shards], meta.get("shard_format", KGPT))


def verify_shards(data_dir: str | Path, dataset: str) -> tuple[int, int]:
    """Check every shard's sha256 against meta.json (a bit flipped on disk passes the
    header and size checks, and could even index past the vocabulary). Returns
    (shards, bytes) checked; raises DataError naming the first damaged shard."""
    meta = read_meta(data_dir, dataset)
    folder = shard_folder(data_dir, dataset, meta)
    n_bytes = n_files = 0
    for split in meta["splits"].values():
        for shard in split["shards"]:
            path = folder / shard["file"]
            try:
                digest = sha256_file(path)
            except FileNotFoundError:
                raise DataError(f"{path} is missing; {_hint(data_dir, dataset)}") from None
            except OSError as e:
                raise DataError(f"{path} cannot be read ({e.strerror}); "
                                f"{_hint(data_dir, dataset)}") from None
            n_bytes += path.stat().st_size
            if digest != shard["sha256"]:
                raise DataError(f"{path} is damaged: its sha256 differs from the one recorded "
                                f"when it was written (meta.json); {_hint(data_dir, dataset)} "
                                "to write it again")
            n_files += 1
    return n_files, n_bytes


def data_fingerprint(data_dir: str | Path, dataset: str) -> str:
    """Identifies the tokens a run trains on (checked on resume): the hash of the whole
    token stream, so the same tokens cut into shards of another size
    (CONFIG_SHARD_TOKENS) are the same data. Data prepared before meta.json recorded
    that hash is named by its shards' hashes instead."""
    return _fingerprints(read_meta(data_dir, dataset))[0]


def same_data(fingerprint: str, data_dir: str | Path, dataset: str) -> bool:
    """Whether a checkpoint's ``data_fingerprint`` names the prepared data: by its
    tokens, or, for a checkpoint written before the token hash, by its shards."""
    return fingerprint in _fingerprints(read_meta(data_dir, dataset))


def _fingerprints(meta: dict) -> list[str]:
    """The current fingerprint, then the shard-based one older checkpoints hold."""
    shards = f"{meta['data_sha256'][:16]}:{meta['train_tokens']}"
    if not meta.get("tokens_sha256"):
        return [shards]
    return [f"tokens-{meta['tokens_sha256'][:16]}:{meta['train_tokens']}", shards]


def train_windows(n_tokens: int, block_size: int) -> int:
    """Training windows per epoch: of block_size+1 tokens (inputs plus shifted
    targets), with one block of slack so each epoch starts at its own offset."""
    return (n_tokens - 1 - block_size) // block_size


def steps_for_epochs(epochs: float, windows: int, samples_per_step: int) -> int:
    return max(1, math.ceil(epochs * windows / samples_per_step))


class TrainBatches:
    """The micro-batches of training, numbered by sample: step ``step``'s
    micro-batch ``micro`` holds samples (step x accumulation + micro) x batch_size
    onwards."""

    def __init__(self, tokens: TokenSequence, block_size: int, batch_size: int,
                 accumulation: int, seed: int):
        self.tokens, self.block_size, self.batch_size = tokens, block_size, batch_size
        self.accumulation, self.seed = accumulation, seed
        self.windows = train_windows(len(tokens), block_size)
        if self.windows < 1:
            raise DataError(f"the training split has {len(tokens)} tokens, fewer than two "
                            f"blocks of {block_size}: use a smaller CONFIG_BLOCK_SIZE or "
                            "more data")
        self.n_chunks = math.ceil(self.windows / CHUNK_WINDOWS)
        self.last_chunk = self.windows - (self.n_chunks - 1) * CHUNK_WINDOWS

    @property
    def samples_per_step(self) -> int:
        return self.batch_size * self.accumulation

    def steps_for_epochs(self, epochs: float) -> int:
        return steps_for_epochs(epochs, self.windows, self.samples_per_step)

    @functools.lru_cache(maxsize=2)
    def _epoch(self, epoch: int) -> tuple[int, np.ndarray, int]:
        """The epoch's offset, chunk order, and where the short last chunk falls."""
        rng = np.random.default_rng([self.seed, epoch])
        offset, order = int(rng.integers(self.block_size)), rng.permutation(self.n_chunks)
        return offset, order, int(np.flatnonzero(order == self.n_chunks - 1)[0])

    @functools.lru_cache(maxsize=4)
    def _chunk(self, epoch: int, chunk: int) -> np.ndarray:
        size = self.last_chunk if chunk == self.n_chunks - 1 else CHUNK_WINDOWS
        return np.random.default_rng([self.seed, epoch, chunk]).permutation(size)

    def window(self, sample: int) -> int:
        """Token offset of sample number ``sample`` (counted from the first step)."""
        epoch, index = divmod(sample, self.windows)
        offset, order, short_slot = self._epoch(epoch)
        # Slots before the short chunk's hold CHUNK_WINDOWS windows each; after it,
        # the count is shifted by its length.
        if index < short_slot * CHUNK_WINDOWS:
            slot, within = divmod(index, CHUNK_WINDOWS)
        elif index < short_slot * CHUNK_WINDOWS + self.last_chunk:
            slot, within = short_slot, index - short_slot * CHUNK_WINDOWS
        else:
            slot, within = divmod(index - self.last_chunk + CHUNK_WINDOWS, CHUNK_WINDOWS)
        chunk = int(order[slot])
        return offset + (chunk * CHUNK_WINDOWS + int(self._chunk(epoch, chunk)[within])) \
            * self.block_size

    def first_sample(self, step: int, micro: int) -> int:
        return (step * self.accumulation + micro) * self.batch_size

    def starts(self, step: int, micro: int) -> np.ndarray:
        first = self.first_sample(step, micro)
        return np.array([self.window(s) for s in range(first, first + self.batch_size)],
                        dtype=np.int64)

    def get(self, step: int, micro: int) -> tuple[np.ndarray, np.ndarray]:
        return self.tokens.windows(self.starts(step, micro), self.block_size)

    def position(self, step: int) -> dict:
        """Where the data stream stands after ``step`` steps: saved in checkpoints."""
        sample = step * self.samples_per_step
        return {"next_sample": sample, "epoch": sample // self.windows,
                "windows_per_epoch": self.windows}


class SequentialBatches(TrainBatches):
    """modded-nanogpt's training order (records/track_3_optimization/
    train_gpt_simple.py, distributed_data_generator): the shards in name order, each
    step the next samples_per_step x block_size consecutive tokens of the current
    shard (+1 for the last target), windows of block_size in order; a shard whose rest
    cannot hold a whole step and one more token is left for the next. No seed: every
    run reads the same tokens in the same order. After the last shard the order starts
    again (modded-nanogpt's stops there)."""

    def __init__(self, tokens: TokenSequence, block_size: int, batch_size: int,
                 accumulation: int, seed: int):
        self.tokens, self.block_size, self.batch_size = tokens, block_size, batch_size
        self.accumulation, self.seed = accumulation, seed
        span = self.samples_per_step * block_size  # tokens of one step
        lengths = np.diff(tokens.starts)
        steps = [(n - span - 2) // span + 1 if n >= span + 2 else 0 for n in lengths]
        if not sum(steps):
            raise DataError(f"no training shard holds one step of {span:,} tokens (+2): the "
                            f"longest has {int(max(lengths, default=0)):,}; use fewer tokens "
                            "per step or whole shards")
        self.first_step = np.cumsum([0] + steps)  # each shard's first step in an epoch
        self.windows = sum(steps) * self.samples_per_step
        self.span = span

    def window(self, sample: int) -> int:
        step, within = divmod(sample % self.windows, self.samples_per_step)
        shard = int(np.searchsorted(self.first_step, step, side="right")) - 1
        return (int(self.tokens.starts[shard]) + (step - int(self.first_step[shard])) * self.span
                + within * self.block_size)


def train_batches(dataset: str, tokens: TokenSequence, block_size: int, batch_size: int,
                  accumulation: int, seed: int) -> TrainBatches:
    """The training order of ``dataset``: its distributor's (sequential) or kgpt's."""
    kind = SequentialBatches if sequential(dataset) else TrainBatches
    return kind(tokens, block_size, batch_size, accumulation, seed)


class ValBatches:
    """The validation set: the same windows at every evaluation and in every run,
    whatever its batch size (a batch-size sweep scores every cell on the same tokens).

    The split is cut into consecutive windows of block_size + 1 tokens, each starting
    where the previous one's inputs end (block_size scored tokens each: inputs and
    next-token targets); ``eval_tokens`` (0: all of them) asks for
    ceil(eval_tokens / block_size) of those windows, taken evenly spaced over the
    split, so a small set still samples all of it. All of them cover the split from
    its start to its last whole window; fewer than block_size tokens at the end are
    not scored. The windows depend only on the split, block_size and eval_tokens.
    ``first``: the first windows instead of evenly spaced ones, as modded-nanogpt
    scores its validation tokens (a sequential dataset's).

    Only their offsets are kept; a batch of ``batch_size`` windows is read from the
    (memory-mapped) split when it is evaluated, so the whole split of a large corpus
    costs 8 bytes per window. The last batch may be short."""

    def __init__(self, tokens: TokenSequence, block_size: int, *, eval_tokens: int,
                 batch_size: int, first: bool = False):
        fit = (len(tokens) - 1) // block_size
        if fit < 1:
            raise DataError(f"the validation split has {len(tokens)} tokens, fewer than one "
                            f"block of {block_size}+1: use a smaller CONFIG_BLOCK_SIZE or a "
                            "larger CONFIG_VAL_FRACTION")
        n = fit if eval_tokens <= 0 else min(fit, -(-eval_tokens // block_size))
        # n of the fit consecutive windows, evenly spaced (all of them when n == fit),
        # or the first n
        index = np.arange(n, dtype=np.int64)
        self.starts = (index if first else index * fit // n) * block_size
        self.tokens, self.block_size, self.batch_size = tokens, block_size, batch_size
        self.split_windows = fit  # how many whole windows the split holds

    @property
    def windows(self) -> int:
        return len(self.starts)

    @property
    def n_tokens(self) -> int:
        """Tokens scored per evaluation (each window's targets)."""
        return self.windows * self.block_size

    def __len__(self) -> int:
        """Batches per evaluation."""
        return -(-self.windows // self.batch_size)

    def batch_starts(self, i: int) -> np.ndarray:
        return self.starts[i * self.batch_size:(i + 1) * self.batch_size]

    def batch(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and targets of batch ``i`` (the last may hold fewer windows)."""
        return self.tokens.windows(self.batch_starts(i), self.block_size)

    def __iter__(self):
        return (self.batch(i) for i in range(len(self)))


def val_batches(dataset: str, tokens: TokenSequence, block_size: int, eval_tokens: int,
                batch_size: int) -> ValBatches:
    """The validation windows of ``dataset``: the first ones for a dataset read in its
    distributor's order, evenly spaced ones otherwise."""
    return ValBatches(tokens, block_size, eval_tokens=eval_tokens, batch_size=batch_size,
                      first=sequential(dataset))
