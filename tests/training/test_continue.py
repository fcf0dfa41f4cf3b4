"""Runs that start from runs: CONFIG_INIT_FROM=<run folder> (weights, a new
optimizer from step 0) and CONFIG_EXTEND_FROM / `make extend` (a finished run
continued, with its whole state, to more steps), and CONFIG_SCHEDULE_ITERS, which
keeps an extension on its parent's schedule."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers import TINY, call_main, read_jsonl, run_make, run_py
from gpt2.training import provenance
from gpt2.training.schedule import lr_at


def train(data_dir: Path, results: Path, *flags: str, check: bool = True):
    return call_main("gpt2/train.py", *TINY, f"--data-dir={data_dir}", f"--results-dir={results}",
                     *flags, check=check)


def folder(results: Path, name: str) -> Path:
    (found,) = [p for p in results.glob(f"{name}-*") if p.is_dir()]
    return found


def curve(run: Path) -> list[tuple]:
    return [(r["step"], r.get("train_loss"), r.get("val_loss"), r.get("lr"), r.get("sparsity"))
            for r in read_jsonl(run / "metrics.jsonl")]


@pytest.fixture(scope="module")
def parent(data_dir, tmp_path_factory) -> Path:
    """A finished, pruned 20-step run with dropout (so the random generators matter)."""
    results = tmp_path_factory.mktemp("continue") / "results"
    train(data_dir, results, "--run-name=parent", "--max-iters=20", "--dropout=0.1",
          "--pruning-method=magnitude", "--target-sparsity=0.5", "--pruning-warmup=2",
          "--pruning-frequency=2", "--pruning-end=0.5")
    return folder(results, "parent")


@pytest.mark.e2e
def test_an_extension_continues_exactly_as_one_long_run_on_the_same_schedule(
        parent, data_dir, tmp_path):
    # (the new run goes to this checkout's results folder, CONFIG_RESULTS_DIR: here the
    # parent's, named as a user's .config would)
    proc = run_make("extend", f"RUN={parent}",
                    f"TRAIN_ARGS=--max-iters=30 --results-dir={parent.parent}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"extending {parent} from step 20 to 30" in proc.stdout
    (child,) = [p for p in parent.parent.glob("parent-*") if p != parent and p.is_dir()]
    # The same training, straight through: 30 steps, the schedules laid over 20.
    train(data_dir, tmp_path / "straight", "--run-name=parent", "--max-iters=30",
          "--dropout=0.1", "--pruning-method=magnitude", "--target-sparsity=0.5",
          "--pruning-warmup=2", "--pruning-frequency=2", "--pruning-end=0.5",
          "--schedule-iters=20")
    straight = folder(tmp_path / "straight", "parent")
    assert curve(child) == curve(straight)  # every loss, rate and sparsity, exactly
    # Its first steps continue the parent's curve (the parent's rows come first).
    assert curve(child)[:len(curve(parent))] == curve(parent)
    # Past the parent's 20 steps the learning rate stays at min_lr (TINY: 3e-4).
    assert {r["lr"] for r in read_jsonl(child / "metrics.jsonl") if r["step"] > 20} == {3e-4}
    record = json.loads((child / "provenance.json").read_text())["parent"]
    assert record["how"] == "extends" and record["path"] == str(parent.resolve())
    assert record["step"] == 20 and len(record["sha256"]) == 64
    config = json.loads((child / "config.json").read_text())
    assert config["schedule_iters"] == 20 and config["max_iters"] == 30
    summary = json.loads((child / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["iters"] == 30


def test_past_the_schedule_the_rate_stays_at_min_lr():
    kw = dict(lr=3e-3, min_lr=3e-4, warmup=3)
    # The cosine over steps 3..20 (17 steps after warmup), then the floor.
    assert lr_at(19, total=20, **kw) == pytest.approx(
        3e-4 + 0.5 * (1 + math.cos(math.pi * 16 / 17)) * 2.7e-3)
    assert [lr_at(s, total=20, **kw) for s in range(20, 30)] == [3e-4] * 10


@pytest.mark.e2e
@pytest.mark.parametrize("flags,says", [
    (("--max-iters=30", "--learning-rate=1e-2"),
     "differs from its parent in learning_rate"),
    (("--max-iters=20",), "has trained 20 already"),
    ((), "needs its new length"),
])
def test_an_extension_that_would_change_the_run_is_refused(parent, flags, says):
    before = sorted(p.name for p in parent.parent.iterdir())
    proc = call_main("gpt2/train.py", f"--extend-from={parent}", *flags)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert sorted(p.name for p in parent.parent.iterdir()) == before  # no folder left


@pytest.mark.e2e
def test_an_unfinished_run_cannot_be_extended(data_dir, tmp_path):
    train(data_dir, tmp_path / "r", "--run-name=cut", "--max-iters=20", "--stop-at-step=10",
          check=False)
    proc = call_main("gpt2/train.py", f"--extend-from={folder(tmp_path / 'r', 'cut')}",
                     "--max-iters=30")
    assert proc.returncode == 2 and "is not a finished run" in proc.stderr


@pytest.mark.e2e
def test_init_from_a_run_takes_its_weights_and_starts_a_new_optimizer(parent, data_dir,
                                                                       tmp_path):
    proc = train(data_dir, tmp_path / "r", "--run-name=tuned", "--max-iters=10",
                 "--learning-rate=1e-3", f"--init-from={parent}")
    assert f"weights from {parent} (step 20, weights only" in proc.stdout
    child = folder(tmp_path / "r", "tuned")
    rows = read_jsonl(child / "metrics.jsonl")
    # Step 0 evaluates the parent's final weights: the parent's final validation loss.
    assert rows[0]["step"] == 0
    assert rows[0]["val_loss"] == json.loads((parent / "summary.json").read_text())[
        "final_val_loss"]
    assert json.loads((child / "provenance.json").read_text())["parent"]["how"] == "weights"
    # A run of another shape is refused, naming the setting.
    proc = train(data_dir, tmp_path / "r", "--run-name=wide", "--max-iters=10",
                 "--n-embd=64", f"--init-from={parent}", check=False)
    assert proc.returncode == 2 and "n_embd=32" in proc.stderr


def test_a_changed_parent_is_a_changed_result():
    base = {"code": {"sources": "s", "torch": "t"}, "data": {"dataset": "d", "tokens": "x"}}
    then = {**base, "parent": {"path": "/r/p", "sha256": "a" * 64, "step": 20}}
    now = {**base, "parent": {"path": "/r/p", "sha256": "b" * 64, "step": 40}}
    assert provenance.changes(then, then) == []
    (line,) = provenance.changes(then, now)
    assert line.startswith("parent run: /r/p then had checkpoint aaaaaaaaaaaaaaaa (step 20)")
    assert provenance.key(then) != provenance.key(now)
