"""The third hostile pass (issue 49): a planted link, a copied run, a tampered matrix
file, numbers past any range, text that drives a terminal. Each test here failed on
93b2e8d. The rules they hold (docs/reliability.md, promises 10 and 20):

* every writer refuses a link where it makes a folder or a file (storage.own_folder,
  storage.write_durably; tests/test_architecture.py lists who may make a folder without
  that check);
* every reader of a run or matrix record checks it as its writer does (gpt2/records.py);
* every command-line number has a range (gpt2/config/argparser.py Bounded), checked
  before any work.

Tiny runs are copies of the session's finished ones (conftest.py two_runs)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal

import pytest
import yaml

from test_input_safety import assert_clean_error
from fake_matrices import fake_matrix
from test_trust_boundaries import bridge, run, tree  # noqa: F401,F811 - fixtures
from gpt2 import export, storage
from gpt2.config.argparser import StrictArgumentParser
from gpt2.matrix import extend
from gpt2.results import charts, pages

pytestmark = pytest.mark.reliability

ONESHOT = ["METHOD=magnitude", "SPARSITY=0.5"]


def prune(bridge, run, args: str = "--calibration-samples 2", **more: str) -> int:
    """make prune-oneshot on ``run`` with ONESHOT_ARGS ``args``."""
    variables = {"RUN": str(run), "METHOD": "magnitude", "SPARSITY": "0.5",
                 "ONESHOT_ARGS": args, **more}
    return bridge("prune-oneshot", **variables)


# ---- writers refuse links ------------------------------------------------------------------

def test_prune_oneshot_never_writes_through_a_planted_link(run, tmp_path, bridge, capfd):
    """A link planted as <run>/oneshot once had the result and a 13 MB .pt written into
    the folder it named, replacing a file of the user's there."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "magnitude-50.json").write_text("USER DATA")
    (run / "oneshot").symlink_to(victim)
    assert prune(bridge, run, "--calibration-samples 2 --save-weights") == 2
    assert_clean_error(capfd.readouterr().err, "oneshot is a link", "Remove the link")
    assert tree(victim) == {"magnitude-50.json": b"USER DATA"}
    # A link planted under the weights' name: refused, the file it names untouched.
    (run / "oneshot").unlink()
    (run / "oneshot").mkdir()
    (run / "oneshot" / "magnitude-50.pt").symlink_to(victim / "weights.pt")
    assert prune(bridge, run, "--calibration-samples 2 --save-weights") == 2
    assert_clean_error(capfd.readouterr().err, "magnitude-50.pt is a link")
    # One under the result's own name is moved aside, never written through.
    assert not (run / "oneshot" / "magnitude-50.json").exists()  # (refused before any work)
    (run / "oneshot" / "magnitude-50.pt").unlink()
    (run / "oneshot" / "magnitude-50.json").symlink_to(victim / "magnitude-50.json")
    assert prune(bridge, run) == 0
    assert "a link was there: kept as magnitude-50.earlier-1.json" in capfd.readouterr().out
    assert (run / "oneshot" / "magnitude-50.earlier-1.json").is_symlink()
    assert tree(victim) == {"magnitude-50.json": b"USER DATA"}


def test_a_durable_write_refuses_a_link_under_the_files_name(tmp_path):
    target = tmp_path / "theirs.txt"
    target.write_text("theirs")
    (tmp_path / "mine.json").symlink_to(target)
    with pytest.raises(storage.StorageError, match="mine.json is a link"):
        storage.write_text_atomic(tmp_path / "mine.json", "{}")
    assert target.read_text() == "theirs" and (tmp_path / "mine.json").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json", "theirs.txt"]


def test_a_checkpoint_kept_for_branches_is_never_a_planted_link(tmp_path):
    from helpers import checkpoint_state
    from gpt2 import run_folder
    from gpt2.training import checkpoint

    checkpoint.save(tmp_path / "ckpt.pt", checkpoint_state(5), 5)
    dest = run_folder.branch_checkpoint(tmp_path, 5)
    dest.parent.mkdir()
    (tmp_path / "theirs.pt").write_text("theirs")
    dest.symlink_to(tmp_path / "theirs.pt")
    with pytest.raises(storage.StorageError, match="step-00000005.pt is a link"):
        checkpoint.keep(tmp_path / "ckpt.pt", dest)
    assert (tmp_path / "theirs.pt").read_text() == "theirs"
    assert not dest.with_name(dest.name + ".sha256").exists()


