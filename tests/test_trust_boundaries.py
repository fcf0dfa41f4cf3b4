"""Commands write only where they own the folder, and what a careless or hostile input
gets is one line, never a traceback or a lost file (docs/reliability.md, promises 9,
10, 15 and 20). Each test here is an attack that once worked: an export over a run's
own config.json, an index.html written into any folder, two cells given one id, a
repaired summary reporting another process's memory, tracebacks from export,
tensorboard, extend and results.

In-process where possible (the make bridge's and the entry points' main functions),
on copies of the session's finished tiny runs (conftest.py two_runs)."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from pathlib import Path

import pytest

from helpers import checkpoint_state, run_make
from test_input_safety import assert_clean_error
import gpt2.cli
from gpt2 import export, storage
from gpt2.results import pages

pytestmark = pytest.mark.reliability


@pytest.fixture
def run(two_runs, tmp_path) -> Path:
    """A copy of a finished tiny run, in a results folder of its own."""
    source = two_runs[1][0]
    copy = tmp_path / "results" / source.name
    shutil.copytree(source, copy, symlinks=True)
    return copy


@pytest.fixture
def bridge(monkeypatch):
    """``bridge(target, **make_variables)``: the make bridge in this process; its exit
    status, with what it printed in capsys."""
    def call(target: str, **variables: str) -> int:
        for var in ("RUN", "EXPORT_ARGS", "CELL", "KCONFIG_CONFIG", "SET"):
            monkeypatch.delenv(var, raising=False)
        for var, value in variables.items():
            monkeypatch.setenv(var, value)
        return gpt2.cli.main([target])
    return call


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links as their targets), by relative path."""
    return {str(p.relative_to(folder)): (os.readlink(p).encode() if p.is_symlink()
                                         else p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file() or p.is_symlink()}


# ---- export ----------------------------------------------------------------------------

def test_export_refuses_a_run_folder_and_any_folder_that_is_not_this_runs_export(
        run, two_runs, tmp_path, capsys):
    """`--out results/latest` once replaced the run's config.json with Hugging Face's
    and exited 0; a folder of someone's files was written into just as silently."""
    before = tree(run)
    assert export.main(["--run-dir", str(run), "--out", str(run)]) == 2
    assert_clean_error(capsys.readouterr().err, "is a run folder", "config.json")
    other = two_runs[1][1]  # (the other run of the fixture: refused, left as it was)
    assert export.main(["--run-dir", str(run), "--out", str(other)]) == 2
    assert_clean_error(capsys.readouterr().err, "is a run folder")
    assert tree(run) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert export.main(["--run-dir", str(run), "--out", str(mine)]) == 2
    assert_clean_error(capsys.readouterr().err, "holds files", "not an export of this run")
    assert tree(mine) == {"notes.txt": b"mine"}
    # A file, and a path through a file: one line each.
    assert export.main(["--run-dir", str(run), "--out", str(mine / "notes.txt")]) == 2
    assert_clean_error(capsys.readouterr().err, "is a file, not a folder")
    assert export.main(["--run-dir", str(run), "--out", str(mine / "notes.txt" / "hf")]) == 2
    assert_clean_error(capsys.readouterr().err, "a file is in the way")
    assert tree(mine) == {"notes.txt": b"mine"}
    # A link, even to an empty folder, is named as one (it was "a file").
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "link").symlink_to(empty)
    assert export.main(["--run-dir", str(run), "--out", str(tmp_path / "link")]) == 2
    assert_clean_error(capsys.readouterr().err, "is a symbolic link")
    assert not any(empty.iterdir())


def test_an_export_replaces_only_an_earlier_export_of_the_same_run(run, two_runs, tmp_path,
                                                                   capsys):
    out = tmp_path / "hf"
    old_umask = os.umask(0o022)
    try:
        assert export.main(["--run-dir", str(run), "--out", str(out)]) == 0
    finally:
        os.umask(old_umask)
    first = tree(out)
    assert set(first) == set(export.FILES)
    # Every file readable by others, as any file written under umask 022 (safetensors
    # made its own 0600).
    assert {oct(os.stat(out / f).st_mode & 0o777) for f in first} == {"0o644"}
    assert oct(os.stat(out).st_mode & 0o777) == "0o755"
    (out / "model.safetensors").write_bytes(b"stale")
    assert export.main(["--run-dir", str(run), "--out", str(out)]) == 0
    assert tree(out) == first  # replaced whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "results"]  # nothing left over
    # Another run's export is not this run's to replace.
    assert export.main(["--run-dir", str(two_runs[1][0]), "--out", str(out)]) == 2
    assert_clean_error(capsys.readouterr().err, "an export of another run", str(run.resolve()))
    assert tree(out) == first


