"""sha256 of files, read in chunks: shards, checkpoints and downloads are checked
against the hash recorded when they were written or published."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

CHUNK = 1 << 22


def sha256_file(path: Path) -> str:
    """The sha256 of a regular file; OSError (EINVAL) for anything else, which
    would never end (a FIFO blocks, a device streams)."""
    h = hashlib.sha256()
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(f.fileno(), True)
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()
