"""Checkpoints: atomic, checksummed, and loaded with torch.load(weights_only=True).

In a run folder:

    checkpoints/step-00000100.pt          a checkpoint
    checkpoints/step-00000100.pt.sha256   its sha256, in sha256sum's format
    ckpt.pt -> checkpoints/step-00000100.pt   the newest complete checkpoint

A save writes the checkpoint to a temporary file (hashing the bytes as they go),
fsyncs it, renames it into place, writes its .sha256 the same way, and only then
moves the ckpt.pt link: a process killed at any moment leaves ckpt.pt on a complete,
verified checkpoint. The newest KEEP checkpoints are kept, so a damaged newest one
still leaves an intact one to resume from (``--resume-step``).

A checkpoint holds only tensors, numbers, strings, lists and dicts, so it loads
without unpickling arbitrary objects; a file that needs more (a crafted pickle
that would run code) is refused. What it holds is listed once, in CONTENTS: a save
and a load both check a state against it.

A full disk or a read-only folder during a save ends the run with a StorageError
(gpt2/storage.py): the partial files are removed, and ckpt.pt still names the
previous checkpoint.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import signal
from pathlib import Path
from typing import Any

import torch

from gpt2 import faults, run_folder, storage
from gpt2.checksums import sha256_file
from gpt2.storage import RESULTS_SETTING, fsync_dir as _fsync_dir, point_link
from gpt2.errors import CheckpointError
from gpt2.run_folder import list_checkpoints, regular_file, step_of

FORMAT = 1
KEEP = 2
FOLDER = run_folder.CHECKPOINTS
_NAME = run_folder.CHECKPOINT_NAME
FAULT_AFTER = 4096  # bytes of a checkpoint written before an injected kill or full disk

# What a checkpoint holds (besides "format"), as the trainer writes it: a save refuses
# a state that does not match (a bug), a load a file that does not (another kgpt's,
# or edited), so the writer and the reader cannot drift apart.
_NUMBER = (int, float)
CONTENTS: dict[str, type | tuple[type, ...]] = {
    "step": int, "model": dict, "optimizer": dict, "sharded": bool, "scaler": dict,
    "pruning": dict, "rng": list, "config": dict, "config_hash": str,
    "data_fingerprint": str, "data_position": dict, "elapsed_s": _NUMBER,
    "train_time_s": _NUMBER, "best_val_loss": _NUMBER, "nonfinite_skips": dict,
    "after_step_done": bool, "pending_row": dict, "max_iters": int,
}
# Held besides by some: Schedule-Free's training weights ("model" holding its average).
OPTIONAL: dict[str, type | tuple[type, ...]] = {"train_weights": dict}


class _HashingWriter:
    """A file that hashes what is written to it; the checkpoint is hashed as it is
    saved instead of read back (tens of GB for the large models)."""

    def __init__(self, f, kill_after: int | None = None, full_after: int | None = None):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0
        self.kill_after, self.full_after = kill_after, full_after
        # torch.save reports a failed write as a RuntimeError that does not say why
        # (no space, say): the first one is kept here to be raised instead.
        self.error: OSError | None = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")  # no copy of a tensor's bytes
        if self.kill_after is not None and self.size + len(view) > self.kill_after:
            self.f.write(view[: max(self.kill_after - self.size, 0)])
            self.f.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # the kill-in-checkpoint fault
        try:
            if self.full_after is not None and self.size + len(view) > self.full_after:
                self.f.write(view[: max(self.full_after - self.size, 0)])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # enospc-in-checkpoint
            written = self.f.write(view)
        except OSError as e:
            self.error = e
            raise
        self.sha.update(view)
        self.size += len(view)
        return written

    def flush(self) -> None:
        self.f.flush()


def _write_durably(path: Path, write) -> None:
    # (A kill leaves the temporary .step-N.pt.<tag>.tmp behind: the next save prunes it.)
    storage.write_durably(path, write, RESULTS_SETTING)


def contents_problem(state: dict[str, Any]) -> str | None:
    """What makes ``state`` differ from CONTENTS, or None."""
    missing = [k for k in CONTENTS if k not in state]
    if missing:
        return f"lacks {', '.join(missing)}"
    wrong = [f"{k} is a {type(state[k]).__name__}" for k, t in {**CONTENTS, **OPTIONAL}.items()
             if k in state and not isinstance(state[k], t)]
    return ", ".join(wrong) or None


def save(link: Path, state: dict[str, Any], step: int) -> Path:
    """Write ``state`` as step ``step``'s checkpoint and point ``link`` at it.
    Raises StorageError when the disk is full or the folder read-only; ``link``
    then still names the previous checkpoint."""
    problem = contents_problem(state)
    if problem:
        raise ValueError(f"the checkpoint state {problem} (checkpoint.CONTENTS)")
    folder = storage.own_folder(link.parent / FOLDER)  # (old ones are pruned from it)
    current = link.resolve() if link.is_symlink() else None
    path, n = folder / f"step-{step:08d}.pt", 1
    while path.exists() and path == current:  # never rewrite the file ckpt.pt names
        path, n = folder / f"step-{step:08d}-{n}.pt", n + 1
    # The faults leave a partial file on disk, as a real kill or full disk does.
    kill_after = FAULT_AFTER if faults.active("kill-in-checkpoint", step) else None
    full_after = FAULT_AFTER if faults.active("enospc-in-checkpoint", step) else None
    hashed: dict[str, Any] = {}

    def write_checkpoint(f):
        w = _HashingWriter(f, kill_after, full_after)
        try:
            torch.save({"format": FORMAT, **state}, w)
        except RuntimeError:
            if w.error is None:
                raise
            raise w.error from None
        hashed["sha256"] = w.sha.hexdigest()

    _write_durably(path, write_checkpoint)
    # Not committed, nor trusted, without its sha256: removed if that cannot be written.
    with storage.writing(path, RESULTS_SETTING, partial=path):
        _write_durably(path.with_name(path.name + ".sha256"),
                       lambda f: f.write(f"{hashed['sha256']}  {path.name}\n".encode()))
        _fsync_dir(folder)
    point(link, path)  # the commit point: ckpt.pt now names the new checkpoint
    _fsync_dir(link.parent)
    _prune(link, keep=path)
    return path


def keep(link: Path, dest: Path) -> None:
    """Keep the checkpoint ``link`` names as ``dest`` too, with its .sha256: a hard link
    (no copy; the rotation of ckpt.pt unlinks only its own name). A ``dest`` already
    there is left as it is (a resumed run saves the same step again); a link there is
    not kgpt's, and is refused (storage.refuse_link)."""
    storage.refuse_link(dest, what="file")
    if dest.exists():
        return
    target = link.resolve()
    storage.own_folder(dest.parent)
    sidecar = target.with_name(target.name + ".sha256")
    digest = (storage.read_regular(sidecar) or b"").decode(errors="replace").split()
    if not digest:
        raise CheckpointError(f"{target} has no sha256 beside it: not kept for branches")
    _write_durably(dest.with_name(dest.name + ".sha256"),
                   lambda f: f.write(f"{digest[0]}  {dest.name}\n".encode()))
    os.link(target, dest)
    _fsync_dir(dest.parent)


