"""Speedup over the tuned baseline (gpt2/matrix/speedup.py) on hand-worked examples:
known curves give known ratios, a known power law gives back its parameters and D_eff."""

from __future__ import annotations

import math

import pytest

from gpt2.matrix import speedup
from gpt2.matrix.results import CellResult

CURVE = [(0, 10.0), (100, 6.0), (200, 5.0), (300, 4.5), (400, 4.2)]


def test_the_tokens_to_reach_a_loss_are_read_between_evaluations():
    assert speedup.tokens_to_reach(CURVE, 4.75) == (250.0, True)  # halfway from 5.0 to 4.5
    assert speedup.tokens_to_reach(CURVE, 6.0) == (100.0, True)
    assert speedup.tokens_to_reach(CURVE, 4.0) == (400.0, False)  # never: a lower bound
    assert speedup.tokens_to_reach(CURVE, 11.0) == (0.0, True)


def test_a_power_law_is_fitted_back_and_gives_the_tokens_of_a_loss():
    law = lambda d: 2.0 * d ** -0.3 + 1.5  # noqa: E731
    tokens = [1e6, 2e6, 4e6, 8e6]
    fit = speedup.fit_power_law(tokens, [law(d) for d in tokens])
    assert fit["a"] == pytest.approx(2.0, rel=1e-3) and fit["b"] == pytest.approx(0.3, rel=1e-3)
    assert fit["c"] == pytest.approx(1.5, rel=1e-4) and fit["r2"] == pytest.approx(1.0)
    assert speedup.effective_tokens(fit, law(3e6)) == pytest.approx(3e6, rel=1e-3)
    assert speedup.effective_tokens(fit, 1.4) is None  # below the floor: no finite D
    assert speedup.fit_power_law(tokens[:2], [law(d) for d in tokens[:2]]) is None


@pytest.mark.parametrize("ratios,says", [([1.2, 1.25, 1.3], "faster"), ([0.8, 0.82, 0.79],
                                         "slower"), ([0.9, 1.1, 1.0], "not distinguishable"),
                                         ([1.4], "no verdict (one seed)")])
def test_the_verdict_needs_the_interval_clear_of_one(ratios, says):
    assert speedup.verdict(ratios)["verdict"] == says


def cell(optimizer, seed, loss, rows, budget=None, lr=1e-3):
    axes = {"optimizer": optimizer, "pruning": "none", "target_sparsity": None, "seed": seed}
    if budget is not None:
        axes["budget"] = budget
    return CellResult(cell=f"{optimizer}-{budget}-{seed}", axes=axes, status="completed",
                      final_val_loss=loss, grid={"lr": lr},
                      metrics=[{"step": i, "tokens": t, "val_loss": v}
                               for i, (t, v) in enumerate(rows)])


def best(optimizer, budget=None):
    row = {"optimizer": optimizer, "pruning": "none", "target_sparsity": None,
           "grid": {"lr": 1e-3}, "best": True}
    return row if budget is None else {**row, "budget": budget}


def test_each_seed_is_matched_on_the_same_seeds_baseline_curve():
    """Muon ends at 4.75 (seed 1) and 4.5 (seed 2) after 200 tokens; AdamW's curve
    reaches those at 250 and 300: speedups 1.25 and 1.5, mean 1.375."""
    cells = [cell("adamw", s, 4.2, CURVE) for s in (1, 2)]
    cells += [cell("muon", 1, 4.75, CURVE[:3]), cell("muon", 2, 4.5, CURVE[:3])]
    found = speedup.speedups(cells, [best("adamw"), best("muon")], "adamw")
    (row,) = found["tokens_to_match"]
    assert row["setting"] == "muon / none" and row["ratios"] == [1.25, 1.5]
    assert row["mean"] == pytest.approx(1.375) and not row["at_least"]
    assert row["ci95"] == pytest.approx(12.706 * math.sqrt(0.03125) / math.sqrt(2))
    assert found["fits"] == [] and found["d_eff"] == []


