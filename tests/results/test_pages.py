"""The HTML results pages: written after runs and matrices and by `make results`,
self-contained (no network), every link and picture there. A real browser drives
them in test_browser.py."""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from helpers import run_target
from gpt2.results import pages


class Links(html.parser.HTMLParser):
    """Every href and src of a page, and the number of rows of each table by id."""

    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.rows: dict[str, int] = {}
        self._table: list[str] = []
        self._in_body = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("href", "src"):
            if a.get(key):
                self.links.append(a[key])
        if tag == "table":
            self._table.append(a.get("id", ""))
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body and self._table:
            self.rows[self._table[-1]] = self.rows.get(self._table[-1], 0) + 1

    def handle_endtag(self, tag):
        if tag == "tbody":
            self._in_body = False
        elif tag == "table" and self._table:
            self._table.pop()


def parse(page: Path) -> Links:
    parser = Links()
    parser.feed(page.read_text())
    return parser


def assert_self_contained(page: Path) -> Links:
    """Nothing fetched from elsewhere; every relative link names a file that exists."""
    parsed = parse(page)
    text = page.read_text()
    assert not re.search(r"""(src|href)=["'](https?:)?//""", text), page
    assert "<link" not in text and "@import" not in text, page  # styles are inline
    for link in parsed.links:
        target = (page.parent / link.split("#")[0]).resolve()
        assert target.exists(), f"{page}: {link} -> {target} is missing"
    return parsed


@pytest.fixture
def results(two_runs, matrix_reference, tmp_path) -> Path:
    """One results folder holding the two runs and the tiny matrix (copies)."""
    root = tmp_path / "results"
    shutil.copytree(two_runs[0], root, symlinks=True)
    shutil.copytree(matrix_reference[1], root / matrix_reference[1].name, symlinks=True)
    return root


@pytest.mark.e2e
def test_training_and_collecting_write_the_pages(two_runs, matrix_reference):
    root, folders = two_runs
    assert (root / pages.INDEX).is_file()
    for folder in folders:
        assert (folder / pages.RUN_PAGE).is_file()
    matrix = matrix_reference[1]
    assert (matrix / pages.MATRIX_PAGE).is_file()
    assert all((c / pages.RUN_PAGE).is_file() for c in (matrix / "cells").iterdir())


@pytest.mark.e2e
def test_the_index_lists_every_run_and_matrix_with_working_links(results):
    # Two runs of one name (a preset run twice, the rate changed): told apart by it.
    for run in results.glob("lr*"):
        record = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**record, "run_name": "tiny"}))
    proc = run_target("results", f"RUN={results}")
    assert proc.returncode == 0, proc.stderr
    assert "open " in proc.stdout and str(results / pages.INDEX) in proc.stdout
    index = assert_self_contained(results / pages.INDEX)
    assert index.rows == {"matrix-table": 1, "run-table": 2}
    assert sum(1 for link in index.links if link.endswith(pages.RUN_PAGE)) == 2
    text = (results / pages.INDEX).read_text()
    assert text.count('<div class="sub differs">lr 3e-3</div>') == 1
    assert text.count('<div class="sub differs">lr 1e-3</div>') == 1
    for run in results.glob("lr*"):
        assert f'href="{run.name}/{pages.RUN_PAGE}"' in text
        page = assert_self_contained(run / pages.RUN_PAGE)
        assert "loss.png" in page.links and "config.json" in page.links
        run_text = (run / pages.RUN_PAGE).read_text()
        assert ">completed<" in run_text and "CONFIG_LEARNING_RATE" in run_text
        assert "=== step" not in run_text and "step 30" in run_text  # samples, newest first
        # wall time as a duration ("0m07s"), not a count of seconds ("7 s")
        wall = json.loads((run / "summary.json").read_text())["wall_time_s"]
        assert f"<dt>wall time</dt><dd>0m{round(wall):02d}s</dd>" in run_text, wall
        # and the learning rate in the Run card, where a user comparing runs looks
        lr = json.loads((run / "config.json").read_text())["learning_rate"]
        assert f"<dt>learning rate</dt><dd>{lr:g}</dd>" in run_text
    # Of two completed runs, the lower validation loss is the one marked best.
    losses = sorted(json.loads((run / "summary.json").read_text())["final_val_loss"]
                    for run in results.glob("lr*"))
    assert f'num best" data-v="{losses[0]!r}"' in text
    assert f'data-v="{losses[1]!r}"' in text and f'num best" data-v="{losses[1]!r}"' not in text


