"""Tokenize a dataset once into shards of uint16 tokens, resumably.

``prepare`` streams the source's documents (gpt2/data/documents.py), tokenizes them
in a process pool, and writes each split as shards of CONFIG_SHARD_TOKENS tokens
(gpt2/data/shards.py) plus meta.json. The tokenizer is the dataset's
(gpt2/data/tokenizer.py: GPT-2's BPE, or a character-level alphabet). Memory stays
bounded: a few pieces of text in flight and at most one shard of tokens per split.

Nothing is lost to a kill. After each finished shard, prepare-state.json records
the shards done and, per split, the piece (and token within it) the next shard
starts at. A re-run with the same settings keeps those shards, skips the pieces
they hold without tokenizing them, and writes the rest; since the piece stream
and the tokenizer are deterministic, the result is byte-identical to an
uninterrupted run. meta.json is written last, so its presence means "complete";
a re-run with everything up to date does nothing.

One preparation at a time per folder: a second one started meanwhile (two `make`
runs sharing the data) waits for the first, saying so, and then finds the data
ready, or continues after the shards of a first one that was stopped.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import hashlib
import http.client
import itertools
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from tqdm import tqdm

from gpt2 import faults, processes, storage
from gpt2.checksums import sha256_file
from gpt2.data import documents as docs
from gpt2.data.shards import (DATA_FORMAT_VERSION, DATA_SETTING, MODDED_FILE, DataError,
                              header_bytes, meta_problem, modded_name, read_count, shard_name,
                              tokens_sha256, write_shard)
from gpt2.config.datasets import DATASETS, HubSource, LocalOnly, ShardFolder, TextSource
from gpt2.data.tokenizer import TokenizerError, tokenizer_for

STATE_NAME = "prepare-state.json"
SPLITS = ("train", "val")
DOWNLOAD_TIMEOUT_S = 60
BATCH_CHARS = 1 << 22  # text per tokenization task: amortizes the trip to a worker
STOP_SIGNALS = processes.STOP_SIGNALS

__all__ = ["DataError", "PrepareInterrupted", "prepare", "sha256_file", "download"]


class PrepareInterrupted(Exception):
    """A stop signal during preparation. Finished shards are kept and recorded, so
    preparing again continues after them."""


@contextlib.contextmanager
def _stop_on_signals(outcome):
    """The stop signals (SIGINT, SIGTERM, SIGHUP, SIGUSR1) stop the preparation at
    once (raising where the main thread is); ``outcome()`` says what was kept."""
    def handle(signum, frame):
        raise PrepareInterrupted(f"{signal.Signals(signum).name} received: {outcome()}")

    with processes.stop_signals_handled_by(handle, STOP_SIGNALS):
        yield


def _ignore_stop_signals() -> None:
    """Pool workers leave stopping to the main process (a Ctrl-C reaches them too)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def download(url: str, dest: Path, sha256: str | None) -> None:
    """Fetch url to dest, refusing content whose sha256 differs from the pinned one
    (``None``: a file with no published checksum, whose digest is printed)."""
    print(f"downloading {url}")
    h = hashlib.sha256()

    def write(f) -> None:  # (a refusal raised here leaves no file behind: write_durably)
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
                for chunk in iter(lambda: resp.read(1 << 20), b""):
                    h.update(chunk)
                    f.write(chunk)
        except (urllib.error.URLError, OSError) as e:
            raise DataError(f"download of {url} failed: {e}. Offline? Put the corpus at "
                            f"{dest} or pass --input FILE (CONFIG_DATA_INPUT)") from None
        if sha256 is not None and h.hexdigest() != sha256:
            raise DataError(f"download of {url} has sha256 {h.hexdigest()}, expected {sha256}: "
                            f"refusing it. Retry, or place a verified copy at {dest}")

    storage.write_durably(dest, write, DATA_SETTING, form="{name}.{tag}.part")
    if sha256 is None:
        print(f"{dest.name}: sha256 {h.hexdigest()}")


def _write_json(path: Path, data: dict) -> None:
    storage.write_bytes_atomic(path, (json.dumps(data, indent=2) + "\n").encode(), DATA_SETTING)


def _read_json(path: Path) -> dict | None:
    """A JSON object from ``path``; None when there is none (missing, damaged, or
    some other JSON value), which prepares the folder again."""
    return storage.read_json_object(path)


# ---- what to read ---------------------------------------------------------------

