"""The learning-rate schedules against hand-computed values and against transcriptions
of the reference code they follow (modded-nanogpt's and nanochat's WSD)."""

import math

import pytest

from gpt2.config.choices import LR_SCHEDULES, WSD_SHAPES
from gpt2.training.schedule import SCHEDULES, lr_at, schedule_of

KW = dict(lr=1.0, min_lr=0.1, warmup=4, total=104)


def test_warmup_is_linear_and_reaches_the_peak():
    for schedule in LR_SCHEDULES:
        assert [lr_at(s, **KW, schedule=schedule) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


def test_cosine_goes_from_peak_through_midpoint_to_floor():
    assert lr_at(4, **KW) == 1.0
    assert lr_at(54, **KW) == pytest.approx(0.55)  # halfway: (1 + 0.1) / 2
    assert lr_at(29, **KW) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))
    assert lr_at(104, **KW) == pytest.approx(0.1)
    assert lr_at(500, **KW) == pytest.approx(0.1)  # never below the floor


def test_constant_holds_the_peak_after_warmup():
    assert lr_at(1, **KW, schedule="constant") == 0.5
    assert [lr_at(s, **KW, schedule="constant") for s in (4, 90, 104, 500)] == [1.0] * 4


def test_linear_goes_straight_from_peak_to_floor():
    assert [lr_at(s, **KW, schedule="linear") for s in (4, 29, 54, 104, 200)] == \
        pytest.approx([1.0, 0.775, 0.55, 0.1, 0.1])


@pytest.mark.parametrize("shape,left", [("linear", lambda p: 1 - p),
                                        ("sqrt", lambda p: 1 - math.sqrt(p)),
                                        ("cosine", lambda p: (1 + math.cos(math.pi * p)) / 2)])
def test_wsd_is_stable_then_cools_down_over_its_fraction(shape, left):
    """100 steps, warmup 4, cooldown 0.25: the peak through step 74, then the shape
    from the peak at step 75 to the floor at step 100."""
    kw = dict(lr=1.0, min_lr=0.1, warmup=4, total=100, schedule="wsd", cooldown=0.25,
              shape=shape)
    assert [lr_at(s, **kw) for s in range(4, 76)] == [1.0] * 72
    for step in range(75, 101):
        p = (step - 75) / 25
        assert lr_at(step, **kw) == pytest.approx(0.1 + 0.9 * left(p)), step
    assert lr_at(130, **kw) == pytest.approx(0.1)


def test_wsd_runs_of_different_lengths_share_their_stable_phase():
    """What makes budgets cheap: a 200-step and a 400-step WSD run agree at every step
    before the shorter one's cooldown."""
    short = dict(lr=1.0, min_lr=0.0, warmup=10, total=200, schedule="wsd", cooldown=0.2)
    long = {**short, "total": 400}
    assert [lr_at(s, **short) for s in range(160)] == [lr_at(s, **long) for s in range(160)]
    assert lr_at(170, **short) < lr_at(170, **long) == 1.0


def test_a_cooldown_longer_than_the_time_after_warmup_starts_after_warmup():
    kw = dict(lr=1.0, min_lr=0.0, warmup=8, total=10, schedule="wsd", cooldown=0.5)
    assert lr_at(7, **kw) == 1.0 and lr_at(8, **kw) == 1.0
    assert lr_at(9, **kw) == pytest.approx(0.5) and lr_at(10, **kw) == 0.0


# ---- the reference code, transcribed -----------------------------------------------

def modded_nanogpt_get_lr(step: int, num_iterations: int, cooldown_frac: float) -> float:
    """KellerJordan/modded-nanogpt train_gpt.py (2025): stable, then a linear cooldown
    to 0.1 of the peak over the last cooldown_frac of the run (no warmup)."""
    x = step / num_iterations
    assert 0 <= x < 1
    if x < 1 - cooldown_frac:
        return 1.0
    w = (1 - x) / cooldown_frac
    return w * 1.0 + (1 - w) * 0.1


def nanochat_get_lr_multiplier(it, num_iterations, warmup_ratio, warmdown_ratio,
                               final_lr_frac):
    """karpathy/nanochat scripts/base_train.py: linear warmup, stable, linear warmdown
    to final_lr_frac of the peak."""
    warmup_iters = round(warmup_ratio * num_iterations)
    warmdown_iters = round(warmdown_ratio * num_iterations)
    if it < warmup_iters:
        return (it + 1) / warmup_iters
    elif it <= num_iterations - warmdown_iters:
        return 1.0
    progress = (num_iterations - it) / warmdown_iters
    return progress * 1.0 + (1 - progress) * final_lr_frac


def test_wsd_linear_is_modded_nanogpts_schedule():
    for n, frac in ((1000, 0.45), (1770, 0.4), (80, 0.25)):
        ours = [lr_at(s, lr=1.0, min_lr=0.1, warmup=0, total=n, schedule="wsd",
                      cooldown=frac) for s in range(n)]
        assert ours == pytest.approx([modded_nanogpt_get_lr(s, n, frac) for s in range(n)],
                                     abs=1e-12)


def test_wsd_linear_is_nanochats_schedule():
    for n, warmup, warmdown, final in ((100, 0.1, 0.2, 0.0), (57, 0.0, 0.2, 0.05),
                                       (300, 0.02, 0.5, 0.1)):
        ours = [lr_at(s, lr=2.0, min_lr=2.0 * final, warmup=round(warmup * n), total=n,
                      schedule="wsd", cooldown=warmdown) for s in range(n)]
        ref = [2.0 * nanochat_get_lr_multiplier(s, n, warmup, warmdown, final)
               for s in range(n)]
        assert ours == pytest.approx(ref, abs=1e-12)