def test_a_full_disk_or_read_only_folder_during_export_is_one_line_and_keeps_the_old_export(
        run, tmp_path, monkeypatch, read_only, capsys):
    out = tmp_path / "hf"
    assert export.main(["--run-dir", str(run), "--out", str(out)]) == 0
    first = tree(out)
    real_fsync = os.fsync

    def full(fd):  # a disk that fills up as the weights are flushed
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    assert export.main(["--run-dir", str(run), "--out", str(out)]) == 2
    assert_clean_error(capsys.readouterr().err, "disk full while writing",
                       "model.safetensors", "free space")
    assert tree(out) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "results"]
    monkeypatch.setattr(os, "fsync", real_fsync)
    read_only(tmp_path / "elsewhere")
    assert export.main(["--run-dir", str(run), "--out", str(tmp_path / "elsewhere" / "hf")]) == 2
    assert_clean_error(capsys.readouterr().err, "cannot write", "Read-only file system")


# ---- results, tensorboard --------------------------------------------------------------

def test_results_writes_pages_only_where_kgpts_results_are(run, tmp_path, bridge, capsys):
    """`make results RUN=<folder>` once wrote index.html into any folder, replacing one
    that was there."""
    someone = tmp_path / "website"
    someone.mkdir()
    (someone / "index.html").write_text("<h1>my page</h1>")
    assert bridge("results", RUN=str(someone)) == 2
    assert_clean_error(capsys.readouterr().err, "holds no runs or matrices", "nothing written")
    assert tree(someone) == {"index.html": b"<h1>my page</h1>"}
    # A results folder with an index.html of someone else's: that page is left alone.
    results = run.parent
    (results / "index.html").write_text("<h1>my page</h1>")
    assert bridge("results", RUN=str(results)) == 2
    assert_clean_error(capsys.readouterr().err, "is not a page kgpt wrote")
    assert (results / "index.html").read_text() == "<h1>my page</h1>"
    (results / "index.html").unlink()
    # A run folder gets its own page, and no index; a results folder gets both.
    assert bridge("results", RUN=str(run)) == 0
    assert (run / pages.RUN_PAGE).is_file() and not (run / pages.INDEX).exists()
    assert bridge("results", RUN=str(results)) == 0
    index = (results / pages.INDEX).read_text()
    assert pages.GENERATOR in index
    assert bridge("results", RUN=str(results)) == 0  # and replaces its own


@pytest.mark.parametrize("value", ["missing", None, "text", {"a": 1}])
def test_the_pages_of_a_run_with_an_odd_summary_are_written(run, value, bridge, capsys):
    """Every figure of summary.json missing or of another type (a summary from an
    older kgpt, or edited by hand): the pages are still written, showing what there is.
    A summary without gradient_accumulation once stopped `make results` with a
    KeyError, and no page was written for any run."""
    summary = json.loads((run / "summary.json").read_text())
    for key in list(summary):
        if key in ("status", "config_hash"):
            continue  # (what says whether it is complete, and whose it is)
        edited = dict(summary)
        if value == "missing":
            del edited[key]
        else:
            edited[key] = value
        (run / "summary.json").write_text(json.dumps(edited))
        assert bridge("results", RUN=str(run.parent)) == 0, (key, capsys.readouterr().err)


def test_a_run_page_says_what_it_does_not_know(run, bridge):
    """No commit (not run from a git checkout) reads as unknown, not "None"; a long
    error is shown past its first word."""
    provenance = json.loads((run / "provenance.json").read_text())
    provenance["code"]["commit"] = None
    (run / "provenance.json").write_text(json.dumps(provenance))
    summary = json.loads((run / "summary.json").read_text())
    error = "error: /a/very/long/path/to/some/file/that/could/not/be/read/at/all/because/it/is/gone"
    (run / "summary.json").write_text(json.dumps({**summary, "status": "failed",
                                                   "error": error}))
    assert bridge("results", RUN=str(run.parent)) == 0
    page = (run / pages.RUN_PAGE).read_text()
    assert "None" not in page.split("commit", 1)[1][:200]
    assert "unknown (not run from a git checkout)" in page
    index = (run.parent / pages.INDEX).read_text()
    assert ">error: /a/very/long/path/to/some/file" in index