def _file_entry(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def _source(dataset: str, out: Path, input_path: str, url: str | None, text_field: str,
            val_fraction: float, streaming: bool):
    """The documents to tokenize and a description of where they come from (part
    of what a finished preparation must match to be reused)."""
    source = DATASETS[dataset]
    rows_are_documents = not isinstance(source, HubSource) or source.rows_are_documents
    if isinstance(source, TextSource) and (not input_path or Path(input_path).is_file()):
        # A one-file corpus lives at data/<dataset>/<raw_name>: a local copy given
        # once is kept there, so later runs without CONFIG_DATA_INPUT find it.
        raw = out / source.raw_name
        if raw.is_symlink() or (raw.exists() and not raw.is_file()):
            raise DataError(f"{raw} is not a regular file (a link, a folder or a pipe), so "
                            "kgpt neither reads nor replaces it: move it away")
        if input_path:
            src = Path(input_path)
            if not raw.is_file() or sha256_file(src) != sha256_file(raw):
                _copy_corpus(src, raw)
        elif not raw.is_file() and not _copy_sibling(dataset, out, raw):
            download(url or source.url, raw, source.sha256)
        digest = sha256_file(raw)
        if digest != source.sha256:
            print(f"note: {raw} differs from the published {dataset} corpus (sha256 "
                  f"{digest[:12]}..., published {source.sha256[:12]}...); using it as is")
        files = docs.LocalFiles([raw], [], [])
        return docs.local_documents(files, text_field, val_fraction), {"kind": "text",
                                                                       "sha256": digest}
    if input_path:
        files = docs.local_files(input_path)
        split_note = (f"{len(files.val)} validation file(s)" if files.val else
                      f"validation held out ({val_fraction:g})")
        print(f"{dataset}: {len(files.train)} training file(s), {split_note}"
              + (f", {len(files.skipped)} file(s) skipped (test*, unknown kinds)"
                 if files.skipped else "") + f" from {input_path}")
        described = {"kind": "local", "rows_are_documents": rows_are_documents,
                     "train": [_file_entry(p) for p in files.train],
                     "val": [_file_entry(p) for p in files.val]}
        return docs.local_documents(files, text_field, val_fraction, rows_are_documents), \
            described
    if isinstance(source, LocalOnly):
        raise DataError(f"dataset {dataset!r} is your own files: set CONFIG_DATA_INPUT "
                        "(--input PATH) to a .txt, .jsonl or .parquet file or a folder of them")
    assert isinstance(source, HubSource)
    described = {"kind": "hub", "path": source.path, "name": source.name,
                 "revision": source.revision, "train_split": source.train_split,
                 "val_split": source.val_split, "text_field": source.text_field}
    return docs.hub_documents(source, docs.val_every(val_fraction), streaming), described


def _copy_corpus(src: Path, raw: Path) -> None:
    def copy(f) -> None:
        with open(src, "rb") as source_file:
            shutil.copyfileobj(source_file, f, 1 << 20)

    storage.write_durably(raw, copy, DATA_SETTING)


def _copy_sibling(dataset: str, out: Path, raw: Path) -> bool:
    """Copy the corpus from another dataset's folder that holds the same published
    file (shakespeare and shakespeare-char read one text): an offline machine that
    has one has both. True when copied."""
    source = DATASETS[dataset]
    for name, other in DATASETS.items():
        if name == dataset or not isinstance(other, TextSource) or other.sha256 != source.sha256:
            continue
        found = out.parent / name / other.raw_name
        if found.is_file() and not found.is_symlink() and sha256_file(found) == source.sha256:
            _copy_corpus(found, raw)
            print(f"{dataset}: the corpus is the one {found} holds (sha256 checked); copied it")
            return True
    return False


# ---- tokenizing ---------------------------------------------------------------

def encode_pieces(batch: list[tuple[str, bool]], dataset: str) -> list[np.ndarray]:
    """Tokens of each (text, end-of-text before) piece, by ``dataset``'s tokenizer.
    Runs in the worker processes."""
    tokenizer = tokenizer_for(dataset)
    out = []
    for text, eot_before in batch:
        if eot_before and tokenizer.eot is None:
            raise DataError(f"{dataset} is character-level: its alphabet has no end-of-text "
                            "token to put between documents, so it takes one text file "
                            "(CONFIG_DATA_INPUT), not several documents")
        try:
            ids = tokenizer.encode(text)
        except TokenizerError as e:
            if e.character is None:
                raise
            raise DataError(f"{dataset} is character-level, and its text holds {e.character!r}, "
                            f"which is not one of the {tokenizer.n_tokens} characters it has "
                            "tokens for: give a text written in them (it is tiny Shakespeare's "
                            "alphabet, nanoGPT's shakespeare_char)") from None
        arr = np.empty(len(ids) + eot_before, dtype=np.uint16)
        if eot_before:
            arr[0] = tokenizer.eot
        arr[eot_before:] = ids  # every vocabulary has fewer than 65,536 tokens: uint16 holds them
        out.append(arr)
    return out


def _batches(items: Iterable[tuple[int, docs.Piece]]) -> Iterator[list[tuple[int, docs.Piece]]]:
    batch: list = []
    chars = 0
    for item in items:
        batch.append(item)
        chars += len(item[1].text)
        if chars >= BATCH_CHARS or len(batch) >= 4096:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def tokenized(items: Iterable[tuple[int, docs.Piece]], workers: int,
              dataset: str) -> Iterator[tuple[int, docs.Piece, np.ndarray]]:
    """(index, piece, tokens) in the order of ``items``; at most 2 x workers batches
    in flight, so a corpus of any size streams through bounded memory."""
    def work(batch):
        return [(p.text, p.eot_before) for _, p in batch]

    batches = _batches(items)
    head = list(itertools.islice(batches, 2))
    batches = itertools.chain(head, batches)
    if workers <= 1 or len(head) < 2:  # one batch (a small corpus) is not worth a pool
        for batch in batches:
            tokens = encode_pieces(work(batch), dataset)
            yield from ((i, p, t) for (i, p), t in zip(batch, tokens))
        return
    # spawn, not fork: a forked child would inherit the parent's threads' locks.
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx,
                                                initializer=_ignore_stop_signals) as pool:
        try:
            ahead: collections.deque = collections.deque()
            for batch in batches:
                ahead.append((batch, pool.submit(encode_pieces, work(batch), dataset)))
                if len(ahead) > 2 * workers:
                    done, future = ahead.popleft()
                    yield from ((i, p, t) for (i, p), t in zip(done, future.result()))
            while ahead:
                done, future = ahead.popleft()
                yield from ((i, p, t) for (i, p), t in zip(done, future.result()))
        except BaseException:  # a stop (or an error): drop the queued work, don't wait on it
            pool.shutdown(wait=False, cancel_futures=True)
            raise


