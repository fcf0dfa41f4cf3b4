"""A run's result files (summary.json, metrics.jsonl, ckpt.pt) are read back as
what they are, never blindly: a damaged summary is not a completed run, a summary
that its checkpoint contradicts is not believed, a cut metrics line costs only
itself, a checkpoint of another configuration is not sampled, and the same tokens
cut into other shards are the same data (docs/reliability.md, promise 14)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
from helpers import TINY, call_main, checkpoint_state, only_run_dir, synthetic_corpus

from gpt2.config.options import Config
from gpt2.training import checkpoint, provenance
from gpt2.runtime import launch
from gpt2 import run_folder
from gpt2.run_folder import RunDir, Summary, scan_metrics

SUMMARY = Summary(status="completed", iters=12, max_iters=12, config_hash="x",
                  final_val_loss=1.0)


def run_dir(tmp_path: Path) -> RunDir:
    """A run folder laid out as a matrix cell's, so the runner can judge it too."""
    run = RunDir(Config(results_dir=str(tmp_path), run_name="tiny"), tmp_path / "cells" / "c1")
    run.path.mkdir(parents=True)
    return run


def save_checkpoint(run_path: Path, step: int, max_iters: int = 12, **more) -> Path:
    """A checkpoint with every entry a save requires, empty unless given."""
    return checkpoint.save(run_path / "ckpt.pt", checkpoint_state(step, max_iters, **more), step)


def bridge():
    """The make bridge's matrix targets (plots and report redraw a single run too)."""
    from gpt2.cli import matrix_commands

    return matrix_commands


# ---- summary.json: written durably, read defensively -------------------------------------

def test_the_summary_is_fsynced_before_and_after_its_rename(tmp_path, monkeypatch):
    run = run_dir(tmp_path)
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(
        f"/proc/self/fd/{fd}")), real(fd))[1])
    run.write_summary(SUMMARY)
    assert len(synced) == 2 and synced[0].endswith(".tmp") and synced[1] == str(run.path)
    assert run.summary() == SUMMARY


def test_the_summary_has_one_schema(tmp_path):
    """summary.json is read and written through Summary: a name outside the schema is
    an error, not a silent None; fields a run did not record are None; figures only
    some runs have (HellaSwag, an error) are written only when they have them."""
    assert SUMMARY.get("final_val_loss") == 1.0 and SUMMARY.get("mfu", "n/a") == "n/a"
    with pytest.raises(KeyError, match="final_val_los"):
        SUMMARY.get("final_val_los")
    written = SUMMARY.to_dict()
    assert list(written)[:3] == ["status", "iters", "max_iters"]
    assert "error" not in written and "hellaswag_acc" not in written and written["mfu"] is None
    assert "error" in dataclasses.replace(SUMMARY, error="boom").to_dict()
    again = Summary.from_dict({**written, "from_another_version": 1})
    assert again == SUMMARY


def test_only_a_completed_summary_is_doubted_and_the_final_step_falls_back_to_max_iters(
        tmp_path):
    """A failed or interrupted summary makes no claim for the checkpoint to contradict;
    with the checkpoint's own final step unreadable, the summary's max_iters (not its
    iters, which a hand edit may have changed) is the final step."""
    run = run_dir(tmp_path)
    save_checkpoint(run.path, 4)
    for status in ("failed", "interrupted"):
        run.write_summary(dataclasses.replace(SUMMARY, status=status))
        assert run.completion_problem() is None and not run.completed()
    damaged = save_checkpoint(run.path, 12)
    damaged.write_bytes(b"PK\x03\x04 cut short")
    run.write_summary(dataclasses.replace(SUMMARY, iters=4))  # max_iters 12, iters 4
    assert run.completion_problem() is None and run.completed()
    run.write_summary(dataclasses.replace(SUMMARY, max_iters=None, iters=4))
    assert "is of step 12 of 4" in run.completion_problem()


def test_every_table_of_summary_names_is_of_the_schema():
    """The views that list summary.json's figures by name (the catalog's headline
    figures, the pages' index columns, a cell's CSV fields) name fields of Summary."""
    from gpt2.matrix.collect import SUMMARY_FIELDS
    from gpt2.results import catalog, pages

    names = {f.key for f in catalog.FIGURES} | set(pages.INDEX_FIGURES) | set(SUMMARY_FIELDS)
    assert names - set(run_folder.SUMMARY_KEYS) == set()


