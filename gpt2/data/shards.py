"""Token shards: the on-disk format of prepared data, and reading them back.

A prepared split is a list of shard files, each a 64-byte header then uint16 GPT-2
tokens:

    offset  bytes  field
    0       8      magic b"KGPTTOK" + NUL: refuses foreign files
    8       4      format version (little-endian uint32)
    12      4      header size in bytes (uint32): tokens start here
    16      8      token count (uint64): refuses truncated or padded files
    24      40     zero

Shards are written to a temporary name, fsynced and renamed, so a file with the
final name is always complete; a write that fails (a full disk) removes its
temporary file and raises StorageError. Training memory-maps them and reads across
shard boundaries as if the split were one array (:class:`TokenSequence`).

kgpt also reads modded-nanogpt's shards in place (its data/fineweb.py writes them, its
data/cached_fineweb10B.py downloads them), in their own format: a header of 256
little-endian int32 (magic 20240520, version 1, token count, then zeros), then uint16
GPT-2 tokens. The same checks refuse a foreign, truncated or padded one
(``fmt=MODDED``).
"""

from __future__ import annotations

import hashlib
import re
import stat
import struct
from pathlib import Path
from typing import Any

import numpy as np

from gpt2 import faults, storage
from gpt2.errors import DataError

MAGIC = b"KGPTTOK\x00"
VERSION = 1  # of the shard header
# Of a prepared folder (meta.json and its shards): prepare writes it, training checks it.
DATA_FORMAT_VERSION = 2
HEADER_BYTES = 64
_HEADER = struct.Struct("<8sIIQ")  # magic, version, header size, token count
TOKEN_DTYPE = np.uint16
DATA_SETTING = "CONFIG_DATA_DIR"  # where to prepare instead when a folder refuses writes
# The shard formats kgpt reads: its own, and modded-nanogpt's.
KGPT, MODDED = "kgpt", "modded-nanogpt"
MODDED_MAGIC = 20240520
MODDED_VERSION = 1
MODDED_HEADER_BYTES = 256 * 4
MODDED_HEADER = struct.Struct("<iii")  # magic, version, token count (of the 256 int32)
# The files a modded-nanogpt split is: data/fineweb.py's names (names, never paths)
MODDED_FILE = {"train": re.compile(r"fineweb_train_\d{6}\.bin\Z"),
               "val": re.compile(r"fineweb_val_\d{6}\.bin\Z")}


def header_bytes(fmt: str) -> int:
    return MODDED_HEADER_BYTES if fmt == MODDED else HEADER_BYTES


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:06d}.bin"


def modded_name(split: str, index: int) -> str:
    """modded-nanogpt's name for shard ``index`` of a split (one MODDED_FILE matches)."""
    return f"fineweb_{split}_{index:06d}.bin"


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def meta_problem(meta: Any) -> str | None:
    """What keeps a parsed meta.json from being one prepare wrote (the fields training
    reads, with their types), or None. A shard's file must be a name prepare gives,
    never a path."""
    if not isinstance(meta, dict):
        kind = {list: "an array", str: "a string", bool: "true or false",
                type(None): "null"}.get(type(meta), "a number")
        return f"it holds {kind}, not an object"
    for key in ("train_tokens", "val_tokens"):
        if not _count(meta.get(key)):
            return f'"{key}" is missing or not a token count'
    if not isinstance(meta.get("data_sha256"), str):
        return '"data_sha256" is missing or not a string'
    splits = meta.get("splits")
    fmt = meta.get("shard_format", KGPT)
    if fmt not in (KGPT, MODDED):
        return f'"shard_format" {fmt!r} is not one kgpt reads'
    if fmt == MODDED and not (isinstance(meta.get("source_dir"), str)
                              and meta["source_dir"].startswith("/")):
        return '"source_dir", the folder of the modded-nanogpt shards, is not an absolute path'
    for split in ("train", "val"):
        entry = splits.get(split) if isinstance(splits, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("shards"), list):
            return f'"splits" lacks a list of {split} shards'
        name = (MODDED_FILE[split] if fmt == MODDED
                else re.compile(rf"{split}_\d{{6}}\.bin\Z"))
        for i, shard in enumerate(entry["shards"]):
            if not (isinstance(shard, dict) and isinstance(shard.get("file"), str)
                    and name.match(shard["file"])
                    and _count(shard.get("tokens")) and isinstance(shard.get("sha256"), str)):
                return (f'{split} shard {i} is not an entry prepare writes ("file" '
                        f'{name.pattern[:-2]}, "tokens", "sha256")')
    return None


def header(n_tokens: int) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, HEADER_BYTES, n_tokens).ljust(HEADER_BYTES, b"\0")


def write_shard(path: Path, tokens: np.ndarray, index: int = 0) -> str:
    """Write tokens (any integer array with values < 2**16) atomically; returns the
    file's sha256. ``index``: the shard's number in its split (for the
    enospc-in-shard fault)."""
    data = memoryview(header(len(tokens)) + np.asarray(tokens, dtype=TOKEN_DTYPE).tobytes())
    def write(f) -> None:
        f.write(data[:HEADER_BYTES])
        faults.disk_full("shard", index)  # a full disk leaves half a file
        f.write(data[HEADER_BYTES:])

    # (<shard>.<tag>.tmp: a name preparation knows as a leftover of its own)
    storage.write_durably(path, write, DATA_SETTING, form="{name}.{tag}.tmp")
    return hashlib.sha256(data).hexdigest()