# ---- writing shards -------------------------------------------------------------

class ShardWriter:
    """Cuts one split's token stream into shards of ``shard_tokens``.

    ``next`` is where the first token not yet in a finished shard comes from:
    (piece index, token offset within that piece's tokens). ``record()`` is called
    after each shard is written, so a shard is recorded even when the same piece
    goes on to fill another whose write fails (a full disk, a signal)."""

    def __init__(self, folder: Path, split: str, shard_tokens: int, saved: dict | None,
                 record=lambda: None):
        self.folder, self.split, self.shard_tokens = folder, split, shard_tokens
        self.record = record
        self.shards: list[dict] = list(saved["shards"]) if saved else []
        self.next: tuple[int, int] = tuple(saved["next"]) if saved else (0, 0)
        self.pending: collections.deque = collections.deque()  # [index, offset, tokens]
        self.n_pending = 0

    def wants(self, index: int) -> bool:
        return index >= self.next[0]

    def add(self, index: int, tokens: np.ndarray) -> list[str]:
        """Queue one piece's tokens; returns the names of the shards this filled."""
        offset = self.next[1] if index == self.next[0] and not self.pending else 0
        if offset < len(tokens):
            self.pending.append([index, offset, tokens])
            self.n_pending += len(tokens) - offset
        written = []
        while self.n_pending >= self.shard_tokens:
            written.append(self._flush(self.shard_tokens))
        return written

    def finish(self) -> str | None:
        return self._flush(self.n_pending) if self.n_pending or not self.shards else None

    def _flush(self, n: int) -> str:
        parts, need = [], n
        while need:
            item = self.pending[0]
            index, offset, tokens = item
            take = min(need, len(tokens) - offset)
            parts.append(tokens[offset:offset + take])
            need -= take
            if offset + take == len(tokens):
                self.pending.popleft()
                self.next = (index + 1, 0)
            else:
                item[1] = offset + take
                self.next = (index, offset + take)
        name = shard_name(self.split, len(self.shards))
        data = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
        digest = write_shard(self.folder / name, data, len(self.shards))
        self.shards.append({"file": name, "tokens": n, "sha256": digest})
        self.n_pending -= n
        self.record()
        return name

    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards)

    def state(self) -> dict:
        return {"shards": self.shards, "next": list(self.next)}


