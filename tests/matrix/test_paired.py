"""The paired comparison's arithmetic (gpt2/matrix/paired.py), on hand-made cells:
differences pair seeds, not positions; the interval is Student-t's; a verdict needs the
whole interval on one side of zero; one seed gets a verdict only within the
evaluation's own noise. tests/matrix/test_matrix_collect.py covers the same through a matrix
folder and the report."""

from __future__ import annotations

import math

import pytest

from gpt2.matrix import paired as pairs
from gpt2.matrix.results import CellResult


def cell(optimizer, seed, loss, point=(("lr", 1e-3),), status="completed", se=None,
         pruning="none", sparsity=None):
    return CellResult(cell=f"{optimizer}-{seed}-{point}", status=status,
                      axes={"optimizer": optimizer, "pruning": pruning,
                            "target_sparsity": sparsity, "seed": seed},
                      final_val_loss=loss, final_val_loss_se=se, grid=dict(point))


def best(optimizer, point=(("lr", 1e-3),), pruning="none", sparsity=None, ok=True):
    return {"optimizer": optimizer, "pruning": pruning, "target_sparsity": sparsity,
            "grid": dict(point), "best": ok}


def test_differences_pair_the_same_seed_and_only_the_best_points():
    """Seeds listed in another order, a second grid point and a failed seed must not
    enter: the baseline's seed 2 failed, so only seeds 1 and 3 pair."""
    cells = [cell("adamw", 3, 4.3), cell("adamw", 1, 4.1), cell("adamw", 2, 4.2, status="failed"),
             cell("muon", 1, 4.0), cell("muon", 2, 4.1), cell("muon", 3, 4.25),
             cell("muon", 1, 1.0, point=(("lr", 2e-3),))]  # not its best point
    (row,) = pairs.paired(cells, [best("adamw"), best("muon")], "adamw")
    assert row["seeds"] == [1, 3]
    assert row["differences"] == pytest.approx([-0.1, -0.05])
    assert row["mean"] == pytest.approx(-0.075)
    assert row["std"] == pytest.approx(math.sqrt(((0.025) ** 2) * 2))
    assert row["ci95"] == pytest.approx(12.706 * row["std"] / math.sqrt(2))
    assert row["verdict"] == "not distinguishable"  # 2 seeds: t = 12.7 keeps 0 inside


def test_verdicts_follow_the_whole_interval():
    assert pairs.verdict([-0.05, -0.06, -0.04])["verdict"] == "better"
    assert pairs.verdict([0.05, 0.06, 0.04])["verdict"] == "worse"
    assert pairs.verdict([-0.05, 0.06, -0.04])["verdict"] == "not distinguishable"
    # mean -0.01, half-width 4.303 * 0.01 / sqrt(3) = 0.0248: 0 inside
    edge = pairs.verdict([-0.02, -0.01, 0.0])
    assert edge["ci95"] == pytest.approx(4.303 * 0.01 / math.sqrt(3))
    assert edge["verdict"] == "not distinguishable"
    assert pairs.t95(2) == 12.706 and pairs.t95(31) == 2.042 and pairs.t95(40) == 1.96


def test_one_seed_gets_a_verdict_only_within_the_evaluation_noise():
    noise = 1.96 * math.hypot(0.01, 0.02)  # 0.0438
    inside = pairs.verdict([0.04], noise)
    assert (inside["verdict"], inside["ci95"], inside["std"]) == ("not distinguishable", None,
                                                                   None)
    assert pairs.verdict([0.05], noise)["verdict"] == "no verdict (one seed)"
    assert pairs.verdict([-0.05], noise)["verdict"] == "no verdict (one seed)"
    assert pairs.verdict([0.0], None)["verdict"] == "no verdict (one seed)"  # noise unknown
    a, b = cell("adamw", 1, 4.0, se=0.01), cell("muon", 1, 4.04, se=0.02)
    assert pairs.evaluation_noise(a, b) == pytest.approx(noise)
    assert pairs.evaluation_noise(a, cell("muon", 1, 4.0)) is None
    (row,) = pairs.paired([a, b], [best("adamw"), best("muon")], "adamw")
    assert row["verdict"] == "not distinguishable" and row["noise"] == pytest.approx(noise)


def test_each_pruning_setting_is_compared_with_the_baselines_at_the_same_setting():
    cells = [cell("adamw", 1, 4.0), cell("adamw", 1, 5.0, pruning="magnitude", sparsity=0.5),
             cell("muon", 1, 4.5, pruning="magnitude", sparsity=0.5),
             cell("muon", 1, 3.0, pruning="magnitude", sparsity=0.7)]
    rows = pairs.paired(cells, [best("adamw"), best("adamw", pruning="magnitude", sparsity=0.5),
                                best("muon", pruning="magnitude", sparsity=0.5),
                                best("muon", pruning="magnitude", sparsity=0.7)], "adamw")
    # magnitude 70 % has no baseline: not compared with another sparsity's
    assert [(r["pruning"], r["target_sparsity"], r["differences"]) for r in rows] == [
        ("magnitude", 0.5, [-0.5])]
    # a setting whose best point is missing, or no seed in common
    rows = pairs.paired([cell("adamw", 1, 4.0), cell("muon", 2, 4.0)],
                        [best("adamw"), best("muon")], "adamw")
    assert rows[0]["n"] == 0 and rows[0]["verdict"] is None
    assert pairs.paired(cells, [best("adamw", ok=False), best("muon")], "adamw") == []
    # another baseline
    (row,) = pairs.paired([cell("adamw", 1, 4.0), cell("muon", 1, 3.5)],
                          [best("adamw"), best("muon")], "muon")
    assert (row["optimizer"], row["baseline"], row["differences"]) == ("adamw", "muon", [0.5])


def test_seed_noise_pools_the_spread_within_each_point_and_eval_error_summarizes_cells():
    cells = [cell("adamw", s, 4.0 + d) for s, d in ((1, -0.1), (2, 0.0), (3, 0.1))]
    cells += [cell("muon", s, 3.0 + d, se=0.01 * s) for s, d in ((1, -0.3), (2, 0.3))]
    cells += [cell("sgd", 1, 9.0)]  # one seed: adds nothing
    # pooled variance: (2 * 0.01 + 1 * 0.18) / 3
    assert pairs.seed_noise(cells) == pytest.approx(math.sqrt((2 * 0.01 + 0.18) / 3))
    assert pairs.seed_noise(cells[:1]) is None
    error = pairs.evaluation_error(cells)
    assert (error["median"], error["min"], error["max"]) == pytest.approx((0.015, 0.01, 0.02))
    assert pairs.evaluation_error(cells[:3]) is None