def test_tensorboard_skips_a_read_only_run_with_one_line_and_writes_the_others(
        two_runs, tmp_path, read_only, bridge, capsys):
    results = tmp_path / "my results"  # (a space: the printed command quotes it)
    for source in two_runs[1]:
        shutil.copytree(source, results / source.name, symlinks=True)
    locked, free = (results / p.name for p in two_runs[1])
    read_only(locked)
    assert bridge("tensorboard", RUN=f"'{locked}' '{free}'") == 2
    out, err = capsys.readouterr()
    assert_clean_error(err, "1 run(s) could not be written", "cannot write",
                       "Read-only file system")
    assert f"skipped  {locked}" in out and f"wrote    {free / 'tensorboard'}" in out
    assert f"tensorboard --logdir '{results / 'tensorboard-runs'}'" in out
    assert [p.name for p in (results / "tensorboard-runs").iterdir()] == [free.name]
    assert not (locked / "tensorboard").exists() and any((free / "tensorboard").iterdir())


# ---- extend, the configuration file -----------------------------------------------------

@pytest.mark.parametrize("record", ["[1, 2]", '"a string"', "7"])
def test_extending_a_run_whose_config_json_is_not_an_object_is_one_line(run, record, capsys):
    from gpt2 import train

    (run / "config.json").write_text(record)
    assert train.main(["--extend-from", str(run), "--max-iters=40"]) == 2
    assert_clean_error(capsys.readouterr().err, "CONFIG_EXTEND_FROM",
                       "has no readable config.json", "a JSON object")


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_config_file_that_is_a_folder_or_a_pipe_is_named_so(tmp_path, bridge, capsys, kind):
    path = tmp_path / "config"
    path.mkdir() if kind == "folder" else os.mkfifo(path)
    assert bridge("train", KCONFIG_CONFIG=str(path)) == 2
    err = capsys.readouterr().err
    assert_clean_error(err, "is a folder" if kind == "folder" else "is not a regular file")
    assert "does not exist" not in err