def test_an_extension_of_a_copied_run_trains_in_this_checkouts_results(run, tmp_path,
                                                                       monkeypatch):
    """A run copied from another machine records that machine's results folder: `make
    extend` once trained the new run there and moved a `latest` link there."""
    from gpt2.cli import run_commands
    from gpt2.training import trained

    record = json.loads((run / "config.json").read_text())
    record["results_dir"] = str(tmp_path / "escape-results")
    (run / "config.json").write_text(json.dumps(record))
    cfg = trained.extension_config({"extend_from": str(run), "max_iters": 40})
    assert cfg.results_dir == "results" and cfg.learning_rate == record["learning_rate"]
    # The bridge names this checkout's folder (CONFIG_RESULTS_DIR; results/ without a
    # .config), unless TRAIN_ARGS names one.
    started = []
    monkeypatch.setattr(run_commands, "run_child", lambda *a, **k: started.append(a[2]) or 0)
    monkeypatch.setattr(run_commands, "results_root", lambda: tmp_path / "mine")
    monkeypatch.setenv("RUN", str(run))
    monkeypatch.setenv("TRAIN_ARGS", "--max-iters=40")
    assert run_commands.cmd_extend() == 0
    assert f"--results-dir={tmp_path / 'mine'}" in started[0]
    monkeypatch.setenv("TRAIN_ARGS", f"--max-iters=40 --results-dir={tmp_path / 'given'}")
    assert run_commands.cmd_extend() == 0
    assert [a for a in started[1] if a.startswith("--results-dir")] == \
        [f"--results-dir={tmp_path / 'given'}"]
    # End to end: the new run and its `latest` link land where this command says.
    from helpers import call_main

    proc = call_main("gpt2/train.py", "--extend-from", str(run), "--max-iters=32",
                     f"--results-dir={tmp_path / 'mine'}", "--cpu-threads=1")
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "escape-results").exists()
    assert (tmp_path / "mine" / "latest").is_symlink()


# ---- readers check what they read -------------------------------------------------------------

@pytest.mark.parametrize("record,says", [
    ({"rounds": [{"round": 1, "added": [{"optimizer": "adamw", "label": "lr",
                                         "value": 1e400, "why": "planted"}]}]},
     "is not a point of this matrix's grids"),
    ({"rounds": [1]}, "round 1: a int, not an object"),
    ({"rounds": "many"}, "has no list of rounds"),
    (["a", "list"], "cannot be read as a JSON object"),
])
def test_the_report_refuses_an_extensions_file_its_matrix_never_wrote(tmp_path, bridge,
                                                                      capsys, record, says):
    """A planted point (value 1e400, which JSON reads as infinity) once gave a "Grid
    extension ... adamw lr + Infinity" section in the report of a matrix that never
    extended a grid; {"rounds": [1]} was a traceback."""
    folder = fake_matrix(tmp_path, seeds=(1,))
    (folder / extend.EXTENSIONS).write_text(json.dumps(record).replace("Infinity", "1e400"))
    assert bridge("report", RUN=str(folder)) == 2
    assert_clean_error(capsys.readouterr().err, says, "delete it")
    assert not (folder / "report.md").exists()


def test_a_planned_extension_point_is_read_and_others_are_not(tmp_path):
    plan = {"axes": {"grids": {"adamw": {"lr": {"field": "learning_rate",
                                                "values": [1e-3, 2e-3, 4e-3]}}}}}
    point = {"optimizer": "adamw", "label": "lr", "value": 4e-3, "why": "best at the top"}
    (tmp_path / extend.EXTENSIONS).write_text(json.dumps(
        {"rounds": [{"round": 1, "added": [point]}]}))
    assert extend.read_planned(tmp_path, plan)["rounds"][0]["added"] == [point]
    for wrong in ({"value": 8e-3}, {"label": "wd"}, {"optimizer": "muon"}, {"value": True}):
        (tmp_path / extend.EXTENSIONS).write_text(json.dumps(
            {"rounds": [{"round": 1, "added": [{**point, **wrong}]}]}))
        with pytest.raises(extend.PlanError, match="not a point"):
            extend.read_planned(tmp_path, plan)
    (tmp_path / extend.EXTENSIONS).write_text(json.dumps(
        {"rounds": [{"round": 2, "added": [point]}]}))
    with pytest.raises(extend.PlanError, match="round 2 where round 1"):
        extend.read_planned(tmp_path, plan)


