"""From a dataset's source to a stream of text pieces, each routed to train or val.

Preparation reads the corpus once, as a stream, in the same order every time:

* a **document** is one row of a jsonl/parquet/Hub dataset, or one whole text
  file; an end-of-text token goes between documents of a split;
* long text (a big text file, WikiText's rows, which are lines of one text) is cut
  into pieces of about a megabyte, at points where cutting cannot change the
  tokens, so memory stays bounded whatever the corpus size;
* validation is the source's own validation split when it has one (a Hub
  dataset's, or local files named ``validation*``, ``valid*``, ``val*`` or
  ``dev*``); otherwise every k-th document (k = 1 / CONFIG_VAL_FRACTION), and a
  plain-text file gives its last CONFIG_VAL_FRACTION of characters (tiny
  Shakespeare's train/val split). Files named ``test*`` are never read.

The stream is a pure function of the source, which is what makes a killed
preparation resumable: pieces are numbered, and the next run skips, without
tokenizing, the pieces that finished shards already hold.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from gpt2.data.shards import DataError
from gpt2.config.datasets import HubSource

PIECE_CHARS = 1 << 20  # about a megabyte of text per piece
READ_CHARS = 1 << 20

TEXT_SUFFIXES = (".txt", ".text")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
VAL_NAME = re.compile(r"^(validation|valid|val|dev)([-_.]|$)", re.IGNORECASE)
TEST_NAME = re.compile(r"^test([-_.]|$)", re.IGNORECASE)


@dataclass(frozen=True)
class Piece:
    split: str  # "train" or "val"
    text: str
    eot_before: bool  # an end-of-text token precedes this piece's tokens


def safe_cut(text: str, limit: int) -> int:
    """The largest p <= limit at which text[:p] and text[p:] tokenize to exactly the
    tokens of text: just before a space that precedes a non-space character. GPT-2's
    pre-tokenizer starts a new piece there whatever came before (a word, or a run
    of whitespace that ends one character earlier). ``limit`` when there is none
    (text without spaces), where the two sides may tokenize a little differently."""
    i = text.rfind(" ", 1, limit)
    while i > 0:
        if i + 1 < len(text) and not text[i + 1].isspace():
            return i
        i = text.rfind(" ", 1, i)
    return limit


def cut_pieces(chunks: Iterable[str], size: int = PIECE_CHARS) -> Iterator[str]:
    """Re-cut a stream of text chunks into pieces of at most ``size`` characters."""
    buf = ""
    for chunk in chunks:
        buf += chunk
        while len(buf) > size:
            p = safe_cut(buf, size)
            yield buf[:p]
            buf = buf[p:]
    if buf:
        yield buf


def pieces(documents: Iterable[tuple[str, Iterable[str]]],
           size: int = PIECE_CHARS) -> Iterator[Piece]:
    """Number-able pieces from (split, text chunks) documents, with an end-of-text
    token before each document but the first of its split. Empty documents vanish."""
    seen: set[str] = set()
    for split, chunks in documents:
        first = True
        for text in cut_pieces(chunks, size):
            yield Piece(split, text, eot_before=first and split in seen)
            first = False
            seen.add(split)


# ---- reading files -------------------------------------------------------------

def _open_text(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    return opener(path, "rt", encoding="utf-8", newline="")


def _kind(path: Path) -> str | None:
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    suffix = Path(name).suffix.lower()
    for kind, suffixes in (("text", TEXT_SUFFIXES), ("jsonl", JSONL_SUFFIXES),
                           ("parquet", PARQUET_SUFFIXES)):
        if suffix in suffixes and not (kind == "parquet" and path.name.endswith(".gz")):
            return kind
    return None


def _read_chars(path: Path, start: int = 0, stop: int | None = None) -> Iterator[str]:
    """Characters [start, stop) of a UTF-8 text file, in chunks."""
    pos = 0
    try:
        with _open_text(path) as f:
            while stop is None or pos < stop:
                chunk = f.read(READ_CHARS)
                if not chunk:
                    return
                lo, hi = max(start - pos, 0), len(chunk) if stop is None else stop - pos
                pos += len(chunk)
                if lo < len(chunk) and hi > 0:
                    yield chunk[lo:hi]
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start} of a "
                        "chunk); convert it, e.g. with iconv -t UTF-8") from None


def count_chars(path: Path) -> int:
    return sum(len(chunk) for chunk in _read_chars(path))


def _jsonl_texts(path: Path, field: str) -> Iterator[str]:
    with _open_text(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{number}: not a JSON line ({e.msg})") from None
            yield _field(row, field, f"{path}:{number}")


def _parquet_texts(path: Path, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise DataError(f"{path} is not a readable parquet file: {e}") from None
    columns = parquet.schema_arrow.names
    if field not in columns:
        raise DataError(f"{path} has no column {field!r} (it has: {', '.join(columns)}); "
                        "set CONFIG_DATA_TEXT_FIELD (--data-text-field) to the text column")
    for batch in parquet.iter_batches(batch_size=1024, columns=[field]):
        for text in batch.column(0).to_pylist():
            yield "" if text is None else text


def _field(row, field: str, where: str) -> str:
    if not isinstance(row, dict) or field not in row:
        keys = ", ".join(row) if isinstance(row, dict) else type(row).__name__
        raise DataError(f"{where}: no field {field!r} (has: {keys}); set "
                        "CONFIG_DATA_TEXT_FIELD (--data-text-field) to the text field")
    text = row[field]
    if text is None:
        return ""
    if not isinstance(text, str):
        raise DataError(f"{where}: field {field!r} holds {type(text).__name__}, not text")
    return text


def _records(path: Path, kind: str, field: str) -> Iterator[str]:
    return _parquet_texts(path, field) if kind == "parquet" else _jsonl_texts(path, field)


# ---- local inputs ----------------------------------------------------------------

@dataclass(frozen=True)
class LocalFiles:
    train: list[Path]
    val: list[Path]  # the input's own validation files (empty: hold out a fraction)
    skipped: list[Path]  # test files and files of unknown kinds, in a folder


def local_files(input_path: str | Path) -> LocalFiles:
    root = Path(os.path.expanduser(input_path))
    if root.is_file():
        if _kind(root) is None:
            raise DataError(f"{root}: unknown kind of file; give .txt, .jsonl (.json, "
                            ".ndjson, optionally .gz) or .parquet files, or a folder of them")
        return LocalFiles([root], [], [])
    if not root.is_dir():
        raise DataError(f"input {root} does not exist (CONFIG_DATA_INPUT / --input)")
    train, val, skipped = [], [], []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        stem = path.name
        if _kind(path) is None or TEST_NAME.match(stem) or stem.startswith("."):
            skipped.append(path)
        elif VAL_NAME.match(stem):
            val.append(path)
        else:
            train.append(path)
    if not train:
        raise DataError(f"{root} holds no training files (.txt, .jsonl, .parquet; files "
                        "named val*/validation*/test* are not training data)")
    return LocalFiles(train, val, skipped)


def local_documents(files: LocalFiles, field: str, val_fraction: float,
                    rows_are_documents: bool = True) -> Iterator[tuple[str, Iterable[str]]]:
    """(split, chunks) documents of local files, in file order. Without validation
    files, a text file (or a file whose rows are lines of one text) gives its tail
    to val, and every k-th row of a document file goes to val."""
    paths = [*files.train, *files.val]
    if all(path.stat().st_size == 0 for path in paths):
        raise DataError(f"{', '.join(map(str, paths))}: empty, there is no text to prepare; "
                        "give a file with text (CONFIG_DATA_INPUT / --input)")
    held_out = not files.val
    every = val_every(val_fraction)
    n_records = 0
    for split, paths in (("train", files.train), ("val", files.val)):
        for path in paths:
            kind = _kind(path)
            if kind == "text":
                if held_out:
                    yield from _split_tail(_read_chars, path, count_chars(path), val_fraction)
                else:
                    yield split, _read_chars(path)
            elif not rows_are_documents:
                if held_out:
                    n_rows = sum(1 for _ in _records(path, kind, field))
                    yield from _split_tail(lambda p, a, b: itertools.islice(
                        _records(p, kind, field), a, b), path, n_rows, val_fraction)
                else:
                    yield split, _records(path, kind, field)
            else:
                for text in _records(path, kind, field):
                    n_records += 1
                    to = "val" if held_out and n_records % every == 0 else split
                    yield to, (text,)


def _split_tail(read, path: Path, length: int, val_fraction: float):
    """Items [0, cut) of a file to train and [cut, length) to val."""
    cut = int(length * (1 - val_fraction))
    yield "train", read(path, 0, cut)
    yield "val", read(path, cut, None)


# ---- the Hugging Face Hub --------------------------------------------------------

def hub_documents(source: HubSource, val_every: int,
                  streaming: bool) -> Iterator[tuple[str, Iterable[str]]]:
    try:
        import datasets
    except ImportError:
        raise DataError("reading Hub datasets needs the `datasets` package: "
                        "pip install -r requirements.txt") from None

    def rows(split: str) -> Iterator[str]:
        try:
            ds = datasets.load_dataset(source.path, source.name, split=split,
                                       streaming=streaming, revision=source.revision)
        except Exception as e:  # network, missing dataset, auth: all end here
            raise DataError(f"could not load {source.path} ({source.name}, split {split}) "
                            f"from the Hugging Face Hub: {type(e).__name__}: {e}. Offline? "
                            "Download its files elsewhere and set CONFIG_DATA_INPUT to the "
                            "folder") from None
        for number, row in enumerate(ds):
            yield _field(row, source.text_field, f"{source.path} row {number}")

    if not source.rows_are_documents:
        yield "train", rows(source.train_split)
        if source.val_split:
            yield "val", rows(source.val_split)
        return
    for number, text in enumerate(rows(source.train_split), 1):
        yield ("val" if source.val_split is None and number % val_every == 0
               else "train"), (text,)
    if source.val_split:
        for text in rows(source.val_split):
            yield "val", (text,)


def val_every(val_fraction: float) -> int:
    """Every k-th document is held out: k = round(1 / fraction), at least 2."""
    return max(2, round(1 / val_fraction))