def test_results_of_a_run_that_is_a_pipe_says_it_is_not_a_folder(tmp_path, bridge, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert bridge("results", RUN=str(fifo)) == 2
    err = capsys.readouterr().err
    assert_clean_error(err, f"{fifo} is not a folder")
    assert bridge("results", RUN=str(tmp_path / "nothing")) == 2
    assert_clean_error(capsys.readouterr().err, "nothing does not exist")


def test_setconfig_says_how_to_fix_a_value_out_of_its_range(tmp_path, bridge, capsys):
    config = tmp_path / "config"
    assert run_make("defconfig", env={"KCONFIG_CONFIG": str(config)}).returncode == 0
    assert bridge("setconfig", KCONFIG_CONFIG=str(config), SET="N_HEAD=0") == 2
    err = capsys.readouterr().err
    assert_clean_error(err, "outside the allowed range", "choose a value in it")
    assert "depends on" not in err


# ---- the matrix ---------------------------------------------------------------------------

# ---- the second hostile pass: files planted in shared folders -----------------------------

def test_a_link_planted_under_a_temporary_name_is_never_written_through(tmp_path, monkeypatch):
    """Every durable write goes to a temporary file beside its target. A predictable
    temporary name let a neighbour plant a link there and have kgpt's next write
    overwrite the file it pointed to; the name is random now and the file is
    created exclusively, so a planted name is skipped, never followed."""
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    tags = iter(["planted", "fresh"])
    monkeypatch.setattr(storage.secrets, "token_hex", lambda n: next(tags))
    (tmp_path / ".page.html.planted.tmp").symlink_to(victim)
    storage.write_text_atomic(tmp_path / "page.html", "<p>kgpt</p>")
    assert victim.read_text() == "mine"
    assert (tmp_path / "page.html").read_text() == "<p>kgpt</p>"
    assert not (tmp_path / "page.html").is_symlink()
    # A folder planted where export stages (or left by a killed one) is left as it was.
    tags = iter(["taken", "free"])
    (tmp_path / ".hf.taken").mkdir()
    (tmp_path / ".hf.taken" / "theirs").write_text("x")
    staged = storage.new_folder(tmp_path / "hf")
    assert staged.name == ".hf.free" and (tmp_path / ".hf.taken" / "theirs").exists()


def test_kgpt_writes_into_no_folder_that_is_a_link(run, tmp_path, bridge, capsys):
    """A link planted as a folder kgpt keeps (checkpoints/, tensorboard/, a comparison's
    folder) once had kgpt write, replace and prune files wherever it pointed: another
    run's checkpoints were deleted, a neighbour's files overwritten."""
    from gpt2.training import checkpoint

    elsewhere = tmp_path / "shared"
    elsewhere.mkdir()
    (elsewhere / "step-00000000.pt").write_text("another run's")
    (run / "tensorboard").symlink_to(elsewhere)
    assert bridge("tensorboard", RUN=str(run)) == 2
    assert_clean_error(capsys.readouterr().err, "is a link", "not a folder of its own")
    shutil.move(run / "checkpoints", tmp_path / "moved")
    (run / "checkpoints").symlink_to(elsewhere)
    with pytest.raises(storage.StorageError, match="is a link"):
        checkpoint.save(run / "ckpt.pt", checkpoint_state(5), 5)
    assert tree(elsewhere) == {"step-00000000.pt": b"another run's"}
    # A comparison's folder: kgpt's own name, but not kgpt's folder.
    from gpt2.results import compare
    from gpt2.results.catalog import expand

    runs = expand([str(p) for p in two_runs_of(run)], tmp_path)
    out = compare.folder_for(runs, tmp_path / "results")
    out.symlink_to(elsewhere)
    with pytest.raises(storage.StorageError, match="is a link"):
        compare.write(runs, out)
    out.unlink()
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(Exception, match="holds files a comparison does not write"):
        compare.write(runs, out)
    assert tree(elsewhere) == {"step-00000000.pt": b"another run's"}


def two_runs_of(run: Path) -> list[Path]:
    """``run`` and a second copy of it beside it (for a comparison)."""
    other = run.with_name(run.name + "-copy")
    if not other.exists():
        shutil.copytree(run, other, symlinks=True)
    return [run, other]


CELL = {"id": "a", "config_hash": "c", "args": [], "optimizer": "adamw", "pruning": "none",
        "seed": 1}


@pytest.mark.parametrize("plan,says", [
    ({"name": "m", "hash": "h", "cells": []}, "no cells"),
    ({"name": "m", "hash": "h", "cells": [{**CELL, "id": "/tmp/elsewhere"}]},
     "no id kgpt would give"),
    ({"name": "m", "hash": "h", "cells": [{**CELL, "id": ".."}]}, "no id kgpt would give"),
    ({"name": "m", "hash": "h", "cells": [{**CELL, "id": 5}]}, "no id kgpt would give"),
    ({"name": "m", "hash": "h", "cells": [{**CELL, "config_hash": None}]},
     "no configuration hash"),
    ({"name": "m", "hash": "h", "cells": [{**CELL, "args": ["rm"]}]},
     "args are not train.py flags"),
    ({"name": "m", "hash": "h", "cells": [CELL, CELL]}, "listed twice"),
    ({"hash": "h", "cells": [CELL]}, "no matrix name"),
    ({"name": "m", "hash": "h", "cells": [{**CELL, "optimizer": None}]},
     "cell a has no optimizer"),
    ({"name": "m", "hash": "h", "cells": [{**CELL, "target_sparsity": "abc"}]},
     "target sparsity is not a number"),
    ({"name": "m", "hash": "h", "cells": [{**CELL, "grid": {"lr": [1, 2]}}]},
     "grid is not a mapping of settings to values"),
    ({"name": "m", "hash": "h", "axes": {"grids": ["x"]}, "cells": [CELL]}, "axes.grids"),
    ({"name": "m", "hash": "h", "axes": {"seeds": "many"}, "cells": [CELL]}, "axes.seeds"),
    (["a list"], "a list, not a mapping"),
])
def test_a_plan_kgpt_did_not_write_is_refused_by_every_reader(tmp_path, plan, says, bridge,
                                                                capsys):
    """A cell id is joined onto the matrix folder: an edited or planted plan.yaml with
    the id /tmp/elsewhere once had a Slurm task train there, and `make results` write a
    page there; an empty plan ended matrix-status in a traceback."""
    import subprocess
    import sys

    import yaml

    from helpers import REPO

    folder = tmp_path / "matrix-m-h"
    folder.mkdir()
    from gpt2.matrix.plan_file import PlanDumper

    # (as kgpt writes YAML, without aliases: a plan with one is refused before its shape)
    (folder / "plan.yaml").write_text(yaml.dump(plan, Dumper=PlanDumper))
    (folder / "summary.csv").write_text("mine")
    for target in ("matrix-status", "report", "plots"):
        assert bridge(target, RUN=str(folder)) == 2, target
        assert_clean_error(capsys.readouterr().err, "is not a plan kgpt wrote", says)
    assert bridge("results", RUN=str(folder)) == 2
    assert_clean_error(capsys.readouterr().err, "is not a plan kgpt wrote")
    task = subprocess.run([sys.executable, "-m", "gpt2.slurm.task", "cell", str(folder)],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_ID": "1"})
    assert "is not a plan kgpt wrote" in task.stdout + task.stderr
    assert "Traceback" not in task.stdout + task.stderr
    assert not Path("/tmp/elsewhere").exists()
    assert sorted(p.name for p in folder.iterdir()) == ["plan.yaml", "summary.csv"]
    assert (folder / "summary.csv").read_text() == "mine"


def test_pages_loss_plots_and_records_of_others_are_left_alone(run, tmp_path, bridge, capsys):
    """A run.html, a loss.png or a summary.csv in a folder RUN= names is only replaced
    when the folder is kgpt's and the page is kgpt's."""
    hf = tmp_path / "a-model"  # a Hugging Face folder: config.json, and a page of its own
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "run.html").write_text("<h1>my model</h1>")
    assert bridge("results", RUN=str(hf)) == 2
    assert_clean_error(capsys.readouterr().err, "is not a page kgpt wrote")
    assert (hf / "run.html").read_text() == "<h1>my model</h1>"
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "summary.json").write_text("{}")
    (notes / "loss.png").write_bytes(b"my plot")
    assert bridge("plots", RUN=str(notes)) == 2
    assert_clean_error(capsys.readouterr().err, "neither a matrix folder", "nothing written")
    assert (notes / "loss.png").read_bytes() == b"my plot"
    # The run's own page is kgpt's: replaced.
    assert bridge("results", RUN=str(run)) == 0 and bridge("results", RUN=str(run)) == 0