def test_matrix_status_shows_what_status_json_may_hold_and_nothing_else(tmp_path, bridge,
                                                                        capsys):
    folder = fake_matrix(tmp_path, seeds=(1,), skip={"adamw-none-seed1"})
    (folder / "status.json").write_text(json.dumps({
        "adamw-none-seed1": {"attempts": -5, "status": "failed",
                             "error": "boom\x1b]0;retitled\x07\x1b[2J"},
        "adamw-magnitude-sparsity50-seed1": {"attempts": 10**9, "returncode": 7000,
                                             "status": "exploded", "wall_s": -3.0}}))
    from gpt2.matrix.plan_file import read_status

    status = read_status(folder)
    assert "attempts" not in status["adamw-none-seed1"]
    assert status["adamw-magnitude-sparsity50-seed1"] == {}
    assert bridge("matrix-status", RUN=str(folder)) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "adamw-none-seed1" in x)
    assert "-5" not in line and " 0  " in line
    assert "\x1b" not in out and "boom\\x1b]0;retitled\\x07\\x1b[2J" in line


def test_a_one_shot_result_is_read_only_as_its_writer_writes_it(tmp_path):
    from gpt2 import run_folder

    good = {"method": "wanda", "target_sparsity": 0.5, "structure": "unstructured",
            "calibration_samples": 2, "calibration_seed": 0, "step": 30,
            "config_hash": "abc", "val_loss": 5.0}
    path = tmp_path / "wanda-50.json"
    path.write_text(json.dumps(good))
    assert run_folder.read_oneshot(path) == good
    for wrong in ({"val_loss": -1.0}, {"target_sparsity": 2.0}, {"method": "random"},
                  {"calibration_samples": 0}, {"step": True}, {"config_hash": None}):
        path.write_text(json.dumps({**good, **wrong}))
        assert run_folder.read_oneshot(path) is None, wrong
    path.write_text('{"val_loss": NaN}')
    assert run_folder.read_oneshot(path) is None
    path.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps(good))
    path.symlink_to(tmp_path / "elsewhere.json")
    assert run_folder.read_oneshot(path) is None  # (a link is not this run's result)


# ---- numbers have ranges ---------------------------------------------------------------------

@pytest.mark.parametrize("variables,says", [
    ({"ONESHOT_ARGS": "--seed -1"}, "--seed: -1 is out of range"),
    ({"ONESHOT_ARGS": "--calibration-samples 99999999999"}, "out of range: from 1 to 65,536"),
    ({"SPARSITY": "1e-300"}, "fewer digits"),
    ({"SPARSITY": "1.5"}, "out of range"),
    ({"FINETUNE": "2", "ONESHOT_ARGS": "--finetune-lr inf"}, "not a finite number"),
    ({"FINETUNE": "2", "ONESHOT_ARGS": "--finetune-lr 1e9"}, "out of range"),
    ({"FINETUNE": "99999999999"}, "--finetune-steps: 99999999999 is out of range"),
])
def test_prune_oneshot_numbers_out_of_range_are_one_line_before_any_work(run, bridge, capfd,
                                                                         variables, says):
    """--seed -1, --calibration-samples 99999999999 and SPARSITY=1e-300 each ended in a
    traceback (the last after the pruning was done); --finetune-lr inf wrote Infinity
    into a .json; FINETUNE= had no upper bound."""
    assert bridge("prune-oneshot", RUN=str(run), METHOD="magnitude",
                  **{"SPARSITY": "0.5", **variables}) == 2
    assert_clean_error(capfd.readouterr().err, says)
    assert not (run / "oneshot").exists()


