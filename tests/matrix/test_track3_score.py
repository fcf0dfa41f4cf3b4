"""Track 3's significance rules (gpt2/matrix/track3.py) on the worked examples of its
README (records/track_3_optimization/README.md, "Rules" and "Pairwise statistical
significance", KellerJordan/modded-nanogpt at f411b3d)."""

from __future__ import annotations

import pytest

from gpt2.matrix import track3


def test_one_run_below_3276_and_four_averaging_below_3278_are_valid():
    """"for a single non-cherry-picked run, any val loss below 3.276 suffices, and for
    n=4 runs, any average below 3.278 suffices"."""
    assert track3.reaches_target(3.2759, 1) and not track3.reaches_target(3.2761, 1)
    assert track3.reaches_target(3.2779, 4) and not track3.reaches_target(3.2781, 4)
    # the margin is the rule's left-hand side: (3.28 - 3.2787) x sqrt(10), result #36
    assert track3.margin(3.2787, 10) == pytest.approx(0.0013 * 10 ** 0.5)


def test_pairwise_rule_on_the_readmes_calculations():
    # "#13 ... Against result #11, a difference of 15 steps, with final loss being the
    # same ... n=16 and n=10 ... the LHS is 0.00167, which does not reach statsig"
    lhs = track3.pairwise(3.2785, 10, 3210, 3.2785, 16, 3225)
    assert lhs == pytest.approx(0.00167, abs=5e-6)
    assert not track3.significantly_better(3.2785, 10, 3210, 3.2785, 16, 3225)
    # "against result #8 ... ((3.2778 - 3.2785) + (40/100 * 0.0045)) / (1/10 + 1/16)**0.5
    # = 0.0027"
    assert track3.pairwise(3.2785, 16, 3210, 3.2778, 10, 3250) == pytest.approx(0.0027,
                                                                               abs=5e-5)
    # "for the Muon hparams in result #12 vs #6, final_loss_diff = -0.0002,
    # exp_stepbased_loss_diff = 50/100*0.0045 = 0.00225, n1 = n2 = 20 ... 0.00648, which
    # is above 0.004"
    assert track3.pairwise(3.2790, 20, 3325, 3.2788, 20, 3375) == pytest.approx(0.00648,
                                                                               abs=5e-6)
    assert track3.significantly_better(3.2790, 20, 3325, 3.2788, 20, 3375)
    # "#11 ... lowers step count by 25 while increasing estimated mean val loss by
    # 0.0014 ... worth about 31 steps, which is greater than the step saving"
    assert track3.pairwise(3.2785, 16, 3225, 3.2771, 8, 3250) < 0


def test_the_score_is_the_earliest_step_whose_mean_passes():
    losses = {3000: [3.2850, 3.2860, 3.2840],
              3100: [3.2790, 3.2770, 3.2790],   # mean 3.2783: (0.0017) x sqrt 3 = 0.0029
              3150: [3.2770, 3.2760, 3.2770],   # mean 3.27667: 0.0058: passes
              3175: [3.2750, 3.2760],           # one seed missing: skipped
              3250: [3.2755, 3.2750, 3.2760]}
    s = track3.score(losses, 3250)
    assert (s.runs, s.valid, s.earliest_step) == (3, True, 3150)
    assert s.mean_loss == pytest.approx(3.2755)
    failing = track3.score({100: [3.30, 3.31], 200: [3.279, 3.2795]}, 200)
    assert not failing.valid and failing.earliest_step is None


def _cell(optimizer, seed, losses, step=25):
    from gpt2.matrix.results import CellResult
    axes = {"optimizer": optimizer, "pruning": "none", "target_sparsity": None, "seed": seed}
    return CellResult(cell=f"{optimizer}-{seed}", axes=axes, status="completed",
                      final_val_loss=losses[-1], grid={"lr": 1e-3},
                      metrics=[{"step": (i + 1) * step, "tokens": (i + 1) * step * 100,
                                "val_loss": v} for i, v in enumerate(losses)])


def _best(optimizer):
    return {"optimizer": optimizer, "pruning": "none", "target_sparsity": None,
            "grid": {"lr": 1e-3}, "best": True}