def test_records_of_the_wrong_shape_are_one_line_or_left_out(run, tmp_path, bridge, capsys):
    """provenance.json, status.json and slurm/jobs.json of another shape, a summary nested
    past the recursion limit, a metrics row with a 400-digit step, a folder whose name
    is not UTF-8, and a FIFO in place of a file: `make results` and `make tensorboard`
    write what they can and never hang or end in a traceback."""
    from gpt2.matrix import runner, slurm_backend
    from gpt2.errors import MatrixError

    results = run.parent
    (run / "provenance.json").write_text(json.dumps({"code": ["commit"], "parent": "x"}))
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 10 ** 400, "val_loss": 1.0}) + "\n")
        f.write(json.dumps({"step": 3, "tokens": 10 ** 400}) + "\n")
    deep = shutil.copytree(run, results / (run.name + "-deep"), symlinks=True)
    (deep / "summary.json").write_text("[" * 100_000 + "]" * 100_000)
    fifo = shutil.copytree(run, results / (run.name + "-fifo"), symlinks=True)
    for name in ("summary.json", "provenance.json", "samples.txt"):
        (fifo / name).unlink()
        os.mkfifo(fifo / name)
    os.mkdir(os.path.join(os.fsencode(results), b"bad\xffname"))
    assert bridge("results", RUN=str(results)) == 0, capsys.readouterr().err
    assert bridge("tensorboard", RUN=str(run)) == 0, capsys.readouterr().err
    # Matrix records: entries of another shape dropped, a damaged job record refused.
    folder = tmp_path / "matrix"
    (folder / "slurm").mkdir(parents=True)
    (folder / "status.json").write_text(json.dumps({
        "a": "x", "b": {"attempts": 1},
        "c": {"attempts": "x", "error": {"x": 1}, "slurm_job": ["x"], "status": "failed"}}))
    assert runner.read_status(folder) == {"b": {"attempts": 1}, "c": {"status": "failed"}}
    for jobs in ({"arrays": 5}, {"arrays": [{"job": 5}]}, ["x"]):
        (folder / "slurm" / "jobs.json").write_text(json.dumps(jobs))
        with pytest.raises(MatrixError, match="jobs.json is damaged"):
            slurm_backend.read_jobs(folder)


def test_a_crafted_checkpoint_with_a_matching_sha256_is_one_line(run, capsys):
    """A checkpoint rewritten with a sha256 to match, holding weights that do not fit
    its model, or a configuration of the wrong types: export and generate refuse it in
    one line (a KeyError, an AttributeError and a RuntimeError once)."""
    import hashlib

    import torch

    from gpt2 import generate

    target = run / "ckpt.pt"
    real = target.resolve()
    original = torch.load(real, weights_only=True)
    for damage in ("no weights", "a number for a tensor", "n_layer a word", "NaN weights"):
        state = {**original, "model": dict(original["model"]),
                 "config": dict(original["config"])}
        if damage == "no weights":
            state["model"] = {}
        elif damage == "a number for a tensor":
            state["model"]["transformer.wte.weight"] = 5
        elif damage == "NaN weights":
            state["model"]["transformer.wte.weight"] = torch.full_like(
                original["model"]["transformer.wte.weight"], float("nan"))
        else:
            state["config"]["n_layer"] = "abc"
        torch.save(state, real)
        digest = hashlib.sha256(real.read_bytes()).hexdigest()
        real.with_name(real.name + ".sha256").write_text(f"{digest}  {real.name}\n")
        assert export.main(["--run-dir", str(run), "--out", str(run.parent / "hf")]) == 2
        assert_clean_error(capsys.readouterr().err, "ckpt.pt")
        assert generate.main([f"--run-dir={run}", "--max-new-tokens=2"]) == 2
        assert_clean_error(capsys.readouterr().err, "ckpt.pt")


