"""Optional experiment trackers: TensorBoard, Weights & Biases or trackio.

The registry for CONFIG_TRACKER lives here. A tracker only mirrors the rows the
trainer already writes to metrics.jsonl; it never changes what a run computes, so
the setting is not part of the config hash. Each library is imported only when its
tracker is opened, so none of them is a dependency of kgpt, and importing this
module imports none of them.

    check_tracker(cfg.tracker, cfg.tracker_project)   # early: missing library -> error
    ...
    tracker = open_tracker(cfg.tracker, cfg.tracker_project, run.path.name, run.path,
                           cfg.to_dict())
    try:
        tracker.log(row, row["step"])   # wherever a metrics row is written
    finally:
        tracker.close()
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any

from gpt2.storage import own_folder
from gpt2.config.choices import PROJECT_TRACKERS, TRACKERS
from gpt2.names import choice_symbol, symbol
from gpt2.config.options import run_tags
from gpt2.errors import ConfigError


# tracker -> (module imported, pip package that provides it)
_MODULES: dict[str, tuple[str, str]] = {
    "tensorboard": ("torch.utils.tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "trackio": ("trackio", "trackio"),
}


def scalars(row: dict[str, Any]) -> dict[str, float | int]:
    """The entries of a metrics row a tracker can plot: finite ints and floats
    (not bools, not None, not text), without the step itself."""
    out: dict[str, float | int] = {}
    for key, value in row.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = value
    return out


# TensorBoard's sections: a metrics key's group ("loss/val_loss"); the rest, "progress/".
TAG_GROUPS = {"train_loss": "loss", "val_loss": "loss", "val_ppl": "loss", "val_loss_se": "loss",
              "best_val_loss": "loss", "lr": "optimizer", "grad_norm": "optimizer",
              "sparsity": "pruning", "tokens_per_sec": "speed", "mfu": "speed",
              "peak_memory_mb": "speed", "load_avg": "speed"}
# The headline settings in TensorBoard's HParams table (each in force in every run).
HPARAMS = ("optimizer", "pruning_method", "target_sparsity", "learning_rate", "weight_decay",
           "max_iters", "batch_size", "gradient_accumulation", "n_layer", "n_embd", "seed",
           "dataset")
# What the HParams table compares runs by: each run's last value of these.
HPARAM_METRICS = ("val_loss", "val_ppl", "train_loss", "sparsity")


def tag(key: str) -> str:
    """``key``'s TensorBoard tag: grouped, so losses sit apart from speed and progress."""
    group = TAG_GROUPS.get(key) or ("eval" if key.startswith("hellaswag") else "progress")
    return f"{group}/{key}"


