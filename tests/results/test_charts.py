"""The charts on the results pages (gpt2/results/charts.py): the numbers they draw are
the run files', and the library drawing them is the pinned uPlot. A real browser hovers
and zooms them in test_browser.py. Fake run folders only: fast, for mutation testing."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from gpt2.results import pages
from test_pages import assert_self_contained


def chart_data(page: Path) -> list[dict]:
    return [json.loads(m) for m in re.findall(
        r'<script type="application/json" data-chart>(.*?)</script>', page.read_text(), re.S)]


def write_fake_run(root: Path, rows: list[dict]) -> Path:
    from gpt2.config.options import Config

    run = root / "tiny-0123456789ab"
    run.mkdir(parents=True)
    cfg = Config(run_name="tiny")
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    (run / "summary.json").write_text(json.dumps({"status": "completed", "iters": 30,
                                                  "config_hash": cfg.config_hash()}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_the_run_page_charts_the_losses_of_metrics_jsonl_with_the_pinned_library(tmp_path):
    """The chart's numbers are the file's, steps aligned (validation only where it was
    evaluated), and the page inlines uPlot's own file, the pinned one."""
    from gpt2.results import charts

    rows = [{"step": 0, "val_loss": 10.9}]
    rows += [{"step": s, "train_loss": 10.0 - s / 10, "lr": 1e-3} for s in range(1, 31)]
    rows += [{"step": 15, "val_loss": 9.25}, {"step": 30, "val_loss": 8.5, "train_loss": 7.0}]
    rows.append({"step": 31, "train_loss": float("nan")})  # (not finite: no point)
    run = write_fake_run(tmp_path, rows)
    page = pages.write_run_page(run)
    [chart] = chart_data(page)
    assert chart["x"] == list(range(0, 31))
    # (the tooltip's first line is "<x_label> <x>", the axes name both)
    assert (chart["title"], chart["x_label"], chart["y_label"]) == (None, "step", "loss")
    train, val = chart["series"]
    assert train["label"] == "train loss" and val["label"] == "val loss"
    assert train["values"][0] is None and train["values"][1:] == \
        [10.0 - s / 10 for s in range(1, 30)] + [7.0]
    assert {s: v for s, v in zip(chart["x"], val["values"]) if v is not None} == \
        {0: 10.9, 15: 9.25, 30: 8.5}
    text = page.read_text()
    vendored = (charts.VENDOR / "uPlot.iife.min.js").read_text()
    assert vendored in text and f"(v{charts.UPLOT_VERSION})" in vendored[:80]
    assert (charts.VENDOR / "uPlot.min.css").read_text() in text
    pages.write_index(tmp_path)
    assert_self_contained(page)


def test_a_run_without_two_points_has_no_chart_and_no_library(tmp_path):
    run = write_fake_run(tmp_path, [{"step": 0, "val_loss": 10.9}, {"step": 1, "train_loss": 9.0}])
    page = pages.write_run_page(run)
    assert chart_data(page) == [] and "var uPlot=" not in page.read_text()
    assert "No loss plot yet." in page.read_text()
    # two points make a line: that run has a chart of its validation loss alone
    more = write_fake_run(tmp_path / "two", [{"step": 0, "val_loss": 10.9},
                                             {"step": 5, "val_loss": 9.5}])
    [chart] = chart_data(pages.write_run_page(more))
    assert chart["x"] == [0, 5] and [s["label"] for s in chart["series"]] == ["val loss"]


def test_the_vendored_library_is_the_pinned_one(tmp_path, monkeypatch):
    import hashlib

    from gpt2.results import charts

    for name, pinned in charts.UPLOT_FILES.items():
        assert hashlib.sha256((charts.VENDOR / name).read_bytes()).hexdigest() == pinned, name
    assert "MIT License" in (charts.VENDOR / "LICENSE").read_text()
    changed = tmp_path / "uplot"
    shutil.copytree(charts.VENDOR, changed)
    with open(changed / "uPlot.iife.min.js", "a") as f:
        f.write("fetch('https://example.com/')\n")
    monkeypatch.setattr(charts, "VENDOR", changed)
    charts.library.cache_clear()
    try:
        with pytest.raises(charts.VendorError, match="not uPlot 1.6.32's file"):
            charts.library()
    finally:
        charts.library.cache_clear()


def test_the_matrix_page_charts_each_cells_validation_loss(tmp_path):
    from fake_matrices import fake_matrix

    folder = fake_matrix(tmp_path / "matrices", seeds=(1, 2))
    page = pages.write_matrix_page(folder)
    [chart] = chart_data(page)
    cells = sorted(p.name for p in (folder / "cells").iterdir())
    assert sorted(s["label"] for s in chart["series"]) == cells
    assert (chart["title"], chart["x_label"], chart["y_label"]) == (None, "step", "val loss")
    for series in chart["series"]:
        rows = [json.loads(line) for line in
                (folder / "cells" / series["label"] / "metrics.jsonl").read_text().splitlines()]
        wanted = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
        assert {s: v for s, v in zip(chart["x"], series["values"]) if v is not None} == wanted