def _foreign_files(out: Path, meta: dict | None) -> list[str]:
    """The files preparing ``out`` would replace or delete that are not kgpt's: a
    meta.json that is a JSON object but not kgpt's (no format_version and tokenizer:
    another tool's), and train.bin/val.bin unless kgpt's own format-1 meta.json names
    them (nanoGPT writes files by those names too). A meta.json that cannot be read
    is taken for kgpt's, damaged: it is prepared again (docs/reliability.md, 4)."""
    ours = meta is None or ("format_version" in meta and "tokenizer" in meta)
    found = [] if ours else ["meta.json"]
    if not (meta is not None and ours and meta.get("format_version") == 1):
        found += [n for n in ("train.bin", "val.bin") if (out / n).exists()]
    return found


# The files a preparation writes and may remove again: its shards, their temporary
# files (a killed write's), and format 1's train.bin/val.bin (which _foreign_files
# lets through only under kgpt's own format-1 meta.json). Nothing else is deleted.
_OURS = re.compile(r"(train|val)(_\d{6}\.bin(\.[0-9a-f]{12})?\.tmp|_\d{6}\.bin|\.bin)")


def _remove_stale(out: Path, keep: set[str]) -> None:
    """Shards and files of an older or different preparation, so no file of another
    run is ever read as ours."""
    for path in out.iterdir():
        if _OURS.fullmatch(path.name) and path.name not in keep:
            path.unlink()


def _complete(out: Path, meta: dict | None, wanted: dict) -> bool:
    if not meta or any(meta.get(k) != v for k, v in wanted.items()) or meta_problem(meta):
        return False
    try:
        return all(read_count(out / s["file"], "") == s["tokens"]
                   for split in SPLITS for s in meta["splits"][split]["shards"])
    except (DataError, KeyError, TypeError):
        return False


def prepare(dataset: str, data_dir: str | os.PathLike, input_path: str = "",
            val_fraction: float = 0.1, url: str | None = None, *, text_field: str = "text",
            shard_tokens: int = 100_000_000, workers: int = 0,
            streaming: bool = False, train_shards: int | None = None) -> dict:
    """Prepare one dataset into data_dir/dataset; returns its meta.json contents.
    ``workers`` 0 uses every core. ``train_shards``: how many training shards a
    ShardFolder dataset downloads (None: all the Hub has). Waits while another
    process prepares the folder."""
    out = Path(data_dir) / dataset
    with storage.writing(out, DATA_SETTING):
        out.mkdir(parents=True, exist_ok=True)
    with _stop_on_signals(lambda: f"stopped waiting for the other preparation of {out}; "
                          "nothing was changed"):
        lock = processes.lock_folder(out, math.inf, waiting=lambda: print(
            f"{out} is being prepared by another process (another `make data`?); waiting "
            "for it to finish, then using its result ...", flush=True))
    try:
        if isinstance(DATASETS[dataset], ShardFolder):
            return _index_shard_folder(dataset, out, input_path, train_shards)
        return _prepare_locked(dataset, out, input_path, val_fraction, url, text_field,
                               shard_tokens, workers, streaming)
    finally:
        os.close(lock)


def _index_shard_folder(dataset: str, out: Path, input_path: str,
                        train_shards: int | None) -> dict:
    """A ShardFolder dataset: the shards of the folder CONFIG_DATA_INPUT names or,
    without one, the Hub's, downloaded into ``out`` (_hub_shards). Every one is
    checked (header, size) and recorded with its folder and sha256 in out/meta.json,
    which training reads; the shards stay where they are."""
    source = DATASETS[dataset]
    assert isinstance(source, ShardFolder)
    meta = _read_json(out / "meta.json")
    if _foreign_files(out, meta):  # (before anything is downloaded into the folder)
        raise DataError(f"{out / 'meta.json'} is not kgpt's, and indexing would replace it: "
                        f"move it away, or set {DATA_SETTING} to another folder")
    if input_path:
        folder = Path(os.path.expanduser(input_path)).resolve()
        files = _local_shards(dataset, source, folder, input_path)
        described = {"folder": str(folder)}
    elif source.hub_repo:
        folder = out.resolve()
        train_shards = train_shards or source.hub_train_shards
        if _hub_up_to_date(meta, source, folder, train_shards):
            print(f"{dataset}: up to date, {meta['train_tokens']:,} train / "
                  f"{meta['val_tokens']:,} val tokens downloaded to {folder}")
            return meta
        with _stop_on_signals(lambda: "download stopped; the shards finished so far are "
                              "kept. Run the same command (`make data`) again to download "
                              "the rest"):
            files, described = _hub_shards(dataset, source, folder, train_shards)
    else:
        raise DataError(f"{dataset} reads shards that are already tokenized: "
                        f"{source.how_to_get}")
    return _index_shards(dataset, out, meta, folder, files, described)