def test_a_preparation_never_deletes_files_it_did_not_write(tmp_path, corpus):
    """nanoGPT writes train.bin, val.bin (and meta files) by the names kgpt's first data
    format used: `make data` into such a folder deleted them. Now only kgpt's own
    format-1 meta.json lets it remove them."""
    from gpt2.data.prepare import prepare
    from gpt2.errors import DataError

    folder = tmp_path / "shakespeare"
    folder.mkdir()
    for name, data in (("train.bin", b"nano"), ("val.bin", b"gpt"),
                       ("meta.json", b'{"vocab_size": 50257}')):
        (folder / name).write_bytes(data)
    with pytest.raises(DataError, match="train.bin, val.bin, which kgpt did not write|"
                                        "meta.json, train.bin, val.bin"):
        prepare("shakespeare", tmp_path, input_path=str(corpus), workers=1)
    assert {p.name for p in folder.iterdir()} >= {"train.bin", "val.bin", "meta.json"}
    assert (folder / "meta.json").read_bytes() == b'{"vocab_size": 50257}'
    (folder / "meta.json").write_text(json.dumps({"format_version": 1, "tokenizer": "gpt2"}))
    prepare("shakespeare", tmp_path, input_path=str(corpus), workers=1)
    assert not (folder / "train.bin").exists() and (folder / "train_000000.bin").exists()
    # Files of the user's that look like shards are not shards kgpt wrote: a new
    # preparation (another split) keeps them.
    for name in ("train_mine.bin", "val_notes.bin", "train_x.tmp"):
        (folder / name).write_text("mine")
    prepare("shakespeare", tmp_path, input_path=str(corpus), workers=1, val_fraction=0.2)
    assert all((folder / n).read_text() == "mine"
               for n in ("train_mine.bin", "val_notes.bin", "train_x.tmp"))
    # The corpus copy is written by its own name, never through a link planted there.
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (folder / "input.txt").unlink()
    (folder / "input.txt").symlink_to(victim)
    with pytest.raises(DataError, match="not a regular file"):
        prepare("shakespeare", tmp_path, input_path=str(corpus), workers=1)
    assert victim.read_text() == "mine"


def test_paths_a_shell_or_sbatch_would_read_otherwise_are_one_line(tmp_path, bridge, capsys):
    """~nosuchuser (Path.expanduser raised RuntimeError), a results folder that is a
    file, and a % that sbatch would expand in an --output path."""
    from gpt2.errors import SlurmError
    from gpt2.slurm import script

    assert bridge("compare", RUN="~nosuchuser/x ~nosuchuser/y") == 2
    assert_clean_error(capsys.readouterr().err, "~nosuchuser/x")
    a_file = tmp_path / "results"
    a_file.write_text("")
    config = tmp_path / "config"
    config.write_text(f'CONFIG_RESULTS_DIR="{a_file}"\n')
    assert bridge("tensorboard", KCONFIG_CONFIG=str(config)) == 2
    assert_clean_error(capsys.readouterr().err, "is a file, not a results folder")
    with pytest.raises(SlurmError, match="cannot take this path"):
        script.safe_path(tmp_path / "%x")


# ---- the third pass: logs, records and folders written by name ---------------------------

def test_appends_and_locks_never_follow_a_link_or_wait_on_a_pipe(tmp_path):
    """Logs, samples and metrics are appended to by name: a link planted there had the
    appends land in the file it named, a FIFO blocked the run (ignoring Ctrl-C), and a
    link as the matrix's .status.lock created a file where it pointed."""
    from gpt2.matrix.runner import update_status

    victim = tmp_path / "victim"
    (tmp_path / "link").symlink_to(victim)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    for name in ("link", "fifo", "folder"):
        with pytest.raises(storage.StorageError, match="not a regular file"):
            storage.open_append(tmp_path / name)
    assert not victim.exists()
    with storage.open_append(tmp_path / "log") as f:
        f.write("one\n")
    with storage.open_append(tmp_path / "log") as f:
        f.write("two\n")
    assert (tmp_path / "log").read_text() == "one\ntwo\n"
    matrix = tmp_path / "matrix"
    matrix.mkdir()
    (matrix / ".status.lock").symlink_to(tmp_path / "created-elsewhere")
    with pytest.raises(storage.StorageError):
        update_status(matrix, "c0", status="running")
    assert not (tmp_path / "created-elsewhere").exists()