@pytest.mark.e2e
def test_the_matrix_page_shows_every_cell_and_plot(results, matrix_reference):
    folder = results / matrix_reference[1].name
    pages.write_all(results)
    page = assert_self_contained(folder / pages.MATRIX_PAGE)
    assert page.rows["cell-table"] == 4
    assert sum(1 for link in page.links if link.startswith("cells/")) == 4
    plots = {link for link in page.links if link.startswith("plots/")}
    assert len(plots) == len(list((folder / "plots").glob("*.png"))) >= 7
    text = (folder / pages.MATRIX_PAGE).read_text()
    # each picture opens at full size (three panels are unreadable as a thumbnail)
    assert '<a href="plots/val_loss.png" title="full size"><img src="plots/val_loss.png"' in text
    # report.md's comparison, before the cells: the page says what the report says
    comparison = text.split('<section class="report" id="comparison">')[1].split("</section>")[0]
    assert "<h2>Paired differences from adamw</h2>" in comparison
    assert "<h2>Speedup over tuned adamw</h2>" in comparison
    assert text.index('id="comparison"') < text.index('id="cell-table"')
    assert "Validation loss vs optimizer step" in text  # titles from plots/plots.json
    for cell in (folder / "cells").iterdir():
        cell_page = assert_self_contained(cell / pages.RUN_PAGE)
        assert f"../../{pages.MATRIX_PAGE}" in cell_page.links


def test_text_from_run_files_is_escaped_on_every_page(tmp_path):
    """Samples are whatever the model wrote and errors whatever was raised: shown as
    text, never read as markup (a `<` would hide the rest of a sample, a `<script>`
    would run). A single run, the index and a matrix page, without training."""
    from gpt2.config.options import Config
    from fake_matrices import fake_matrix

    root = tmp_path / "results"
    run = root / "tiny-0123456789ab"
    run.mkdir(parents=True)
    cfg = Config(run_name="tiny")
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    error = "ValueError: loss < 0 & <b>rising</b>"
    (run / "summary.json").write_text(json.dumps({"status": "failed", "error": error,
                                                  "config_hash": cfg.config_hash()}))
    (run / "samples.txt").write_text("=== step 10 ===\nTom & Jerry <script>alert(1)</script>"
                                     " if a<b\n")
    escaped_error = "ValueError: loss &lt; 0 &amp; &lt;b&gt;rising&lt;/b&gt;"
    pages.write_run_page(run)
    text = (run / pages.RUN_PAGE).read_text()
    assert re.findall(r"<pre>(.*?)</pre>", text, re.S) == [
        "Tom &amp; Jerry &lt;script&gt;alert(1)&lt;/script&gt; if a&lt;b"]
    assert escaped_error in text and "<b>rising" not in text
    pages.write_index(root)
    index = (root / pages.INDEX).read_text()
    assert f'title="{escaped_error}"' in index and "<b>rising" not in index

    folder = fake_matrix(tmp_path / "matrices", seeds=(1,), status={"adamw-none-seed1": "failed"})
    summary = folder / "cells" / "adamw-none-seed1" / "summary.json"
    summary.write_text(summary.read_text().replace("RuntimeError: boom", error))
    matrix = (pages.write_matrix_page(folder)).read_text()
    assert f'title="{escaped_error}"' in matrix and "<b>rising" not in matrix


