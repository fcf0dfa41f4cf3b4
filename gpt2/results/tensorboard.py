"""``make tensorboard``: TensorBoard event files for runs made without the tracker.

Each run's metrics.jsonl is written, row by row, through the same TensorBoard
tracker training uses (gpt2/training/trackers.py: the same scalars, the same
``<run>/tensorboard/`` folder, the configuration as text), with each row's wall time
set to when it happened (the run's start, config.json's time, plus the row's
elapsed_s). ``tensorboard --logdir results`` then shows every run, single or cell.

A run whose tensorboard/ holds event files written while it trained is left alone;
event files written here are marked, and replaced the next time (a run that went
on since gets its new rows).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpt2.results.catalog import Run, number
from gpt2.storage import (RESULTS_SETTING, own_folder, refuse_link,
                          write_text_atomic, writing)
from gpt2.training.trackers import open_tracker
from gpt2 import run_folder

FOLDER = "tensorboard"
MARK = ".kgpt-backfill"  # in FOLDER: its event files were written from metrics.jsonl
# <results>/tensorboard-runs/: one link per run to its event files, what `make
# tensorboard` hands TensorBoard. Pointed at the results folder itself, TensorBoard
# would also follow results/latest and show the newest run twice.
VIEW = "tensorboard-runs"


def backfill(run: Run) -> int | None:
    """Write ``run``'s metrics as event files; the number of rows written, or None
    when the run has event files of its own (left alone)."""
    folder = run.path / FOLDER
    refuse_link(folder)  # (its files would be deleted and written wherever it points)
    # The mark is kgpt's own file, never a link: a planted one once had the folder's
    # other files (a user's) deleted with it.
    mark = folder / MARK
    if folder.exists() and not (mark.is_file() and not mark.is_symlink()):
        return None
    rows = run.metrics()
    start = (run.path / run_folder.CONFIG_JSON).stat().st_mtime
    # TensorBoard's writer makes its own files: a folder that refuses them (read-only,
    # full) is a StorageError naming the run's folder, not an OSError from inside it.
    with writing(folder, RESULTS_SETTING):
        if folder.exists():
            shutil.rmtree(folder)
        tracker = open_tracker("tensorboard", "", run.name, run.path, run.config)
        try:
            write_text_atomic(folder / MARK, "event files written by `make tensorboard` from "
                              "metrics.jsonl; it replaces them when run again\n")
            for row in rows:
                elapsed = number(row.get("elapsed_s"))
                tracker.log(row, row["step"], walltime=start + elapsed if elapsed else None)
        finally:
            tracker.close()
    return len(rows)


def view(root: Path, runs: list[Run]) -> Path:
    """``root``/tensorboard-runs holding one link per run with event files, named by
    the run's folder (``<matrix>/<cell>`` for a cell), and nothing else: the links of
    an earlier view are replaced. Returns the folder."""
    folder = root / VIEW
    own_folder(folder)
    for old in sorted(folder.rglob("*"), reverse=True):  # (links first, then their folders)
        if old.is_symlink():
            old.unlink()
        elif old.is_dir() and not any(old.iterdir()):
            old.rmdir()
    for run in runs:
        events = run.path / FOLDER
        if not events.is_dir() or events.is_symlink():  # (a link: not the run's events)
            continue
        name = f"{run.matrix.name}/{run.name}" if run.matrix else run.name
        link = folder / name
        own_folder(link.parent)
        if link.exists() or link.is_symlink():  # (not a link of an earlier view: removed)
            print(f"note: {link} is not a link kgpt made, so {run.name} is left out of the "
                  "view: move it away to see the run")
            continue
        link.symlink_to(os.path.relpath(events.resolve(), link.parent.resolve()))
    return folder
