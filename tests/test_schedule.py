"""The learning-rate schedule against hand-computed values."""

import pytest

from gpt2.training.schedule import lr_at

KW = dict(lr=1.0, min_lr=0.1, warmup=4, total=104)


def test_warmup_is_linear_and_reaches_the_peak():
    assert [lr_at(s, **KW, decay=True) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


def test_cosine_goes_from_peak_through_midpoint_to_floor():
    assert lr_at(4, **KW, decay=True) == 1.0
    assert lr_at(54, **KW, decay=True) == pytest.approx(0.55)  # halfway: (1 + 0.1) / 2
    assert lr_at(104, **KW, decay=True) == pytest.approx(0.1)
    assert lr_at(500, **KW, decay=True) == pytest.approx(0.1)  # never below the floor


def test_no_decay_holds_the_peak_after_warmup():
    assert lr_at(1, **KW, decay=False) == 0.5
    assert lr_at(90, **KW, decay=False) == 1.0


def test_zero_warmup_starts_at_the_peak():
    assert lr_at(0, lr=1.0, min_lr=0.0, warmup=0, total=10, decay=True) == 1.0


def test_a_one_step_decay_reaches_the_floor_on_that_step():
    assert lr_at(4, lr=1.0, min_lr=0.1, warmup=4, total=5, decay=True) == 1.0
    assert lr_at(5, lr=1.0, min_lr=0.1, warmup=4, total=5, decay=True) == pytest.approx(0.1)
