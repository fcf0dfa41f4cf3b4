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
import os
import shutil
from pathlib import Path

import pytest

from helpers import run_make
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
    assert f"tensorboard --logdir '{results}'" in out
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


def test_setconfig_says_how_to_fix_a_value_out_of_its_range(tmp_path, bridge, capsys):
    config = tmp_path / "config"
    assert run_make("defconfig", env={"KCONFIG_CONFIG": str(config)}).returncode == 0
    assert bridge("setconfig", KCONFIG_CONFIG=str(config), SET="N_HEAD=0") == 2
    err = capsys.readouterr().err
    assert_clean_error(err, "outside the allowed range", "choose a value in it")
    assert "depends on" not in err


# ---- the matrix ---------------------------------------------------------------------------

def test_cells_that_differ_only_past_six_digits_get_their_own_ids(tmp_path, monkeypatch):
    """WEIGHT_DECAY=0.1,0.1000001 once planned two cells named
    ...weight_decay0.1-seed1337: the second failed as "a run of another configuration"
    forever. Values are written exactly now, and a shared id is refused at plan time,
    naming both values (checked by planting the old six-digit rule)."""
    from gpt2.config import kconfig
    from gpt2.errors import PlanError
    from gpt2.matrix import plan as plan_module
    from gpt2.matrix.plan import plan_from_dotconfig

    config = tmp_path / "config"
    config.write_text("CONFIG_MODEL_SIZE_CUSTOM=y\nCONFIG_DEVICE_CPU=y\nCONFIG_DTYPE_FLOAT32=y\n"
                      "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\n"
                      "CONFIG_MATRIX_PRUNING_NONE=y\nCONFIG_MATRIX_PRUNING_MAGNITUDE=y\n"
                      'CONFIG_MATRIX_SPARSITIES="0.7,0.7000001"\n'
                      'CONFIG_MATRIX_SWEEP="WEIGHT_DECAY=0.1,0.1000001"\n')
    assert run_make("olddefconfig", env={"KCONFIG_CONFIG": str(config)}).returncode == 0
    plan = plan_from_dotconfig(kconfig.load(config), [])
    ids = [c.id for c in plan.cells]
    assert len(set(ids)) == len(ids) == 6
    assert "adamw-none-weight_decay0.1000001-seed1337" in ids
    assert "adamw-magnitude-70.00001-weight_decay0.1-seed1337" in ids
    monkeypatch.setattr(plan_module, "cell_id", lambda o, p, s, seed, point=(): "-".join(
        [o, p, *([f"{s * 100:.6g}"] if s is not None else []),
         *(f"{k}{v:.6g}" for k, v in point), f"seed{seed}"]))
    with pytest.raises(PlanError) as e:
        plan_from_dotconfig(kconfig.load(config), [])
    assert "two cells would be named adamw-none-weight_decay0.1-seed1337" in str(e.value)
    assert "weight_decay=0.1; weight_decay=0.1000001" in str(e.value)