def test_samples_with_bytes_that_are_not_utf8_resume_and_extend(run, tmp_path):
    from gpt2.config.options import Config
    from gpt2.run_folder import RunDir

    with open(run / "samples.txt", "ab") as f:
        f.write(b"\xff\xfe garbled\n=== step x ===\n")
    folder = RunDir(Config(), tmp_path / "extension")
    storage.own_folder(folder.path)
    folder.copy_history(run, 10**6)  # (an extension starts with its parent's history)
    assert "\ufffd" in (folder.path / "samples.txt").read_text()
    RunDir(Config(), run).truncate_samples(5)


def test_superseded_checkpoints_are_never_replaced(tmp_path):
    """Resuming from an older checkpoint twice once replaced the first set-aside
    checkpoint with the second (promise 4: superseded files are never deleted)."""
    from gpt2.training import checkpoint

    link = tmp_path / "ckpt.pt"
    checkpoint.save(link, checkpoint_state(2), 2)
    kept = tmp_path / "checkpoints" / "step-00000002.pt"
    for _ in range(2):
        checkpoint.save(link, checkpoint_state(4), 4)
        checkpoint.set_aside_after(link, kept)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("superseded-*.pt"))
    assert names == ["superseded-1-step-00000004.pt", "superseded-step-00000004.pt"]


def test_training_into_a_folder_of_someone_elses_files_is_refused(data_dir, tmp_path, capsys):
    from helpers import TINY

    from gpt2 import train

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    for name, text in (("config", "mine"), ("loss.png", "my plot"), ("notes.txt", "x")):
        (theirs / name).write_text(text)
    assert train.main([*TINY, f"--data-dir={data_dir}", f"--run-dir={theirs}"]) == 2
    assert_clean_error(capsys.readouterr().err, "is not a run folder", "notes.txt")
    assert tree(theirs) == {"config": b"mine", "loss.png": b"my plot", "notes.txt": b"x"}


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's needs root")
def test_a_folder_of_another_user_is_not_written_into(run, tmp_path, bridge, capsys):
    """In a shared results folder, a run folder (or matrix folder) made first under
    kgpt's predictable name by someone else is theirs: kgpt writes no page into it,
    trains nothing into it, and still writes the index for everyone."""
    neighbour = run.parent / (run.name + "-theirs")
    shutil.copytree(run, neighbour, symlinks=True)
    (neighbour / "run.html").unlink(missing_ok=True)
    os.chown(neighbour, 12345, 12345)
    with pytest.raises(storage.StorageError, match="belongs to another user"):
        storage.own_folder(neighbour)
    assert bridge("results", RUN=str(run.parent)) == 0
    out = capsys.readouterr().out
    assert f"{neighbour} is another user's" in out
    assert not (neighbour / "run.html").exists() and (run.parent / "index.html").exists()


def test_a_link_as_a_matrix_folder_or_its_cells_is_refused(tmp_path):
    from gpt2.matrix.runner import own_cell_dir

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    matrix = tmp_path / "matrix-m-h"
    matrix.mkdir()
    (matrix / "cells").symlink_to(elsewhere)
    with pytest.raises(storage.StorageError, match="is a link"):
        own_cell_dir(matrix, "c0")
    assert list(elsewhere.iterdir()) == []
    (tmp_path / "as-link").symlink_to(elsewhere)
    with pytest.raises(storage.StorageError, match="is a link"):
        storage.own_folder(tmp_path / "as-link")


def test_the_latest_link_is_moved_without_touching_planted_names(tmp_path, monkeypatch):
    tags = iter(["planted", "fresh"])
    monkeypatch.setattr(storage.secrets, "token_hex", lambda n: next(tags))
    (tmp_path / ".latest.planted").write_text("theirs")
    (tmp_path / "run-a").mkdir()
    storage.point_link(tmp_path / "latest", "run-a")
    assert os.readlink(tmp_path / "latest") == "run-a"
    assert (tmp_path / ".latest.planted").read_text() == "theirs"


@pytest.mark.parametrize("line,says", [
    ('{"ctx": "a", "endings": ["a", "b", "c", "d"], "label": Infinity}', "label 0-3"),
    ('[' * 50_000 + ']' * 50_000, "not a HellaSwag example"),
    ('{"ctx": "a", "endings": ["a", "b", "c"], "label": 1}', "needs 4 endings"),
])
def test_a_hellaswag_file_of_the_wrong_shape_is_one_line(tmp_path, line, says):
    from gpt2.errors import DataError
    from gpt2.eval import hellaswag

    path = tmp_path / "hellaswag.jsonl"
    path.write_bytes(line.encode() + b"\n")
    with pytest.raises(DataError, match=says):
        hellaswag.load(path)
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(DataError, match="not a regular file"):
        hellaswag.load(tmp_path / "fifo.jsonl")


