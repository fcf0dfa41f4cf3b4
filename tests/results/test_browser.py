"""The results pages in a real browser: headless Chromium (Debian's chromium and
chromium-driver, which .ci/run installs) opens them from disk through Selenium,
sorts and filters the tables, follows every link, and takes screenshots.

Screenshots go to $KGPT_SCREENSHOTS when set (to look at them), else to the test's
tmp folder."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from gpt2.results import pages

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1440,1000")

pytestmark = pytest.mark.e2e
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in requirements.txt")
if not (os.access(CHROMIUM, os.X_OK) and os.access(DRIVER, os.X_OK)):
    pytest.skip("Chromium is not installed (.ci/run installs Debian's chromium and "
                "chromium-driver)", allow_module_level=True)


@pytest.fixture
def browser(tmp_path):
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def results(two_runs, matrix_reference, tmp_path) -> Path:
    root = tmp_path / "results"
    shutil.copytree(two_runs[0], root, symlinks=True)
    shutil.copytree(matrix_reference[1], root / matrix_reference[1].name, symlinks=True)
    pages.write_all(root)
    return root


def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("KGPT_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def visible_rows(driver, table: str) -> list:
    return [r for r in driver.find_elements("css selector", f"#{table} tbody tr")
            if r.is_displayed()]


def open_page(driver, url: str) -> None:
    driver.get(url)
    assert driver.find_element("css selector", "header.top h1").text, url
    # Pictures load lazily, as they scroll into view: load them all, then look.
    driver.execute_script("document.querySelectorAll('img[loading=lazy]')"
                          ".forEach(i => i.loading = 'eager')")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not driver.execute_script(
            "return Array.from(document.images).every(i => i.complete)"):
        time.sleep(0.1)
    broken = driver.execute_script(
        "return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))"
        ".map(i => i.getAttribute('src'))")
    assert broken == [], f"{url}: pictures that did not load: {broken}"
    assert console_errors(driver) == [], url


def test_the_pages_work_in_chromium(browser, results, tmp_path):
    out = shots(tmp_path)
    open_page(browser, (results / pages.INDEX).as_uri())
    assert browser.title == "kgpt results"
    assert len(visible_rows(browser, "run-table")) == 2
    assert len(visible_rows(browser, "matrix-table")) == 1
    browser.save_screenshot(str(out / "index.png"))
    # On a wide screen the whole table shows: no sideways scrolling at 2,200 px.
    browser.set_window_size(2200, 1000)
    assert browser.execute_script(
        "var w = document.getElementById('run-table').parentNode;"
        "return [w.scrollWidth <= w.clientWidth, w.clientWidth > 1600]") == [True, True]
    browser.save_screenshot(str(out / "index-2200.png"))
    browser.set_window_size(1440, 1000)

    # Sorting by validation loss: ascending, then descending on a second click.
    header = next(th for th in browser.find_elements("css selector", "#run-table thead th")
                  if th.text.startswith("val loss"))
    column = browser.find_elements("css selector", "#run-table thead th").index(header)

    def losses():
        return [float(r.find_elements("css selector", "td")[column].text)
                for r in visible_rows(browser, "run-table")]

    header.click()
    assert header.get_attribute("aria-sort") == "ascending" and losses() == sorted(losses())
    header.click()
    assert losses() == sorted(losses(), reverse=True)

    # The filter keeps the rows holding every word typed.
    box = browser.find_element("css selector", "input[data-filter=run-table]")
    box.send_keys("lr1e-3 completed")
    rows = visible_rows(browser, "run-table")
    assert len(rows) == 1 and rows[0].text.startswith("lr1e-3")
    assert browser.find_element("css selector", "[data-shown=run-table]").text == \
        "1 of 2 shown"
    box.clear()
    box.send_keys("x")  # (clear() fires no input event: type, then erase)
    box.send_keys("\b")
    assert len(visible_rows(browser, "run-table")) == 2

    # Every link of the index opens a page with its pictures and no console error.
    links = [a.get_attribute("href") for a in browser.find_elements("css selector", "a")]
    assert len(links) == 3
    for link in links:
        open_page(browser, link)
    open_page(browser, (next(results.glob("lr3e-3-*")) / pages.RUN_PAGE).as_uri())
    browser.save_screenshot(str(out / "run.png"))
    matrix = next(results.glob("matrix-*"))
    open_page(browser, (matrix / pages.MATRIX_PAGE).as_uri())
    assert len(visible_rows(browser, "cell-table")) == 4
    browser.save_screenshot(str(out / "matrix.png"))
    cells = [a.get_attribute("href") for a in
             browser.find_elements("css selector", "#cell-table a")]
    assert len(cells) == 4
    for link in cells:
        open_page(browser, link)
    assert all((out / f"{name}.png").stat().st_size > 20_000
               for name in ("index", "run", "matrix"))


def test_a_hundred_runs_stay_usable(browser, two_runs, tmp_path):
    """120 runs (copies of one run's files under other names and learning rates):
    the index lists them all, the filter finds one, sorting puts the best first."""
    import json

    source = two_runs[1][0]
    root = tmp_path / "results"
    for i in range(120):
        run = root / f"sweep-lr{i:03d}-{i:010x}"
        run.mkdir(parents=True)
        for name in ("metrics.jsonl", "samples.txt", "provenance.json"):
            shutil.copyfile(source / name, run / name)
        config = json.loads((source / "config.json").read_text())
        summary = json.loads((source / "summary.json").read_text())
        config["learning_rate"] = 1e-4 * (i + 1)
        summary["final_val_loss"] = 5.0 + ((i * 37) % 120) / 100  # 5.00 once: i = 0
        (run / "config.json").write_text(json.dumps(config))
        (run / "summary.json").write_text(json.dumps(summary))
    pages.write_all(root)
    open_page(browser, (root / pages.INDEX).as_uri())
    assert len(visible_rows(browser, "run-table")) == 120
    header = next(th for th in browser.find_elements("css selector", "#run-table thead th")
                  if th.text.startswith("val loss"))
    header.click()
    first = visible_rows(browser, "run-table")[0]
    assert first.text.startswith("sweep-lr000-") and "5.0000" in first.text
    browser.save_screenshot(str(shots(tmp_path) / "index-120-runs.png"))
    browser.find_element("css selector", "input[data-filter=run-table]").send_keys("lr042")
    rows = visible_rows(browser, "run-table")
    assert len(rows) == 1 and rows[0].text.startswith("sweep-lr042-")


def test_the_matrix_page_in_chromium_carries_the_tuned_comparison(browser, tmp_path):
    """The page users are sent to says what report.md opens with: the tuned table, its
    under-tuned warnings, the grids and the learning-rate plot, above the cells; and
    it shows no picture of nothing."""
    from fake_matrices import bowl, fake_tuned_matrix

    from gpt2.matrix.collect import collect

    folder = fake_tuned_matrix(tmp_path / "results", bowl)
    collect(folder)
    pages.publish_matrix(folder)
    open_page(browser, (folder / pages.MATRIX_PAGE).as_uri())
    heads = [h.text for h in browser.find_elements("css selector", "#comparison h2")]
    assert "Tuned comparison: each optimizer at its best grid point" in heads
    table = browser.find_element("xpath", "//section[@id='comparison']//h2[starts-with(., "
                                 "'Tuned comparison')]/following-sibling::table[1]")
    assert table.is_displayed() and "muon" in table.text and "0.04" in table.text
    text = browser.find_element("css selector", "#comparison").text
    assert "Under-tuned" in text and "the best lr (muon_lr) 0.04 is the largest of its grid" in text
    lr = browser.find_element("css selector", "#comparison img[src='plots/lr_sweep.png']")
    assert lr.is_displayed() and lr.get_attribute("naturalWidth") != "0"
    assert browser.find_element("css selector", "#comparison").location["y"] < \
        browser.find_element("css selector", "#cell-table").location["y"]
    # a dense tuning matrix: no sparsity pictures on the page
    srcs = [i.get_attribute("src") for i in browser.find_elements("css selector", ".plots img")]
    assert srcs and not any("sparsity" in s for s in srcs)
    browser.save_screenshot(str(shots(tmp_path) / "matrix-tuned.png"))


def chart_tip(browser, chart: int, index: int, y_fraction: float = 0.5) -> str:
    """Hover over chart ``chart`` of the page at its ``index``-th x value; the tooltip's text."""
    from selenium.webdriver.common.action_chains import ActionChains

    over = browser.find_elements("css selector", ".uplot .u-over")[chart]
    left = browser.execute_script(
        f"var u = window.kgptCharts[{chart}]; return u.valToPos(u.data[0][{index}], 'x');")
    size = over.size
    left = min(max(left, 1), size["width"] - 2)  # (the last point is on the right edge)
    ActionChains(browser).move_to_element_with_offset(
        over, round(left - size["width"] / 2), round((y_fraction - 0.5) * size["height"])).perform()
    tip = over.find_element("css selector", ".chart-tip")
    assert tip.is_displayed()
    return tip.text


def test_the_charts_show_values_on_hover_and_zoom_on_drag(browser, results, tmp_path):
    """The run page's loss chart and the matrix page's cell chart, drawn in the browser
    from the runs' metrics.jsonl: the tooltip shows the numbers in the files, a drag
    zooms into the range dragged across, a double click zooms out; nothing is fetched."""
    import json

    from selenium.webdriver.common.action_chains import ActionChains

    run = next(results.glob("lr3e-3-*"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r["train_loss"] for r in rows if "train_loss" in r}
    val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    open_page(browser, (run / pages.RUN_PAGE).as_uri())
    assert browser.execute_script("return window.kgptCharts.length") == 1
    assert browser.execute_script(
        "return document.querySelectorAll('script[src], link[rel=stylesheet], img[src^=http]')"
        ".length") == 0
    x = browser.execute_script("return window.kgptCharts[0].data[0]")
    assert x == sorted(set(train) | set(val))
    step = max(val)  # the last evaluation: both losses are there
    text = chart_tip(browser, 0, x.index(step)).splitlines()
    assert text == [f"step {step:,}", f"train loss: {train[step]:.4f}",
                    f"val loss: {val[step]:.4f}"]
    middle = x[len(x) // 2]
    assert chart_tip(browser, 0, x.index(middle)).splitlines()[:2] == \
        [f"step {middle:,}", f"train loss: {train[middle]:.4f}"]
    browser.save_screenshot(str(shots(tmp_path) / "run-chart-hover.png"))

    # drag from a quarter to three quarters of the width: that range fills the chart
    over = browser.find_element("css selector", ".uplot .u-over")
    width = over.size["width"]
    ActionChains(browser).move_to_element_with_offset(over, -width // 4, 0).click_and_hold() \
        .move_by_offset(width // 2, 0).release().perform()
    lo, hi = browser.execute_script("var s = window.kgptCharts[0].scales.x; return [s.min, s.max]")
    span = x[-1] - x[0]
    assert x[0] + 0.2 * span < lo < x[0] + 0.3 * span and x[0] + 0.7 * span < hi < x[0] + 0.8 * span
    browser.save_screenshot(str(shots(tmp_path) / "run-chart-zoomed.png"))
    ActionChains(browser).double_click(over).perform()
    assert browser.execute_script(
        "var s = window.kgptCharts[0].scales.x; return [s.min, s.max]") == [x[0], x[-1]]

    # the matrix page: one line per cell, each cell's own validation losses
    matrix = next(results.glob("matrix-*"))
    open_page(browser, (matrix / pages.MATRIX_PAGE).as_uri())
    curves = {}
    for cell in sorted((matrix / "cells").iterdir()):
        cell_rows = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines()]
        curves[cell.name] = {r["step"]: r["val_loss"] for r in cell_rows if "val_loss" in r}
    x = browser.execute_script("return window.kgptCharts[0].data[0]")
    step = x[-1]
    lines = chart_tip(browser, 0, len(x) - 1).splitlines()
    assert lines[0] == f"step {step:,}"
    assert sorted(lines[1:]) == sorted(f"{c}: {v[step]:.4f}" for c, v in curves.items())
    browser.save_screenshot(str(shots(tmp_path) / "matrix-chart-hover.png"))