def test_a_rerun_of_another_calibration_keeps_the_earlier_result(run, bridge, capfd):
    assert prune(bridge, run, "--calibration-samples 2 --save-weights") == 0
    first = json.loads((run / "oneshot" / "magnitude-50.json").read_text())
    # (a folder of the user's under the first name the weights would take is left alone)
    (run / "oneshot" / "magnitude-50.earlier-1.pt").mkdir()
    assert prune(bridge, run, "--calibration-samples 2 --seed 7") == 0
    assert "the earlier result (calibration_seed 0) was there: kept as " \
        "magnitude-50.earlier-2.json" in capfd.readouterr().out
    names = sorted(p.name for p in (run / "oneshot").iterdir())
    assert names == ["magnitude-50.earlier-1.pt", "magnitude-50.earlier-2.json",
                     "magnitude-50.earlier-2.pt", "magnitude-50.json"]
    assert json.loads((run / "oneshot" / "magnitude-50.earlier-2.json").read_text()) == first
    assert json.loads((run / "oneshot" / "magnitude-50.json").read_text())[
        "calibration_seed"] == 7
    # The same calibration again is the same computation: replaced, nothing more kept.
    assert prune(bridge, run, "--calibration-samples 2 --seed 7") == 0
    assert sorted(p.name for p in (run / "oneshot").iterdir()) == names
    # A file that is no result kgpt wrote (a user's, or a damaged one, which a matrix
    # prunes again) is kept too, never replaced.
    (run / "oneshot" / "magnitude-50.json").write_text("my notes")
    assert prune(bridge, run, "--calibration-samples 2 --seed 7") == 0
    assert "a file that is not a one-shot result kgpt wrote was there: kept as " \
        "magnitude-50.earlier-3.json" in capfd.readouterr().out
    assert (run / "oneshot" / "magnitude-50.earlier-3.json").read_text() == "my notes"
    # A folder there is refused before any work.
    (run / "oneshot" / "magnitude-50.json").unlink()
    (run / "oneshot" / "magnitude-50.json").mkdir()
    assert prune(bridge, run) == 2
    assert_clean_error(capfd.readouterr().err, "is a folder or a pipe")


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every entry point's parser, as its main() builds it (caught at parse_args)."""
    from gpt2 import evaluate, generate, prepare_data, prune_oneshot, train
    from scripts import bench, bench_optim, memcheck

    found = {}

    class Caught(Exception):
        pass

    def catch(self, args=None, namespace=None):
        found[self.prog] = self
        raise Caught

    mains = (train.main, generate.main, evaluate.main, prune_oneshot.main, export.main,
             prepare_data.main, bench.main, bench_optim.main, memcheck.main)
    original = StrictArgumentParser.parse_args
    StrictArgumentParser.parse_args = catch
    try:
        for main in mains:
            with pytest.raises(Caught):
                main([])
    finally:
        StrictArgumentParser.parse_args = original
    return found


def test_every_number_flag_of_every_entry_point_has_a_range():
    found = parsers()
    assert {"gpt2/train.py", "gpt2/prune_oneshot.py", "gpt2/generate.py"} <= set(found)
    numbers = 0
    for prog, parser in found.items():
        assert parser.unbounded() == [], prog
        for action in parser._actions:
            bounds = getattr(action.type, "bounds", None)
            if bounds is not None:
                numbers += 1
                assert None not in bounds, (prog, action.option_strings)
    assert numbers > 100  # (train.py's settings among them: the walk saw them)


@pytest.mark.parametrize("flag,value", [("--num-samples", "0"), ("--num-samples", "1001"),
                                        ("--seed", "-1"), ("--temperature", "nan"),
                                        ("--top-k", "-1")])
def test_generate_numbers_out_of_range_are_one_line(flag, value, capsys):
    from gpt2 import generate

    with pytest.raises(SystemExit) as stop:
        generate.main(["--run-dir", "nowhere", flag, value])
    assert stop.value.code == 2
    assert_clean_error(capsys.readouterr().err, f"argument {flag}")


# ---- pages and terminals ---------------------------------------------------------------------