def _prune(link: Path, keep: Path) -> None:
    """Delete all but the newest KEEP checkpoints, and leftovers of killed saves."""
    files = list_checkpoints(link)
    for old in files[:-KEEP]:
        if old != keep:
            old.unlink(missing_ok=True)
            old.with_name(old.name + ".sha256").unlink(missing_ok=True)
    for leftover in (link.parent / FOLDER).glob(".step-*.pt*.tmp"):  # (its own names only)
        if leftover.is_symlink() or leftover.is_file():  # (a folder by that name is not one)
            leftover.unlink(missing_ok=True)


def recorded_sha256(path: Path) -> str:
    """The sha256 written beside checkpoint ``path`` ("" when there is none): its
    identity, for a run that starts from it to record."""
    data = storage.read_regular(path.with_name(path.name + ".sha256"))
    text = (data or b"").decode(errors="replace")
    return text.split()[0] if text.strip() else ""


def verify(path: Path) -> None:
    """Raise CheckpointError unless ``path`` matches the sha256 written beside it."""
    sidecar = path.with_name(path.name + ".sha256")
    if not regular_file(path):
        raise CheckpointError(f"{path} is missing" if not path.exists() else
                              f"{path} is not a regular file, so it is not read")
    if not sidecar.is_file():
        raise CheckpointError(f"{path} has no {sidecar.name} beside it: it was not written "
                              "completely by kgpt, so it is not trusted")
    expected = recorded_sha256(path)
    actual = sha256_file(path)
    if actual != expected:
        raise CheckpointError(f"{path} is damaged: its sha256 is {actual[:16]}..., "
                              f"{sidecar.name} says {expected[:16]}... (a truncated, "
                              "overwritten or bit-flipped file)")


def _advice(link: Path, bad: Path | None) -> str:
    intact = []
    for p in reversed(list_checkpoints(link)):
        if p == bad:
            continue
        try:
            verify(p)
            intact.append(p)
        except CheckpointError:
            pass
    if intact:
        return (f" The checkpoint of step {step_of(intact[0])} is intact: to resume from it, "
                f"run `make TRAIN_ARGS=--resume-step={step_of(intact[0])}` (or add "
                f"--resume-step {step_of(intact[0])} to train.py).")
    return (f" No intact checkpoint is left: move {link.parent} away (or delete it) to start "
            "the run over.")