def test_with_three_budgets_d_eff_comes_from_the_baselines_fit():
    """AdamW's final losses lie on 2 D^-0.3 + 1.5 at 1, 2 and 4 M tokens; Muon's loss
    after 1 M tokens is AdamW's at 1.5 M: D_eff / D = 1.5 at every seed."""
    law = lambda d: 2.0 * d ** -0.3 + 1.5  # noqa: E731
    cells, rows = [], [best("adamw", b) for b in (1, 2, 4)] + [best("muon", 1)]
    for b in (1, 2, 4):
        for s in (1, 2):
            d = b * 1e6
            cells.append(cell("adamw", s, law(d), [(0, 10.0), (d, law(d))], budget=b))
    for s in (1, 2):
        cells.append(cell("muon", s, law(1.5e6), [(0, 10.0), (1e6, law(1.5e6))], budget=1))
    found = speedup.speedups(cells, rows, "adamw")
    (fit,) = found["fits"]
    assert fit["points"] == 6 and fit["b"] == pytest.approx(0.3, rel=1e-3)
    (row,) = found["d_eff"]
    assert row["budget"] == 1 and row["ratios"] == pytest.approx([1.5, 1.5], rel=1e-3)


def test_the_budget_fit_is_drawn_only_where_there_is_a_fit(tmp_path):
    from gpt2.matrix.plots import make_plots

    law = lambda d: 2.0 * d ** -0.3 + 1.5  # noqa: E731
    cells = [cell("adamw", s, law(b * 1e6) + 0.002 * s, [(0, 10.0), (b * 1e6, law(b * 1e6))],
                  budget=b) for b in (1, 2, 4) for s in (1, 2)]
    cells += [cell("muon", s, law(b * 1.5e6), [(0, 10.0), (b * 1e6, law(b * 1.5e6))], budget=b)
              for b in (1, 2, 4) for s in (1, 2)]
    rows = [best(o, b) for o in ("adamw", "muon") for b in (1, 2, 4)]
    fits = speedup.speedups(cells, rows, "adamw")["fits"]
    made = make_plots(cells, tmp_path / "a", fits=fits)
    assert "budget_fit.png" in [p.filename for p in made]
    assert (tmp_path / "a" / "budget_fit.png").stat().st_size > 10_000
    assert "budget_fit.png" not in [p.filename for p in make_plots(cells, tmp_path / "b")]
    assert not (tmp_path / "b" / "budget_fit.png").exists()


def test_a_d_eff_past_the_baselines_budgets_is_marked_as_extrapolated():
    law = lambda d: 2.0 * d ** -0.3 + 1.5  # noqa: E731
    cells, rows = [], [best("adamw", b) for b in (1, 2, 4)] + [best("muon", 4)]
    for b in (1, 2, 4):
        d = b * 1e6
        cells.append(cell("adamw", 1, law(d), [(0, 10.0), (d, law(d))], budget=b))
    # Muon after 4 M tokens is AdamW's 6 M: past AdamW's largest budget, 4 M
    cells.append(cell("muon", 1, law(6e6), [(0, 10.0), (4e6, law(6e6))], budget=4))
    (row,) = speedup.speedups(cells, rows, "adamw")["d_eff"]
    assert row["ratios"] == pytest.approx([1.5], rel=1e-3) and row["extrapolated"] == 1


@pytest.mark.parametrize("second,says", [(5.5, "not distinguishable"), (5.0, "at least as fast")])
def test_at_least_as_fast_needs_every_seeds_ratio_to_reach_one(second, says):
    """Muon's seed 1 ends below anything AdamW's curve reaches (4.0 after 200 tokens: a
    lower bound of 2); its seed 2 ends at 5.5 (AdamW's at 150 tokens: 0.75) or at 5.0
    (200 tokens: exactly 1). A bound lifts the verdict only when no seed is below 1: the
    mean of 2 and 0.75 is above 1, which a rule on the mean or on any seed would take."""
    cells = [cell("adamw", s, 4.2, CURVE) for s in (1, 2)]
    cells += [cell("muon", 1, 4.0, CURVE[:3]), cell("muon", 2, second, CURVE[:3])]
    (row,) = speedup.speedups(cells, [best("adamw"), best("muon")], "adamw")["tokens_to_match"]
    assert row["at_least"] and row["ratios"] == [2.0, 0.75 if second == 5.5 else 1.0]
    assert row["verdict"] == says
