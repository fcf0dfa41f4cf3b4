"""What a run is at a step, and the one description of it that checkpoints hold.

``TrainState.state_dict()`` is what a save writes and ``load_state_dict()`` what a
resume reads back, so the two cannot drift apart; gpt2/training/checkpoint.py checks
the layout (CONTENTS) at both ends. Together they make resume exact: model,
optimizer, grad scaler, pruning masks, every process's random generators and the
position in the data stream all continue where they stopped.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from gpt2.config.options import Config
from gpt2.data.loader import TrainBatches, same_data
from gpt2.errors import ResumeError
from gpt2.model.gpt import GPT
from gpt2.runtime import distributed
from gpt2.runtime.device import Runtime
from gpt2.optim.algorithms.optimizer_base import evaluates_elsewhere, evaluation_point


@dataclass
class Progress:
    """How far the run has come: the numbers a checkpoint holds besides tensors."""

    step: int = 0  # steps completed
    train_time_s: float = 0.0  # time spent in optimizer steps (the speed figures)
    best_val_loss: float = math.inf
    # Steps skipped for a non-finite loss (CONFIG_NONFINITE=skip).
    nonfinite_skips: dict[str, int] = field(
        default_factory=lambda: {"in_a_row": 0, "total": 0})
    # The metrics row of a step whose evaluation a stop cut short; a resume redoes
    # that evaluation before the next step.
    pending_row: dict[str, Any] | None = None
    # The 2:4 kernel's weight shapes, as sparse_kernel.decide chose them before the
    # first step ([] none; None not decided): a resume runs the same kernels.
    sparse_shapes: list[list[int]] | None = None


@dataclass
class Identity:
    """What a checkpoint must match to be resumed by this run."""

    config: Config  # as requested (an auto batch may train it split differently)
    data_fingerprint: str
    batches: TrainBatches  # positions in the data stream
    max_iters: int


class TrainState:
    """The model, its optimizer, grad scaler and pruner, the random generators and
    the Progress of one run, saved and restored as one."""

    def __init__(self, model: GPT, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, pruner, runtime: Runtime,
                 dist: distributed.Dist, sharded: bool, identity: Identity):
        self.model, self.optimizer, self.scaler, self.pruner = model, optimizer, scaler, pruner
        self.runtime, self.dist, self.sharded, self.identity = runtime, dist, sharded, identity
        self.progress = Progress()
        self._elapsed_before = 0.0  # wall time of the sessions before this one
        self._session_start = time.perf_counter()

    def start_clock(self) -> None:
        """This session's wall time counts from now."""
        self._session_start = time.perf_counter()

    def elapsed_s(self) -> float:
        """Wall time of the run over all its sessions."""
        return self._elapsed_before + time.perf_counter() - self._session_start

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs, in checkpoint.CONTENTS' layout. Every process
        calls it (it gathers their random generators, and FSDP's shards); only the
        first process writes the result."""
        rng = self.dist.gather(rng_state(self.runtime))  # dropout differs per process
        weights, moments = (distributed.full_state(self.model, self.optimizer) if self.sharded
                            else (self.model.state_dict(), self.optimizer.state_dict()))
        extra = {}
        if evaluates_elsewhere(self.optimizer):
            # "model" is what evaluate, generate and export read: the point the
            # optimizer evaluates at (Schedule-Free's average); the training point
            # beside it, for an exact resume
            extra["train_weights"] = weights  # (views of y, which the context puts back)
            with evaluation_point(self.optimizer, self.pruner):
                weights = {k: v.clone() for k, v in self.model.state_dict().items()}
        p, ident = self.progress, self.identity
        return {
            **extra,
            "step": p.step, "model": weights, "optimizer": moments, "sharded": self.sharded,
            "scaler": self.scaler.state_dict(), "pruning": self.pruner.state_dict(),
            "rng": rng, "config": ident.config.to_dict(),
            "config_hash": ident.config.config_hash(),
            "data_fingerprint": ident.data_fingerprint,
            "data_position": ident.batches.position(p.step),
            "elapsed_s": self.elapsed_s(), "train_time_s": p.train_time_s,
            "best_val_loss": p.best_val_loss, "nonfinite_skips": dict(p.nonfinite_skips),
            "after_step_done": p.pending_row is None, "pending_row": p.pending_row or {},
            "sparse_shapes": p.sparse_shapes,
            "max_iters": ident.max_iters, "cpu_threads": torch.get_num_threads()}

    def check(self, state: dict[str, Any], where: Path, folder: Path,
              data_changed_ok: bool, config_hash: str | None = None) -> None:
        """Raise ResumeError when the checkpoint ``state`` (read from ``where``, in
        the run folder ``folder``) is not one this run can continue; nothing is
        restored yet. ``config_hash``: the configuration it must be of, when not
        this run's own (the parent an extension continues)."""
        cfg = self.identity.config
        if state["config_hash"] != (config_hash or cfg.config_hash()):
            raise ResumeError(f"{where} belongs to another configuration")
        if not data_changed_ok and not same_data(state["data_fingerprint"], cfg.data_dir,
                                                 cfg.dataset):
            # provenance.json normally catches this first; this guards a folder without it
            raise ResumeError(f"{where} was trained on different data ({cfg.dataset} was "
                              f"re-prepared since); move {folder} away to start over")
        if bool(state.get("sharded")) != self.sharded:
            raise ResumeError(f"{where} was written with CONFIG_PARALLEL_"
                              f"{'FSDP' if state.get('sharded') else 'DDP'} (or one process); "
                              "resume it the same way")
        position, step = state["data_position"], state["step"]
        if position != self.identity.batches.position(step):
            raise ResumeError(f"{where} stopped at data position {position}, which step "
                              f"{step} of this configuration cannot continue from")

    def load_state_dict(self, state: dict[str, Any], say: Callable[[str], None],
                        forget: frozenset[str] = frozenset()) -> None:
        """Continue from a checkpoint that ``check`` accepted. ``forget``: parts left
        out on purpose (gpt2/faults.py's forget-* faults, which the exact-resume
        test must notice)."""
        try:
            if self.sharded:
                distributed.load_full_state(self.model, self.optimizer, state["model"],
                                            state["optimizer"])
            else:
                # Schedule-Free's training point, where it keeps one; else the weights
                self.model.load_state_dict(state.get("train_weights", state["model"]))
                if "optimizer" not in forget:
                    self.optimizer.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
            self.pruner.load_state_dict(state["pruning"])
        except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as e:
            # (its sha256 matched: written so, or rewritten with a sha256 to match)
            raise ResumeError(f"the checkpoint's state does not fit this run's model, "
                              f"optimizer or pruning ({str(e).splitlines()[0][:200]}): resume "
                              "from an earlier checkpoint (TRAIN_ARGS=--resume-step=N), or "
                              "start the run again in a new folder") from None
        if "rng" not in forget:
            restore_rng(state["rng"], self.runtime, self.dist, say)
        check_threads(state.get("cpu_threads"), self.runtime, say)
        self._elapsed_before = state["elapsed_s"]
        self.progress = Progress(
            step=state["step"], train_time_s=state["train_time_s"],
            best_val_loss=state["best_val_loss"],
            nonfinite_skips=dict(state["nonfinite_skips"]),
            pending_row=None if state["after_step_done"] else state["pending_row"],
            sparse_shapes=state.get("sparse_shapes"))  # (absent before kgpt checked shapes)


def rng_state(runtime: Runtime) -> dict[str, Any]:
    """This process's random generators (dropout draws from them)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if runtime.device_type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], runtime: Runtime) -> None:
    # Generator states are CPU byte tensors whatever the device: set_rng_state
    # refuses a CUDA one (checkpoints load onto the CPU; this guards other callers).
    torch.set_rng_state(state["torch"].cpu())
    if runtime.device_type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def restore_rng(saved: list[dict[str, Any]], runtime: Runtime, dist: distributed.Dist,
                say: Callable[[str], None]) -> None:
    """Each process continues its own random stream, when the checkpoint has one for
    it (the same process count); otherwise resume is exact only without dropout."""
    if len(saved) != dist.world:
        say(f"note: the checkpoint was written by {len(saved)} process(es), this run has "
            f"{dist.world}: dropout masks will differ from an uninterrupted run")
    set_rng_state(saved[dist.rank % len(saved)], runtime)


def check_threads(saved: int | None, runtime: Runtime, say: Callable[[str], None]) -> None:
    """On the CPU, torch splits sums among its threads, so another thread count
    rounds differently and the resumed losses drift from an uninterrupted run's.
    Checkpoints written before the count was recorded say nothing."""
    if saved is not None and runtime.device_type == "cpu" and saved != torch.get_num_threads():
        say(f"note: the checkpoint was written with {saved} CPU thread(s), this run has "
            f"{torch.get_num_threads()}: losses will differ by rounding from an uninterrupted "
            f"run (resume with --cpu-threads={saved}, CONFIG_CPU_THREADS={saved}, to keep it "
            "exact)")
