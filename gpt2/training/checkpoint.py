"""Checkpoints: written atomically, loaded with torch.load(weights_only=True).

A checkpoint holds only tensors, numbers, strings, lists and dicts, so it loads
without unpickling arbitrary objects. It is written to a temporary file, fsynced
and renamed over the old one: a crash mid-write leaves the previous checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

FORMAT = 1


class ResumeError(Exception):
    """A checkpoint that cannot continue this run."""


def save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save({"format": FORMAT, **state}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    state = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a kgpt checkpoint of format {FORMAT}")
    return state
