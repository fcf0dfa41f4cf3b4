"""Checkpoint files in-process (gpt2/training/checkpoint.py): what a save leaves on
disk, which checkpoint a resume picks, and the exact refusal of each damaged or
foreign file with the advice that goes with it. test_reliability.py kills and damages
real training runs; these are the fast checks of the same rules."""

from __future__ import annotations

import hashlib
import os
import signal

import pytest
import torch
from helpers import checkpoint_state

from gpt2.errors import CheckpointError
from gpt2.training import checkpoint
from gpt2.run_folder import final_step, list_checkpoints, newest, present, step_of
from gpt2.training.checkpoint import (contents_problem, recorded_sha256, resolve, save,
                                      set_aside_after, verify)


def state(step: int, **over) -> dict:
    return checkpoint_state(step, **{"model": {"w": torch.full((4,), float(step))}, **over})


@pytest.fixture
def link(tmp_path):
    return tmp_path / "ckpt.pt"


def names(link) -> list[str]:
    return sorted(p.name for p in (link.parent / "checkpoints").iterdir())


def test_a_save_writes_the_file_its_checksum_and_moves_the_link_keeping_two(link):
    assert not present(link) and newest(link) is None and list_checkpoints(link) == []
    first = save(link, state(4), 4)
    assert first == link.parent / "checkpoints" / "step-00000004.pt"
    assert os.readlink(link) == "checkpoints/step-00000004.pt"
    digest = hashlib.sha256(first.read_bytes()).hexdigest()
    assert (first.parent / "step-00000004.pt.sha256").read_text() == f"{digest}  step-00000004.pt\n"
    assert recorded_sha256(first) == digest
    (link.parent / "checkpoints" / ".step-00000006.pt.tmp").write_bytes(b"x")  # a killed save's
    save(link, state(8), 8)
    save(link, state(12), 12)
    assert names(link) == ["step-00000008.pt", "step-00000008.pt.sha256",
                           "step-00000012.pt", "step-00000012.pt.sha256"]
    assert newest(link).name == "step-00000012.pt" and present(link)
    assert [step_of(p) for p in list_checkpoints(link)] == [8, 12]
    assert final_step(newest(link)) == 12
    loaded = checkpoint.load(link)
    assert loaded["step"] == 12 and loaded["format"] == checkpoint.FORMAT
    assert torch.equal(loaded["model"]["w"], torch.full((4,), 12.0))


def test_saving_the_step_the_link_names_again_never_rewrites_that_file(link):
    save(link, state(4), 4)
    again = save(link, state(4, best_val_loss=1.5), 4)
    assert again.name == "step-00000004-1.pt" and os.readlink(link) == "checkpoints/" + again.name
    third = save(link, state(4, best_val_loss=2.5), 4)
    assert third.name == "step-00000004.pt"  # the file the link no longer names
    assert os.readlink(link) == "checkpoints/step-00000004.pt"
    assert checkpoint.load(link)["best_val_loss"] == 2.5
    assert checkpoint.load(again)["best_val_loss"] == 1.5  # the previous one, untouched


def test_a_state_that_is_not_what_a_checkpoint_holds_is_refused_both_ways(link):
    assert contents_problem(state(1)) is None
    bad = state(1)
    del bad["rng"], bad["scaler"]
    assert contents_problem(bad) == "lacks scaler, rng"
    assert contents_problem({**state(1), "step": "1", "sharded": 1}) == "step is a str, sharded is a int"
    with pytest.raises(ValueError) as err:
        save(link, bad, 1)
    assert str(err.value) == "the checkpoint state lacks scaler, rng (checkpoint.CONTENTS)"
    assert not present(link)


