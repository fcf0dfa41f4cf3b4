"""A run folder: its files, the state it is in, and what its summary holds.

``results/<run-name>-<hash>/`` where ``<hash>`` covers every setting that can change
what the run computes. Same config -> same folder: an unfinished run resumes and a
finished one reports its summary. Inside (the names are the constants below):

    config         the .config the run was started from (or a rendering of its flags)
    config.json    the resolved, typed configuration
    provenance.json  the code and data it ran with (gpt2/training/provenance.py)
    metrics.jsonl  one JSON object per log/eval step, appended as training goes
    summary.json   status and headline figures (Summary: its one schema)
    ckpt.pt        a link to the newest complete checkpoint, checkpoints/step-N.pt,
                   which has its sha256 beside it (gpt2/training/checkpoint.py)
    samples.txt    a text sample at every evaluation
    loss.png       train and val loss against steps

``results/latest`` is a symlink to the newest run folder (left alone, with a note,
when it cannot be moved: a read-only folder, or a folder of the user's by that name).

Everything that asks what state a run is in asks here: ``state`` (one vocabulary,
STATES), ``completion_problem`` (when "completed" is believed), ``read_summary``.
Nothing here imports torch: `make` on a finished run, the matrix runner, the Slurm
backend and the results pages read run folders without it. A checkpoint's final step
is read from its pickled index with an unpickler that builds nothing (final_step).

A full disk or a folder that refuses a write raises StorageError (gpt2/storage.py),
naming the file; train.py prints it as one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import pickle
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from gpt2 import records, storage
from gpt2.config.choices import ONESHOT_METHODS, PRUNING_STRUCTURES
from gpt2.processes import folder_locked, lock_folder
from gpt2.config.options import Config
from gpt2.storage import RESULTS_SETTING, point_link, write_text_atomic
from gpt2.errors import CheckpointError, RunBusyError

# ---- the files ------------------------------------------------------------------------

CONFIG = "config"
CONFIG_JSON = "config.json"
PROVENANCE = "provenance.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
SAMPLES = "samples.txt"
LOSS_PNG = "loss.png"
CKPT = "ckpt.pt"
CHECKPOINTS = "checkpoints"
# Checkpoints kept for runs that branch from this one (train.py --keep-steps): one per
# step, never rotated away.
BRANCHES = "branches"
LATEST = "latest"  # results/latest, the newest single run
# `make prune-oneshot`'s results (gpt2/prune_oneshot.py): one JSON per method and target.
ONESHOT = "oneshot"
# What a run folder may hold before its first start records config.json: the lock,
# and the log a matrix runner opens for the cell before it starts training.
BEFORE_THE_START = frozenset({".lock", "train.log"})



def oneshot_result(run_dir: Path, method: str, sparsity: float, structure: str = "unstructured",
                   finetune: int = 0) -> Path:
    """<run>/oneshot/wanda-50.json, sparsegpt-2of4.json, magnitude-70-ft100.json: the
    result of pruning the run once with ``method`` (and fine-tuning ``finetune`` steps)."""
    from gpt2.config.axes import sparsity_tag

    tag = sparsity_tag(sparsity) if structure == "unstructured" else structure.replace(":", "of")
    return Path(run_dir) / ONESHOT / (f"{method}-{tag}" + (f"-ft{finetune}" if finetune else "")
                                      + ".json")


# What a one-shot result holds (gpt2/prune_oneshot.py writes it, checked; the matrix's
# report and any reader check it the same way, gpt2/records.py). Losses may be null: a
# pruning that broke the model has no finite loss to write.
ONESHOT_FIELDS = {
    "method": records.Field(str, choices=ONESHOT_METHODS, required=True),
    "target_sparsity": records.Field(float, 0, 1, required=True),
    "structure": records.Field(str, choices=PRUNING_STRUCTURES, required=True),
    "measured_sparsity": records.Field(float, 0, 1),
    "val_loss_before": records.Field(float, 0), "val_loss": records.Field(float, 0),
    "val_loss_se": records.Field(float, 0), "val_tokens": records.Field(int, 0),
    "calibration_samples": records.Field(int, 1, required=True),
    "calibration_seed": records.Field(int, 0, required=True),
    "calibration_tokens": records.Field(int, 0),
    "step": records.Field(int, 0, required=True),
    "config_hash": records.Field(str, required=True),
    "seconds": records.Field(float, 0), "device": records.Field(str),
    "finetune_steps": records.Field(int, 0), "finetune_lr": records.Field(float, 0),
    "finetune_tokens": records.Field(int, 0), "finetune_seconds": records.Field(float, 0),
    "finetune_train_loss": records.Field(float, 0), "val_loss_pruned": records.Field(float, 0),
}


def read_oneshot(path: Path) -> dict[str, Any] | None:
    """The one-shot result at ``path`` (a regular file, not a link), checked; None
    when there is none kgpt wrote."""
    data = storage.read_regular(path, follow=False, limit=storage.RECORD_LIMIT)
    try:
        result = json.loads(data) if data is not None else None
    except (ValueError, RecursionError):
        return None
    return result if records.problem(result, ONESHOT_FIELDS) is None else None


# ---- the states, one vocabulary --------------------------------------------------------

# What a run (a single run or a matrix cell) can be. From its folder alone: completed,
# interrupted (a checkpoint to resume from, or a summary saying so), failed (a summary
# saying so) or pending (nothing started). A process holding the folder's lock makes it
# running; a backend that has it waiting in a queue, queued.
COMPLETED, INTERRUPTED, FAILED, PENDING = "completed", "interrupted", "failed", "pending"
RUNNING, QUEUED = "running", "queued"
STATES = (COMPLETED, RUNNING, QUEUED, FAILED, INTERRUPTED, PENDING)  # as counts are listed

# ---- checkpoint names (gpt2/training/checkpoint.py writes and loads them) --------------

CHECKPOINT_NAME = re.compile(r"^step-(\d{8})(?:-(\d+))?\.pt$")


def branch_checkpoint(folder: Path, step: int) -> Path:
    """The checkpoint of ``step`` that run ``folder`` kept for branches."""
    return Path(folder) / BRANCHES / f"step-{step:08d}.pt"


def list_checkpoints(link: Path) -> list[Path]:
    """The run's checkpoint files, oldest first (``link``: its ckpt.pt)."""
    folder = link.parent / CHECKPOINTS
    if not folder.is_dir():
        return []
    found = [(int(m[1]), int(m[2] or 0), p) for p in folder.iterdir()
             if (m := CHECKPOINT_NAME.match(p.name))]
    return [p for *_, p in sorted(found)]


