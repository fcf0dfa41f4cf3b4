"""Cooldown branches (train.py --keep-steps / --branch-from): under WSD a shorter run
starts from a longer run's checkpoint where its own cooldown begins, and ends exactly
as if it had trained from step 0: what lets a matrix compare budgets while training
each stable phase once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import TINY, call_main, read_jsonl, run_py
from test_continue import folder, train as continue_train

pytestmark = pytest.mark.e2e  # every test here starts processes (tests/conftest.py)

# Dropout on, so the random generators are part of what must carry over; a cooldown
# of a quarter: a 20-step run cools down from step 15, a 40-step one from step 30.
WSD = ["--lr-schedule=wsd", "--wsd-cooldown=0.25", "--wsd-shape=sqrt", "--dropout=0.1",
       "--checkpoint-interval=7", "--run-name=b"]


def train(data_dir: Path, results: Path, *flags: str, check: bool = True):
    return continue_train(data_dir, results, *WSD, *flags, check=check)


def only(results: Path) -> Path:
    return folder(results, "b")


def curve(run: Path) -> list[tuple]:
    return [(r["step"], r.get("train_loss"), r.get("val_loss"), r.get("lr"), r.get("tokens"))
            for r in read_jsonl(run / "metrics.jsonl")]


@pytest.fixture(scope="module")
def longer(data_dir, tmp_path_factory) -> Path:
    """A 40-step WSD run that keeps step 15's checkpoint."""
    results = tmp_path_factory.mktemp("branch") / "long"
    train(data_dir, results, "--max-iters=40", "--keep-steps=15")
    return only(results)


def test_a_branched_run_ends_exactly_as_the_straight_run(longer, data_dir, tmp_path):
    kept = longer / "branches" / "step-00000015.pt"
    assert kept.is_file() and (longer / "branches" / "step-00000015.pt.sha256").is_file()
    assert (longer / "checkpoints").is_dir() and not (longer / "checkpoints" / kept.name).exists()
    proc = train(data_dir, tmp_path / "branched", "--max-iters=20", f"--branch-from={longer}")
    assert f"branching from {longer} at step 15" in proc.stdout
    train(data_dir, tmp_path / "straight", "--max-iters=20")
    branched, straight = only(tmp_path / "branched"), only(tmp_path / "straight")
    assert branched.name == straight.name  # one configuration: one hash
    assert curve(branched) == curve(straight)  # every loss and rate, exactly
    assert curve(branched)[:16] == curve(longer)[:16]  # its first 15 steps are the longer run's
    assert curve(branched)[-1][3] != curve(longer)[20][3]  # then its own cooldown
    mine = torch.load(branched / "ckpt.pt", weights_only=True)["model"]
    theirs = torch.load(straight / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert (branched / "samples.txt").read_text() == (straight / "samples.txt").read_text()
    a, b = (json.loads((d / "summary.json").read_text()) for d in (branched, straight))
    assert a["final_val_loss"] == b["final_val_loss"] and a["status"] == "completed"
    again = train(data_dir, tmp_path / "branched", "--max-iters=20", f"--branch-from={longer}")
    assert "already complete" in again.stdout  # the branch is its result, not another's
    parent = json.loads((branched / "provenance.json").read_text())["parent"]
    assert (parent["how"], parent["step"], parent["path"]) == ("branches", 15,
                                                               str(longer.resolve()))


COSINE = ["--dropout=0.1", "--checkpoint-interval=7", "--run-name=b"]


@pytest.mark.parametrize("base,flags,says", [
    (WSD, ("--learning-rate=2e-3",), "differs from the longer run in learning_rate"),
    (COSINE, (), "this run cannot branch: it is not a WSD run"),
    (WSD, ("--wsd-cooldown=0.5",), "differs from the longer run in wsd_cooldown"),
    (WSD, ("--max-iters=12",), "kept no intact checkpoint of step 9"),
    (WSD, ("--pruning-method=magnitude", "--target-sparsity=0.5", "--pruning-warmup=2",
           "--pruning-frequency=2"), "its pruning ramp is laid out over its own length"),
])
def test_a_run_that_would_not_be_the_same_is_refused(longer, data_dir, tmp_path, base, flags,
                                                     says):
    proc = call_main("gpt2/train.py", *TINY, f"--data-dir={data_dir}", f"--results-dir={tmp_path}",
                     *base, "--max-iters=20", *flags, f"--branch-from={longer}", check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr
    assert not list(tmp_path.glob("b-*/metrics.jsonl"))  # nothing trained
