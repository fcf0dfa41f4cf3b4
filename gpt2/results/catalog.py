"""Every run and matrix under a results folder, read from their files only.

A run folder is one with a ``config.json`` (what train.py writes first: see
gpt2/run_folder.py); a matrix folder has a ``plan.yaml`` and its cells are run
folders under ``cells/``. Nothing here loads a checkpoint, so listing a folder of
hundreds of runs takes a moment; nothing is ever written.

    runs, matrices = scan(Path("results"))        # the index page
    runs = expand(["results/lr*", "results/matrix-x"], Path("."))   # make compare RUN=...
"""

from __future__ import annotations

import glob
import os
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


from gpt2 import storage
from gpt2.errors import ResultsError, StorageError
from gpt2.training import provenance
from gpt2.run_folder import (COMPLETED, FAILED, INTERRUPTED, NO_SUMMARY, RUNNING, Summary,
                             completion_problem,
                             read_metrics, read_summary)

from gpt2.matrix.plan_file import NAME, PLAN_FILE, read_plan, read_status  # (no torch)
from gpt2 import run_folder
# Folders the trainer set aside (results of other code or data, damaged files):
# kept for the user, listed as such, never mistaken for the current result.
ASIDE = re.compile(r"\.(superseded|damaged)-\d+$")


@dataclass(frozen=True)
class Figure:
    """A headline figure of a run: where it is read, how it is written, and which
    way is better (for highlighting the best of a column)."""

    key: str
    label: str
    format: Callable[[Any], str]
    better: str | None = None  # "low" | "high" | None


def _fixed(digits: int) -> Callable[[Any], str]:
    return lambda v: f"{v:,.{digits}f}"


FIGURES: tuple[Figure, ...] = (
    Figure("final_val_loss", "val loss", _fixed(4), "low"),
    Figure("final_val_ppl", "val ppl", _fixed(2), "low"),
    Figure("best_val_loss", "best val loss", _fixed(4), "low"),
    Figure("iters", "steps", _fixed(0)),
    Figure("tokens", "tokens", _fixed(0)),
    Figure("tokens_per_sec", "tokens/s", _fixed(0), "high"),
    Figure("mfu", "MFU", lambda v: f"{100 * v:.1f} %", "high"),
    Figure("peak_memory_mb", "peak MB", _fixed(0), "low"),
    Figure("final_sparsity", "sparsity", _fixed(3)),
    Figure("hellaswag_acc_norm", "HellaSwag", _fixed(4), "high"),
)
FIGURE = {f.key: f for f in FIGURES}


def number(value: Any) -> float | None:
    """``value`` if it is a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return value if math.isfinite(value) else None
    except OverflowError:  # an int past float's range (10**400): damage, not a figure
        return None


read_json = storage.read_json_object  # (None: missing, unreadable or not an object)


@dataclass
class Run:
    """One run folder (a single run or a matrix cell) as its files describe it."""

    path: Path
    config: dict[str, Any]  # config.json ({} when it cannot be read)
    summary: Summary | None  # summary.json (None: not written yet, or unreadable)
    provenance: dict[str, Any] | None
    matrix: Path | None = None  # the matrix folder of a cell
    running: bool = False  # a process holds the folder's lock: training now
    hellaswag: dict[str, Any] | None = None  # hellaswag.json of `make eval-hellaswag`
    doubt: str | None = None  # why a summary that says "completed" is not believed
    _metrics: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def set_aside(self) -> bool:
        return bool(ASIDE.search(self.path.name))

    @property
    def status(self) -> str:
        """running | completed | failed | interrupted (started, no final summary)."""
        if self.running:
            return RUNNING
        if self.summary and not self.doubt:
            return str(self.summary.status or FAILED)
        return INTERRUPTED

    @property
    def parent(self) -> dict[str, Any] | None:
        """The run this one started from (init-from a run, or an extension), as its
        provenance records it."""
        return (self.provenance or {}).get("parent")

    def metrics(self) -> list[dict[str, Any]]:
        """Its metrics.jsonl's intact rows ([] when there is none it can read)."""
        if self._metrics is None:
            try:
                self._metrics = read_metrics(self.path / run_folder.METRICS)
            except StorageError:
                self._metrics = []
        return self._metrics

    def figure(self, key: str) -> float | None:
        """A headline figure from summary.json (HellaSwag also from hellaswag.json);
        None when the run has not recorded it."""
        value = (self.summary or NO_SUMMARY).get(key)
        if value is None and key.startswith("hellaswag_") and self.hellaswag:
            value = self.hellaswag.get(key)
        if value is None and not self.summary and key in ("iters", "tokens"):
            rows = self.metrics()  # an unfinished run: how far it got
            value = rows[-1].get("step" if key == "iters" else "tokens") if rows else None
        return number(value)

    def setting(self, name: str) -> Any:
        return self.config.get(name)

    def modified(self) -> float:
        """When the run last wrote a result (its summary, else its folder)."""
        for name in (run_folder.SUMMARY, run_folder.METRICS, run_folder.CONFIG_JSON, ""):
            try:
                return (self.path / name).stat().st_mtime
            except OSError:
                continue
        return 0.0


def is_run(path: Path) -> bool:
    return _holds(path, run_folder.CONFIG_JSON)


def is_matrix(path: Path) -> bool:
    return _holds(path, PLAN_FILE)