def test_notes_show_code_as_written_and_never_publish_a_linked_file(run, tmp_path, bridge):
    (run / "notes.md").write_text("Compare `a < b && c > d`:\n\n```\nif x < y & z:\n```\n\n"
                                  "and x < y & z in prose.\n")
    assert bridge("results", RUN=str(run)) == 0
    page = (run / pages.RUN_PAGE).read_text()
    assert "<code>a &lt; b &amp;&amp; c &gt; d</code>" in page
    assert "<pre><code>if x &lt; y &amp; z:" in page
    assert "x &lt; y &amp; z in prose" in page and "&amp;lt;" not in page
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-KEY-0123")
    (run / "notes.md").unlink()
    (run / "notes.md").symlink_to(secret)
    (run / "samples.txt").unlink(missing_ok=True)
    (run / "samples.txt").symlink_to(secret)
    assert bridge("results", RUN=str(run)) == 0
    page = (run / pages.RUN_PAGE).read_text()
    assert "SECRET-KEY" not in page
    assert 'href="notes.md"' not in page and 'href="samples.txt"' not in page


def test_a_changed_missing_or_planted_chart_file_is_one_line(run, tmp_path, bridge, capsys,
                                                             monkeypatch):
    vendor = tmp_path / "vendor"
    shutil.copytree(charts.VENDOR, vendor)
    monkeypatch.setattr(charts, "VENDOR", vendor)
    name = "uPlot.iife.min.js"
    for damage, says in ((lambda p: p.write_bytes(p.read_bytes() + b"\n"), "sha256 differs"),
                         (lambda p: p.unlink(), "is missing"),
                         (lambda p: (p.unlink(), os.mkfifo(tmp_path / "fifo"),
                                     p.symlink_to(tmp_path / "fifo")), "is missing")):
        shutil.copy(charts.__file__.replace("charts.py", f"vendor/uplot/{name}"), vendor / name)
        damage(vendor / name)
        charts.library.cache_clear()
        signal.alarm(60)  # (a reader waiting on the FIFO would hang here)
        try:
            assert bridge("results", RUN=str(run)) == 2
        finally:
            signal.alarm(0)
        assert_clean_error(capsys.readouterr().err, name, says)
        (vendor / name).unlink(missing_ok=True)
    charts.library.cache_clear()


def test_generate_shows_control_characters_instead_of_sending_them(run, bridge, capfd):
    assert bridge("generate", RUN=str(run), PROMPT="ROMEO\x1b]0;retitled\x07:",
                  MAX_NEW_TOKENS="4") == 0
    out, err = capfd.readouterr()
    assert "\x1b" not in out + err and "\x07" not in out
    assert "ROMEO\\x1b]0;retitled\\x07:" in out


# ---- the second hostile pass (on this issue's own changes) -----------------------------------

def test_a_plan_of_nested_aliases_is_refused_at_once(tmp_path):
    """Ten lines of nested YAML aliases (a 794-byte plan.yaml) once took `make
    matrix-status` 101 s and 3 GB, formatting one cell id."""
    from gpt2.errors import PlanFileError
    from gpt2.matrix import plan_file

    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"] + [
        f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 10)]
    (tmp_path / "plan.yaml").write_text("name: m\nhash: h\n" + "\n".join(lines)
                                        + "\ncells: [{id: *l9}]\n")
    with pytest.raises(PlanFileError, match="an alias"):
        plan_file.read_plan(tmp_path)
    # kgpt's own plan.yaml never holds one, even of a list it holds twice.
    shared = ["--max-iters=5"]
    text = yaml.dump({"a": shared, "b": shared}, Dumper=plan_file.PlanDumper)
    assert "*" not in text and yaml.safe_load(text) == {"a": shared, "b": shared}


def test_a_record_of_gigabytes_is_not_read(run, bridge):
    """A 3 GB summary.json of holes (no disk used) once cost `make results` 4 GB of
    memory; past a record's limit a file is read as damaged, without reading it."""
    from gpt2 import run_folder

    with open(run / "summary.json", "r+b") as f:
        f.truncate(3 << 30)
    assert run_folder.read_summary(run) is None
    assert storage.read_regular(run / "summary.json") is None  # (past READ_LIMIT too)
    assert bridge("results", RUN=str(run)) == 0