class Tracker:
    """Where metric rows go besides metrics.jsonl. The base class is the "none"
    tracker: it does nothing."""

    name = "none"

    def log(self, row: dict[str, Any], step: int) -> None:
        """Record the numeric entries of one metrics row at training step ``step``."""

    def close(self) -> None:
        """Flush and finish the run in the tracker. Safe to call more than once."""


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, module: Any, run_dir: Path, config: dict[str, Any]):
        self.log_dir = Path(run_dir) / "tensorboard"
        # (the writer makes and fills the folder itself: a link planted there is
        # refused first, as every folder kgpt writes into)
        own_folder(self.log_dir)
        self._writer = module.SummaryWriter(log_dir=str(self.log_dir))
        # Indented text renders as a code block in TensorBoard's markdown view.
        text = json.dumps(config, indent=2, sort_keys=True, default=str)
        self._writer.add_text("config", "\n".join("    " + line for line in text.splitlines()))
        # HParams: the run's headline settings and its last metrics, written at close
        # into this run's own event file (SummaryWriter.add_hparams would start another).
        self._hparams = {k: config[k] for k in HPARAMS
                         if isinstance(config.get(k), (int, float, str, bool))}
        self._last: dict[str, float] = {}
        self._step = 0

    def log(self, row: dict[str, Any], step: int, walltime: float | None = None) -> None:
        """``walltime``: when the row happened (seconds since the epoch), for rows
        written afterwards (gpt2/results/tensorboard.py); default now."""
        for key, value in scalars(row).items():
            self._writer.add_scalar(tag(key), value, global_step=step, walltime=walltime)
            if key in HPARAM_METRICS:
                self._last[key] = value
        self._step = step
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            try:
                from torch.utils.tensorboard.summary import hparams
            except ImportError:  # (a stand-in for the library: no HParams to write)
                hparams = None
            if hparams is not None and self._hparams and self._last:
                metrics = {f"hparams/final_{k}": v for k, v in self._last.items()}
                for summary in hparams(self._hparams, metrics):
                    self._writer.file_writer.add_summary(summary)
                for name, value in metrics.items():
                    self._writer.add_scalar(name, value, global_step=self._step)
            self._writer.close()
            self._writer = None


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, module: Any, project: str, run_name: str, run_dir: Path,
                 config: dict[str, Any]):
        # (the run's own tags and notes, CONFIG_RUN_TAGS and CONFIG_RUN_NOTES, are W&B's too)
        self._run = module.init(project=project, name=run_name, config=config,
                                dir=str(run_dir), tags=run_tags(config.get("run_tags")),
                                notes=config.get("run_notes") or None)

    def log(self, row: dict[str, Any], step: int) -> None:
        self._run.log(scalars(row), step=step)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


class TrackioTracker(Tracker):
    """trackio's module-level API mirrors wandb's; it keeps the current run itself."""

    name = "trackio"

    def __init__(self, module: Any, project: str, run_name: str, config: dict[str, Any]):
        self._trackio = module
        module.init(project=project, name=run_name, config=config)
        self._open = True

    def log(self, row: dict[str, Any], step: int) -> None:
        self._trackio.log(scalars(row), step=step)

    def close(self) -> None:
        if self._open:
            self._trackio.finish()
            self._open = False


def _import(name: str) -> Any:
    """The tracker's library, or a ConfigError that says how to install it."""
    module_name, package = _MODULES[name]
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        # Missing altogether, or there but broken (e.g. one of its own imports fails).
        why = ("is not installed" if e.name in (module_name, package)
               else f"could not be imported ({e})")
        raise ConfigError("tracker", (
            f"tracker {name!r} is selected ({symbol(choice_symbol('tracker', name))}, "
            f"--tracker {name}) but the {package} package {why}: install it into the "
            f"Python that runs kgpt ({sys.executable} -m pip install {package}), or select "
            f"{symbol(choice_symbol('tracker', 'none'))}")) from e


def check_tracker(name: str, project: str) -> None:
    """Raise the ConfigError ``open_tracker`` would raise (unknown tracker, empty
    project, library missing) without starting anything: call it before the slow
    setup so a missing library stops the run at once."""
    if name not in TRACKERS:
        raise ConfigError("tracker", f"{name!r} is not one of {', '.join(TRACKERS)}")
    if name in PROJECT_TRACKERS and not project.strip():
        raise ConfigError("tracker_project", f"must not be empty with tracker {name!r}")
    if name != "none":
        _import(name)


def open_tracker(name: str, project: str, run_name: str, run_dir: Path,
                 config: dict[str, Any]) -> Tracker:
    """Start a run in the selected tracker. ``run_dir`` must exist (TensorBoard writes
    its event files to ``run_dir/tensorboard``, wandb its files under ``run_dir``)."""
    check_tracker(name, project)
    if name == "none":
        return Tracker()
    module = _import(name)  # already imported by the check: a dictionary lookup
    if name == "tensorboard":
        return TensorBoardTracker(module, run_dir, config)
    if name == "wandb":
        return WandbTracker(module, project, run_name, run_dir, config)
    return TrackioTracker(module, project, run_name, config)