def _holds(path: Path, name: str) -> bool:
    """``path`` is a folder with the file ``name`` in it (False when it cannot be told:
    a folder this user may not read)."""
    try:
        return path.is_dir() and (path / name).is_file()
    except OSError:
        return False


def read_run(path: Path, matrix: Path | None = None) -> Run:
    if not is_run(path):
        raise ResultsError(f"{path} is not a run folder (a run folder holds config.json: "
                           "results/<run>-<hash>/, or a matrix's cells/<cell>/)")
    summary = read_summary(path)
    return Run(path=path, config=read_json(path / run_folder.CONFIG_JSON) or {}, summary=summary,
               provenance=provenance.read(path), matrix=matrix,
               running=run_folder.live_state(path) == run_folder.RUNNING, hellaswag=read_json(path / "hellaswag.json"),
               doubt=completion_problem(path, summary))


@dataclass
class Matrix:
    """A matrix folder: its plan and the cells that have a folder so far."""

    path: Path
    plan: dict[str, Any]
    cells: list[Run]
    status: dict[str, Any]  # status.json of the runner (or the Slurm backend)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def planned(self) -> int:
        return len(self.plan.get("cells") or [])

    def count(self, status: str) -> int:
        return sum(1 for c in self.cells if c.status == status)

    def best(self) -> Run | None:
        done = [c for c in self.cells if c.status == COMPLETED
                and c.figure("final_val_loss") is not None]
        return min(done, key=lambda c: c.figure("final_val_loss"), default=None)

    def modified(self) -> float:
        try:
            planned = (self.path / PLAN_FILE).stat().st_mtime
        except OSError:
            planned = 0.0
        return max([c.modified() for c in self.cells] + [planned])


def read_matrix(path: Path) -> Matrix:
    """The matrix in ``path``; PlanFileError (a ResultsError) when its plan.yaml is
    not one kgpt wrote."""
    plan = read_plan(path)
    cells = [read_run(path / "cells" / c["id"], matrix=path) for c in plan["cells"]
             if is_run(path / "cells" / c["id"])]
    return Matrix(path=path, plan=plan, cells=cells,
                  status=read_status(path))


def scan(root: Path) -> tuple[list[Run], list[Matrix]]:
    """The single runs and the matrices directly under ``root``, newest first. Links
    (results/latest) are skipped: they name a folder that is listed anyway. So is
    what cannot be one of kgpt's (a name kgpt never gives, a folder this user cannot
    read, a matrix whose plan.yaml is not kgpt's): in a shared results folder, a
    neighbour's odd folder must not stop the listing of everyone's."""
    runs, matrices = [], []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return [], []
    except NotADirectoryError:
        raise ResultsError(f"{root} is a file, not a results folder: set CONFIG_RESULTS_DIR "
                           "to a folder, or name one with RUN=") from None
    except OSError as e:
        raise ResultsError(f"cannot read the results folder {root} ({e.strerror})") from None
    for entry in entries:
        if not NAME.fullmatch(entry.name):
            continue
        try:
            if entry.is_symlink() or not entry.is_dir():
                continue
            path = Path(entry.path)
            if is_matrix(path):
                try:
                    matrices.append(read_matrix(path))
                except ResultsError:
                    continue  # a plan cut short, or not kgpt's: nothing to show
            elif is_run(path):
                runs.append(read_run(path))
        except OSError:
            continue  # (not readable by this user)
    runs.sort(key=Run.modified, reverse=True)
    matrices.sort(key=Matrix.modified, reverse=True)
    return runs, matrices


def expand(patterns: list[str], base: Path) -> list[Run]:
    """The runs that ``patterns`` name, in the order given, each once: run folders,
    matrix folders (their cells, in plan order) and globs of either, relative to
    ``base`` unless absolute."""
    out: dict[Path, Run] = {}
    for pattern in patterns:
        text = os.path.expanduser(pattern)  # (~nosuchuser/x: left as it is, no error)
        full = text if os.path.isabs(text) else str(base / text)
        matches = sorted(glob.glob(full)) if glob.has_magic(text) else [full]
        if not matches:
            raise ResultsError(f"{pattern!r} matches no folder")
        for match in matches:
            path = Path(match)
            if glob.has_magic(text) and not NAME.fullmatch(path.name):
                continue  # (a name kgpt never gives a folder, such as one not in UTF-8)
            if path.is_symlink():
                path = path.resolve()  # results/latest: the run it names
            if is_matrix(path):
                found = read_matrix(path).cells
                if not found:
                    raise ResultsError(f"{path} is a matrix with no cell started yet")
            elif is_run(path):
                found = [read_run(path, matrix=_matrix_of(path))]
            elif glob.has_magic(text):
                continue  # results/* also matches files, links' targets, results/bench
            else:
                raise ResultsError(f"{path} is neither a run folder (config.json) nor a "
                                   f"matrix folder ({PLAN_FILE})")
            for run in found:
                out.setdefault(run.path.resolve(), run)
    if not out:
        raise ResultsError(f"no run folders in {' '.join(patterns)}")
    return list(out.values())


def _matrix_of(path: Path) -> Path | None:
    """The matrix folder of a cell folder (…/<matrix>/cells/<cell>), else None."""
    parent = path.resolve().parent
    return parent.parent if parent.name == "cells" and is_matrix(parent.parent) else None
