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
import yaml
from fake_matrices import TUNED_PLOTS, fake_tuned_matrix
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
        assert c.cfg.max_iters == c.value("budget") == int(c.id.split("-iters")[1].split("-")[0])
        assert f"--max-iters={c.cfg.max_iters}" in c.argv
    data = budgets.to_dict()
    assert data["axes"]["budgets"] == [1000, 2000]
    assert list(data["cells"][0])[:6] == ["id", "optimizer", "pruning", "target_sparsity",
                                          "budget", "seed"]
    # Without the axis: the ids, plan.yaml and folder of a matrix that never had it.
    plain = plan_of(tmp_path, MATRIX12)
    assert [c.id for c in plain.cells] == EXPECTED12
    assert "budgets" not in plain.to_dict()["axes"]
    assert "budget" not in plain.to_dict()["cells"][0]
    # One budget names nothing new in the ids, but the cells train that long.
    one = plan_of(tmp_path, MATRIX12 + 'CONFIG_MATRIX_MAX_ITERS="1000"\n')
    assert [c.id for c in one.cells] == EXPECTED12
    assert {c.cfg.max_iters for c in one.cells} == {1000} != {c.cfg.max_iters for c in plain.cells}
    assert one.folder != plain.folder


def test_budgets_in_chinchilla_multiples_become_steps_for_each_cells_model(tmp_path):
    """1x is 20 tokens per parameter (Hoffmann et al. 2022) of the cell's own model:
    GPT-2 124M with kgpt's padded vocabulary has 124,475,904 parameters."""
    plan = plan_of(tmp_path, MATRIX12 + 'CONFIG_MATRIX_MAX_ITERS="0.5x 1x"\n')
    assert plan.to_dict()["axes"]["budgets"] == ["0.5x", "1x"]
    half, one = plan.cells[:2]
    assert (half.id, one.id) == ("adamw-none-budget0.5x-seed1337", "adamw-none-budget1x-seed1337")
    per_step = half.cfg.tokens_per_step()
    assert half.cfg.max_iters == math.ceil(0.5 * 20 * 124_475_904 / per_step)
    assert one.cfg.max_iters == math.ceil(20 * 124_475_904 / per_step)
    # a sweep of the batch size changes the steps a budget takes, not its tokens
    swept = plan_of(tmp_path, MATRIX12 + 'CONFIG_MATRIX_MAX_ITERS="1x"\n'
                    'CONFIG_MATRIX_SWEEP="GRADIENT_ACCUMULATION=1,2"\n')
    steps = {c.cfg.gradient_accumulation: c.cfg.max_iters for c in swept.cells[:2]}
    assert steps[1] == math.ceil(20 * 124_475_904 / (per_step // half.cfg.gradient_accumulation))
    assert abs(steps[1] - 2 * steps[2]) <= 1


def test_a_smoke_run_shrinks_the_budgets_with_the_rest(tmp_path):
    """SMOKE=20 makes the largest budget 20 steps and the others proportional."""
    from gpt2.config import kconfig
    from gpt2.config.smoke import shrink
    from gpt2.matrix.plan import plan_from_dotconfig

    path = tmp_path / "config"
    for budgets, steps in (("1000 2000 4000", {5, 10, 20}), ("0.5x 1x 2x", {5, 10, 20})):
        path.write_text(MATRIX12 + f'CONFIG_MATRIX_MAX_ITERS="{budgets}"\n')
        plan = plan_from_dotconfig(kconfig.load(path), [], adjust=lambda v: shrink(v, 20)[0])
        assert {c.cfg.max_iters for c in plan.cells} == steps


def test_a_setting_the_budget_axis_varies_cannot_be_fixed_elsewhere(tmp_path):
    body = MATRIX12 + 'CONFIG_MATRIX_MAX_ITERS="1000 2000"\n'
    with pytest.raises(PlanError, match="TRAIN_ARGS sets --max-iters, which the matrix varies"):
        plan_of(tmp_path, body, ["--max-iters=5000"])
    assert plan_of(tmp_path, MATRIX12, ["--max-iters=5000"]).cells[0].cfg.max_iters == 5000
    with pytest.raises(PlanError, match="MAX_ITERS: the matrix has its own axis for it"):
        plan_of(tmp_path, body + 'CONFIG_MATRIX_SWEEP="MAX_ITERS=10,20"\n')
    with pytest.raises(PlanError, match="CONFIG_EPOCHS=1 sets every cell's length"):
        plan_of(tmp_path, body + 'CONFIG_EPOCHS="1"\n')
    for text, says in (("1000 y", "CONFIG_MATRIX_MAX_ITERS: 'y' is not a budget"),
                       ("1000 2x", "in steps .* or every one in Chinchilla multiples"),
                       ("0x 1x", "0 is not a budget: a multiple of 20 tokens"),
                       ("1000 1000", "budget 1000 is listed twice")):
        with pytest.raises(KconfigError, match=says):
            plan_of(tmp_path, MATRIX12 + f'CONFIG_MATRIX_MAX_ITERS="{text}"\n')


def by_budget(cell) -> float:
    """AdamW's best rate is 4e-3 at 20 steps and 2e-3 at 40 (so a comparison across
    budgets would pick the 40-step cells everywhere); Muon is 0.05 better than AdamW at
    20 steps and 0.2 better at 40, at every seed."""
    steps, point = cell.value("budget"), dict(cell.point)
    best_lr = 4e-3 if steps == 20 else 2e-3
    shift = {1: -0.3, 2: 0.0}[cell.seed] - (0.5 if steps == 40 else 0.0)
    if cell.optimizer == "adamw":
        return 4.0 + abs(math.log2(point["lr"] / best_lr)) / 10 + shift
    gain = 0.05 if steps == 20 else 0.2
    return 4.0 - gain + (0.04 - point["lr"]) + 0.01 * (not point["wd"]) + shift


@pytest.mark.slow
def test_each_budget_is_tuned_paired_and_reported_on_its_own(tmp_path):
    folder = fake_tuned_matrix(tmp_path, by_budget, seeds=(1, 2), more={"budgets": (20, 40)})
    collect(folder)
    with open(folder / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:7] == ["cell", "optimizer", "pruning", "target_sparsity",
                                 "budget", "final_sparsity", "seed"]
    assert {r["budget"] for r in rows} == {"20", "40"} and len(rows) == 2 * 2 * (3 + 6)
    summary = json.loads((folder / "summary.json").read_text())
    tuned = {(r["optimizer"], r["budget"]): r for r in summary["tuned"]}
    assert set(tuned) == {("adamw", 20), ("adamw", 40), ("muon", 20), ("muon", 40)}
    assert tuned["adamw", 20]["grid"]["lr"] == 4e-3 and tuned["adamw", 40]["grid"]["lr"] == 2e-3
    assert any("adamw / none / 20 steps: the best lr" in w for w in tuned["adamw", 20]["edges"])
    paired = {r["budget"]: r for r in summary["paired"]}
    assert paired[20]["differences"] == pytest.approx([-0.05, -0.05])
    assert paired[40]["differences"] == pytest.approx([-0.2, -0.2])
    report = (folder / "report.md").read_text()
    assert "| # | optimizer | pruning | target | budget | learning_rate |" in report
    assert "| 4 | adamw | none | — | 20 steps | 4e-3 |" in report
    assert "| optimizer | pruning / budget | vs |" in report
    assert "| muon | none / 40 steps | adamw | 2 | -0.2000 |" in report
    # (dense cells only: no sparsity pictures)
    assert {p.name for p in (folder / "plots").glob("*.png")} == TUNED_PLOTS - {
        "ppl_vs_sparsity.png", "sparsity_vs_step.png"}


def test_the_matrix_page_has_a_column_per_axis(tmp_path):
    from gpt2.results import pages

    folder = fake_tuned_matrix(tmp_path, by_budget, seeds=(1,), more={"budgets": (20, 40)})
    collect(folder, plots=False)
    html = pages.write_matrix_page(folder).read_text()
    heads = html.split('id="cell-table"')[1].split("<thead>")[1].split("</thead>")[0]
    assert ('<th>optimizer</th><th>pruning</th><th class="num">target</th>'
            '<th>budget</th><th class="num">seed</th>') in heads
    assert '<td class="num" data-v="40.0">40 steps</td>' in html


@pytest.mark.e2e
def test_shorter_wsd_budgets_branch_from_the_longest_cell(tmp_path, data_dir):
    """A dense and a pruned AdamW at 16 and 32 steps under WSD: the dense 32-step cell
    trains first and keeps step 12 (where a 16-step run's cooldown of a quarter begins);
    the dense 16-step cell starts there and ends as a straight run of it; the pruned
    cells train from step 0 (their ramp depends on their length)."""
    from helpers import call_main, run_target
    from matrix_helpers import folder_of, run_matrix, tiny_matrix

    # tiny_matrix's cells, AdamW only (a Kconfig file sets each symbol once)
    text = tiny_matrix(tmp_path, data_dir, max_iters=32).read_text()
    for symbol in ("OPTIMIZER_ADAMWPRUNE", "PRUNING_STATE"):
        text = text.replace(f"CONFIG_MATRIX_{symbol}=y", f"# CONFIG_MATRIX_{symbol} is not set")
    text = "".join(line for line in text.splitlines(True)
                   if "LR_SCHEDULE_" not in line and "MATRIX_MAX_ITERS" not in line)
    config = tmp_path / "config"
    config.write_text(text + 'CONFIG_LR_SCHEDULE_WSD=y\nCONFIG_WSD_COOLDOWN="0.25"\n'
                      'CONFIG_MATRIX_MAX_ITERS="16 32"\n')
    assert run_target("olddefconfig", env={"KCONFIG_CONFIG": str(config)}).returncode == 0
    proc = run_matrix(config)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = folder_of(config)
    plan = yaml.safe_load((folder / "plan.yaml").read_text())
    branch = {c["id"]: c.get("branch") for c in plan["cells"]}
    assert branch == {"adamw-none-iters16-seed1337": {"from": "adamw-none-iters32-seed1337",
                                                      "step": 12},
                      "adamw-none-iters32-seed1337": None,
                      "adamw-magnitude-50-iters16-seed1337": None,
                      "adamw-magnitude-50-iters32-seed1337": None}
    out = proc.stdout
    assert out.index("starting adamw-none-iters32") < out.index("starting adamw-none-iters16")
    cells = folder / "cells"
    assert (cells / "adamw-none-iters32-seed1337" / "branches" / "step-00000012.pt").is_file()
    assert "branching from" in (cells / "adamw-none-iters16-seed1337" / "train.log").read_text()
    assert "branching" not in (cells / "adamw-magnitude-50-iters16-seed1337" /
                               "train.log").read_text()
    report = (folder / "report.md").read_text()
    assert "## Cooldown branches" in report
    assert "1 of the 1 shorter-budget cells" in report
    assert "trained 84 of the 96 steps they add up to (12% saved)" in report
    assert "different code or data versions" not in report  # a branch is the same run
    again = run_matrix(config)  # and a re-run finds every cell, the branch too, complete
    assert again.returncode == 0, again.stdout + again.stderr
    assert "4 cells: 4 completed, 0 to run" in again.stdout
    # the branched cell is the straight run
    args = next(c["args"] for c in plan["cells"] if c["id"] == "adamw-none-iters16-seed1337")
    straight = tmp_path / "straight"
    call_main("gpt2/train.py", *args, f"--run-dir={straight}", check=True)
    ran = json.loads((cells / "adamw-none-iters16-seed1337" / "summary.json").read_text())
    assert json.loads((straight / "summary.json").read_text())["final_val_loss"] == \
        ran["final_val_loss"]


def test_the_branch_report_tells_cells_not_yet_run_from_cells_trained_from_step_0():
    """A matrix stopped halfway (an H100 run of the protocol preset) listed its pending
    branch cells as "trained from step 0 instead": a cell that has not started is
    counted as not run yet, and only cells that ran straight are listed as such."""
    from gpt2.matrix.report import branch_lines
    from gpt2.matrix.results import CellResult

    def planned(cid, steps, parent=None):
        return {"id": cid, "args": [f"--max-iters={steps}", "--warmup-iters=2"],
                **({"branch": {"from": parent, "step": steps - 4}} if parent else {})}

    plan = {"cells": [planned("a32", 32), planned("a16", 16, "a32"),
                      planned("b32", 32), planned("b16", 16, "b32"),
                      planned("c32", 32), planned("c16", 16, "c32")]}
    ran = {"a32": "completed", "a16": "completed", "b32": "completed", "b16": "completed",
           "c32": "interrupted", "c16": "pending"}
    cells = [CellResult(cid, {}, status) for cid, status in ran.items()]
    cells[1].provenance = {"parent": {"how": "branches"}}
    text = "\n".join(branch_lines(plan, cells))
    assert "1 of the 3 shorter-budget cells" in text
    assert "trained 132 of the 144 steps they add up to (8% saved)" in text
    assert "they ran on Slurm): `b16`." in text
    assert "Not run yet: 1 of them" in text


def test_a_structure_axis_pairs_each_n_of_m_with_its_own_sparsity(tmp_path):
    """CONFIG_MATRIX_STRUCTURES: each pruned cell at each structure, an N:M one only at
    its own sparsity (2:4 at 50 %, not 70 or 90); dense cells have no structure; labels
    and plan.yaml name it, and each cell trains with it."""
    plan = plan_of(tmp_path, MATRIX12 + 'CONFIG_MATRIX_STRUCTURES="unstructured 2:4"\n')
    ids = [c.id for c in plan.cells]
    assert ids[:5] == ["adamw-none-seed1337", "adamw-movement-50-unstructured-seed1337",
                       "adamw-movement-50-2of4-seed1337",
                       "adamw-movement-70-unstructured-seed1337",
                       "adamw-movement-90-unstructured-seed1337"]
    assert len(ids) == 15 and not any("70-2of4" in i or "90-2of4" in i for i in ids)
    by_id = {c.id: c for c in plan.cells}
    assert by_id["adamwprune-state-50-2of4-seed1337"].cfg.pruning_structure == "2:4"
    assert by_id["adamw-movement-90-unstructured-seed1337"].cfg.pruning_structure == \
        "unstructured"
    assert "--pruning-structure=2:4" in by_id["adamw-movement-50-2of4-seed1337"].argv
    assert plan.to_dict()["axes"]["structures"] == ["unstructured", "2:4"]
    assert axes.label(plan.to_dict()["cells"][2]) == "adamw / movement 50% 2:4"
    with pytest.raises(KconfigError, match="CONFIG_MATRIX_STRUCTURES: '2:3' is not a mask structure"):
        plan_of(tmp_path, MATRIX12 + 'CONFIG_MATRIX_STRUCTURES="2:3"\n')


def test_a_tag_reads_back_as_its_value_so_no_two_values_share_one():
    """Cell ids, tables and plots write values with sparsity_tag and value_tag: 0.7 and
    0.7000001 (or 0.1 and 0.1000001) formatted to six digits would share a cell id, and
    the second cell would be refused forever as another configuration's run."""
    import random

    assert axes.sparsity_tag(0.7) == "70" and axes.sparsity_tag(0.7000001) == "70.00001"
    assert axes.value_tag(0.1) == "0.1" and axes.value_tag(0.1000001) == "0.1000001"
    assert axes.value_tag(6e-4) == "6e-4" and axes.value_tag(6.000001e-4) == "6.000001e-4"
    rng = random.Random(0)
    values = [rng.uniform(1e-6, 1.0) for _ in range(2000)] + [0.5 + k * 1e-9 for k in range(50)]
    assert len({axes.value_tag(v) for v in values}) == len(set(values))
    assert all(float(axes.value_tag(v)) == v for v in values)
    assert all(float(axes.sparsity_tag(v)) / 100 == pytest.approx(v, rel=1e-12) for v in values)
    assert len({axes.sparsity_tag(v) for v in values}) == len(set(values))