def resolve(link: Path, step: int | None = None) -> Path:
    """The checkpoint file to resume from: ``link``'s target, or step ``step``'s file."""
    if step is not None:
        matches = [p for p in list_checkpoints(link) if step_of(p) == step]
        if not matches:
            have = ", ".join(str(step_of(p)) for p in list_checkpoints(link)) or "none"
            raise CheckpointError(f"{link.parent} has no checkpoint of step {step} "
                                  f"(checkpoints: {have})")
        return matches[-1]
    if link.is_symlink():
        target = link.parent / os.readlink(link)
        if not target.is_file():
            raise CheckpointError(f"{link} points at {target}, which is missing." +
                                  _advice(link, target))
        return target
    if link.is_file():
        raise CheckpointError(f"{link} is a plain file, not a link to a checksummed "
                              "checkpoint: it was written by an older kgpt, which this one "
                              "cannot resume; move the run folder away to start over")
    # No link: killed between a first save and its link (the file is complete, its
    # checksum written), or the link was deleted. The newest checkpoint that
    # verifies is the one to continue from.
    for p in reversed(list_checkpoints(link)):
        try:
            verify(p)
        except CheckpointError:
            continue
        print(f"note: {link} is missing; resuming from the newest intact checkpoint, {p}")
        return p
    raise CheckpointError(f"{link.parent} has checkpoints but none is intact and no "
                          f"{link.name} names one." + _advice(link, None))


def point(link: Path, path: Path) -> None:
    """Make ``link`` name ``path``, replacing it in one step."""
    point_link(link, f"{FOLDER}/{path.name}")


def set_aside_after(link: Path, kept: Path) -> list[Path]:
    """Resuming from an older checkpoint: rename the newer ones to superseded-*.pt
    (kept for the user to inspect or delete, never loaded or pruned again) and point
    ``link`` at ``kept``. An earlier set-aside of the same name is kept too (the new
    one gets the first free superseded-N-), and a checkpoints/ that is a link is
    refused before anything is renamed."""
    storage.refuse_link(link.parent / FOLDER)
    files = list_checkpoints(link)
    aside = []
    for p in files[files.index(kept) + 1:]:
        new, n = p.with_name(f"superseded-{p.name}"), 1
        while new.exists() or new.with_name(new.name + ".sha256").exists():
            new, n = p.with_name(f"superseded-{n}-{p.name}"), n + 1
        p.replace(new)
        sidecar = p.with_name(p.name + ".sha256")
        if sidecar.exists():
            sidecar.replace(new.with_name(new.name + ".sha256"))
        aside.append(new)
    point(link, kept)
    _fsync_dir(link.parent / FOLDER)
    return aside


def load(path: Path, map_location: str | torch.device = "cpu",
         link: Path | None = None) -> dict[str, Any]:
    """Verify and load a checkpoint file (or the one a ckpt.pt link names).
    Raises CheckpointError, saying what to run, for anything but a good checkpoint."""
    path = Path(path)
    if link is None and path.is_symlink():
        link = path
    target = resolve(link) if link is not None and path == link else path
    if link is not None and not link.is_symlink() and target.exists():
        point(link, target)  # restore the missing link: the next save expects one
    try:
        verify(target)
    except CheckpointError as e:
        raise CheckpointError(str(e) + (_advice(link, target) if link is not None else "")) \
            from None
    try:
        state = torch.load(target, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{target} holds objects other than tensors and plain data; "
                              "it is refused, since loading it could run code "
                              f"({str(e).splitlines()[0]})") from None
    except (RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(f"{target} cannot be read as a checkpoint: "
                              f"{str(e).splitlines()[0]}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{target} is not a kgpt checkpoint of format {FORMAT}")
    problem = contents_problem(state)
    if problem:
        raise CheckpointError(f"{target} {problem}: it was written by another kgpt or changed "
                              "since, so it cannot be resumed or sampled from." +
                              (_advice(link, target) if link is not None else ""))
    return state


class Checkpointer:
    """When the training loop saves, and where: every ``interval`` steps, at the last
    step, when the run halts (a stop signal, --stop-at-step), and at the steps a
    matrix keeps for branches (``keep_steps``, hard-linked beside the rotation). The
    loop hands it each finished step; it decides (torchtitan's CheckpointManager
    plays the same part for its loop). Every process calls it: gathering a sharded
    state takes them all, and only the ``main`` one writes."""

    def __init__(self, run_path: Path, link: Path, interval: int, last_step: int,
                 keep_steps: tuple[int, ...], main: bool, last_saved: int | None):
        self.run_path, self.link = run_path, link
        self.interval, self.last_step = interval, last_step
        self.keep_steps, self.main = keep_steps, main
        self.last_saved = last_saved  # (None: nothing saved by this run yet)

    def due(self, step: int, halt: bool) -> bool:
        return (step % self.interval == 0 or step == self.last_step or halt
                or step in self.keep_steps)

    def after_step(self, train_state, step: int, halt: bool) -> None:
        """Save the state after ``step`` when it is due, and keep it for branches when
        ``step`` is one of the kept steps."""
        if self.due(step, halt):
            self.save(train_state)
        if step in self.keep_steps and self.main:
            keep(self.link, run_folder.branch_checkpoint(self.run_path, step))

    def save(self, train_state, pending: dict[str, Any] | None = None) -> None:
        """A checkpoint of ``train_state`` after its current step. ``pending``: the
        step's metrics row when its evaluation was cut short; resuming redoes that."""
        train_state.progress.pending_row = pending
        saved = train_state.state_dict()  # every process takes part
        step = train_state.progress.step
        self.last_saved = step
        if self.main:
            save(self.link, saved, step)
