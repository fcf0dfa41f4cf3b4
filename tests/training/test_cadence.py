"""When the loop evaluates (gpt2/training/evaluation.py's Cadence): the validation
loss on its interval and at the last step, HellaSwag on its own interval and at the
last step when it has examples, and which evaluations fell on an interval."""

from __future__ import annotations

from gpt2.training.evaluation import Cadence


def test_validation_and_hellaswag_keep_their_own_intervals_and_both_run_at_the_end():
    cadence = Cadence(eval_interval=4, hellaswag_interval=6, last_step=10, hellaswag=True)
    steps = range(1, 11)
    assert [s for s in steps if cadence.validates(s)] == [4, 8, 10]
    assert [s for s in steps if cadence.scores(s)] == [6, 10]
    # the last step's extra evaluations end the run: no memory to hand back after them
    assert [s for s in steps if cadence.on_interval(s)] == [4, 6, 8]


def test_without_examples_hellaswag_never_runs():
    cadence = Cadence(eval_interval=4, hellaswag_interval=6, last_step=12, hellaswag=False)
    assert not any(cadence.scores(s) for s in range(1, 13))
    assert [s for s in range(1, 13) if cadence.on_interval(s)] == [4, 8, 12]