def _local_shards(dataset: str, source: ShardFolder, folder: Path,
                  input_path: str) -> dict[str, list[Path]]:
    """Each split's shards in the folder CONFIG_DATA_INPUT names, by name."""
    if not folder.is_dir():
        raise DataError(f"CONFIG_DATA_INPUT={input_path} is not a folder; {dataset} reads "
                        f"a folder of shards: {source.how_to_get}")
    files = {split: sorted(p for p in folder.iterdir() if MODDED_FILE[split].match(p.name))
             for split in SPLITS}
    for split, paths in files.items():
        if not paths:
            raise DataError(f"{folder} holds no {MODDED_FILE[split].pattern[:-2]} files: "
                            f"{source.how_to_get}")
    return files


def _sizes(paths: Iterable[Path]) -> dict[str, int]:
    """Each file's size by name: what tells an indexed folder unchanged."""
    return {p.name: p.stat().st_size for p in paths}


def _index_shards(dataset: str, out: Path, meta: dict | None, folder: Path,
                  files: dict[str, list[Path]], described: dict) -> dict:
    """Check and record ``files`` (each split's shards, in order, all in ``folder``)
    in out/meta.json; nothing is read when meta.json already records them, from the
    same source, at the same sizes."""
    source = DATASETS[dataset]
    hint = f"fetch it again ({source.how_to_get})"
    fmt = source.shard_format
    sizes = _sizes(p for ps in files.values() for p in ps)
    if (meta and not meta_problem(meta) and meta.get("source_dir") == str(folder)
            and meta.get("source") == described and meta.get("sizes") == sizes):
        print(f"{dataset}: up to date, {meta['train_tokens']:,} train / "
              f"{meta['val_tokens']:,} val tokens in {folder}")
        return meta
    entries, streams = {}, hashlib.sha256()
    t0 = time.perf_counter()
    for split, paths in files.items():
        counts = [read_count(p, hint, fmt) for p in paths]
        # The token stream's hash as tokens_sha256 computes it (split, count, tokens),
        # in the same pass as each file's own.
        streams.update(f"{split}\0{sum(counts)}\0".encode())
        entries[split] = []
        for path, count in zip(paths, counts):
            whole = hashlib.sha256()
            with open(path, "rb") as f:
                whole.update(f.read(header_bytes(fmt)))
                while chunk := f.read(1 << 24):
                    whole.update(chunk)
                    streams.update(chunk)
            entries[split].append({"file": path.name, "tokens": count,
                                   "sha256": whole.hexdigest()})
    digest = hashlib.sha256("".join(sh["sha256"] for s in SPLITS
                                    for sh in entries[s]).encode()).hexdigest()
    counts = {s: sum(sh["tokens"] for sh in entries[s]) for s in SPLITS}
    meta = {"format_version": DATA_FORMAT_VERSION, "dataset": dataset,
            "tokenizer": tokenizer_for(dataset).name, "source": described,
            "shard_format": fmt, "source_dir": str(folder), "sizes": sizes,
            "train_tokens": counts["train"], "val_tokens": counts["val"], "dtype": "uint16",
            "data_sha256": digest, "tokens_sha256": streams.hexdigest(),
            "splits": {s: {"tokens": counts[s], "shards": entries[s]} for s in SPLITS}}
    _write_json(out / "meta.json", meta)
    print(f"{dataset}: indexed {counts['train']:,} train / {counts['val']:,} val tokens in "
          f"{sum(len(e) for e in entries.values())} shard(s) of {folder} in "
          f"{time.perf_counter() - t0:.1f}s (read in place)")
    return meta


# ---- a ShardFolder's shards from the Hugging Face Hub ----------------------------
# Three kinds of plain GET with urllib, not huggingface_hub: the Hub's listing of the
# repository gives each file's sha256, and download() already fetches a file against
# a sha256, writing it durably (no partial file under the shard's name); the library
# would add its own cache (a second copy of up to 20 GB, or links into it) for nothing
# more, and a test's local server serves these requests as easily as the Hub does.

