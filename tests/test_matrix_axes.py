"""The matrix's axes (gpt2/config/axes.py): a cell is a point on the declared axes,
and everything that names or groups cells follows the declarations. The training
budget (CONFIG_MATRIX_MAX_ITERS) is docs/architecture.md's worked example: one
declaration and one Kconfig entry, and it reaches the plan, the ids, plan.yaml,
summary.csv, the tuning groups, the paired differences, the report and the page."""

from __future__ import annotations

import csv
import json
import math

import pytest
from test_matrix_collect import PLOTS, fake_tuned_matrix
from test_matrix_plan import EXPECTED12, MATRIX12, plan_of

from gpt2.config import axes
from gpt2.config.kconfig import KconfigError
from gpt2.errors import PlanError
from gpt2.matrix.collect import collect


def test_every_axis_is_declared_once_with_its_kconfig_symbols():
    """What Kconfig offers for each axis is what its declaration reads."""
    from gpt2.config.kconfig import new_kconfig

    kconf = new_kconfig()
    names = [a.name for a in axes.AXES]
    assert len(set(names)) == len(names) and len({a.plural for a in axes.AXES}) == len(names)
    assert len({a.field for a in axes.AXES}) == len(names)
    for a in axes.AXES:
        symbols = [a.symbol(e) for e in a.entries] if a.entries else [a.symbol]
        assert all(s in kconf.syms for s in symbols), (a.name, symbols)
    assert [a.name for a in axes.REPLICATES] == ["seed"]


def test_budgets_are_cells_of_their_own(tmp_path):
    """Each budget is a value of every cell's point: ids say it where there are several,
    each cell trains that many steps, and plan.yaml lists the budgets and each cell's."""
    budgets = plan_of(tmp_path, MATRIX12 + 'CONFIG_MATRIX_MAX_ITERS="1000 2000"\n')
    assert len(budgets.cells) == 24
    ids = [c.id for c in budgets.cells]
    # the budget nests inside the sparsity and outside the seed, as declared
    assert ids[:3] == ["adamw-none-iters1000-seed1337", "adamw-none-iters2000-seed1337",
                       "adamw-movement-50-iters1000-seed1337"]
    for c in budgets.cells:
        assert c.cfg.max_iters == c.value("max_iters") == int(c.id.split("-iters")[1].split("-")[0])
        assert f"--max-iters={c.cfg.max_iters}" in c.argv
    data = budgets.to_dict()
    assert data["axes"]["budgets"] == [1000, 2000]
    assert list(data["cells"][0])[:6] == ["id", "optimizer", "pruning", "target_sparsity",
                                          "max_iters", "seed"]
    # Without the axis: the ids, plan.yaml and folder of a matrix that never had it.
    plain = plan_of(tmp_path, MATRIX12)
    assert [c.id for c in plain.cells] == EXPECTED12
    assert "budgets" not in plain.to_dict()["axes"]
    assert "max_iters" not in plain.to_dict()["cells"][0]
    # One budget names nothing new in the ids, but the cells train that long.
    one = plan_of(tmp_path, MATRIX12 + 'CONFIG_MATRIX_MAX_ITERS="1000"\n')
    assert [c.id for c in one.cells] == EXPECTED12
    assert {c.cfg.max_iters for c in one.cells} == {1000} != {c.cfg.max_iters for c in plain.cells}
    assert one.folder != plain.folder


