"""Charts users can zoom and hover on the results pages, drawn by uPlot.

The PNGs (loss.png, the matrix's plots/) stay: report.md and a file browser show
them. The pages add charts drawn in the browser from the run's own numbers, inlined
into the page with the library, so a page needs no network and opens from disk or
from a copy (a CDN is refused by offline clusters and leaks which runs are looked at).

uPlot (https://github.com/leeoniya/uPlot, MIT) is small (51 kB), maintained, made for
time series of many points and many series, and draws on a canvas: hovering shows
the values under the cursor, dragging zooms into a range, a double click zooms out.
Its files in vendor/uplot/ are the npm package's, unchanged, at the version below;
UPLOT_FILES pins each one's sha256 (tests/results/test_pages.py checks them, and
scripts/vendor_uplot.sh fetches a new version and prints the new hashes). What kgpt
adds is templates/charts.js: building the charts from the data below, and the
tooltip naming the nearest series (a matrix has many).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

from gpt2 import storage
from gpt2.errors import ResultsError
from gpt2.results.catalog import number

VENDOR = Path(__file__).parent / "vendor" / "uplot"
UPLOT_VERSION = "1.6.32"
UPLOT_FILES = {
    "uPlot.iife.min.js": "19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f",
    "uPlot.min.css": "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
    "LICENSE": "8f989229699b4fe2f1a0432d0e9edc338a8a911e250e2d1b01ecd770a5f5b1bd",
}


class VendorError(ResultsError):
    """A vendored file is missing or not the pinned one (an installation problem): one
    line from every command that writes pages, as any ResultsError."""


@functools.lru_cache(maxsize=1)
def library() -> dict[str, str]:
    """uPlot's script and stylesheet, each checked against its pinned sha256."""
    texts = {}
    for name, pinned in UPLOT_FILES.items():
        data = storage.read_regular(VENDOR / name)  # (a FIFO there is not waited on)
        if data is None:
            raise VendorError(f"{VENDOR / name} is missing, or not a regular file: reinstall "
                              "kgpt (git checkout gpt2/results/vendor), or run "
                              "scripts/vendor_uplot.sh")
        if hashlib.sha256(data).hexdigest() != pinned:
            raise VendorError(f"{VENDOR / name} is not uPlot {UPLOT_VERSION}'s file (sha256 "
                              "differs): reinstall kgpt, or run scripts/vendor_uplot.sh")
        texts[name] = data.decode()
    return {"js": texts["uPlot.iife.min.js"], "css": texts["uPlot.min.css"]}


def _aligned(series: dict[str, dict[int, float]]) -> tuple[list[int], list[list[float | None]]]:
    """One x column (every step any series has) and each series' values on it (None
    where it has none: the chart joins across, as evaluations are sparser than logs)."""
    steps = sorted({s for values in series.values() for s in values})
    return steps, [[values.get(s) for s in steps] for values in series.values()]


def chart(title: str | None, x_label: str, y_label: str,
          series: dict[str, dict[int, float]]) -> dict[str, Any] | None:
    """The data charts.js draws: one x column and named y columns (``title`` None: the
    page's heading names the chart); None when no series has two points (a line of
    one point says nothing)."""
    series = {k: v for k, v in series.items() if len(v) >= 2}
    if not series:
        return None
    x, ys = _aligned(series)
    return {"title": title, "x_label": x_label, "y_label": y_label, "x": x,
            "series": [{"label": label, "values": values}
                       for label, values in zip(series, ys)]}


def _curve(rows: list[dict[str, Any]], key: str) -> dict[int, float]:
    out = {}
    for row in rows:
        value = number(row.get(key))
        if value is not None and isinstance(row.get("step"), int):
            out[row["step"]] = value
    return out


def run_chart(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A run's training and validation loss against step, from its metrics rows."""
    return chart(None, "step", "loss", {"train loss": _curve(rows, "train_loss"),
                                          "val loss": _curve(rows, "val_loss")})


def matrix_chart(cells: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """Each cell's validation loss against step: cell id -> its metrics rows."""
    return chart(None, "step", "val loss",
                 {cell: _curve(rows, "val_loss") for cell, rows in cells.items()})