HUB_ENDPOINT = "https://huggingface.co"
_COMMIT = re.compile(r"[0-9a-f]{40}\Z")  # what the Hub's "sha" of a revision must be
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")  # an LFS file's "oid"
# A download a SIGKILL cut short: write_durably's temporary file (download()'s form)
# beside a shard. Any other signal removes it itself.
_PARTIAL = [re.compile(MODDED_FILE[s].pattern[:-2] + r"\.[0-9a-f]{12}\.part\Z")
            for s in SPLITS]


def hub_endpoint() -> str:
    """The Hub's address: HF_ENDPOINT's when set (huggingface_hub's own convention,
    so a mirror configured for it works here too), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT).rstrip("/")


def _offline(source: ShardFolder) -> str:
    return (f"Offline, or to use shards you already have: {source.how_to_get} (or set "
            "HF_ENDPOINT to a Hugging Face mirror)")


def _hub_json(url: str, source: ShardFolder) -> object:
    """The JSON ``url`` answers; a DataError naming it and the offline route when it
    cannot be had."""
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
            return json.load(resp)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        raise DataError(f"cannot read {url}: {e}. {_offline(source)}") from None
    except ValueError:  # (not JSON, or not UTF-8)
        raise DataError(f"{url} answered with something other than JSON: not the Hugging "
                        f"Face Hub's API (check HF_ENDPOINT). {_offline(source)}") from None


def _hub_listing(source: ShardFolder) -> tuple[str, dict[str, dict]]:
    """The commit the repository's revision is at now, and the entries of its tree at
    that commit (so every file comes from one commit) whose path is a shard's name at
    the root (MODDED_FILE): no other path the server names is ever used."""
    base = f"{hub_endpoint()}/api/datasets/{source.hub_repo}"
    url = f"{base}/revision/{urllib.parse.quote(source.hub_revision, safe='')}"
    info = _hub_json(url, source)
    commit = info.get("sha") if isinstance(info, dict) else None
    if not (isinstance(commit, str) and _COMMIT.match(commit)):
        raise DataError(f"{url} names no commit (a \"sha\" of 40 hex digits): not the "
                        f"Hugging Face Hub's answer (check HF_ENDPOINT). {_offline(source)}")
    url = f"{base}/tree/{commit}"
    tree = _hub_json(url, source)
    if not isinstance(tree, list):
        raise DataError(f"{url} is not a list of files: not the Hugging Face Hub's answer "
                        f"(check HF_ENDPOINT). {_offline(source)}")
    return commit, {e["path"]: e for e in tree
                    if isinstance(e, dict) and e.get("type") == "file"
                    and isinstance(e.get("path"), str)
                    and any(name.match(e["path"]) for name in MODDED_FILE.values())}


def _listed_file(entry: dict, url: str) -> tuple[int, str]:
    """(size, sha256) of a listed LFS file; refused when the listing gives none (kgpt
    downloads only what it can check)."""
    lfs = entry.get("lfs")
    size, oid = (lfs.get("size"), lfs.get("oid")) if isinstance(lfs, dict) else (None, None)
    if not (type(size) is int and size >= 0 and isinstance(oid, str) and _SHA256.match(oid)):
        raise DataError(f"{url} lists {entry['path']} without an LFS size and sha256 "
                        "(\"lfs\": {\"oid\", \"size\"}), so its download could not be checked: "
                        "not downloading it")
    return size, oid


def _hub_shards(dataset: str, source: ShardFolder, folder: Path,
                train_shards: int) -> tuple[dict[str, list[Path]], dict]:
    """Download into ``folder`` the shards modded-nanogpt's data/cached_fineweb10B.py
    fetches (the validation shard and training shards 1..train_shards) that are not
    there yet, all from one commit, each checked against the listing's size and
    sha256. Returns each split's files and meta.json's "source"."""
    commit, listed = _hub_listing(source)
    names = {"train": [modded_name("train", i) for i in range(1, train_shards + 1)],
             "val": [modded_name("val", 0)]}
    tree = f"{hub_endpoint()}/api/datasets/{source.hub_repo}/tree/{commit}"
    missing = [n for split in ("val", "train") for n in names[split] if n not in listed]
    if missing:
        raise DataError(f"{source.hub_repo} at commit {commit} has no {', '.join(missing[:3])}"
                        f"{f' (and {len(missing) - 3} more)' if len(missing) > 3 else ''} "
                        f"({tree}); kgpt downloads {names['val'][0]} and training shards 1 to "
                        f"CONFIG_DATA_TRAIN_SHARDS={train_shards}: lower it to the training "
                        f"shards the repository has. {_offline(source)}")
    _remove_partial_downloads(folder)
    todo = []
    for name in names["val"] + names["train"]:
        size, sha256 = _listed_file(listed[name], tree)
        if not _already_there(folder / name, size, sha256, source):
            todo.append((name, size, sha256))
    print(f"{dataset}: {len(todo)} of {train_shards + 1} shard(s) to download "
          f"({sum(t[1] for t in todo) / 1e9:.1f} GB) from {source.hub_repo} at commit "
          f"{commit[:12]} into {folder}", flush=True)
    for i, (name, size, sha256) in enumerate(todo, 1):
        url = (f"{hub_endpoint()}/datasets/{source.hub_repo}/resolve/{commit}/"
               f"{urllib.parse.quote(name)}")
        # (a line a file: each is 200 MB, minutes on a slow link)
        t0 = time.perf_counter()
        print(f"  [{i}/{len(todo)}] {name}, {size / 1e6:,.0f} MB ...", end="", flush=True)
        try:
            download(url, folder / name, sha256)
        except BaseException:
            print(flush=True)  # (the reason on a line of its own)
            raise
        print(f" {size / 1e6 / max(time.perf_counter() - t0, 1e-6):,.0f} MB/s", flush=True)
        if (folder / name).stat().st_size != size:  # (the listing contradicts itself)
            (folder / name).unlink()
            raise DataError(f"{url} has the listed sha256 but not the listed size ({size} "
                            f"bytes, {tree}): refusing it. Retry later. {_offline(source)}")
    described = {"repo": source.hub_repo, "revision": source.hub_revision, "commit": commit,
                 "folder": str(folder)}
    return {split: [folder / n for n in names[split]] for split in SPLITS}, described


def _already_there(path: Path, size: int, sha256: str, source: ShardFolder) -> bool:
    """Whether ``path`` already holds the listed file (a finished earlier download, or
    a copy put there), by size and then sha256. Another file under that name is
    refused, never replaced: kgpt cannot tell it from someone's own."""
    if not os.path.lexists(path):
        return False
    try:
        found = path.stat().st_size
        digest = sha256_file(path) if found == size else None
    except OSError as e:  # (a dangling link, a pipe, unreadable)
        raise DataError(f"{path} cannot be read ({e.strerror}), and kgpt downloads "
                        f"{source.hub_repo}'s file of that name there: move it away, then run "
                        "`make data` again") from None
    if digest != sha256:
        has = f"sha256 {digest}" if digest else f"{found:,} bytes"
        wants = f"sha256 {sha256}" if digest else f"{size:,} bytes"
        raise DataError(f"{path} is not the file {source.hub_repo} lists under that name "
                        f"(it has {has}, the listing {wants}): a damaged download or another "
                        "file, which kgpt does not replace. Delete or move it away, then run "
                        "`make data` again to download it")
    return True