@pytest.mark.e2e
def test_a_page_that_cannot_be_written_never_fails_the_run(two_runs, monkeypatch, capsys):
    def broken(path):
        raise OSError("disk gone")

    monkeypatch.setattr(pages, "write_run_page", broken)
    assert pages.publish_run(two_runs[1][0], two_runs[0]) is False
    assert "the HTML pages were not updated (OSError: disk gone); `make results` writes " \
        "them" in capsys.readouterr().out


@pytest.mark.e2e
def test_reporting_a_complete_run_writes_its_page_only_when_missing(two_runs, data_dir, tmp_path,
                                                                     capsys):
    """A run finished before the pages existed gets one when it is reported; one that has
    its page is left as it is (reporting writes nothing it already has)."""
    from helpers import BPE, TINY
    from gpt2 import train as train_py

    results = tmp_path / "results"
    shutil.copytree(two_runs[0], results, symlinks=True)
    run = results / two_runs[1][1].name
    args = [*TINY, f"--data-dir={data_dir}", f"--results-dir={results}", "--run-name=lr1e-3",
            "--learning-rate=1e-3", "--log-interval=5", "--min-lr=1e-4", BPE]
    (run / pages.RUN_PAGE).unlink()
    (results / pages.INDEX).unlink()
    assert train_py.main(args) == 0
    assert "is already complete" in capsys.readouterr().out
    assert train_py.run_of(args).path == run
    assert pages.publish_after_run(run, results)  # as make does after train.py
    assert (run / pages.RUN_PAGE).is_file() and (results / pages.INDEX).is_file()
    (run / pages.RUN_PAGE).write_text("kept")
    assert train_py.main(args) == 0
    assert "is already complete" in capsys.readouterr().out
    assert pages.publish_after_run(run, results)
    assert (run / pages.RUN_PAGE).read_text() == "kept"
    (run / pages.RUN_PAGE).unlink()
    assert pages.publish_after_run(run, results)
    older = (run / "summary.json").stat().st_mtime - 10
    os.utime(run / pages.RUN_PAGE, (older, older))  # a page older than the summary
    assert pages.publish_after_run(run, results)
    assert (run / pages.RUN_PAGE).stat().st_mtime > older  # written again


def test_the_comparison_on_the_matrix_page_keeps_only_safe_html(tmp_path):
    """report.md holds text from run folders (a cell's error): rendered on the page, no
    tag, attribute or link outside the allowlist survives, and the tables do."""
    from gpt2.results import report_html

    (tmp_path / "report.md").write_text(
        "# Test matrix x\n\nintro\n\n## Tuned comparison\n\n| a | b |\n|---|---|\n"
        "| 1 | <script>alert(1)</script> |\n\n"
        "- `cell`: failed — [click](javascript:alert(2)) <img src=x onerror=alert(3)>\n"
        "- ![plot](plots/val_loss.png) ![far](../../etc/passwd) [page](cells/a/run.html)\n"
        "- [up](cells/../../etc/passwd) ![up2](plots/x/../../../shadow) [dot](cells/a/..)\n\n"
        "**Under-tuned** <b onclick=x>bold</b> & co\n\n## Results, best first\n\n| secret |\n")
    out = report_html.comparison(tmp_path)
    assert "<table>" in out and "<td>1</td>" in out and "<strong>Under-tuned</strong>" in out
    assert "<script" not in out and "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert "javascript:" not in out and "<a>click</a>" in out  # the link, without its target
    assert "&lt;img src=x onerror=alert(3)&gt;" in out and 'src="x"' not in out
    assert '<img alt="plot" src="plots/val_loss.png" loading="lazy">' in out
    assert '<img alt="far" loading="lazy">' in out and "passwd" not in out
    assert '<a href="cells/a/run.html">page</a>' in out
    # a link that starts inside the folder and climbs out of it is refused too
    assert "<a>up</a>" in out and '<img alt="up2" loading="lazy">' in out and "<a>dot</a>" in out
    assert "shadow" not in out and ".." not in out
    assert "onclick" not in out.replace("&lt;b onclick=x&gt;", "")
    assert "secret" not in out  # the results table is the page's own


