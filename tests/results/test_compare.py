"""`make compare`: the settings that differ between runs, their figures, the files."""

from __future__ import annotations

import csv
import json
import re
import shutil

import pytest

from helpers import run_target
from gpt2.errors import ResultsError
from gpt2.results import catalog, compare


@pytest.mark.e2e
def test_compare_prints_the_differing_setting_and_each_runs_figures(two_runs, tmp_path):
    _, (fast, slow) = two_runs
    config = tmp_path / "config"
    config.write_text(f'CONFIG_RESULTS_DIR="{tmp_path / "results"}"\n')
    proc = run_target("compare", f"RUN={fast} {slow}", env={"KCONFIG_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # Only the learning rate differs (run names and folders are not settings), and
    # each run is named by it.
    assert lines[0].split()[:3] == ["run", "status", "learning_rate"]
    rows = {cells[0]: cells for cells in (re.split(r"\s{2,}", line.strip())
                                          for line in lines[2:4])}
    assert rows["lr 3e-3"][1:3] == ["completed", "0.003"]
    assert rows["lr 1e-3"][1:3] == ["completed", "0.001"]
    # The figures are the runs' own, as summary.json has them.
    for folder, name in ((fast, "lr 3e-3"), (slow, "lr 1e-3")):
        summary = json.loads((folder / "summary.json").read_text())
        assert f"{summary['final_val_loss']:.4f}" in rows[name]
        assert f"{summary['tokens']:,}" in rows[name]
    # Written under the configured results folder, in a folder of this set of runs.
    (out,) = (tmp_path / "results").glob("compare-*")
    assert f"written: {out}/compare.md" in proc.stdout
    with open(out / "compare.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["folder"] for r in table] == [str(fast), str(slow)]
    assert [r["run"] for r in table] == ["lr 3e-3", "lr 1e-3"]
    assert [r["learning_rate"] for r in table] == ["0.003", "0.001"]
    # numbers as numbers (not "614,400"), as summary.csv writes them
    for r, folder in zip(table, (fast, slow)):
        summary = json.loads((folder / "summary.json").read_text())
        assert int(r["tokens"]) == summary["tokens"]
        assert float(r["final_val_loss"]) == summary["final_val_loss"]
    assert (out / "compare.png").stat().st_size > 10_000
    # Its loss axis starts below the untrained model's loss, which would flatten the rest.
    runs = catalog.expand([str(fast), str(slow)], tmp_path)
    untrained = min(r.metrics()[0]["val_loss"] for r in runs)
    low, high = compare._y_limits(runs)
    assert high < untrained and low < min(r.figure("final_val_loss") for r in runs)
    assert "Settings that differ: `learning_rate`." in (out / "compare.md").read_text()
    # Another set of runs never overwrites this comparison.
    assert compare.folder_for(catalog.expand([str(fast)], tmp_path), tmp_path) != \
        compare.folder_for(catalog.expand([str(fast), str(slow)], tmp_path), tmp_path)


@pytest.mark.e2e
def test_settings_not_in_force_show_as_a_dash(two_runs, tmp_path):
    _, (fast, _) = two_runs
    muon = tmp_path / "muon-run"
    shutil.copytree(fast, muon)
    record = json.loads((muon / "config.json").read_text())
    record.update(optimizer="muon", muon_momentum=0.9)
    (muon / "config.json").write_text(json.dumps(record))
    runs = catalog.expand([str(fast), str(muon)], tmp_path)
    settings = compare.differing_settings(runs)
    # (in force in the Muon run only: the optimizer column says it, so not a column)
    assert settings[0] == "optimizer" and "muon_momentum" not in settings
    # Muon's momentum is no setting of an AdamW run: shown as "-", not as its default.
    assert compare.setting_text(runs[0], "muon_momentum") == compare.NOT_IN_FORCE
    assert compare.setting_text(runs[1], "muon_momentum") == "0.9"
    # (the tune matrix's table was 370 columns of such "-")
    assert compare.labels(runs) == ["adamw", "muon"]
    record.update(muon_momentum=0.95)
    (muon / "config.json").write_text(json.dumps(record))
    other = tmp_path / "muon-2"
    shutil.copytree(muon, other)
    record.update(muon_momentum=0.9)
    (other / "config.json").write_text(json.dumps(record))
    runs = catalog.expand([str(muon), str(other)], tmp_path)
    assert compare.differing_settings(runs) == ["muon_momentum"]
    assert compare.labels(runs) == ["muon momentum 0.95", "muon momentum 0.9"]


@pytest.mark.e2e
def test_globs_matrix_folders_and_cells_mix(two_runs, matrix_reference, tmp_path):
    _, folder, _ = matrix_reference
    results, (fast, slow) = two_runs
    runs = catalog.expand([str(results / "lr*"), str(folder)], tmp_path)
    names = [compare.label(r) for r in runs]
    assert names[:2] == sorted([fast.name, slow.name], reverse=False)
    # The matrix folder stands for its cells, in plan order, named with the matrix.
    assert names[2:] == [f"{folder.name}/{c}" for c in
                         ("adamw-none-seed1337", "adamw-magnitude-50-seed1337",
                          "adamwprune-none-seed1337", "adamwprune-state-50-seed1337")]
    text, out = compare.write(runs, tmp_path / "cmp")
    assert "pruning_method" in text.splitlines()[0] and "magnitude" in text
    assert (out / "compare.png").is_file()


@pytest.mark.parametrize("pattern,says", [
    ("no-such-run", "neither a run folder"), ("nothing-*", "matches no folder")])
def test_a_bad_run_name_is_an_error_that_says_why(tmp_path, pattern, says):
    with pytest.raises(ResultsError, match=says):
        catalog.expand([pattern], tmp_path)


@pytest.mark.e2e
def test_compare_without_run_says_how(tmp_path):
    proc = run_target("compare", env={"KCONFIG_CONFIG": str(tmp_path / "none")})
    assert proc.returncode == 2 and 'RUN="results/run-a results/run-b"' in proc.stderr
