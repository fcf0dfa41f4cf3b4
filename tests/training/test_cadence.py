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


def track3_validates(step: int, train_steps: int) -> bool:
    """train_gpt_simple.py (modded-nanogpt track 3): val_step_freq = 125 if
    step / train_steps < 0.9 else 25; evaluate if step == train_steps or
    step % val_step_freq == 0."""
    val_step_freq = 125 if step / train_steps < 0.9 else 25
    return step == train_steps or step % val_step_freq == 0


def test_the_late_interval_is_track3s_evaluation_cadence():
    """From the last 10 % on, every 25 steps: track 3's cadence, step for step, for its
    baselines' lengths and one where 90 % falls between two multiples of 25."""
    for steps in (3250, 5625, 3210, 1001):
        cadence = Cadence(eval_interval=125, hellaswag_interval=1, last_step=steps,
                          hellaswag=False, late_interval=25, late_fraction=0.1)
        ours = [s for s in range(1, steps + 1) if cadence.validates(s)]
        assert ours == [s for s in range(1, steps + 1) if track3_validates(s, steps)], steps
    late = Cadence(eval_interval=125, hellaswag_interval=1, last_step=3250, hellaswag=False,
                   late_interval=25)
    assert [s for s in range(2900, 3001) if late.validates(s)] == [2925, 2950, 2975, 3000]
    assert Cadence(125, 1, 3250, False).validates(2950) is False  # no late interval set