def test_summary_figures_outside_what_the_trainer_writes_are_not_known(run, bridge):
    from gpt2 import run_folder

    record = json.loads((run / "summary.json").read_text())
    record.update(iters=10**40, tokens_per_sec=-5.0, device=7, final_val_loss=float("nan"))
    (run / "summary.json").write_text(json.dumps(record))
    summary = run_folder.read_summary(run)
    assert (summary.iters, summary.tokens_per_sec, summary.device) == (None, None, None)
    assert summary.final_val_loss != summary.final_val_loss  # (NaN: a diverged loss stays)
    assert bridge("results", RUN=str(run)) == 0
    page = (run / pages.RUN_PAGE).read_text()
    assert '<div class="v">-5</div>' not in page and "1e+40" not in page


def test_what_an_export_record_says_reaches_the_terminal_shown_not_obeyed(run, tmp_path,
                                                                          bridge, capfd):
    out = run / "hf"
    out.mkdir()
    (out / "kgpt.json").write_text(json.dumps({"run": "\x1b[2J\x1b]0;owned\x07\r FAKE"}))
    assert bridge("export", RUN=str(run)) == 2
    err = capfd.readouterr().err
    assert "\x1b" not in err and "\r" not in err
    assert_clean_error(err, "an export of another run (\\x1b[2J\\x1b]0;owned\\x07\\x0d FAKE)")


def test_tensorboard_never_takes_a_planted_mark_or_links_a_run_it_refused(run, tmp_path,
                                                                         bridge, capsys):
    from gpt2.results import tensorboard

    events = run / tensorboard.FOLDER
    events.mkdir()
    (events / "mine.txt").write_text("mine")
    (tmp_path / "mark").write_text("")
    (events / tensorboard.MARK).symlink_to(tmp_path / "mark")
    assert bridge("tensorboard", RUN=str(run)) == 0
    assert (events / "mine.txt").read_text() == "mine"
    shutil.rmtree(events)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    events.symlink_to(elsewhere)
    assert bridge("tensorboard", RUN=str(run)) == 2
    assert_clean_error(capsys.readouterr().err, "is a link")
    view = run.parent / tensorboard.VIEW
    assert not any(p.is_symlink() and p.resolve() == elsewhere for p in view.rglob("*")) \
        if view.exists() else True


def test_keep_steps_has_a_range(capsys):
    from gpt2 import train

    with pytest.raises(SystemExit) as stop:
        train.main(["--keep-steps=5,99999999999", "--dry-run"])
    assert stop.value.code == 2
    assert_clean_error(capsys.readouterr().err, "steps are from 1 to 1,000,000,000")


# ---- the third hostile pass ------------------------------------------------------------------

def test_a_folder_or_a_pipe_under_a_files_name_is_one_line_never_a_crash(tmp_path):
    (tmp_path / "summary.csv").mkdir()
    (tmp_path / "summary.csv" / "mine.txt").write_text("mine")
    os.mkfifo(tmp_path / "report.md")
    for name in ("summary.csv", "report.md"):
        with pytest.raises(storage.StorageError, match="is a folder or a pipe"):
            storage.write_text_atomic(tmp_path / name, "text")
    assert (tmp_path / "summary.csv" / "mine.txt").read_text() == "mine"


def test_a_folder_under_a_checkpoint_leftovers_name_is_not_a_leftover(tmp_path):
    from helpers import checkpoint_state
    from gpt2.training import checkpoint

    checkpoint.save(tmp_path / "ckpt.pt", checkpoint_state(5), 5)
    planted = tmp_path / "checkpoints" / ".step-00000009.pt.evil.tmp"
    planted.mkdir()
    checkpoint.save(tmp_path / "ckpt.pt", checkpoint_state(6), 6)  # (it once raised here)
    assert planted.is_dir()