def test_every_schedule_and_shape_is_registered_and_configurable():
    assert tuple(SCHEDULES) == LR_SCHEDULES and "sqrt" in WSD_SHAPES


def test_a_record_from_before_lr_schedule_reads_as_cosine_or_constant():
    old = {"learning_rate": 1.0, "min_lr": 0.1, "warmup_iters": 4, "decay_lr": True}
    assert schedule_of(old)["schedule"] == "cosine"
    assert schedule_of({**old, "decay_lr": False})["schedule"] == "constant"
    new = {**old, "lr_schedule": "wsd", "wsd_cooldown": 0.3, "wsd_shape": "sqrt"}
    assert schedule_of(new) == {"lr": 1.0, "min_lr": 0.1, "warmup": 4, "schedule": "wsd",
                                "cooldown": 0.3, "shape": "sqrt"}


@pytest.mark.e2e
def test_every_parameter_group_follows_the_schedule_muons_own_rate_included(tmp_path,
                                                                           data_dir):
    """A Muon run under WSD (sqrt cooldown over half its 30 steps): the logged rate is the
    schedule's at every step, and the checkpoint's groups (Muon's hidden matrices at
    muon_lr, its AdamW part at the learning rate) hold the last update's rate times
    their own scale."""
    import torch
    from helpers import only_run_dir, read_jsonl, train_tiny

    train_tiny(data_dir, tmp_path, "--optimizer=muon", "--muon-lr=0.02", "--lr-schedule=wsd",
               "--wsd-cooldown=0.5", "--wsd-shape=sqrt")
    run = only_run_dir(tmp_path)
    kw = dict(lr=3e-3, min_lr=3e-4, warmup=3, total=30, schedule="wsd", cooldown=0.5,
              shape="sqrt")
    lrs = {r["step"]: r["lr"] for r in read_jsonl(run / "metrics.jsonl") if "train_loss" in r}
    assert lrs == pytest.approx({s: lr_at(s - 1, **kw) for s in range(1, 31)}, rel=1e-12)
    assert lrs[10] == 3e-3 and lrs[30] < 6e-4  # stable, then cooled down
    groups = torch.load(run / "ckpt.pt", weights_only=True)["optimizer"]["param_groups"]
    last = lr_at(29, **kw)
    assert {round(g["lr_scale"], 12) for g in groups} == {1.0, round(0.02 / 3e-3, 12)}
    for g in groups:
        assert g["lr"] == pytest.approx(last * g["lr_scale"], rel=1e-12)


# ---- cooldown branches: when a run may start from a longer one -------------------------

def wsd(**kw):
    from gpt2.config.options import Config

    return Config(**{"lr_schedule": "wsd", "max_iters": 100, "warmup_iters": 10,
                     "wsd_cooldown": 0.2, **kw})


def test_a_wsd_run_branches_where_its_cooldown_begins():
    from gpt2.training.schedule import branch_step

    assert branch_step(wsd()) == 80 and branch_step(wsd(max_iters=40)) == 32
    assert branch_step(wsd(wsd_cooldown=0.95)) == 10  # (never inside the warmup)
    assert branch_step(wsd(wsd_cooldown=1.0, warmup_iters=0)) is None  # from step 0: nothing shared
    for other in (dict(lr_schedule="cosine"), dict(schedule_iters=100), dict(epochs=1.0),
                  dict(max_iters=0)):
        assert branch_step(wsd(**other)) is None, other


@pytest.mark.parametrize("parent,child,says", [
    (dict(max_iters=200), {}, None),
    (dict(max_iters=200), dict(learning_rate=1e-3), "differs from the longer run in learning_rate"),
    (dict(max_iters=200), dict(wsd_shape="sqrt"), "differs from the longer run in wsd_shape"),
    (dict(max_iters=200), dict(pruning_method="magnitude", target_sparsity=0.5),
     "pruning ramp is laid out over its own length"),
    (dict(max_iters=80), {}, "does not reach step 80"),
    (dict(max_iters=200), dict(lr_schedule="cosine"), "is not a WSD run"),
    (dict(max_iters=200, wsd_cooldown=0.6), {}, "differs from the longer run in wsd_cooldown"),
    (dict(max_iters=200, run_name="other", checkpoint_interval=7), {}, None),
    # AdEMAMix's warmups over the run's own length differ with it; set in steps, not
    (dict(max_iters=200, optimizer="ademamix"), dict(optimizer="ademamix"),
     "warmups span its own length"),
    (dict(max_iters=200, optimizer="ademamix", ademamix_warmup=50),
     dict(optimizer="ademamix", ademamix_warmup=50), None),
])
def test_a_branch_is_refused_unless_it_is_the_same_run(parent, child, says):
    from gpt2.training.schedule import branch_problem

    problem = branch_problem(wsd(**parent), wsd(**child))
    assert problem is None if says is None else says in problem


def test_equal_settings_with_unequal_rates_before_the_branch_are_refused(monkeypatch):
    """The last guard: every rate before the branch step must be equal, whatever made
    them differ (here a schedule function that depends on the length)."""
    from gpt2.training import schedule

    real = schedule.lr_at
    monkeypatch.setattr(schedule, "lr_at",
                        lambda step, **kw: real(step, **kw) * (1 + kw["total"] * 1e-9))
    assert "the learning rates differ before step 80" in schedule.branch_problem(
        wsd(max_iters=200), wsd())
