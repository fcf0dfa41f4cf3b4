"""`make tensorboard`: event files for runs trained without the tracker, read back
with TensorBoard's own reader."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from helpers import read_jsonl, run_target
from gpt2.results import tensorboard

pytestmark = pytest.mark.e2e  # every test here starts processes (tests/conftest.py)

accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="tensorboard is in requirements.txt")


def scalars(folder: Path, tag: str) -> list[tuple[int, float, float]]:
    events = accumulator.EventAccumulator(str(folder))
    events.Reload()
    return [(e.step, e.value, e.wall_time) for e in events.Scalars(tag)]


def test_the_metrics_become_event_files_and_a_second_run_replaces_them(two_runs, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(two_runs[0], root, symlinks=True)
    config = tmp_path / "config"
    config.write_text(f'CONFIG_RESULTS_DIR="{root}"\n')
    proc = run_target("tensorboard", env={"KCONFIG_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stderr
    assert f"tensorboard --logdir {root}" in proc.stdout
    # the command runs as printed, nothing activated: the venv's own binary
    command, _, logdir = proc.stdout.split("View them: ")[1].split()[:3]
    assert command.endswith("/tensorboard") and os.access(command, os.X_OK), command
    # and each run once, though results/latest points at one of them
    assert (root / "latest").is_symlink() and logdir == str(root / tensorboard.VIEW)
    from tensorboard.backend.event_processing import io_wrapper

    seen = sorted(io_wrapper.GetLogdirSubdirectories(logdir))
    assert [os.path.realpath(p) for p in seen] == sorted(
        str((r / tensorboard.FOLDER).resolve()) for r in root.glob("lr*"))
    for run in root.glob("lr*"):
        rows = read_jsonl(run / "metrics.jsonl")
        got = scalars(run / tensorboard.FOLDER, "loss/val_loss")
        evals = [r for r in rows if "val_loss" in r]
        assert [(s, pytest.approx(v, rel=1e-6)) for s, v, _ in got] == \
            [(r["step"], r["val_loss"]) for r in evals]
        # Wall time: when each row happened (its elapsed_s after the run's start),
        # not when the file was written.
        gaps = [t - got[0][2] for _, _, t in got]
        assert gaps == pytest.approx([r["elapsed_s"] - evals[0]["elapsed_s"] for r in evals],
                                     abs=1e-3)
        assert [s for s, _, _ in scalars(run / tensorboard.FOLDER, "loss/train_loss")] == \
            [r["step"] for r in rows if "train_loss" in r]
        # tags in sections: losses apart from progress and speed, none left flat
        events = accumulator.EventAccumulator(str(run / tensorboard.FOLDER))
        events.Reload()
        tags = events.Tags()["scalars"]
        assert {"progress/elapsed_s", "progress/tokens", "optimizer/lr",
                "speed/tokens_per_sec"} <= set(tags) and all("/" in t for t in tags)
        # HParams: the run's settings, and its final loss to compare runs by
        content = events.PluginTagToContent("hparams")
        assert "_hparams_/session_start_info" in content
        assert b"learning_rate" in content["_hparams_/session_start_info"]
        final = scalars(run / tensorboard.FOLDER, "hparams/final_val_loss")
        assert final[-1][1] == pytest.approx(evals[-1]["val_loss"], rel=1e-6)
    # Again: the backfilled files are replaced, not doubled.
    proc = run_target("tensorboard", env={"KCONFIG_CONFIG": str(config)})
    run = next(root.glob("lr*"))
    assert len(list((run / tensorboard.FOLDER).glob("events.out.tfevents.*"))) == 1


def test_event_files_written_while_training_are_left_alone(two_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_runs[1][0], run)
    own = run / tensorboard.FOLDER
    own.mkdir()
    (own / "events.out.tfevents.1.host").write_bytes(b"the tracker's")
    proc = run_target("tensorboard", f"RUN={run}")
    assert proc.returncode == 0 and "kept" in proc.stdout and "0 run(s) written" in proc.stdout
    assert [p.name for p in own.iterdir()] == ["events.out.tfevents.1.host"]