def test_one_test_of_complete_and_one_vocabulary_of_states(tmp_path):
    run = run_dir(tmp_path)
    assert run_folder.state(run.path) == run_folder.PENDING
    save_checkpoint(run.path, 4)
    assert run_folder.state(run.path) == run_folder.INTERRUPTED
    run.write_summary(SUMMARY)  # completed, 12 of 12, but its checkpoint is of step 4
    assert run_folder.state(run.path) == run_folder.INTERRUPTED
    save_checkpoint(run.path, 12)
    assert run_folder.state(run.path) == run_folder.COMPLETED
    assert run_folder.completed(run.path, "x") and not run_folder.completed(run.path, "y")
    assert run_folder.state(run.path, "y") == run_folder.INTERRUPTED  # another config's
    assert set(run_folder.STATES) == {"completed", "running", "queued", "failed",
                                      "interrupted", "pending"}


@pytest.mark.reliability
@pytest.mark.parametrize("damage", [b'{"status": "compl', b"\xff\xfe{}", b"[]", b""])
def test_a_damaged_summary_is_not_known_complete_and_is_kept(tmp_path, damage):
    run = run_dir(tmp_path)
    run.summary_path.write_bytes(damage)
    assert run.summary() is None and not run.completed() and run.summary_damaged()
    aside = run.set_aside_summary()
    assert aside.name == "summary.json.damaged-1" and aside.read_bytes() == damage
    assert not run.summary_path.exists() and not run.summary_damaged()


@pytest.mark.reliability
def test_a_completed_summary_must_agree_with_the_newest_checkpoint(tmp_path, monkeypatch):
    from gpt2.matrix.runner import cell_state

    run = run_dir(tmp_path)
    run.write_summary(SUMMARY)
    assert run.completed()  # no checkpoint left (deleted to save space): nothing contradicts it
    save_checkpoint(run.path, 4)
    monkeypatch.setattr(checkpoint.torch, "load", None)  # judged without loading it
    assert not run.completed()
    assert "the newest checkpoint (step-00000004.pt) is of step 4 of 12" in run.completion_problem()
    assert cell_state(tmp_path, "c1", "x") == "interrupted"  # as a matrix cell
    save_checkpoint(run.path, 12)
    assert run.completed() and run.completion_problem() is None
    assert cell_state(tmp_path, "c1", "x") == "completed"
    # The checkpoint's own max_iters is what counts, not the summary's.
    run.write_summary(dataclasses.replace(SUMMARY, iters=4, max_iters=4))
    save_checkpoint(run.path, 4)
    checkpoint.point(run.ckpt, run.path / "checkpoints" / "step-00000004.pt")
    assert "of step 4 of 12" in run.completion_problem()