def test_tags_and_notes_show_on_the_pages_as_text(tmp_path):
    from test_charts import write_fake_run

    """CONFIG_RUN_TAGS and CONFIG_RUN_NOTES on the index and the run page, and the
    run's notes.md rendered as markdown through the allowlist: text, never markup,
    and links only to the run's own files."""
    from gpt2.config.options import Config

    run = write_fake_run(tmp_path, [{"step": 0, "val_loss": 10.9}])
    config = json.loads((run / "config.json").read_text())
    config.update(run_tags="baseline ablation:warmup", run_notes="warmup <b>50</b> & 100")
    (run / "config.json").write_text(json.dumps(config))
    (run / "notes.md").write_text("## Seen\n\n**fell** to 2.9, [metrics](metrics.jsonl), "
                                  "[away](https://example.com/x) <img src=x onerror=alert(1)>\n")
    page = pages.write_run_page(run).read_text()
    assert '<span class="tag">baseline</span><span class="tag">ablation:warmup</span>' in page
    assert "warmup &lt;b&gt;50&lt;/b&gt; &amp; 100" in page and "<b>50" not in page
    notes = re.search(r'<div class="notesmd">(.*?)</div>', page, re.S).group(1)
    assert "<h2>Seen</h2>" in notes and "<strong>fell</strong>" in notes
    assert '<a href="metrics.jsonl">metrics</a>' in notes and "<a>away</a>" in notes
    assert "&lt;img src=x onerror=alert(1)&gt;" in notes and "<img" not in notes
    assert 'href="notes.md"' in page  # (among the run's files)
    index = pages.write_index(tmp_path).read_text()
    assert '<span class="tag">baseline</span> <span class="tag">ablation:warmup</span>' in index
    assert 'title="warmup &lt;b&gt;50&lt;/b&gt; &amp; 100"' in index
    # tags and notes describe a run; they never change what it computes, nor its folder
    assert Config(run_tags="a b", run_notes="x").config_hash() == Config().config_hash()


def test_a_long_notes_file_is_cut_with_a_link_to_all_of_it(tmp_path):
    from test_charts import write_fake_run

    run = write_fake_run(tmp_path, [{"step": 0, "val_loss": 10.9}])
    (run / "notes.md").write_text("word " * (pages.NOTES_LIMIT // 5 + 100))
    page = pages.write_run_page(run).read_text()
    assert "notes.md is longer than the page shows" in page
    assert page.count("word") < pages.NOTES_LIMIT // 5 + 10


def test_the_run_page_names_the_structure_and_what_the_2of4_kernel_did(tmp_path):
    """A 2:4 run's page says 2:4 beside the method (the index too), and how many
    Linears its summary says ran on the sparse kernel; a run where the kernel cannot
    run says nothing of it."""
    from test_charts import write_fake_run

    run = write_fake_run(tmp_path, [{"step": 0, "val_loss": 10.9}])
    config = json.loads((run / "config.json").read_text())
    config.update(pruning_method="magnitude", target_sparsity=0.5)
    (run / "config.json").write_text(json.dumps(config))
    page = pages.write_run_page(run).read_text()
    assert "<dd>magnitude 50%</dd>" in page and "sparse kernel" not in page
    config["pruning_structure"] = "2:4"
    (run / "config.json").write_text(json.dumps(config))
    summary = json.loads((run / "summary.json").read_text())
    for layers, says in ((24, "forward of 24 Linear layers"), (0, "not used (checked")):
        (run / "summary.json").write_text(json.dumps({**summary,
                                                      "sparse_kernel_layers": layers}))
        page = pages.write_run_page(run).read_text()
        assert "<dd>magnitude 50% 2:4</dd>" in page
        assert f"<dt>2:4 sparse kernel</dt><dd>{says}" in page
    assert "magnitude 50% 2:4" in pages.write_index(tmp_path).read_text()