def test_a_matrix_is_scored_per_tuned_setting_and_against_its_baseline():
    """Two seeds each; Muon passes 3.28 at step 75 (mean 3.2765: margin 0.0049), AdamW
    only at its end, step 100 (mean 3.2745); each seed's first step at or below the
    target; the pairwise rule at equal steps is AdamW's loss minus Muon's over sqrt(1)."""
    cells = [_cell("adamw", 1, [3.40, 3.30, 3.281, 3.2745]),
             _cell("adamw", 2, [3.41, 3.31, 3.282, 3.2745]),
             _cell("muon", 1, [3.35, 3.285, 3.2765, 3.2700]),
             _cell("muon", 2, [3.36, 3.29, 3.2765, 3.2690])]
    rows = {r["optimizer"]: r for r in track3.target_rows(cells, [_best("adamw"), _best("muon")],
                                                          "adamw", 3.28)}
    adamw, muon = rows["adamw"], rows["muon"]
    assert (adamw["score"].steps, adamw["score"].earliest_step, adamw["score"].valid) == \
        (100, 100, True)
    assert muon["score"].earliest_step == 75
    assert muon["first"] == [(75, 7500), (75, 7500)] and adamw["first"][0] == (100, 10000)
    assert "pairwise" not in adamw
    assert muon["pairwise"] == pytest.approx((3.2745 - 3.2695) / 1.0)


def test_the_rules_pass_at_their_bound_and_use_the_target_given():
    """A margin of exactly 0.004 passes (">= 0.004"), in the test and the pairwise rule
    (n1 = n2 = 2: the denominator is 1); and every score uses the target it is given,
    not 3.28: at 6.3 a mean of 6.2 over 4 seeds has the margin 0.2."""
    assert track3.margin(0.0, 1, target=0.004) == track3.SIGNIFICANT_MARGIN
    assert track3.reaches_target(0.0, 1, target=0.004)
    assert track3.pairwise(0.0, 2, 100, 0.004, 2, 100) == track3.SIGNIFICANT_MARGIN
    assert track3.significantly_better(0.0, 2, 100, 0.004, 2, 100)
    s = track3.score({100: [6.5, 6.4, 6.6, 6.5], 200: [6.25, 6.2, 6.15, 6.2]}, 200, target=6.3)
    assert (s.valid, s.earliest_step) == (True, 200)
    assert s.margin == pytest.approx(0.1 * 2)
    # (against 3.28 nothing here would pass, and the margin would be negative)
    assert not track3.score({200: [6.2]}, 200).valid


def test_a_seed_s_first_step_at_or_below_the_target():
    rows = [{"step": 0, "tokens": 0, "val_loss": 10.8}, {"step": 10, "train_loss": 6.0},
            {"step": 20, "tokens": 2048, "val_loss": 6.3}, {"step": 30, "val_loss": 6.1}]
    assert track3.first_below(rows, 6.3) == (20, 2048)  # at the target counts
    assert track3.first_below(rows, 6.2) == (30, 0)  # a row without tokens: 0
    assert track3.first_below(rows, 6.0) is None


def test_settings_without_a_best_point_or_completed_seeds_are_skipped_not_the_rest():
    """A setting listed before the others with no best point, with none of its cells
    completed, or with no evaluation recorded, leaves the settings after it scored."""
    silent = _cell("sgd", 1, [9.0])
    silent.metrics[:] = [{"step": 25, "tokens": 2500, "train_loss": 9.0}]  # no evaluation
    cells = [_cell("muon", 1, [3.30, 3.27]), _cell("muon", 2, [3.30, 3.27]), silent]
    unfinished = {**_best("lion"), "best": False}
    no_cells = _best("adamw")
    rows = track3.target_rows(cells, [unfinished, no_cells, _best("sgd"), _best("muon")],
                              "adamw", 3.305)
    assert [r["setting"] for r in rows] == ["muon / none"]
    # (the target given, 3.305, is passed at step 25: 3.28 only at 50)
    assert rows[0]["score"].earliest_step == 25 and rows[0]["first"] == [(25, 2500)] * 2


def test_the_target_setting_is_a_positive_loss_or_empty():
    from gpt2.config import matrix

    assert matrix.parse_target_loss(" 3.28 ") == 3.28 and matrix.parse_target_loss("") is None
    for bad in ("abc", "-1", "0", "nan"):
        with pytest.raises(ValueError):
            matrix.parse_target_loss(bad)