class _Planted:
    """Unpickled by a trusting reader, this runs a command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoints_final_step_is_read_without_torch_and_runs_nothing(tmp_path):
    """The index reader gives the max_iters torch.load gives, for a real checkpoint; a
    planted pickle that would run a command on load runs nothing and is refused, as
    torch.load(weights_only=True) refuses it."""
    import pickle
    import zipfile

    import torch

    model = torch.nn.Linear(3, 2)  # a state_dict carries _metadata; rng states are ByteTensors
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    saved = save_checkpoint(tmp_path, 7, max_iters=30, model=model.state_dict(),
                            optimizer=optimizer.state_dict(), rng=[torch.get_rng_state()])
    assert run_folder.final_step(saved) == torch.load(saved, weights_only=True)["max_iters"] == 30
    marker = tmp_path / "ran"
    planted = tmp_path / "checkpoints" / "step-00000009.pt"
    with zipfile.ZipFile(planted, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"max_iters": 5, "x": _Planted(marker)}))
    assert run_folder.final_step(planted) is None and not marker.exists()
    pickle.loads(pickle.dumps(_Planted(marker)))  # (the planted object does run when trusted)
    assert marker.exists()
    for foreign in (b"", b"not a zip", b"PK\x03\x04 cut"):
        planted.write_bytes(foreign)
        assert run_folder.final_step(planted) is None


@pytest.mark.reliability
def test_an_unreadable_checkpoint_is_judged_by_its_step_and_the_summarys_max_iters(tmp_path):
    """A damaged checkpoint's index cannot say the run's final step, but its name still
    says its step: the summary's own max_iters (else its iters) is the final step
    then, so a "completed" whose newest checkpoint is of step 4 of 12 is still not
    believed, and one whose checkpoint is of step 12 still is."""
    run = run_dir(tmp_path)
    run.write_summary(SUMMARY)  # completed, 12 of 12
    damaged = save_checkpoint(run.path, 4)
    damaged.write_bytes(b"PK\x03\x04 cut short")
    assert run_folder.final_step(damaged) is None  # the fallback is what is under test
    assert not run.completed()
    assert "the newest checkpoint (step-00000004.pt) is of step 4 of 12" in \
        run.completion_problem()
    run.write_summary(dataclasses.replace(SUMMARY, max_iters=None))
    assert "is of step 4 of 12" in run.completion_problem()
    save_checkpoint(run.path, 12).write_bytes(b"")
    assert run.completed() and run.completion_problem() is None


@pytest.mark.reliability
def test_launch_judges_by_a_readable_summary_only(tmp_path, monkeypatch, capsys):
    """The torchrun launcher, with a stand-in for torchrun."""
    summary = tmp_path / "summary.json"

    def launch_with(worker: str) -> int:
        monkeypatch.setattr(launch, "torchrun_command",
                            lambda *a, **k: [sys.executable, "-c", worker])
        return launch.launch("train.py", [], 2, tmp_path)

    # A worker that crashed leaving a garbled summary: a failure, said in one line.
    rc = launch_with(f"import pathlib, sys; pathlib.Path({str(summary)!r})"
                     ".write_bytes(b'\\xff\\xfe{{'); sys.exit(1)")
    assert rc == 1 and "failed in one of its 2 processes" in capsys.readouterr().err
    # Workers that found the run already complete exit 0 and write nothing new.
    summary.write_text(json.dumps(SUMMARY.to_dict()))
    os.utime(summary, (0, 0))
    assert launch_with("pass") == 0
    save_checkpoint(tmp_path, 4)  # ... unless its checkpoint says it is not complete
    assert launch_with("pass") == 1


# ---- metrics.jsonl: a cut line costs only itself -----------------------------------------

def rows_text(steps) -> str:
    return "".join(json.dumps({"step": s, "train_loss": 10.0 - s}) + "\n" for s in steps)


@pytest.mark.reliability
def test_a_cut_metrics_line_keeps_every_intact_row(tmp_path, capsys):
    run = run_dir(tmp_path)
    run.metrics.write_text(rows_text([0, 1]) + '{"step": 2, "train_lo\n' + rows_text([3, 4, 5])
                           + "[1, 2]\n" + '{"step": 6, "tr')
    rows, skipped = scan_metrics(run.metrics)
    assert [r["step"] for r in rows] == [0, 1, 3, 4, 5] and skipped == 3
    assert run.truncate_metrics(4) == 3  # resuming from step 4
    assert run.metrics.read_text() == rows_text([0, 1, 3, 4])
    # make plots on a run whose metrics end in a cut line and whose summary is damaged
    run.metrics.write_text(rows_text([0, 1, 2]) + '{"step": 3, "trai')
    run.summary_path.write_text('{"status": "comp')
    assert bridge().replot_single_run(run.path) == 0
    out = capsys.readouterr().out
    assert "skipped 1 damaged line(s)" in out and "plotted its 3 intact rows" in out
    assert "summary.json cannot be read (damaged)" in out and (run.path / "loss.png").is_file()


# ---- the matrix's tables --------------------------------------------------------------------

@pytest.mark.reliability
def test_collect_leaves_unbelievable_summaries_out_of_the_ranking(tmp_path):
    from fake_matrices import fake_matrix

    from gpt2.matrix.collect import collect, load_cells

    folder = fake_matrix(tmp_path, seeds=(1,), losses={"adamw-none-seed1": 1.0})
    cells = folder / "cells"
    save_checkpoint(cells / "adamw-none-seed1", 4, max_iters=20)  # "completed" at step 4 of 20
    (cells / "adamw-magnitude-50-seed1" / "summary.json").write_text('{"status": "compl')
    metrics = cells / "adamwprune-none-seed1" / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text(lines[0] + lines[1][:10] + "\n" + lines[2])
    found = collect(folder, plots=False)
    assert ("adamw-none-seed1: interrupted (" in found.missing[0]
            and "is of step 4 of 20" in found.missing[0])
    assert found.missing[1] == ("adamw-magnitude-50-seed1: interrupted (" + str(
        cells / "adamw-magnitude-50-seed1" / "summary.json") + " cannot be read (damaged))")
    assert "adamwprune-none-seed1: skipped 1 damaged line(s) of metrics.jsonl" in found.warnings[0]
    assert [r["step"] for r in load_cells(folder)[2].metrics] == [0, 20]
    report = (folder / "report.md").read_text()
    first = report.split("## Results")[1].split("\n\n")[1].splitlines()[2].split("|")
    assert (first[2].strip(), first[3].strip()) == ("adamwprune", "none")  # not the 1.0 claimed
    assert "`adamw-none-seed1`: interrupted" in report


# ---- data identity: the tokens, not their cut into shards -----------------------------------

def test_the_same_tokens_in_other_shards_are_the_same_data(tmp_path):
    from gpt2.data.loader import data_fingerprint, read_meta, same_data
    from gpt2.data.prepare import prepare

    corpus = synthetic_corpus(tmp_path / "corpus.txt", n_lines=3000)
    small, large = tmp_path / "small", tmp_path / "large"
    prepare("shakespeare", small, str(corpus), shard_tokens=1024, workers=1)
    prepare("shakespeare", large, str(corpus), shard_tokens=10**9, workers=1)
    assert len(read_meta(small, "shakespeare")["splits"]["train"]["shards"]) > 1
    assert data_fingerprint(small, "shakespeare") == data_fingerprint(large, "shakespeare")
    then = {"code": provenance.code_identity(),
            "data": provenance.data_identity(small, "shakespeare")}
    assert provenance.changes(then, provenance.identity(large, "shakespeare")) == []
    # The shard size is not part of the run's hash either: it computes nothing.
    assert Config(shard_tokens=1024).config_hash() == Config(shard_tokens=10**9).config_hash()
    # A checkpoint of an older kgpt names the data by its shards, and still resumes.
    meta = read_meta(large, "shakespeare")
    assert same_data(f"{meta['data_sha256'][:16]}:{meta['train_tokens']}", large, "shakespeare")
    # Other tokens are other data.
    other = tmp_path / "other"
    corpus.write_text(corpus.read_text().replace("crown", "crowd"))
    prepare("shakespeare", other, str(corpus), shard_tokens=10**9, workers=1)
    assert not same_data(data_fingerprint(large, "shakespeare"), other, "shakespeare")
    (what,) = provenance.changes(then, provenance.identity(other, "shakespeare"))
    assert what.startswith("data: shakespeare was prepared again with other content (tokens")


def test_other_tokens_of_the_same_count_are_other_data(tmp_path):
    """The token hash is of the tokens themselves: an edit that keeps every count (one
    word for another of one token each, or two tokens swapped) is other data, and a
    run made on the old data is not reported as made on the new."""
    import numpy as np

    from gpt2.data.loader import data_fingerprint, read_meta, same_data
    from gpt2.data.prepare import prepare
    from gpt2.data.shards import tokens_sha256, write_shard

    def hashed(train: list[int], val: list[int]) -> str:
        paths = {}
        for split, tokens in (("train", train), ("val", val)):
            path = tmp_path / f"{split}-{'-'.join(map(str, tokens))}.bin"
            write_shard(path, np.array(tokens))
            paths[split] = [path]
        return tokens_sha256(paths)

    assert hashed([1, 2, 3], [4]) == hashed([1, 2, 3], [4])
    assert hashed([1, 2, 3], [4]) != hashed([1, 3, 2], [4]) != hashed([1, 2, 3], [5])

    corpus = synthetic_corpus(tmp_path / "corpus.txt", n_lines=3000)
    before, after = tmp_path / "before", tmp_path / "after"
    prepare("shakespeare", before, str(corpus), shard_tokens=10**9, workers=1)
    corpus.write_text(corpus.read_text().replace("crown", "sword"))  # one token each
    prepare("shakespeare", after, str(corpus), shard_tokens=10**9, workers=1)
    old, new = read_meta(before, "shakespeare"), read_meta(after, "shakespeare")
    assert [old[k] for k in ("train_tokens", "val_tokens")] == [
        new[k] for k in ("train_tokens", "val_tokens")]  # the premise: no count changed
    assert old["tokens_sha256"] != new["tokens_sha256"]
    assert not same_data(data_fingerprint(before, "shakespeare"), after, "shakespeare")
    then = {"code": provenance.code_identity(),
            "data": provenance.data_identity(before, "shakespeare")}
    (what,) = provenance.changes(then, provenance.identity(after, "shakespeare"))
    assert what.startswith("data: shakespeare was prepared again with other content (tokens")


# ---- generate ----------------------------------------------------------------------------------

@pytest.mark.reliability
def test_generate_refuses_a_checkpoint_of_another_configuration(tmp_path, capsys):
    from gpt2 import generate
    from gpt2.config.options import from_record
    from gpt2.model.gpt import GPT
    from gpt2.model.build import model_config

    def tiny_run(seed: int) -> Path:
        cfg = from_record({**Config().to_dict(), "model_size": "custom", "n_layer": 1,
                           "n_head": 2, "n_embd": 32, "block_size": 32, "seed": seed,
                           "results_dir": str(tmp_path), "run_name": "tiny",
                           "sample_prompt": "ROMEO:", "sample_tokens": 4})
        run = RunDir(cfg)
        run.create("", {})
        save_checkpoint(run.path, 1, max_iters=1, model=GPT(model_config(cfg)).state_dict(),
                        config=cfg.to_dict(), config_hash=cfg.config_hash())
        return run.path

    mine, other = tiny_run(1), tiny_run(2)
    assert generate.main([f"--run-dir={mine}", "--device=cpu"]) == 0
    os.remove(mine / "ckpt.pt")
    os.symlink(other / "checkpoints" / "step-00000001.pt", mine / "ckpt.pt")
    capsys.readouterr()
    assert generate.main([f"--run-dir={mine}", "--device=cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert other.name.rsplit("-", 1)[1] in err and mine.name.rsplit("-", 1)[1] in err
    assert "point ckpt.pt back" in err and "(config.json)" in err


# ---- end to end: the trainer resumes what its files say -------------------------------------

@pytest.mark.reliability
def test_a_run_whose_summary_lies_or_is_damaged_resumes_from_its_checkpoint(data_dir, tmp_path):
    def train(*extra):
        return call_main("gpt2/train.py", *TINY, f"--data-dir={data_dir}",
                         f"--results-dir={tmp_path}", "--run-name=tiny", "--max-iters=12",
                         "--checkpoint-interval=4", "--eval-interval=4", *extra)

    assert train("--stop-at-step=4").returncode == 130
    run = only_run_dir(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "status": "completed"}))
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert [json.loads(ln)["step"] for ln in lines] == [0, 1, 2, 3, 4]
    lines[2] = lines[2][:15] + "\n"  # step 2's row, cut by a crash
    (run / "metrics.jsonl").write_text("".join(lines))

    proc = train("--cpu-threads=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "says completed, but the newest checkpoint (step-00000004.pt) is of step 4 of 12" in out
    assert "resuming" in out and "from step 4/12" in out
    assert "had 1 damaged line(s)" in out
    assert "written with 1 CPU thread(s), this run has 2" in out and "--cpu-threads=1" in out
    steps = [r["step"] for r in scan_metrics(run / "metrics.jsonl")[0]]
    assert steps == [0, 1, *range(3, 13)]  # the intact rows 3 and 4 survived the cut one
    assert checkpoint.load(run / "ckpt.pt")["cpu_threads"] == 2
    completed = (run / "summary.json").read_text()

    (run / "summary.json").write_text(completed[:40])  # a cut summary
    proc = train()
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "summary.json cannot be read (damaged)" in proc.stdout
    assert "resuming it from its checkpoint" in proc.stdout and "from step 12/12" in proc.stdout
    assert (run / "summary.json.damaged-1").read_text() == completed[:40]
    again = json.loads((run / "summary.json").read_text())
    before = json.loads(completed)
    assert again["status"] == "completed" and again["iters"] == 12
    assert again["final_val_loss"] == before["final_val_loss"]
    # What this process did not measure is not its own: no speed, and the peak memory
    # the training processes logged, not the repairing process's.
    assert again["tokens_per_sec"] is None
    logged = [r["peak_memory_mb"] for r in scan_metrics(run / "metrics.jsonl")[0]
              if "peak_memory_mb" in r]
    assert logged and again["peak_memory_mb"] == max(logged)
    assert max(logged) <= before["peak_memory_mb"]