def test_a_setting_the_budget_axis_varies_cannot_be_fixed_elsewhere(tmp_path):
    body = MATRIX12 + 'CONFIG_MATRIX_MAX_ITERS="1000 2000"\n'
    with pytest.raises(PlanError, match="TRAIN_ARGS sets --max-iters, which the matrix varies"):
        plan_of(tmp_path, body, ["--max-iters=5000"])
    assert plan_of(tmp_path, MATRIX12, ["--max-iters=5000"]).cells[0].cfg.max_iters == 5000
    with pytest.raises(PlanError, match="MAX_ITERS: the matrix has its own axis for it"):
        plan_of(tmp_path, body + 'CONFIG_MATRIX_SWEEP="MAX_ITERS=10,20"\n')
    with pytest.raises(KconfigError, match="CONFIG_MATRIX_MAX_ITERS: 'x' is not a budget"):
        plan_of(tmp_path, MATRIX12 + 'CONFIG_MATRIX_MAX_ITERS="1000 x"\n')
    with pytest.raises(KconfigError, match="budget 1000 is listed twice"):
        plan_of(tmp_path, MATRIX12 + 'CONFIG_MATRIX_MAX_ITERS="1000 1000"\n')


def by_budget(cell) -> float:
    """AdamW's best rate is 4e-3 at 20 steps and 2e-3 at 40 (so a comparison across
    budgets would pick the 40-step cells everywhere); Muon is 0.05 better than AdamW at
    20 steps and 0.2 better at 40, at every seed."""
    steps, point = cell.value("max_iters"), dict(cell.point)
    best_lr = 4e-3 if steps == 20 else 2e-3
    shift = {1: -0.3, 2: 0.0}[cell.seed] - (0.5 if steps == 40 else 0.0)
    if cell.optimizer == "adamw":
        return 4.0 + abs(math.log2(point["lr"] / best_lr)) / 10 + shift
    gain = 0.05 if steps == 20 else 0.2
    return 4.0 - gain + (0.04 - point["lr"]) + 0.01 * (not point["wd"]) + shift


def test_each_budget_is_tuned_paired_and_reported_on_its_own(tmp_path):
    folder = fake_tuned_matrix(tmp_path, by_budget, seeds=(1, 2), more={"budgets": (20, 40)})
    collect(folder)
    with open(folder / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:7] == ["cell", "optimizer", "pruning", "target_sparsity",
                                 "max_iters", "final_sparsity", "seed"]
    assert {r["max_iters"] for r in rows} == {"20", "40"} and len(rows) == 2 * 2 * (3 + 6)
    summary = json.loads((folder / "summary.json").read_text())
    tuned = {(r["optimizer"], r["max_iters"]): r for r in summary["tuned"]}
    assert set(tuned) == {("adamw", 20), ("adamw", 40), ("muon", 20), ("muon", 40)}
    assert tuned["adamw", 20]["grid"]["lr"] == 4e-3 and tuned["adamw", 40]["grid"]["lr"] == 2e-3
    assert any("adamw / none / 20 steps: the best lr" in w for w in tuned["adamw", 20]["edges"])
    paired = {r["max_iters"]: r for r in summary["paired"]}
    assert paired[20]["differences"] == pytest.approx([-0.05, -0.05])
    assert paired[40]["differences"] == pytest.approx([-0.2, -0.2])
    report = (folder / "report.md").read_text()
    assert "| # | optimizer | pruning | target | steps | learning_rate |" in report
    assert "| 4 | adamw | none | — | 20 steps | 4e-3 |" in report
    assert "| optimizer | pruning / steps | vs |" in report
    assert "| muon | none / 40 steps | adamw | 2 | -0.2000 |" in report
    assert {p.name for p in (folder / "plots").glob("*.png")} == PLOTS


def test_the_matrix_page_has_a_column_per_axis(tmp_path):
    from gpt2.results import pages

    folder = fake_tuned_matrix(tmp_path, by_budget, seeds=(1,), more={"budgets": (20, 40)})
    collect(folder, plots=False)
    html = pages.write_matrix_page(folder).read_text()
    heads = html.split("<thead>")[1].split("</thead>")[0]
    assert ('<th>optimizer</th><th>pruning</th><th class="num">target</th>'
            '<th class="num">steps</th><th class="num">seed</th>') in heads
    assert 'data-v="40.0">40 steps</td>' in html