def test_values_that_pass_one_check_and_break_a_later_one_are_refused(run, capsys):
    """A temperature of 1e-320 passed the check and ended generation in a traceback
    (the logits divided by it are infinite); a seed past 64 bits did too."""
    from gpt2 import generate

    for flag in ("--temperature=1e-320", "--seed=99999999999999999999999"):
        with pytest.raises(SystemExit) as stop:  # (refused as the flags are read)
            generate.main([f"--run-dir={run}", flag])
        assert stop.value.code == 2
        assert_clean_error(capsys.readouterr().err, flag.split("=")[0])


def test_plans_with_ids_past_a_path_component_or_numbers_past_floats_are_refused():
    """A 5000-character cell id once ended make report, results and matrix-status in
    "File name too long"; a NaN sparsity in make report's plots."""
    from gpt2.matrix.plan_file import plan_problem

    plan = {"name": "m", "hash": "h", "cells": [CELL]}
    assert plan_problem(plan) is None
    assert "no id kgpt would give" in plan_problem({**plan, "cells": [{**CELL, "id": "a" * 129}]})
    assert plan_problem({**plan, "cells": [{**CELL, "id": "a" * 128}]}) is None
    assert "no matrix name" in plan_problem({**plan, "name": "m" * 200})
    for bad in (math.nan, math.inf, 10 ** 400):
        assert "target sparsity is not a number" in plan_problem(
            {**plan, "cells": [{**CELL, "target_sparsity": bad}]})
        assert "grid is not a mapping" in plan_problem(
            {**plan, "cells": [{**CELL, "grid": {"lr": bad}}]})
        assert "axes.sparsities" in plan_problem({**plan, "axes": {"sparsities": [bad]}})


def test_figures_past_floats_and_cells_that_are_links_do_not_reach_the_pages(tmp_path):
    """A summary figure of 10**400 once ended make report in an OverflowError; a cell
    folder that is a link to another run had make report replace that run's page."""
    import json as jsonlib

    from fake_matrices import bowl, fake_tuned_matrix

    from gpt2.matrix.collect import collect, load_cells
    from gpt2.matrix.results import finite
    from gpt2.results import pages

    assert not finite(10 ** 400) and finite(10 ** 300) and not finite(math.nan)
    folder = fake_tuned_matrix(tmp_path / "m", bowl, seeds=(1,))
    first, second = sorted((folder / "cells").iterdir())[:2]
    summary = jsonlib.loads((first / "summary.json").read_text())
    (first / "summary.json").write_text(jsonlib.dumps({**summary, "tokens_per_sec": 10 ** 400,
                                                       "wall_time_s": 10 ** 400}))
    other = tmp_path / "someone-else"
    shutil.copytree(second, other)
    pages.write_run_page(other)
    before = (other / pages.RUN_PAGE).read_text()
    shutil.rmtree(second)
    second.symlink_to(other)
    collect(folder)  # plots and report
    cell = next(c for c in load_cells(folder) if c.cell == first.name)
    assert cell.tokens_per_sec is None and cell.usable
    pages.matrix_pages(folder)
    assert (other / pages.RUN_PAGE).read_text() == before
    assert (first / pages.RUN_PAGE).is_file()


def test_compare_replaces_only_a_comparison_it_wrote(two_runs, tmp_path):
    """A compare folder holding a user's own compare.csv (and nothing of kgpt's) once had
    it replaced: files of kgpt's names are kgpt's only beside its own compare.md."""
    from gpt2.errors import ResultsError
    from gpt2.results import catalog, compare

    runs = [catalog.read_run(p) for p in two_runs[1]]
    mine = tmp_path / "compare-mine"
    mine.mkdir()
    (mine / "compare.csv").write_text("my numbers\n")
    with pytest.raises(ResultsError, match="that kgpt did not write"):
        compare.write(runs, mine)
    assert (mine / "compare.csv").read_text() == "my numbers\n"
    assert sorted(p.name for p in mine.iterdir()) == ["compare.csv"]
    ours = tmp_path / "compare-ours"
    compare.write(runs, ours)
    (ours / "compare.csv").write_text("stale\n")
    compare.write(runs, ours)  # its own earlier comparison: replaced
    assert (ours / "compare.csv").read_text().startswith("folder,")
