"""Turn a raw corpus into train.bin / val.bin (uint16 GPT-2 tokens) and meta.json.

Runs once per dataset: training memory-maps the .bin files and never tokenizes.
Re-running is a no-op while the source, split and tokenizer are unchanged. Files
are written to a temporary name and renamed, and meta.json goes last, so a killed
preparation never leaves files that look finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from gpt2.data.sources import DATASETS
from gpt2.data.tokenizer import TOKENIZER_NAME, encode

FORMAT_VERSION = 1
DOWNLOAD_TIMEOUT_S = 60


class DataError(Exception):
    """Missing, corrupt or unusable data; the message says what to run."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(url: str, dest: Path, sha256: str) -> None:
    """Fetch url to dest, refusing content whose sha256 differs from the pinned one."""
    tmp = dest.with_name(dest.name + ".part")
    print(f"downloading {url}")
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp, open(tmp, "wb") as f:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                h.update(chunk)
                f.write(chunk)
    except (urllib.error.URLError, OSError) as e:
        tmp.unlink(missing_ok=True)
        raise DataError(f"download of {url} failed: {e}. Offline? Put the corpus at {dest} "
                        "or pass --input FILE (CONFIG_DATA_INPUT)") from None
    if h.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise DataError(f"download of {url} has sha256 {h.hexdigest()}, expected {sha256}: "
                        f"refusing it. Retry, or place a verified copy at {dest}")
    os.replace(tmp, dest)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def prepare(dataset: str, data_dir: str | os.PathLike, input_path: str = "",
            val_fraction: float = 0.1, url: str | None = None) -> dict:
    """Prepare one dataset; returns its meta.json contents."""
    source = DATASETS[dataset]
    out = Path(data_dir) / dataset
    out.mkdir(parents=True, exist_ok=True)
    raw = out / source.raw_name
    if input_path:
        src = Path(input_path)
        if not src.is_file():
            raise DataError(f"input file {src} does not exist (CONFIG_DATA_INPUT / --input)")
        if src.resolve() != raw.resolve():
            shutil.copyfile(src, raw)
    elif not raw.is_file():
        download(url or source.url, raw, source.sha256)
    source_sha = sha256_file(raw)
    if source_sha != source.sha256:
        print(f"note: {raw} differs from the published {dataset} corpus "
              f"(sha256 {source_sha[:12]}..., published {source.sha256[:12]}...); using it as is")

    wanted = {"format_version": FORMAT_VERSION, "dataset": dataset, "tokenizer": TOKENIZER_NAME,
              "source_sha256": source_sha, "val_fraction": val_fraction}
    meta_path = out / "meta.json"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError:
            meta = {}
        if all(meta.get(k) == v for k, v in wanted.items()) and all(
                (out / f"{s}.bin").is_file()
                and (out / f"{s}.bin").stat().st_size == 2 * meta.get(f"{s}_tokens", -1)
                for s in ("train", "val")):
            print(f"{dataset}: up to date in {out} ({meta['train_tokens']:,} train / "
                  f"{meta['val_tokens']:,} val tokens)")
            return meta
        meta_path.unlink()  # stale: the .bin files are about to change

    t0 = time.perf_counter()
    text = raw.read_text(encoding="utf-8")
    cut = int(len(text) * (1 - val_fraction))
    splits = {"train": text[:cut], "val": text[cut:]}
    counts = {}
    for name, part in splits.items():
        ids = np.array(encode(part), dtype=np.uint32)
        if ids.size and ids.max() >= 2**16:
            raise DataError(f"token id {ids.max()} does not fit uint16")
        _write_atomic(out / f"{name}.bin", ids.astype(np.uint16).tobytes())
        counts[name] = int(ids.size)
    elapsed = time.perf_counter() - t0
    meta = {**wanted, "train_tokens": counts["train"], "val_tokens": counts["val"],
            "dtype": "uint16", "source_bytes": raw.stat().st_size}
    _write_atomic(meta_path, (json.dumps(meta, indent=2) + "\n").encode())
    total = counts["train"] + counts["val"]
    print(f"{dataset}: wrote {counts['train']:,} train / {counts['val']:,} val tokens to {out} "
          f"in {elapsed:.1f}s ({total / max(elapsed, 1e-9):,.0f} tokens/s)")
    return meta