def present(link: Path) -> bool:
    """Whether the run has a checkpoint, even a broken one: a dangling ckpt.pt or a
    checksummed checkpoint must never be mistaken for a fresh start. A file with no
    .sha256 beside it and no link to it is the remains of a first save that was
    killed: nothing was committed, so it does not count."""
    return link.is_symlink() or link.exists() or any(
        p.with_name(p.name + ".sha256").exists() for p in list_checkpoints(link))


def newest(link: Path) -> Path | None:
    """The newest checkpoint, by names alone: ``link``'s target (even a missing one),
    else the newest file in checkpoints/; None when there is none, or ``link`` is a
    plain file or names something other than a checkpoint."""
    if link.is_symlink():
        target = link.parent / os.readlink(link)
        return target if CHECKPOINT_NAME.match(target.name) else None
    if link.exists():
        return None
    files = list_checkpoints(link)
    return files[-1] if files else None


def step_of(path: Path) -> int:
    m = CHECKPOINT_NAME.match(path.name)
    if not m:
        raise CheckpointError(f"{path} is not named like a checkpoint (step-NNNNNNNN.pt)")
    return int(m[1])


class _Inert:
    """What the index reader makes of every object a checkpoint's pickle names
    (tensors, storages, torch types): nothing, whatever it is called with."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


class _Dict(dict):
    """An OrderedDict as read back: a dict that takes attributes (a state_dict's
    _metadata)."""


class _IndexReader(pickle.Unpickler):
    """Unpickles a torch checkpoint's data.pkl without torch and without running
    anything it names: torch's classes (tensors, storages, dtypes) are _Inert, an
    OrderedDict a _Dict, every tensor's storage None; the plain values (numbers,
    strings, dicts) come out as saved. A file naming any other class is refused, as
    torch.load(weights_only=True) refuses it: it is not a checkpoint kgpt wrote."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return _Dict
        if module == "torch" or module.startswith("torch."):
            return _Inert
        raise pickle.UnpicklingError(f"{module}.{name} is not in a kgpt checkpoint")

    def persistent_load(self, pid: Any) -> None:
        return None