def read_count(path: Path, hint: str, fmt: str = KGPT) -> int:
    """The token count of a shard, after checking it is one of ``fmt``'s and complete.
    ``hint`` says what to run when it is not."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # (a FIFO would block the reader forever)
            raise DataError(f"{path} is not a regular file (a pipe, a folder?); {hint}")
        size = st.st_size
        with open(path, "rb") as f:
            head = f.read(header_bytes(fmt))
    except FileNotFoundError:
        raise DataError(f"{path} is missing; {hint}") from None
    if fmt == MODDED:
        return _modded_count(path, head, size, hint)
    if len(head) < _HEADER.size or head[:8] != MAGIC:
        raise DataError(f"{path} is not a kgpt token shard (no {MAGIC[:7].decode()} header): "
                        f"a foreign, empty or older file; {hint}")
    _, version, head_size, count = _HEADER.unpack(head[:_HEADER.size])
    if version != VERSION:
        raise DataError(f"{path} has shard format version {version}, this kgpt reads "
                        f"{VERSION}; {hint}")
    if size != head_size + 2 * count:
        raise DataError(f"{path} holds {size - head_size} token bytes, its header says "
                        f"{2 * count}: the file is truncated or damaged; {hint}")
    return count


def _modded_count(path: Path, head: bytes, size: int, hint: str) -> int:
    if len(head) < MODDED_HEADER_BYTES:
        raise DataError(f"{path} is shorter than a modded-nanogpt shard's header "
                        f"({MODDED_HEADER_BYTES} bytes): a foreign, empty or truncated file; "
                        f"{hint}")
    magic, version, count = MODDED_HEADER.unpack(head[:MODDED_HEADER.size])
    if magic != MODDED_MAGIC:
        raise DataError(f"{path} is not a modded-nanogpt token shard (magic number {magic}, "
                        f"not {MODDED_MAGIC}): a foreign file; {hint}")
    if version != MODDED_VERSION:
        raise DataError(f"{path} has modded-nanogpt shard version {version}, kgpt reads "
                        f"{MODDED_VERSION}; {hint}")
    if count < 0 or size != MODDED_HEADER_BYTES + 2 * count:
        raise DataError(f"{path} holds {size - MODDED_HEADER_BYTES} token bytes, its header "
                        f"says {2 * count}: the file is truncated or damaged; {hint}")
    return count


def tokens_sha256(splits: dict[str, list[Path]], fmt: str = KGPT) -> str:
    """The sha256 of each split's tokens, in order, however they are cut into shards:
    the same corpus prepared with another CONFIG_SHARD_TOKENS hashes the same. Each
    split is named and counted in the hash, so moving tokens between splits changes
    it."""
    digest = hashlib.sha256()
    for split, paths in splits.items():
        digest.update(f"{split}\0{sum(read_count(p, '', fmt) for p in paths)}\0".encode())
        for path in paths:
            with open(path, "rb") as f:
                f.seek(header_bytes(fmt))
                while chunk := f.read(1 << 24):
                    digest.update(chunk)
    return digest.hexdigest()


def open_shard(path: Path, hint: str, fmt: str = KGPT) -> np.memmap:
    count = read_count(path, hint, fmt)
    if count == 0:
        return np.zeros(0, dtype=TOKEN_DTYPE)  # np.memmap refuses an empty map
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=header_bytes(fmt),
                     shape=(count,))


class TokenSequence:
    """The shards of one split read as one array: ``read(start, n)`` may span
    shards. ``shards`` are arrays: memory maps (:func:`open_shards`) or, in
    tests, plain arrays."""

    def __init__(self, shards: list[np.ndarray]):
        self.shards = shards
        self.starts = np.cumsum([0] + [len(s) for s in shards])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def read(self, start: int, n: int) -> np.ndarray:
        """Tokens [start, start + n) as int64."""
        if start < 0 or start + n > len(self):
            raise IndexError(f"tokens [{start}, {start + n}) outside 0..{len(self)}")
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        local = start - int(self.starts[i])
        shard = self.shards[i]
        if local + n <= len(shard):  # the common case: inside one shard
            return shard[local:local + n].astype(np.int64)
        out = np.empty(n, dtype=np.int64)
        done = 0
        while done < n:
            shard = self.shards[i]
            take = min(n - done, len(shard) - local)
            out[done:done + take] = shard[local:local + take]
            done, i, local = done + take, i + 1, 0
        return out

    def windows(self, starts: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and next-token targets for windows of ``block_size`` + 1 tokens."""
        chunk = np.stack([self.read(int(s), block_size + 1) for s in starts])
        return chunk[:, :-1], chunk[:, 1:]


def open_shards(paths: list[Path], hint: str, expected: list[int],
                fmt: str = KGPT) -> TokenSequence:
    """Memory-map each shard once, checking its header and that it holds the token
    count meta.json recorded."""
    shards = [open_shard(p, hint, fmt) for p in paths]
    for path, shard, count in zip(paths, shards, expected):
        if len(shard) != count:
            raise DataError(f"{path} holds {len(shard)} tokens, meta.json says {count}: the "
                            f"data changed after it was prepared; {hint}")
    return TokenSequence(shards)