def test_text_that_utf8_cannot_hold_is_written_and_shown_escaped(tmp_path, bridge, capsys):
    """A lone surrogate (a JSON "\\ud800", an undecodable byte of a folder's name) once
    ended `make report` and `make results` in a UnicodeEncodeError; 0x9b, the 8-bit CSI,
    reached the terminal as a byte."""
    from gpt2.processes import terminal_safe

    storage.write_text_atomic(tmp_path / "t.md", "boom \ud800 and \udc9b")
    assert (tmp_path / "t.md").read_text() == "boom \\ud800 and \\udc9b"
    assert terminal_safe("Hi\udc9b2J \ud800 \u200f\u061c\u200b\ufeff") == \
        "Hi\\x9b2J \\ud800 \\u200f\\u061c\\u200b\\ufeff"
    folder = fake_matrix(tmp_path / "m", seeds=(1,), status={"adamw-none-seed1": "failed"})
    cell = folder / "cells" / "adamw-none-seed1" / "summary.json"
    record = json.loads(cell.read_text())
    cell.write_text(json.dumps({**record, "error": "boom \ud800\x1b[2J"}))
    assert bridge("report", RUN=str(folder)) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x1b" not in (folder / "report.md").read_text()


def test_torchrun_flags_with_control_characters_are_refused(bridge, capsys, monkeypatch):
    monkeypatch.setenv("TORCHRUN_ARGS", "--rdzv-endpoint=\x1b]0;PWN\x07:0")
    assert bridge("train") == 2
    assert_clean_error(capsys.readouterr().err, "TORCHRUN_ARGS holds the control character "
                       "\\x1b")


def test_a_name_in_the_tensorboard_view_that_is_a_users_file_is_left_alone(run, bridge,
                                                                          capfd):
    from gpt2.results import tensorboard

    view = run.parent / tensorboard.VIEW
    view.mkdir()
    (view / run.name).write_text("notes")
    assert bridge("tensorboard", RUN=str(run)) == 0
    assert "is not a link kgpt made" in capfd.readouterr().out
    assert (view / run.name).read_text() == "notes"


def test_memcheck_writes_its_json_as_every_kgpt_file(tmp_path, capsys):
    from scripts import memcheck

    victim = tmp_path / "victim"
    victim.write_text("theirs")
    (tmp_path / "link.json").symlink_to(victim)
    (tmp_path / "folder.json").mkdir()
    for name, says in (("link.json", "is a link"), ("folder.json", "is a folder or a pipe")):
        assert memcheck.main(["--model-size=custom", "--n-layer=1", "--n-head=1",
                              "--n-embd=32", "--device=cpu", f"--json={tmp_path / name}"]) == 2
        assert_clean_error(capsys.readouterr().err, says)
    assert victim.read_text() == "theirs"


def test_a_plan_of_megabytes_of_bare_values_is_refused_in_seconds(tmp_path):
    """8 MB of "1," in a planted plan.yaml once took `make matrix-status` minutes."""
    from gpt2.errors import PlanFileError
    from gpt2.matrix import plan_file

    (tmp_path / "plan.yaml").write_text("name: m\nhash: h\njunk: ["
                                        + ",".join(["1"] * (plan_file.PLAN_EVENTS + 10))
                                        + "]\ncells: []\n")
    with pytest.raises(PlanFileError, match="more than 1,000,000 values"):
        plan_file.read_plan(tmp_path)
    with open(tmp_path / "plan.yaml", "r+b") as f:
        f.truncate(plan_file.PLAN_LIMIT + 1)
    with pytest.raises(PlanFileError, match="past any plan kgpt writes"):
        plan_file.read_plan(tmp_path)


def test_make_help_shows_a_defconfigs_escapes_and_odd_bytes(tmp_path, monkeypatch, capsys):
    from gpt2.cli import help as make_help
    from gpt2.cli import presets

    shutil.copytree(presets.DEFCONFIG_DIR, tmp_path / "defconfigs")
    (tmp_path / "defconfigs" / "zz-evil").write_text("# evil \x1b]0;PWNED\x07\x1b[2J desc\n")
    (tmp_path / "defconfigs" / "zz-bad").write_bytes(b"# caf\xe9 \xff\n")
    monkeypatch.setattr(presets, "DEFCONFIG_DIR", tmp_path / "defconfigs")
    assert make_help.cmd_help() == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "evil \\x1b]0;PWNED\\x07\\x1b[2J desc" in out and "zz-bad" in out
