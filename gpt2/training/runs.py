"""The results contract: one folder per resolved configuration.

``results/<run-name>-<hash>/`` where ``<hash>`` covers every setting that can change
what the run computes. Same config -> same folder: an unfinished run resumes and a
finished one reports its summary. Inside:

    config         the .config the run was started from (or a rendering of its flags)
    config.json    the resolved, typed configuration
    provenance.json  the code and data it ran with (gpt2/training/provenance.py)
    metrics.jsonl  one JSON object per log/eval step, appended as training goes
    summary.json   status (completed | failed | interrupted) and headline figures
    ckpt.pt        a link to the newest complete checkpoint, checkpoints/step-N.pt,
                   which has its sha256 beside it (gpt2/training/checkpoint.py)
    samples.txt    a text sample at every evaluation
    loss.png       train and val loss against steps

``results/latest`` is a symlink to the newest run folder (left alone, with a note,
when it cannot be moved: a read-only folder, or a folder of the user's by that name).

A full disk or a folder that refuses a write raises StorageError (gpt2/storage.py),
naming the file; train.py prints it as one line.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

from gpt2 import REPO, storage
from gpt2.processes import lock_folder
from gpt2.config.options import Config
from gpt2.training import checkpoint
from gpt2.training.provenance import own_checkout
from gpt2.storage import RESULTS_SETTING, point_link, write_text_atomic
from gpt2.errors import RunBusyError




def git_commit() -> str | None:
    """The commit of kgpt's own checkout, with "-dirty" after uncommitted changes; None
    outside one (a tree unpacked inside another repository has no commit of its own:
    provenance.own_checkout)."""
    if not own_checkout(REPO):
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def set_aside(path: Path, why: str = "superseded") -> Path:
    """Rename a run folder (or a damaged file) to ``<name>.<why>-N`` beside it (the
    first free N) and return the new path: results of other code or data, and files
    that cannot be read, are kept for the user, never deleted."""
    n = 1
    while path.with_name(f"{path.name}.{why}-{n}").exists():
        n += 1
    aside = path.with_name(f"{path.name}.{why}-{n}")
    with storage.writing(path, RESULTS_SETTING):
        os.rename(path, aside)
    return aside


def scan_metrics(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The intact rows of a metrics.jsonl, and how many damaged lines were skipped.
    Each row is a line of its own, so a line cut short by a crash (or garbled on disk)
    says nothing about the lines after it: those are kept. A row is intact when it is
    an object whose step is a whole number and whose numbers are a float's (an integer
    of 400 digits is damage, not a figure). None at all: ([], 0); one that exists but
    cannot be read (not a regular file, not this user's): StorageError, never an empty
    history, since a resume rewrites the file from what was read."""
    if not path.exists() and not path.is_symlink():
        return [], 0
    data = storage.read_regular(path)
    if data is None:
        raise storage.StorageError(f"cannot read {path} (not a regular file, or not "
                                   "readable by this user): make it readable, or move it away")
    rows, skipped = [], 0
    for line in data.decode(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            row = None
        if isinstance(row, dict) and _intact(row):
            rows.append(row)
        else:
            skipped += 1
    return rows, skipped


def _intact(row: dict[str, Any]) -> bool:
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**53:
        return False
    return all(abs(v) < 2**53 for v in row.values()
               if isinstance(v, int) and not isinstance(v, bool))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The intact rows of a metrics.jsonl (damaged lines skipped)."""
    return scan_metrics(path)[0]


def read_summary(path: Path) -> dict[str, Any] | None:
    """A run's summary.json, or None when there is none or it cannot be read (cut
    short, garbled, not a JSON object). An unreadable summary says nothing about the
    run: its checkpoint and metrics tell where it stands."""
    return storage.read_json_object(path)


def completion_problem(folder: Path, summary: dict[str, Any] | None) -> str | None:
    """Why a summary that says "completed" is not believed; None when it is, or when
    it does not say so. A completed run saved a checkpoint at its final step, so its
    newest checkpoint must be of that step: a summary edited by hand, or one left
    by a run that a --resume-step took back and a kill stopped, fails this.

    What is trusted: the checkpoint, not the summary under test. Its step is read
    from its file name (ckpt.pt's target, checkpoints/step-N.pt), which the save
    names after the step it holds and records in the .sha256 beside it, so no
    checkpoint is loaded for it; the final step is the max_iters the checkpoint
    records, read from its small pickled index without its tensors (the summary's
    own max_iters only when the checkpoint cannot be read). With no checkpoint left
    (deleted to save space after the run), nothing contradicts the summary."""
    if not summary or summary.get("status") != "completed":
        return None
    newest = checkpoint.newest(folder / "ckpt.pt")
    if newest is None:
        return None
    step = checkpoint.step_of(newest)
    final = checkpoint.final_step(newest)
    if final is None:
        final = summary.get("max_iters", summary.get("iters"))
    if step == final:
        return None
    return (f"{folder / 'summary.json'} says completed, but the newest checkpoint "
            f"({newest.name}) is of step {step} of {final}")


# What a run folder may hold before its first start records config.json: the lock,
# and the log a matrix runner opens for the cell before it starts training.
BEFORE_THE_START = frozenset({".lock", "train.log"})


class RunDir:
    def __init__(self, cfg: Config, path: str | os.PathLike | None = None):
        """``path`` places the run elsewhere (a matrix cell's folder); such a run is
        not pointed at by results/latest, which belongs to single runs."""
        self.cfg = cfg
        self.root = Path(cfg.results_dir)
        self.path = Path(path) if path else self.root / f"{cfg.run_name}-{cfg.config_hash()}"
        self.linked = path is None
        self.ckpt = self.path / "ckpt.pt"
        self.metrics = self.path / "metrics.jsonl"
        self.summary_path = self.path / "summary.json"
        self.samples = self.path / "samples.txt"
        self.loss_png = self.path / "loss.png"

    # ---- state ----------------------------------------------------------------------
    def summary(self) -> dict[str, Any] | None:
        """summary.json's contents; None when missing or unreadable."""
        return read_summary(self.summary_path)

    def summary_damaged(self) -> bool:
        return self.summary_path.exists() and self.summary() is None

    def set_aside_summary(self) -> Path:
        """Move a damaged summary.json out of the way (kept as summary.json.damaged-N)."""
        return set_aside(self.summary_path, "damaged")

    def completion_problem(self) -> str | None:
        return completion_problem(self.path, self.summary())

    def completed(self) -> bool:
        """Complete by its summary, and its newest checkpoint agrees."""
        s = self.summary()
        return bool(s) and s.get("status") == "completed" and not completion_problem(self.path, s)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive lock on the folder while training: two processes training
        one run would interleave checkpoints and metrics. The kernel drops the lock
        when the process dies, however it dies; the folder itself is locked, so no
        file deleted from it can release the lock."""
        storage.own_folder(self.path)  # (a link planted there is refused, not followed)
        with storage.writing(self.path, RESULTS_SETTING):
            fd = lock_folder(self.path)  # (a .lock file on NFS: written too)
        if fd is None:
            raise RunBusyError(f"another process is training {self.path}; wait for it to "
                               "finish or stop it (it checkpoints on Ctrl-C or SIGTERM), then "
                               "run this again")
        try:
            yield
        finally:
            os.close(fd)

    # ---- writing --------------------------------------------------------------------
    def create(self, dotconfig: str, provenance: dict[str, Any]) -> None:
        """Create the folder and record the configuration (first start only) and the
        code and data this start runs with (every start)."""
        storage.own_folder(self.path)
        if not (self.path / "config.json").is_file():
            others = sorted({p.name for p in self.path.iterdir()} - BEFORE_THE_START)
            if others:
                # (a folder named with --run-dir that holds someone's files, not a run)
                raise storage.StorageError(
                    f"{self.path} holds files and is not a run folder (no config.json): "
                    f"{', '.join(others)[:200]}. Train into a new or empty folder")
            write_text_atomic(self.path / "config", dotconfig)
            write_text_atomic(self.path / "config.json",
                               json.dumps(self.cfg.to_dict(), indent=2) + "\n")
        write_text_atomic(self.path / "provenance.json", json.dumps(provenance, indent=2) + "\n")
        self.point_latest()

    def point_latest(self) -> None:
        """Point results/latest here; it is a convenience, so what stops that is a note."""
        if not self.linked:
            return
        try:
            point_link(self.root / "latest", self.path.name)
        except storage.StorageError as e:
            print(f"note: {e}")

    def append_metrics(self, row: dict[str, Any]) -> None:
        with storage.open_append(self.metrics) as f:
            f.write(json.dumps(row) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        return read_metrics(self.metrics)

    def truncate_metrics(self, last_step: int) -> int:
        """Drop rows written after the checkpoint we resume from (they will be redone),
        and damaged lines; returns how many damaged lines were dropped."""
        rows, skipped = scan_metrics(self.metrics)
        rows = [r for r in rows if r["step"] <= last_step]
        write_text_atomic(self.metrics, "".join(json.dumps(r) + "\n" for r in rows))
        return skipped

    def truncate_samples(self, last_step: int) -> None:
        if not self.samples.is_file():
            return
        kept, keep = [], True
        for line in storage.read_text(self.samples).splitlines(keepends=True):
            m = re.match(r"=== step (\d+) ===", line)
            if m:
                keep = int(m[1]) <= last_step
            if keep:
                kept.append(line)
        write_text_atomic(self.samples, "".join(kept))

    def copy_history(self, parent: Path, step: int) -> None:
        """Start this run's metrics and samples with the parent run's, up to ``step``
        (an extension: its curves then run from step 0)."""
        rows = [r for r in read_metrics(parent / "metrics.jsonl") if r["step"] <= step]
        write_text_atomic(self.metrics, "".join(json.dumps(r) + "\n" for r in rows))
        source = parent / "samples.txt"
        write_text_atomic(self.samples, storage.read_text(source))
        self.truncate_samples(step)

    def append_sample(self, step: int, text: str) -> None:
        with storage.open_append(self.samples) as f:
            f.write(f"=== step {step} ===\n{text}\n\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_text_atomic(self.summary_path, json.dumps(summary, indent=2) + "\n")

    def plot_loss(self) -> None:
        plot_loss(self.read_metrics(), self.loss_png, title=self.path.name)


def plot_loss(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(r["step"], r["train_loss"]) for r in rows if r.get("train_loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    if train:
        ax.plot(*zip(*train), label="train loss", color="tab:blue", linewidth=1.2)
    if val:
        ax.plot(*zip(*val), label="val loss", color="tab:orange", marker="o", markersize=3,
                linewidth=1.5)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy loss (nats/token)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    if train or val:
        ax.legend()
    fig.tight_layout()
    try:
        storage.save_figure(fig, path)
    finally:
        plt.close(fig)


def _flops(s: dict[str, Any]) -> str:
    """Achieved model FLOP/s, with MFU where the device's peak is known."""
    tflops = s.get("achieved_tflops")
    if tflops is None:
        return "n/a FLOP/s"
    text = f"{tflops:.1f} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:.1f} GFLOP/s"
    return text + (f" (MFU {s['mfu']:.1%})" if s.get("mfu") is not None else "")


def format_summary(run_path: Path, s: dict[str, Any]) -> str:
    def num(key: str, fmt: str) -> str:
        v = s.get(key)
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    return "\n".join([
        f"run      {run_path}",
        f"status   {s.get('status')}   steps {s.get('iters')}   tokens {num('tokens', ',')}",
        f"val      loss {num('final_val_loss', '.4f')}   ppl {num('final_val_ppl', '.2f')}   "
        f"best {num('best_val_loss', '.4f')}",
        f"speed    {num('tokens_per_sec', ',.0f')} tokens/s   {_flops(s)}   wall "
        f"{num('wall_time_s', '.1f')} s",
        f"memory   peak {num('peak_memory_mb', ',.0f')} MB   predicted "
        f"{num('predicted_peak_memory_mb', ',.0f')} MB   micro-batch {num('micro_batch', 'd')} x "
        f"{num('gradient_accumulation', 'd')}",
        f"model    {num('n_params', ',')} params   {s.get('optimizer')} / {s.get('pruning')}   "
        f"{s.get('device')} {s.get('dtype')}",
        f"sparsity {num('final_sparsity', '.4f')} measured   target {num('target_sparsity', 'g')}",
    ])