def _remove_partial_downloads(folder: Path) -> None:
    """The temporary files of downloads a SIGKILL cut short (only those names)."""
    for path in folder.iterdir():
        if any(p.fullmatch(path.name) for p in _PARTIAL) and not path.is_symlink():
            path.unlink()


def _hub_up_to_date(meta: dict | None, source: ShardFolder, folder: Path,
                    train_shards: int) -> bool:
    """Whether meta.json records this many training shards downloaded from the Hub
    into ``folder``, all still there at their sizes: then nothing is asked of the Hub,
    and a machine offline since trains on them (training checks each sha256 again)."""
    if not meta or meta_problem(meta) or meta.get("source_dir") != str(folder):
        return False
    recorded = meta.get("source")
    if not (isinstance(recorded, dict) and recorded.get("repo") == source.hub_repo
            and len(meta["splits"]["train"]["shards"]) == train_shards):
        return False
    try:
        return meta.get("sizes") == _sizes(folder / s["file"] for split in SPLITS
                                           for s in meta["splits"][split]["shards"])
    except OSError:
        return False


def _prepare_locked(dataset: str, out: Path, input_path: str, val_fraction: float,
                    url: str | None, text_field: str, shard_tokens: int, workers: int,
                    streaming: bool) -> dict:
    meta_path = out / "meta.json"
    meta = _read_json(meta_path)
    foreign = _foreign_files(out, meta)  # (before anything in the folder is written)
    if foreign:
        raise DataError(f"{out} holds {', '.join(foreign)}, which kgpt did not write (its "
                        "meta.json says nothing of them), and preparing would replace or "
                        f"delete them: move them away, or set {DATA_SETTING} to another folder")
    documents, described = _source(dataset, out, input_path, url, text_field, val_fraction,
                                   streaming)
    wanted = {"format_version": DATA_FORMAT_VERSION, "dataset": dataset,
              "tokenizer": tokenizer_for(dataset).name,
              "source": described, "val_fraction": val_fraction, "text_field": text_field,
              "shard_tokens": shard_tokens}
    if _complete(out, meta, wanted):
        print(f"{dataset}: up to date in {out} ({meta['train_tokens']:,} train / "
              f"{meta['val_tokens']:,} val tokens)")
        return meta
    meta_path.unlink(missing_ok=True)  # from here on the folder is incomplete

    state_path = out / STATE_NAME
    state = _read_json(state_path)
    if not state or state.get("wanted") != wanted or not _shards_intact(out, state):
        state = {"wanted": wanted, "splits": {}}

    def record() -> None:
        _write_json(state_path, {"wanted": wanted, "splits": {
            s: w.state() for s, w in writers.items()}})

    writers = {s: ShardWriter(out, s, shard_tokens, state["splits"].get(s), record)
               for s in SPLITS}
    kept = {sh["file"] for w in writers.values() for sh in w.shards}
    _remove_stale(out, kept)
    if kept:
        print(f"{dataset}: resuming an interrupted preparation: {len(kept)} finished "
              "shard(s) kept")

    workers = workers or os.cpu_count() or 1
    written = 0
    t0 = time.perf_counter()
    new_tokens = 0
    items = ((i, p) for i, p in enumerate(docs.pieces(documents)) if writers[p.split].wants(i))

    def kept() -> str:
        finished = sum(len(w.shards) for w in writers.values())
        return (f"preparation stopped; {finished} finished shard(s) kept. Run the same "
                "command (`make data`) again to continue after them.")

    with _stop_on_signals(kept), tqdm(desc=f"{dataset}: tokenizing", unit="tok",
                                      unit_scale=True, disable=None, mininterval=1.0,
                                      file=processes.raw_stream(sys.stderr)) as bar:
        for index, piece, tokens in tokenized(items, workers, dataset):
            new_tokens += len(tokens)
            bar.update(len(tokens))
            for name in writers[piece.split].add(index, tokens):
                bar.write(f"{dataset}: wrote {name}")
                written += 1
                if faults.active("kill-in-prepare", written):
                    os.kill(os.getpid(), signal.SIGKILL)
                faults.signal_self("prepare", written)
    for w in writers.values():
        w.finish()
    elapsed = time.perf_counter() - t0

    counts = {s: w.tokens() for s, w in writers.items()}
    if counts["val"] == 0:
        state_path.unlink(missing_ok=True)
        raise DataError(f"{dataset}: the validation split came out empty; raise "
                        "CONFIG_VAL_FRACTION or give more documents (or files named "
                        "validation*)")
    digest = hashlib.sha256("".join(sh["sha256"] for s in SPLITS
                                    for sh in writers[s].shards).encode()).hexdigest()
    # data_sha256 identifies these files; tokens_sha256 the tokens, whatever the shard
    # size (what a run's data identity compares).
    streams = tokens_sha256({s: [out / sh["file"] for sh in writers[s].shards] for s in SPLITS})
    meta = {**wanted, "train_tokens": counts["train"], "val_tokens": counts["val"],
            "dtype": "uint16", "data_sha256": digest, "tokens_sha256": streams,
            "splits": {s: {"tokens": counts[s], "shards": writers[s].shards} for s in SPLITS}}
    _write_json(meta_path, meta)
    state_path.unlink(missing_ok=True)
    n_shards = sum(len(w.shards) for w in writers.values())
    print(f"{dataset}: wrote {counts['train']:,} train / {counts['val']:,} val tokens in "
          f"{n_shards} shard(s) to {out} in {elapsed:.1f}s ({new_tokens / max(elapsed, 1e-9):,.0f}"
          f" tokens/s, {workers} worker(s))")
    return meta


def _shards_intact(out: Path, state: dict) -> bool:
    """The shards a saved state lists are there, whole and unchanged."""
    try:
        return all(sha256_file(out / sh["file"]) == sh["sha256"]
                   for split in state["splits"].values() for sh in split["shards"])
    except (OSError, KeyError, TypeError, AttributeError):
        return False
