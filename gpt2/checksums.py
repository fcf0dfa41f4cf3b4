"""sha256 of files, read in chunks: shards, checkpoints and downloads are checked
against the hash recorded when they were written or published."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 22


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()