def final_step(path: Path) -> int | None:
    """The last step of the run that wrote checkpoint ``path`` (its max_iters); None
    when it cannot be read. Only the zip's small pickled index is read, never the
    tensors (milliseconds for a checkpoint of hundreds of MB), and only from a regular
    file: a FIFO by that name would block the reader forever."""
    if not regular_file(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            index = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(index) != 1:
                return None
            state = _IndexReader(io.BytesIO(archive.read(index[0]))).load()
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, OSError, ValueError,
            TypeError, AttributeError, IndexError, KeyError, RecursionError, MemoryError):
        return None  # missing, damaged or foreign: the caller falls back
    final = state.get("max_iters") if isinstance(state, dict) else None
    return final if isinstance(final, int) and not isinstance(final, bool) else None


def regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


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


# ---- summary.json -----------------------------------------------------------------------

# Figures a run reports only when it has them: written then, left out otherwise.
_ONLY_WHEN_SET = ("hellaswag_acc", "hellaswag_acc_norm", "error", "sparse_kernel_layers")


@dataclass(frozen=True)
class Summary:
    """summary.json, the completion marker and a run's headline figures: its one
    schema. The trainer writes one at every end (completed, interrupted, failed);
    everything else reads it through read_summary, by field, or by name with get()
    where a table lists the fields it shows (a name outside the schema is an error,
    not a silent None)."""

    status: str | None  # COMPLETED, INTERRUPTED or FAILED
    iters: int | None = None  # steps done
    max_iters: int | None = None  # steps planned
    tokens: int | None = None
    final_val_loss: float | None = None
    final_val_ppl: float | None = None
    final_val_loss_se: float | None = None  # standard error of final_val_loss
    best_val_loss: float | None = None
    val_tokens: int | None = None  # tokens each validation scores
    epochs_trained: float | None = None
    train_split_tokens: int | None = None
    hellaswag_acc: float | None = None
    hellaswag_acc_norm: float | None = None
    tokens_per_sec: float | None = None
    flops_per_token: float | None = None
    achieved_tflops: float | None = None
    peak_tflops: float | None = None
    mfu: float | None = None
    peak_memory_mb: float | None = None
    predicted_peak_memory_mb: float | None = None
    micro_batch: int | None = None
    gradient_accumulation: int | None = None
    wall_time_s: float | None = None
    device: str | None = None
    dtype: str | None = None
    load_avg: float | None = None
    n_params: int | None = None
    optimizer: str | None = None
    pruning: str | None = None
    target_sparsity: float | None = None
    final_sparsity: float | None = None
    optimizer_hparams: dict[str, Any] | None = None
    pruning_hparams: dict[str, Any] | None = None
    config_hash: str | None = None
    torch_version: str | None = None
    git_commit: str | None = None
    exit_status: int | None = None
    provenance: dict[str, Any] | None = None  # what the result was made from
    nonfinite_skipped_steps: int | None = None
    # Linears whose forward ran on the 2:4 kernel (CONFIG_SPARSE_KERNEL; 0: none passed
    # its check or the ramp has not ended; absent where it cannot run)
    sparse_kernel_layers: int | None = None
    error: str | None = None

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key``, or ``default`` when the run did not record it."""
        if key not in SUMMARY_KEYS:
            raise KeyError(f"{key!r} is not a field of summary.json (run_folder.Summary)")
        value = getattr(self, key)
        return default if value is None else value

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items()
                if v is not None or k not in _ONLY_WHEN_SET}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Summary":
        """A summary as a file holds it: fields it lacks are None, names the schema
        does not know (another version's) are left out, and a value the trainer never
        writes (of another type, negative, NaN, past any number: SUMMARY_FIELDS) is
        None, "not known", as it would be missing."""
        return cls(**{k: v if SUMMARY_FIELDS[k].problem(v := data.get(k)) is None else None
                      for k in SUMMARY_KEYS})


SUMMARY_KEYS = tuple(f.name for f in dataclasses.fields(Summary))
# Each field as the trainer writes it: its type, and every number a count or a figure
# that is never negative (gpt2/records.py); a NaN is a diverged run's loss, and stays.
SUMMARY_FIELDS = {f.name: records.Field(kind, 0 if kind in (int, float) else None,
                                        finite=False)
                  for f in dataclasses.fields(Summary)
                  for kind in [next(t for t in (dict, int, float, str) if t.__name__ in f.type)]}
NO_SUMMARY = Summary(status=None)  # what a folder without a readable summary.json says


def read_summary(folder: Path) -> Summary | None:
    """The summary.json of the run folder ``folder``, or None when there is none or it
    cannot be read (cut short, garbled, not a JSON object). An unreadable summary
    says nothing about the run: its checkpoint and metrics tell where it stands."""
    data = storage.read_json_object(folder / SUMMARY)
    return None if data is None else Summary.from_dict(data)


def summary_damaged(folder: Path) -> bool:
    """A summary.json is there but cannot be read."""
    return (folder / SUMMARY).exists() and read_summary(folder) is None


def completion_problem(folder: Path, summary: Summary | None) -> str | None:
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
    if summary is None or summary.status != COMPLETED:
        return None
    last = newest(folder / CKPT)
    if last is None:
        return None
    step = step_of(last)
    final = final_step(last)
    if final is None:
        final = summary.max_iters if summary.max_iters is not None else summary.iters
    if step == final:
        return None
    return (f"{folder / SUMMARY} says completed, but the newest checkpoint "
            f"({last.name}) is of step {step} of {final}")


def completed(folder: Path, config_hash: str | None = None) -> bool:
    """The one test of "this run is complete": its summary says so (for the
    configuration ``config_hash``, when given) and its newest checkpoint agrees."""
    s = read_summary(folder)
    return (s is not None and s.status == COMPLETED
            and (config_hash is None or s.config_hash == config_hash)
            and completion_problem(folder, s) is None)


def state(folder: Path, config_hash: str | None = None) -> str:
    """COMPLETED, INTERRUPTED (a checkpoint to resume from) or PENDING, from the
    folder alone: what a runner does next with it (report it, resume it, start it).
    A summary that cannot be read, or whose "completed" its checkpoint contradicts,
    does not make a run completed: train.py resumes it."""
    if completed(folder, config_hash):
        return COMPLETED
    return INTERRUPTED if present(folder / CKPT) else PENDING


def live_state(folder: Path, config_hash: str | None = None) -> str:
    """What a user is told a run is now: RUNNING while a process on this machine holds
    its folder's lock (training it), else its folder's ``state``. Every status shown
    (make matrix-status for local and Slurm cells, the results index) asks this."""
    if folder_locked(folder):
        return RUNNING
    return state(folder, config_hash)


def folder_name(cfg: Config) -> str:
    """A single run's folder under its results folder: <run name>-<config hash>."""
    return f"{cfg.run_name}-{cfg.config_hash()}"


class RunDir:
    def __init__(self, cfg: Config, path: str | os.PathLike | None = None):
        """``path`` places the run elsewhere (a matrix cell's folder); such a run is
        not pointed at by results/latest, which belongs to single runs."""
        self.cfg = cfg
        self.root = Path(cfg.results_dir)
        self.path = Path(path) if path else self.root / folder_name(cfg)
        self.linked = path is None
        self.ckpt = self.path / CKPT
        self.metrics = self.path / METRICS
        self.summary_path = self.path / SUMMARY
        self.samples = self.path / SAMPLES
        self.loss_png = self.path / LOSS_PNG

    # ---- state ----------------------------------------------------------------------
    def summary(self) -> Summary | None:
        """summary.json's contents; None when missing or unreadable."""
        return read_summary(self.path)

    def summary_damaged(self) -> bool:
        return summary_damaged(self.path)

    def set_aside_summary(self) -> Path:
        """Move a damaged summary.json out of the way (kept as summary.json.damaged-N)."""
        return set_aside(self.summary_path, "damaged")

    def completion_problem(self) -> str | None:
        return completion_problem(self.path, self.summary())

    def completed(self) -> bool:
        """Complete by its summary, and its newest checkpoint agrees."""
        return completed(self.path)

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
        if not (self.path / CONFIG_JSON).is_file():
            others = sorted({p.name for p in self.path.iterdir()} - BEFORE_THE_START)
            if others:
                # (a folder named with --run-dir that holds someone's files, not a run)
                raise storage.StorageError(
                    f"{self.path} holds files and is not a run folder (no config.json): "
                    f"{', '.join(others)[:200]}. Train into a new or empty folder")
            write_text_atomic(self.path / CONFIG, dotconfig)
            write_text_atomic(self.path / CONFIG_JSON,
                               json.dumps(self.cfg.to_dict(), indent=2) + "\n")
        write_text_atomic(self.path / PROVENANCE, json.dumps(provenance, indent=2) + "\n")
        self.point_latest()

    def point_latest(self) -> None:
        """Point results/latest here; it is a convenience, so what stops that is a note."""
        if not self.linked:
            return
        try:
            point_link(self.root / LATEST, self.path.name)
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
        rows = [r for r in read_metrics(parent / METRICS) if r["step"] <= step]
        write_text_atomic(self.metrics, "".join(json.dumps(r) + "\n" for r in rows))
        source = parent / SAMPLES
        write_text_atomic(self.samples, storage.read_text(source))
        self.truncate_samples(step)

    def append_sample(self, step: int, text: str) -> None:
        with storage.open_append(self.samples) as f:
            f.write(f"=== step {step} ===\n{text}\n\n")

    def write_summary(self, summary: Summary) -> None:
        write_text_atomic(self.summary_path, json.dumps(summary.to_dict(), indent=2) + "\n")

    def plot_loss(self) -> None:
        plot_loss(self.read_metrics(), self.loss_png, title=self.path.name)


def plot_loss(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    # A Figure of its own on the Agg canvas, not pyplot: nothing global to close, and
    # every run ends here, where importing pyplot (its backends and state) cost a
    # tenth of a second or more.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    train = [(r["step"], r["train_loss"]) for r in rows if r.get("train_loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    fig = Figure(figsize=(7, 4.2), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
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
    storage.save_figure(fig, path)


def _flops(s: Summary) -> str:
    """Achieved model FLOP/s, with MFU where the device's peak is known."""
    tflops = s.achieved_tflops
    if tflops is None:
        return "n/a FLOP/s"
    text = f"{tflops:.1f} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:.1f} GFLOP/s"
    return text + (f" (MFU {s.mfu:.1%})" if s.mfu is not None else "")


def format_summary(run_path: Path, s: Summary) -> str:
    def num(key: str, fmt: str) -> str:
        v = s.get(key)
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    return "\n".join([
        f"run      {run_path}",
        f"status   {s.status}   steps {s.iters}   tokens {num('tokens', ',')}",
        f"val      loss {num('final_val_loss', '.4f')}   ppl {num('final_val_ppl', '.2f')}   "
        f"best {num('best_val_loss', '.4f')}",
        f"speed    {num('tokens_per_sec', ',.0f')} tokens/s   {_flops(s)}   wall "
        f"{num('wall_time_s', '.1f')} s",
        f"memory   peak {num('peak_memory_mb', ',.0f')} MB   predicted "
        f"{num('predicted_peak_memory_mb', ',.0f')} MB   micro-batch {num('micro_batch', 'd')} x "
        f"{num('gradient_accumulation', 'd')}",
        f"model    {num('n_params', ',')} params   {s.optimizer} / {s.pruning}   "
        f"{s.device} {s.dtype}",
        f"sparsity {num('final_sparsity', '.4f')} measured   target {num('target_sparsity', 'g')}",
    ])