def _write_with_checksum(path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")


class NotPlainData:
    pass


def test_a_checksummed_file_that_is_not_a_checkpoint_is_refused_saying_what_it_is(tmp_path):
    folder = tmp_path / "checkpoints"
    p = folder / "step-00000001.pt"
    _write_with_checksum(p, {"format": 99, **state(1)})
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(p)
    assert str(err.value) == f"{p} is not a kgpt checkpoint of format 1"
    _write_with_checksum(p, [1, 2])
    with pytest.raises(CheckpointError, match="is not a kgpt checkpoint of format 1"):
        checkpoint.load(p)
    old = {"format": 1, **state(1)}
    del old["pending_row"]
    _write_with_checksum(p, old)
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(p)
    assert str(err.value) == (f"{p} lacks pending_row: it was written by another kgpt or "
                              "changed since, so it cannot be resumed or sampled from.")
    _write_with_checksum(p, {"format": 1, **state(1), "model": NotPlainData()})
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(p)
    assert str(err.value).startswith(f"{p} holds objects other than tensors and plain data; "
                                     "it is refused, since loading it could run code (")
    _write_with_checksum(p, {"format": 1, **state(1)})
    cut = p.read_bytes()[:-200]  # cut short, and checksummed as it is
    p.write_bytes(cut)
    p.with_name(p.name + ".sha256").write_text(f"{hashlib.sha256(cut).hexdigest()}  {p.name}\n")
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(p)
    assert str(err.value).startswith(f"{p} cannot be read as a checkpoint: ")
    assert final_step(p) is None


def test_verify_names_a_missing_unchecksummed_or_damaged_file(link):
    path = save(link, state(4), 4)
    verify(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    actual = hashlib.sha256(bytes(data)).hexdigest()
    with pytest.raises(CheckpointError) as err:
        verify(path)
    assert str(err.value) == (
        f"{path} is damaged: its sha256 is {actual[:16]}..., step-00000004.pt.sha256 says "
        f"{recorded_sha256(path)[:16]}... (a truncated, overwritten or bit-flipped file)")
    path.with_name(path.name + ".sha256").unlink()
    assert recorded_sha256(path) == ""
    with pytest.raises(CheckpointError) as err:
        verify(path)
    assert str(err.value) == (f"{path} has no step-00000004.pt.sha256 beside it: it was not "
                              "written completely by kgpt, so it is not trusted")
    path.unlink()
    with pytest.raises(CheckpointError) as err:
        verify(path)
    assert str(err.value) == f"{path} is missing"


def test_a_damaged_newest_checkpoint_points_to_the_intact_older_one(link):
    save(link, state(4), 4)
    newer = save(link, state(8), 8)
    newer.write_bytes(newer.read_bytes()[:-10])
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(link)
    assert str(err.value).endswith(
        "(a truncated, overwritten or bit-flipped file) The checkpoint of step 4 is intact: to "
        "resume from it, run `make TRAIN_ARGS=--resume-step=4` (or add --resume-step 4 to "
        "train.py).")
    assert resolve(link, step=4).name == "step-00000004.pt"
    with pytest.raises(CheckpointError) as err:
        resolve(link, step=5)
    assert str(err.value) == f"{link.parent} has no checkpoint of step 5 (checkpoints: 4, 8)"
    older = resolve(link, step=4)
    older.write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(link)
    assert str(err.value).endswith(f" No intact checkpoint is left: move {link.parent} away (or "
                                   "delete it) to start the run over.")


def test_the_link_missing_dangling_or_a_plain_file(link, capsys):
    save(link, state(4), 4)
    path8 = save(link, state(8), 8)
    link.unlink()  # killed between a first save and its link, or deleted
    assert present(link) and newest(link) == path8
    assert resolve(link) == path8
    assert capsys.readouterr().out == (f"note: {link} is missing; resuming from the newest "
                                       f"intact checkpoint, {path8}\n")
    assert checkpoint.load(link, link=link)["step"] == 8
    assert os.readlink(link) == "checkpoints/step-00000008.pt"  # restored for the next save
    path8.unlink()
    with pytest.raises(CheckpointError) as err:
        resolve(link)
    assert str(err.value) == (
        f"{link} points at {path8}, which is missing. The checkpoint of step 4 is intact: to "
        "resume from it, run `make TRAIN_ARGS=--resume-step=4` (or add --resume-step 4 to "
        "train.py).")
    link.unlink()
    link.write_bytes(b"old")
    assert newest(link) is None
    with pytest.raises(CheckpointError) as err:
        resolve(link)
    assert str(err.value) == (
        f"{link} is a plain file, not a link to a checksummed checkpoint: it was written by an "
        "older kgpt, which this one cannot resume; move the run folder away to start over")
    link.unlink()
    (link.parent / "checkpoints" / "step-00000004.pt.sha256").write_text("0" * 64 + "  x\n")
    with pytest.raises(CheckpointError) as err:
        resolve(link)
    assert str(err.value) == (f"{link.parent} has checkpoints but none is intact and no ckpt.pt "
                              f"names one. No intact checkpoint is left: move {link.parent} "
                              "away (or delete it) to start the run over.")


def test_a_first_save_killed_before_its_checksum_is_no_checkpoint(link):
    folder = link.parent / "checkpoints"
    folder.mkdir()
    (folder / "step-00000004.pt").write_bytes(b"partial")
    assert not present(link)  # nothing committed: a fresh start
    (folder / "step-00000004.pt.sha256").write_text("x  step-00000004.pt\n")
    assert present(link)  # committed: never mistaken for a fresh start
    (folder / "notes.txt").write_text("")
    assert [p.name for p in list_checkpoints(link)] == ["step-00000004.pt"]
    os.symlink("elsewhere.txt", link)
    assert newest(link) is None  # names something other than a checkpoint
    with pytest.raises(CheckpointError) as err:
        step_of(link.parent / "elsewhere.txt")
    assert str(err.value) == (f"{link.parent / 'elsewhere.txt'} is not named like a checkpoint "
                              "(step-NNNNNNNN.pt)")


def test_resuming_an_older_step_sets_the_newer_ones_aside(link):
    p4 = save(link, state(4), 4)
    save(link, state(8), 8)
    (link.parent / "checkpoints" / "step-00000008.pt.sha256").unlink()
    aside = set_aside_after(link, p4)
    assert [p.name for p in aside] == ["superseded-step-00000008.pt"]
    assert names(link) == ["step-00000004.pt", "step-00000004.pt.sha256",
                           "superseded-step-00000008.pt"]
    assert os.readlink(link) == "checkpoints/step-00000004.pt"
    save(link, state(12), 12)
    save(link, state(16), 16)  # pruning never touches what was set aside
    assert names(link) == ["step-00000012.pt", "step-00000012.pt.sha256", "step-00000016.pt",
                           "step-00000016.pt.sha256", "superseded-step-00000008.pt"]
    p20 = save(link, state(20), 20)
    (link.parent / "checkpoints" / "step-00000016.pt.sha256").write_text("y  z\n")
    assert [p.name for p in set_aside_after(link, list_checkpoints(link)[0])] == [
        "superseded-step-00000020.pt"]
    assert (p20.parent / "superseded-step-00000020.pt.sha256").is_file()


# ---- the injected faults, the writer, and the rarer paths ---------------------------------

def test_the_writer_hashes_what_it_writes_and_a_full_disk_stops_it_at_the_byte(tmp_path):
    from gpt2.training.checkpoint import _HashingWriter

    chunks = [b"abc", bytearray(b"defgh"), torch.arange(4, dtype=torch.int32).numpy().tobytes()]
    with open(tmp_path / "f", "wb") as f:
        w = _HashingWriter(f)
        for c in chunks:
            assert w.write(c) == len(c)
    whole = b"".join(bytes(c) for c in chunks)
    assert (tmp_path / "f").read_bytes() == whole
    assert (w.size, w.sha.hexdigest()) == (len(whole), hashlib.sha256(whole).hexdigest())
    with open(tmp_path / "g", "wb") as f:
        w = _HashingWriter(f, full_after=6)
        w.write(b"abcd")
        with pytest.raises(OSError) as err:
            w.write(b"efghij")
    assert (tmp_path / "g").read_bytes() == b"abcdef"  # what fitted, as a full disk leaves it
    assert (err.value.errno, err.value.strerror) == (28, os.strerror(28))
    assert w.error is err.value and w.size == 4


def test_a_disk_full_mid_save_leaves_the_previous_checkpoint_named(link, monkeypatch):
    from gpt2.errors import StorageError

    save(link, state(4), 4)
    monkeypatch.setenv("KGPT_FAULTS", "enospc-in-checkpoint@8")
    with pytest.raises(StorageError) as err:
        save(link, state(8, model={"w": torch.zeros(4096)}), 8)  # more than FAULT_AFTER
    assert str(err.value) == (f"disk full while writing {link.parent}/checkpoints/step-00000008.pt"
                              ": free space and run the same command again to resume")
    assert names(link) == ["step-00000004.pt", "step-00000004.pt.sha256"]  # partial removed
    assert os.readlink(link) == "checkpoints/step-00000004.pt"
    save(link, state(12), 12)  # the fault is for step 8 only
    assert newest(link).name == "step-00000012.pt"


def test_a_kill_mid_save_strikes_after_the_promised_bytes(link, monkeypatch):
    """kill-in-checkpoint SIGKILLs the process FAULT_AFTER bytes into the file (the
    reliability tests then resume from what is left); here the kill is caught."""
    class Killed(Exception):
        pass

    seen = {}

    def kill(pid, sig):
        # (the temporary file's name is random: storage.open_temp)
        (tmp,) = (link.parent / "checkpoints").glob(".step-00000004.pt.*.tmp")
        seen.update(pid=pid, sig=sig, size=tmp.stat().st_size)
        raise Killed

    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setenv("KGPT_FAULTS", "kill-in-checkpoint@4")
    with pytest.raises((Killed, RuntimeError)):  # torch's writer wraps what write raises
        save(link, state(4, model={"w": torch.zeros(4096)}), 4)  # more than FAULT_AFTER
    assert seen == {"pid": os.getpid(), "sig": signal.SIGKILL, "size": checkpoint.FAULT_AFTER}
    assert not present(link)


def test_what_the_final_step_lookup_trusts(tmp_path):
    p = tmp_path / "checkpoints" / "step-00000001.pt"
    _write_with_checksum(p, {"format": 1, **state(1, max_iters=40)})
    assert final_step(p) == 40
    for unusable in ([1, 2], {"max_iters": "40"}, {"max_iters": 40, "x": NotPlainData()}):
        _write_with_checksum(p, unusable)  # not a dict, not a step, not plain data
        assert final_step(p) is None, unusable
    assert final_step(tmp_path / "missing.pt") is None


def test_order_newest_and_presence_by_names_alone(link):
    folder = link.parent / "checkpoints"
    os.symlink("checkpoints/step-00000009.pt", link)
    assert present(link)  # a dangling link is a broken checkpoint, not a fresh start
    link.unlink()
    folder.mkdir()
    for name in ("step-00000008.pt", "step-00000004-1.pt", "step-00000012.pt",
                 "step-00000004.pt"):
        (folder / name).write_bytes(b"")
    assert [p.name for p in list_checkpoints(link)] == [
        "step-00000004.pt", "step-00000004-1.pt", "step-00000008.pt", "step-00000012.pt"]
    assert newest(link).name == "step-00000012.pt"


def test_a_save_never_prunes_the_file_it_just_wrote(link):
    """Re-saving step 1 after a resume from it, with newer checkpoints on disk: the
    new file sorts oldest, yet the link names it, so it stays."""
    save(link, state(4), 4)
    save(link, state(6), 6)
    (link.parent / "checkpoints" / "step-00000006.pt.sha256").unlink()  # pruned without one
    save(link, state(8), 8)
    assert [p.name for p in list_checkpoints(link)] == ["step-00000006.pt", "step-00000008.pt"]
    checkpoint.point(link, link.parent / "checkpoints" / "step-00000006.pt")
    (link.parent / "checkpoints" / "step-00000001.pt").write_bytes(b"")
    again = save(link, state(1), 1)
    assert again.name == "step-00000001.pt" and checkpoint.load(link)["step"] == 1


def test_the_rarer_refusals_and_choices_of_resolve_and_load(link, capsys):
    with pytest.raises(CheckpointError) as err:
        resolve(link, step=3)
    assert str(err.value) == f"{link.parent} has no checkpoint of step 3 (checkpoints: none)"
    p4 = save(link, state(4), 4)
    p8 = save(link, state(8), 8)
    p12 = save(link, state(12), 12)
    assert checkpoint.load(p8, link=link)["step"] == 8  # the file asked for, not the link's
    meta = checkpoint.load(link, map_location="meta")
    assert meta["model"]["w"].device.type == "meta"
    p12.write_bytes(p12.read_bytes()[:-1])
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(p12)  # no link: no advice about other checkpoints
    with pytest.raises(CheckpointError) as plain:
        verify(p12)
    assert str(err.value) == str(plain.value)
    link.unlink()  # and the newest is damaged: the newest intact one is taken
    assert resolve(link) == p8
    assert capsys.readouterr().out.endswith(f"intact checkpoint, {p8}\n")
    set_aside_after(link, p8)
    assert [p.name for p in list_checkpoints(link)] == [p8.name]
    assert (p4.parent / f"superseded-{p12.name}").is_file() and not p4.exists()


def test_a_load_refusal_quotes_the_first_line_of_torchs_reason(tmp_path):
    import pickle

    p = tmp_path / "checkpoints" / "step-00000001.pt"
    _write_with_checksum(p, {"format": 1, **state(1), "model": NotPlainData()})
    with pytest.raises(pickle.UnpicklingError) as torch_says:
        torch.load(p, weights_only=True)
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(p)
    assert str(err.value) == (f"{p} holds objects other than tensors and plain data; it is "
                              "refused, since loading it could run code "
                              f"({str(torch_says.value).splitlines()[0]})")


def test_a_save_makes_the_folders_it_needs(tmp_path):
    link = tmp_path / "results" / "run" / "ckpt.pt"  # neither folder exists yet
    save(link, state(2), 2)
    assert os.readlink(link) == "checkpoints/step-00000002.pt"
    recorded = (link.parent / "checkpoints" / "step-00000002.pt.sha256")
    recorded.write_text("")
    assert recorded_sha256(link.parent / "checkpoints" / "step-00000002.pt") == ""


def test_an_older_resume_sets_aside_only_what_came_after_it(link):
    p4, p8 = save(link, state(4), 4), save(link, state(8), 8)
    p12 = p8.with_name("step-00000012.pt")
    _write_with_checksum(p12, {"format": 1, **state(12)})
    assert [p.name for p in set_aside_after(link, p8)] == ["superseded-step-00000012.pt"]
    assert p4.is_file() and p8.is_file() and os.readlink(link) == "checkpoints/" + p8.name


def test_a_foreign_checkpoint_behind_the_link_gets_the_advice_too(link):
    save(link, state(4), 4)
    p8 = link.parent / "checkpoints" / "step-00000008.pt"
    foreign = {"format": 1, **state(8)}
    del foreign["rng"]
    _write_with_checksum(p8, foreign)
    checkpoint.point(link, p8)
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(link)
    assert str(err.value) == (
        f"{p8} lacks rng: it was written by another kgpt or changed since, so it cannot be "
        "resumed or sampled from. The checkpoint of step 4 is intact: to resume from it, run "
        "`make TRAIN_ARGS=--resume-step=4` (or add --resume-step 4 to train.py).")


def test_an_unreadable_checkpoint_quotes_torchs_first_line(tmp_path):
    p = tmp_path / "checkpoints" / "step-00000001.pt"
    _write_with_checksum(p, {"format": 1, **state(1)})
    cut = p.read_bytes()[:-200]
    p.write_bytes(cut)
    p.with_name(p.name + ".sha256").write_text(f"{hashlib.sha256(cut).hexdigest()}  {p.name}\n")
    with pytest.raises(RuntimeError) as torch_says:
        torch.load(p, weights_only=True)
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(p)
    assert str(err.value) == (f"{p} cannot be read as a checkpoint: "
                              f"{str(torch_says.value).splitlines()[0]}")


class FakeTrainState:
    """What the Checkpointer asks of the trainer's state: its progress and a state dict."""

    def __init__(self):
        self.progress = type("Progress", (), {"step": 0, "pending_row": None})()
        self.gathered = 0

    def state_dict(self) -> dict:
        self.gathered += 1
        return state(self.progress.step, pending_row=self.progress.pending_row or {})


@pytest.mark.parametrize("main", [True, False])
def test_the_checkpointer_saves_on_interval_last_halt_and_kept_steps_only(tmp_path, main):
    """Every 4 steps, the last (10), a halt (step 5), a kept step (7, hard-linked for
    branches); every process gathers the state, only the main one writes."""
    from gpt2 import run_folder

    link = tmp_path / "ckpt.pt"
    saver = checkpoint.Checkpointer(tmp_path, link, interval=4, last_step=10, keep_steps=(7,),
                                    main=main, last_saved=None)
    train_state = FakeTrainState()
    saved = []
    for step in range(1, 11):
        train_state.progress.step = step
        before = train_state.gathered
        saver.after_step(train_state, step, halt=step == 5)
        if train_state.gathered > before:
            saved.append(step)
    assert saved == [4, 5, 7, 8, 10]
    assert saver.last_saved == 10
    assert [step_of(p) for p in list_checkpoints(link)] == ([8, 10] if main else [])
    assert run_folder.branch_checkpoint(tmp_path, 7).is_file() is main
    assert not run_folder.branch_checkpoint(tmp_path, 8).exists()


def test_a_save_for_a_cut_evaluation_carries_its_row_to_the_resume(tmp_path):
    link = tmp_path / "ckpt.pt"
    saver = checkpoint.Checkpointer(tmp_path, link, 100, 1000, (), True, last_saved=3)
    train_state = FakeTrainState()
    train_state.progress.step = 6
    saver.save(train_state, pending={"step": 6, "train_loss": 2.5})
    assert saver.last_saved == 6
    assert checkpoint.load(link)["pending_row"] == {"step": 6, "train_loss": 2.5}
