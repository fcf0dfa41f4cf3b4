"""The training loop.

Exact resume is a design rule here, not a feature bolted on: batches are a pure
function of (seed, step), sampling uses its own generator, and a checkpoint holds the
whole TrainState (gpt2/training/state.py). Stopping after step k and resuming
therefore gives the same losses as never stopping.

``train(cfg)`` is the entry point. It sets up the device and the processes, then
looks at the run folder: a finished run of this configuration is reported, a result
of other code or data is refused, set aside or reused (gpt2/training/provenance.py),
anything else is trained from the start or resumed by a ``Trainer``, whose
constructor builds data, model, optimizer, pruner and state, and whose ``train()``
is the loop.

Only the first process talks and writes; with several, the others compute the same
steps silently.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from gpt2 import faults, processes, storage
from gpt2.config import choices
from gpt2.config.options import TRAIN, Config, applies, to_dotconfig
from gpt2.data.loader import (data_fingerprint, open_split, train_batches, val_batches,
                              verify_shards)
from gpt2.errors import (EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_NONFINITE, EXIT_OUT_OF_MEMORY,
                         CheckpointError, ConfigError, ProvenanceError, ResumeError)
from gpt2.eval import hellaswag
from gpt2.model import pretrained
from gpt2.model.gpt import GPT
from gpt2.model.build import model_config
from gpt2.training import checkpoint, epochs, guards, provenance, reporting
from gpt2.runtime import distributed, launch
from gpt2.estimates import flops, memory
from gpt2.runtime.device import Runtime, compiled, return_freed_memory, setup_runtime
from gpt2.training.evaluation import (Cadence, Interrupted, hellaswag_scores, sample,
                                      validation_loss)
from gpt2.optim.algorithms.optimizers import build_optimizer
from gpt2.sparsity.algorithms.pruning import build_pruner
from gpt2.sparsity.algorithms import sparse_kernel
from gpt2.training import trained
from gpt2 import run_folder
from gpt2.run_folder import (COMPLETED, FAILED, INTERRUPTED, NO_SUMMARY, RunDir, Summary,
                             format_summary, read_summary, set_aside)
from gpt2.training.provenance import git_commit
from gpt2.training.schedule import branch_problem, branch_step, lr_at, schedule_of
from gpt2.optim.algorithms.optimizer_base import evaluation_point
from gpt2.training.state import Identity, TrainState
from gpt2.training.step import (apply_learning_rate, batch_stream, nonfinite_advice,
                                optimizer_step, total_steps)
from gpt2.training.trackers import check_tracker, open_tracker


@dataclass(frozen=True)
class RunOptions:
    """How a run was asked to go, besides its Config (train.py's flags)."""

    dotconfig: str | None = None  # the .config text to keep in the run folder
    stop_at_step: int | None = None  # save and stop there, as a stop signal would
    resume_step: int | None = None  # resume from this kept checkpoint, not the newest
    if_changed: str = "refuse"  # a result of other code or data: provenance.IF_CHANGED
    keep_steps: tuple[int, ...] = ()  # keep these steps' checkpoints for branches
    branch_from: str | None = None  # a longer run to start from at our cooldown (WSD)


def train(cfg: Config, dotconfig: str | None = None, stop_at_step: int | None = None,
          run_dir: str | None = None, resume_step: int | None = None,
          if_changed: str = "refuse", keep_steps: tuple[int, ...] = (),
          branch_from: str | None = None) -> int:
    """Run (or resume, or report) the training run ``cfg`` describes; returns an exit
    status (gpt2/errors.py): 0 completed, 130 interrupted, 3 stopped by a
    non-finite loss, 4 out of memory. Raises on bad data or a failed step.
    ``run_dir`` overrides the run folder (a matrix cell's); the rest: RunOptions.
    Training writes the run folder only: what started it publishes its page
    (gpt2/results/pages.py) once it has ended."""
    check_tracker(cfg.tracker, cfg.tracker_project)  # a missing library stops us before any work
    dist = distributed.from_env()
    problem = choices.accumulation_problem(cfg.gradient_accumulation, dist.world)
    if problem:  # torchrun may start more processes than CONFIG_NPROC_PER_NODE (nodes)
        raise ConfigError("gradient_accumulation", problem)
    runtime = setup_runtime(cfg.device, cfg.dtype, cfg.tf32, cfg.cpu_threads,
                            local_rank=dist.local_rank if dist.enabled else None,
                            attention=cfg.attention_backend, dropout=cfg.dropout)
    sparse_kernel.resolve(cfg, runtime.device_type)  # CONFIG_SPARSE_KERNEL_ON that cannot: now
    run = RunDir(cfg, run_dir)
    options = RunOptions(dotconfig, stop_at_step, resume_step, if_changed, tuple(keep_steps),
                         branch_from)
    distributed.init(dist, runtime.device_type)
    try:
        with contextlib.ExitStack() as held:  # releases the run folder's lock, however we leave
            rc = _train_or_report(cfg, run, runtime, dist, held, options)
    finally:
        distributed.shutdown(dist)
    return rc


def _speaker(dist: distributed.Dist) -> Callable[..., None]:
    """``print`` for the first process, silence for the others."""
    return functools.partial(print, flush=True) if dist.main else (lambda *a, **k: None)


def _train_or_report(cfg: Config, run: RunDir, runtime: Runtime, dist: distributed.Dist,
                     held: contextlib.ExitStack, options: RunOptions) -> int:
    """Report the run when the folder holds it complete; otherwise train it."""
    say = _speaker(dist)
    done = run.summary()
    if done and done.config_hash != cfg.config_hash():
        raise ResumeError(f"{run.path} holds a run of another configuration (hash "
                          f"{done.config_hash}, this one {cfg.config_hash()}); choose "
                          "another folder or move it away")
    current = provenance.identity(
        cfg.data_dir, cfg.dataset, trained.parent_identity(cfg) or (
            trained.branch_identity(Path(options.branch_from), cfg)
            if options.branch_from and not run.ckpt.exists() else None))
    recorded = _check_provenance(run, current, options.if_changed, held, dist, say)
    doubt = run.completion_problem()
    if doubt and options.resume_step is None:
        say(f"note: {doubt}: the run is not complete; resuming it from that checkpoint")
    if run.completed() and options.resume_step is None:
        if dist.main:
            run.point_latest()
        say(reporting.complete_report(run, reused=bool(provenance.changes(recorded, current))))
        return 0
    return Trainer(cfg, run, runtime, dist, held, options, recorded, current).train()


def _check_provenance(run: RunDir, current: dict[str, Any], if_changed: str,
                      held: contextlib.ExitStack, dist: distributed.Dist, say) -> dict | None:
    """A result in the folder made by other code or data is refused, set aside
    (rerun) or taken as it is (reuse), as ``if_changed`` says. Returns the recorded
    provenance that the run goes on from (None: a fresh start)."""
    recorded = provenance.read(run.path)
    state = run_folder.state(run.path)
    state = None if state == run_folder.PENDING else state
    what = state and provenance.changes(recorded, current)
    if not what:
        return recorded if state else None
    listed = "\n  ".join(what)
    if if_changed == "refuse":
        raise ProvenanceError(
            f"{run.path} holds a{'n' if state == 'interrupted' else ''} {state} run made under "
            f"other code or data:\n  {listed}\nIts results describe that code and data, not "
            "these. Train it again under this code (the old folder is kept, renamed): "
            "`make IF_CHANGED=rerun` (train.py --if-changed=rerun); or report/resume it anyway, "
            "recording the change: `make IF_CHANGED=reuse` (--if-changed=reuse)")
    if if_changed == "reuse":
        how = "resuming" if state == INTERRUPTED else "reporting"
        say(f"note: {run.path} was made under other code or data; {how} it as asked "
            f"(--if-changed=reuse):\n  {listed}")
        return recorded
    if dist.main:  # rerun: nothing is deleted; the old result moves beside the new one
        held.enter_context(run.locked())
        aside = set_aside(run.path)
        say(f"{run.path} was made under other code or data:\n  {listed}\nset it aside as "
            f"{aside.name}; training again (--if-changed=rerun)")
    dist.barrier()  # every process sees the emptied folder before it looks for checkpoints
    return None


class StopRequest:
    """SIGINT, SIGTERM (also what a trainer gets when the process that started it
    dies), SIGHUP (its terminal closed) and SIGUSR1 (the batch systems' "time is
    nearly up"): finish the current step, checkpoint, and exit. An evaluation in
    progress is abandoned.

    Alone, a second signal aborts without saving. Under torchrun it does not: the
    launcher forwards a signal it got and torchrun may send its own, and every
    process must reach the common step at which all of them save. Nor under Slurm,
    where the job's task runner passes on a signal Slurm may also send directly."""

    def __init__(self, second_aborts: bool = True, announce: bool = True):
        self.signal: int | None = None
        self.second_aborts, self.announce = second_aborts, announce

    def handle(self, signum, frame) -> None:
        if self.signal is not None:
            if self.second_aborts:  # second signal: stop now
                raise KeyboardInterrupt
            return
        self.signal = signum
        if self.announce:
            print(f"\n{signal.Signals(signum).name} received: saving a checkpoint after this "
                  "step" + (" (send it again to abort without saving)" if self.second_aborts
                            else ""), flush=True)

    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal else "no signal"


class Trainer:
    """One run, trained from its current state to its last step.

    The constructor reads the data, builds model, optimizer, pruner and grad scaler
    into a TrainState, takes the run folder, and restores the newest checkpoint when
    there is one; ``train()`` runs the loop and returns the exit status."""

    def __init__(self, cfg: Config, run: RunDir, runtime: Runtime, dist: distributed.Dist,
                 held: contextlib.ExitStack, options: RunOptions, recorded: dict | None,
                 current: dict[str, Any]):
        self.run, self.runtime, self.dist, self.options = run, runtime, dist, options
        # The run is named and hashed by the configuration as asked for (requested);
        # auto batch may train it (self.cfg) with another split of the same sequences.
        self.requested = cfg
        self.say = _speaker(dist)
        self.forget = faults.forgotten()
        # What summary.json says the result was made from (provenance.json has each file).
        self.made_from = {"code": {k: v for k, v in current["code"].items() if k != "files"},
                          "data": current["data"]}
        self._open_data()
        self.resuming = run_folder.present(run.ckpt)  # even a broken one: never start over silently
        if options.resume_step is not None and not self.resuming:
            raise ResumeError(f"--resume-step {options.resume_step}: {run.path} has no "
                              "checkpoints")
        self.state = self._build_state()
        # (checked before the folder is made: a refused extension leaves nothing behind)
        parent = self._parent_state() if cfg.extend_from and not self.resuming else None
        branch = (self._branch_state() if options.branch_from and not self.resuming
                  and not cfg.extend_from else None)
        self._take_folder(held, provenance.with_history(recorded, current))
        if self.resuming:
            self._resume()
        elif parent is not None:
            self._extend(*parent)
        elif branch is not None:
            self._branch(*branch)
        elif dist.main:
            run.truncate_metrics(-1)
            run.truncate_samples(-1)
        self._announce()
        self._prepare_loop()

    # ---- building ------------------------------------------------------------------

    def _open_data(self) -> None:
        """Verify the shards, settle the batch split that fits in memory, and open
        the training and validation batches (and HellaSwag's examples, when asked)."""
        requested, run, say = self.requested, self.run, self.say
        train_tokens = open_split(requested.data_dir, requested.dataset, "train")
        t_verify = time.perf_counter()
        n_shards, n_bytes = verify_shards(requested.data_dir, requested.dataset)
        say(f"data {requested.dataset}: {n_shards} shard(s), {n_bytes / 2**20:,.1f} MiB, "
            f"verified against their sha256 in {time.perf_counter() - t_verify:.1f}s")
        cfg, self.predicted, self.budget = memory.check(
            requested, self.runtime.device_type,
            resume_batch=(run.summary() or NO_SUMMARY).micro_batch, world=self.dist.world)
        self.cfg = cfg
        # (the windows are the same whatever batch size auto batch settles on)
        self.val = val_batches(cfg.dataset, open_split(cfg.data_dir, cfg.dataset, "val"),
                               cfg.block_size, cfg.eval_tokens, cfg.batch_size)
        self.batches = train_batches(cfg.dataset, train_tokens, cfg.block_size, cfg.batch_size,
                                     cfg.gradient_accumulation, cfg.seed)
        self.n_train_tokens = len(train_tokens)
        self.max_iters = total_steps(cfg, self.batches)
        # The learning-rate decay and the pruning ramp span this many steps.
        self.schedule_steps = cfg.schedule_steps(self.max_iters)
        problem = applies(cfg, "pruning_warmup") and choices.schedule_problem(
            cfg, self.schedule_steps)
        if problem:
            raise ConfigError("pruning_warmup", problem)
        self.hellaswag_examples = (hellaswag.load(hellaswag.file_of(cfg),
                                                  cfg.hellaswag_examples)
                                   if cfg.hellaswag_interval else None)

    def _build_state(self) -> TrainState:
        cfg, runtime, dist = self.cfg, self.runtime, self.dist
        torch.manual_seed(cfg.seed)
        model = GPT(model_config(cfg))
        if cfg.init_from and not self.resuming:  # a resume has the weights already
            self.say("weights from " + (trained.init_from_run(model, cfg)
                                        if trained.parent_of(cfg) else
                                        pretrained.init_from(model, cfg)))
        model = model.to(runtime.device)
        sharded = dist.enabled and cfg.parallel == "fsdp"
        if sharded:
            distributed.shard(model, dist, runtime.device_type)
        optimizer = build_optimizer(model, cfg, runtime.device_type, self.max_iters)
        pruner = build_pruner(model, optimizer, cfg, self.schedule_steps)
        scaler = torch.amp.GradScaler(runtime.device_type, enabled=runtime.needs_grad_scaler)
        identity = Identity(self.requested, data_fingerprint(cfg.data_dir, cfg.dataset),
                            self.batches, self.max_iters)
        return TrainState(model, optimizer, scaler, pruner, runtime, dist, sharded, identity)

    def _take_folder(self, held: contextlib.ExitStack, provenance_record: dict) -> None:
        """Everything before only read; from here on this process owns the folder."""
        run = self.run
        if self.dist.main:
            held.enter_context(run.locked())
            run.create(self.options.dotconfig if self.options.dotconfig is not None
                       else to_dotconfig(self.cfg, TRAIN), provenance_record)
            if run.summary_damaged():  # kept, and rewritten from the checkpoint and metrics
                aside = run.set_aside_summary()
                self.say(f"note: {run.summary_path} cannot be read (damaged), so the run is not "
                         "taken as complete; " + ("resuming it from its checkpoint"
                                                  if self.resuming else
                                                  "it has no checkpoint: starting over")
                         + f"; the damaged file is kept as {aside.name}")
        self.dist.barrier()  # the others read the checkpoint only once rank 0 holds the folder

    def _resume(self) -> None:
        """Continue from the newest checkpoint (or --resume-step's), and cut the
        metrics and samples back to it."""
        run, resume_step = self.run, self.options.resume_step
        source = checkpoint.resolve(run.ckpt, resume_step)
        # Onto the CPU: load_state_dict copies each tensor to where its parameter
        # lives, the device never holds two copies, and the generator states stay
        # CPU byte tensors as set_rng_state needs (mapped to CUDA they made every
        # CUDA resume fail; found on an H100).
        saved = checkpoint.load(source, map_location="cpu", link=run.ckpt)
        self.state.check(saved, run.ckpt, run.path,
                         data_changed_ok=self.options.if_changed == "reuse")
        self.state.load_state_dict(saved, self.say, forget=self.forget)
        del saved
        start = self.state.progress.step
        redo = self.state.progress.pending_row is not None  # that step's rows go too
        if self.dist.main:
            if resume_step is not None:
                aside = checkpoint.set_aside_after(run.ckpt, source)
                if aside:
                    self.say(f"set aside {len(aside)} newer checkpoint(s) as "
                             f"{', '.join(p.name for p in aside)}")
            skipped = run.truncate_metrics(start - redo)
            if skipped:
                self.say(f"note: {run.metrics} had {skipped} damaged line(s) (cut short by a "
                         f"crash?): dropped them, kept the intact rows up to step {start}")
            run.truncate_samples(start - redo)
        self.say(f"resuming {run.path} from step {start}/{self.max_iters}"
                 + (f" (checkpoint of step {resume_step})" if resume_step is not None else ""))

    def _parent_state(self) -> tuple[Path, Config, dict[str, Any]]:
        """The run CONFIG_EXTEND_FROM names, its Config and final checkpoint, once
        checked: finished, the same settings but its length, shorter than this run."""
        parent = Path(os.path.expanduser(self.requested.extend_from))
        try:
            parent_cfg, saved = trained.load(parent)
        except ResumeError as e:
            raise ConfigError("extend_from", str(e)) from None
        summary = read_summary(parent) or NO_SUMMARY
        if not run_folder.completed(parent):
            raise ConfigError("extend_from", f"{parent} is not a finished run (its summary says "
                              f"{summary.status or 'nothing'}): finish it first, or start "
                              "a new run from its weights with CONFIG_INIT_FROM")
        problem = trained.extension_problem(parent_cfg, self.requested)
        if problem:
            raise ConfigError("extend_from", problem)
        step = saved["step"]
        if self.max_iters <= step:
            raise ConfigError("max_iters", f"{self.max_iters} steps: {parent} has trained "
                              f"{step} already; extend it to more")
        self.state.check(saved, parent / trained.CKPT, parent, data_changed_ok=False,
                         config_hash=parent_cfg.config_hash())
        return parent, parent_cfg, saved

    def _extend(self, parent: Path, parent_cfg: Config, saved: dict[str, Any]) -> None:
        """Start from the parent run's final checkpoint with its whole state, its
        metrics and samples copied in, so this run's files tell the story from step 0."""
        step = saved["step"]
        self.state.load_state_dict(saved, self.say)
        if self.dist.main:
            self.run.copy_history(parent, step)
        self.say(f"extending {parent} from step {step} to {self.max_iters}: its weights, "
                 "optimizer state, pruning, data position and random generators"
                 + (f"; the schedules span its {self.schedule_steps} steps"
                    if self.schedule_steps == parent_cfg.schedule_steps(step) else ""))

    def _branch_state(self) -> tuple[Path, dict[str, Any]]:
        """The checkpoint of the longer run --branch-from names at the step this run's
        cooldown begins, once checked: the same run but for its length, the same rates
        before that step, and the checkpoint kept and intact."""
        folder = Path(os.path.expanduser(self.options.branch_from))
        step = branch_step(self.requested)
        if step is None:
            raise ResumeError(f"--branch-from {folder}: this run cannot branch: "
                              + branch_problem(self.requested, self.requested))
        try:
            problem = branch_problem(trained.recorded_config(folder), self.requested)
        except CheckpointError as e:
            raise ResumeError(f"--branch-from {folder}: {e}") from None
        if problem:
            raise ResumeError(f"--branch-from {folder}: this run cannot branch from it: "
                              f"{problem}")
        path = run_folder.branch_checkpoint(folder, step)
        try:
            parent_cfg, saved = trained.load_file(path)
        except CheckpointError as e:
            raise ResumeError(f"--branch-from {folder}: it kept no intact checkpoint of step "
                              f"{step} ({e}); train this run from the start") from None
        self.state.check(saved, path, folder, data_changed_ok=False,
                         config_hash=parent_cfg.config_hash())
        return folder, saved

    def _branch(self, parent: Path, saved: dict[str, Any]) -> None:
        """Start from the longer run's state where this run's cooldown begins, with its
        metrics and samples up to there: what this run would have done itself."""
        step = saved["step"]
        self.state.load_state_dict(saved, self.say)
        if self.dist.main:
            self.run.copy_history(parent, step)
        self.say(f"branching from {parent} at step {step} (the cooldown of this "
                 f"{self.max_iters}-step run begins there): its weights, optimizer state, "
                 "data position and random generators")

    def _announce(self) -> None:
        cfg, runtime, budget, val = self.cfg, self.runtime, self.budget, self.val
        planned = epochs.epochs(self.max_iters * cfg.tokens_per_step(), self.n_train_tokens)
        self.say(f"run {self.run.path}\nmodel {self.state.model.num_params():,} parameters | "
                 f"{self.max_iters} steps x {cfg.tokens_per_step():,} tokens | "
                 f"{runtime.name()} {cfg.dtype}"
                 + (f" x {self.dist.world} processes" if self.dist.enabled else "")
                 + f" | data {self.n_train_tokens:,} train tokens "
                 f"({self.batches.windows} windows/epoch), {planned:,.2f} epochs planned\n"
                 f"validation {val.n_tokens:,} tokens: {val.windows:,} of the split's "
                 f"{val.split_windows:,} windows of {val.block_size}\n"
                 f"memory predicted peak {memory.gib(self.predicted.peak)} (micro-batch "
                 f"{cfg.batch_size}){memory.bound_note(cfg, runtime.device_type)} | budget "
                 f"{memory.gib(budget.bytes) if budget.bytes else 'unknown'} ({budget.source}) "
                 f"| {memory.verdict(self.predicted.peak, budget.bytes)}")
        warning = epochs.warning(cfg, self.max_iters, self.n_train_tokens)
        if warning:
            self.say(warning)

    def _prepare_loop(self) -> None:
        """Compile and wrap the model, start the clocks, open the tracker."""
        cfg, runtime, dist, model = self.cfg, self.runtime, self.dist, self.state.model
        self.faults = faults.for_training(model)  # None unless a test injects faults
        compiles = runtime.compiles(cfg.compile)
        if compiles:
            self.say(f"compiling the model with torch.compile (mode {cfg.compile_mode}): the "
                     "first step takes longer")
        # Evaluation runs the (compiled) model itself; DDP wraps it for training.
        self.fwd = compiled(model, cfg.compile_mode, cfg.compile_backend) if compiles else model
        self.train_fwd = self.fwd
        if dist.enabled and not self.state.sharded:
            self.train_fwd = torch.nn.parallel.DistributedDataParallel(
                self.fwd, device_ids=[dist.local_rank] if runtime.device_type == "cuda" else None)
        self.micro_steps = dist.micro_steps(cfg.gradient_accumulation)
        can_run, note = sparse_kernel.resolve(cfg, runtime.device_type)
        if cfg.pruning_method != "none" and cfg.pruning_structure == sparse_kernel.STRUCTURE:
            self.say(note)
        # (None: the kernel cannot run here; else the Linears swapped so far)
        self.sparse_layers: int | None = 0 if can_run else None
        self.sparse_shapes = self._sparse_shapes() if can_run else set()
        self.sparse_pending = bool(self.sparse_shapes)  # (until the ramp's end swaps them)
        self.tokens_per_step = cfg.tokens_per_step()
        runtime.reset_peak_memory()
        self.state.start_clock()
        self.start_step = self.state.progress.step
        self.train_time_at_start = self.state.progress.train_time_s
        self.checkpointer = checkpoint.Checkpointer(
            self.run.path, self.run.ckpt, cfg.checkpoint_interval, self.max_iters,
            self.options.keep_steps, dist.main,
            last_saved=self.start_step if self.resuming else None)
        self.cadence = Cadence(cfg.eval_interval, cfg.hellaswag_interval, self.max_iters,
                               hellaswag=bool(self.hellaswag_examples),
                               late_interval=cfg.eval_late_interval,
                               late_fraction=cfg.eval_late_fraction)
        # (Under torchrun or Slurm one stop can arrive twice: see StopRequest.)
        self.stop = StopRequest(second_aborts=not (launch.under_torchrun()
                                                   or "SLURM_JOB_ID" in os.environ),
                                announce=dist.main)
        # One process can abandon an evaluation for a stop request; several must
        # finish it (each waits for the others in every batch).
        self.stopping = (lambda: self.stop.signal is not None) if dist.world == 1 else None
        # Named by the folder: matrix cells share a run name, their folders differ.
        self.tracker = open_tracker(cfg.tracker if dist.main else "none", cfg.tracker_project,
                                    self.run.path.name, self.run.path, cfg.to_dict())

    # ---- the loop ------------------------------------------------------------------

    def train(self) -> int:
        """Train to max_iters, evaluating, logging and checkpointing on the way;
        returns the exit status. A stop signal ends it after the current step with a
        checkpoint; a failure is recorded in summary.json before it is raised."""
        cfg, progress = self.cfg, self.state.progress
        schedule = schedule_of(cfg)
        try:
            with processes.stop_signals_handled_by(self.stop.handle):
                try:
                    self._evaluate_before_first_step()
                    stream = self._batch_stream()
                    self._since_line = [0, 0.0]  # tokens and step seconds since the last line
                    for step in range(progress.step + 1, self.max_iters + 1):
                        self._fault("step", step)
                        t0 = time.perf_counter()
                        lr = lr_at(step - 1, total=self.schedule_steps, **schedule)
                        apply_learning_rate(self.state.optimizer, lr)
                        self._engage_sparse_kernel(step)
                        loss, grad_norm = self._optimizer_step(stream, step)
                        progress.step = step  # only now: a step that raised is not done
                        self.runtime.synchronize()
                        step_time = time.perf_counter() - t0
                        progress.train_time_s += step_time
                        row = self._progress_row(step, loss, grad_norm, lr, step_time)
                        self._after_step(step, row, lr)
                        halt = self._halt(step)
                        self.checkpointer.after_step(self.state, step, halt)
                        if halt and step != self.max_iters:
                            return self._stopped(self.stop.name() if self.stop.signal else
                                                 f"--stop-at-step {self.options.stop_at_step}")
                except Interrupted as cut:
                    self.checkpointer.save(self.state, pending=cut.row)
                    done = f" (after {cut.progress})" if cut.progress else ""
                    return self._stopped(f"{self.stop.name()} during evaluation{done}; it is "
                                         "redone on resume")
        except KeyboardInterrupt:
            self._summarize(INTERRUPTED, error="aborted by a second signal",
                            exit_status=EXIT_INTERRUPTED)
            self.say(f"aborted at step {progress.step}; the last checkpoint in {self.run.path} "
                     "is kept")
            return EXIT_INTERRUPTED
        except storage.StorageError as e:
            # A full disk or a folder refusing writes: the last checkpoint is intact and
            # train.py says what to do. The summary may not be writable either.
            with contextlib.suppress(storage.StorageError):
                self._summarize(FAILED, error=str(e), exit_status=EXIT_BAD_INPUT)
            raise
        except guards.NonFiniteLoss as e:
            self._summarize(FAILED, error=str(e), exit_status=EXIT_NONFINITE)
            self.say(nonfinite_advice(cfg, e, self.checkpointer.last_saved))
            return EXIT_NONFINITE
        except Exception as e:
            if not guards.is_out_of_memory(e):
                self._summarize(FAILED, error=f"{type(e).__name__}: {e}", exit_status=1)
                raise
            return self._out_of_memory(e)
        finally:
            self.tracker.close()
        self.say(format_summary(self.run.path, self._summarize(COMPLETED)))
        return 0

    def _fault(self, point: str, step: int) -> None:
        """The fault-injection hook (gpt2/faults.py): nothing unless a test asks."""
        if self.faults is not None:
            self.faults.at(point, step)

    def _sparse_shapes(self) -> set[tuple[int, int]]:
        """The pruned weight shapes whose forward runs on the 2:4 kernel: decided by
        checking it before the first step (sparse_kernel.decide; on every process,
        agreed), or as the checkpoint says it was decided."""
        progress = self.state.progress
        if progress.sparse_shapes is None:
            shapes = [tuple(p.shape) for _, p in self.state.pruner.targets]
            verdicts = sparse_kernel.decide(self.cfg, shapes, self.runtime.torch_dtype,
                                            torch.device(self.runtime.device),
                                            gather=self.dist.gather)
            self.say("sparse kernel check, per pruned weight shape (out x in):\n"
                     + "\n".join(f"  {v.line()}" for v in verdicts))
            progress.sparse_shapes = [list(v.shape) for v in verdicts if v.sparse]
        else:
            self.say("sparse kernel: as this run decided before its first step, on "
                     + (", ".join(map(sparse_kernel.shape_text, progress.sparse_shapes))
                        or "no weight shape"))
        if not progress.sparse_shapes:
            self.say("sparse kernel: no weight shape passed; the masks apply to dense matmuls")
        return {(o, i) for o, i in progress.sparse_shapes}

    def _engage_sparse_kernel(self, step: int) -> None:
        """From the step the pruner says its weights are 2:4 (Pruner.structured_from:
        after the ramp's end), the pruned Linears compute their forward sparse
        (gpt2/sparsity/algorithms/sparse_kernel.py): before, they could not be compressed."""
        if not self.sparse_pending or step < self.state.pruner.structured_from():
            return
        self.sparse_pending = False
        swapped = sparse_kernel.engage(self.state.model,
                                       [name for name, _ in self.state.pruner.targets],
                                       self.sparse_shapes)
        self.sparse_layers = swapped
        self.say(f"step {step:>6}/{self.max_iters} | 2:4 masks final: {swapped} Linear layers "
                 "now run their forward on the compressed weights")

    def _batch_stream(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        first = 0 if "data-position" in self.forget else self.state.progress.step
        return batch_stream(self.batches, first, self.max_iters, self.cfg.data_workers,
                            self.runtime, self.micro_steps)

    def _optimizer_step(self, stream, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One step. A non-finite loss skips it (CONFIG_NONFINITE=skip, at most
        NONFINITE_MAX_SKIPS in a row) or raises guards.NonFiniteLoss."""
        cfg, state = self.cfg, self.state
        skips = state.progress.nonfinite_skips
        try:
            result = optimizer_step(state, stream, step, cfg, self.train_fwd,
                                    len(self.micro_steps), self._finite)
        except guards.NonFiniteLoss as e:
            if cfg.nonfinite != "skip" or skips["in_a_row"] >= cfg.nonfinite_max_skips:
                raise guards.NonFiniteLoss(e.step, e.value, skips["in_a_row"] + (
                    cfg.nonfinite == "skip")) from None
            skips["in_a_row"] += 1
            skips["total"] += 1
            self.say(f"step {e.step:>6}/{self.max_iters} | loss {e.value} is not finite: step "
                     f"skipped, no update ({skips['in_a_row']} in a row, at most "
                     f"{cfg.nonfinite_max_skips})")
            return torch.tensor(e.value), None
        skips["in_a_row"] = 0
        return result

    def _finite(self, loss_sum: torch.Tensor) -> Callable[[], bool]:
        """Whether every process's loss is finite (all skip or stop together), read
        later (step.optimizer_step)."""
        bad = self.dist.any_later(~torch.isfinite(loss_sum))
        return lambda: not bad()

    def _halt(self, step: int) -> bool:
        """A stop signal reached any process, or --stop-at-step is reached."""
        stop_at = self.options.stop_at_step
        return self.dist.any(self.stop.signal is not None, self.runtime.device) or (
            stop_at is not None and step >= stop_at)

    # ---- logging and evaluation ----------------------------------------------------

    def _after_evaluation(self) -> None:
        if self.runtime.device_type == "cpu":
            return_freed_memory()  # (why: device.return_freed_memory)

    def _progress_row(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor | None,
                      lr: float, step_time: float) -> dict[str, Any] | None:
        """The metrics row of a step that is due a progress line (printed), else None.
        Its speed is the steps' own tokens over their own time since the last line, as
        the summary's is over the run: an evaluation or a checkpoint between two lines
        does not count, wherever it falls (an evaluation every 25 steps between lines
        every 10 once doubled a line's figure)."""
        cfg, progress, pruner = self.cfg, self.state.progress, self.state.pruner
        self._since_line[0] += self.tokens_per_step
        self._since_line[1] += step_time
        if step == self.start_step + 1 and step % cfg.log_interval and step != self.max_iters:
            self.say(f"step {step:>6}/{self.max_iters} | first step done in {step_time:.1f}s; "
                     f"progress every {cfg.log_interval} steps")
        if step % cfg.log_interval and step != self.max_iters:
            return None
        tok_s = self._since_line[0] / max(self._since_line[1], 1e-9)
        row = {"step": step, "tokens": step * self.tokens_per_step, "epochs": self._epochs(step),
               "train_loss": self.dist.mean(loss.to(self.runtime.device)).item(), "lr": lr,
               "grad_norm": None if grad_norm is None else grad_norm.item(),
               "tokens_per_sec": tok_s, "sparsity": pruner.sparsity(),
               "elapsed_s": self.state.elapsed_s(),
               "peak_memory_mb": self.runtime.peak_memory_mb(),
               # how busy the machine was: tokens/s of two runs compare only at like loads
               "load_avg": os.getloadavg()[0]}
        if progress.nonfinite_skips["total"]:
            row["skipped_steps"] = progress.nonfinite_skips["total"]
        eta = ((self.max_iters - step) * (progress.train_time_s - self.train_time_at_start)
               / (step - self.start_step))
        self.say(reporting.progress_line(row, self.max_iters, eta, self.runtime.peak_memory_mb(),
                                         bool(pruner.target)))
        self._since_line = [0, 0.0]
        return row

    def _evaluate_before_first_step(self) -> None:
        """The untrained model's validation loss, or the evaluation a stop cut short."""
        progress = self.state.progress
        if progress.step == 0:
            self.say(f"step {0:>6}/{self.max_iters} | evaluating the untrained model "
                     f"({self.val.n_tokens:,} validation tokens in {len(self.val):,} batches)")
            try:
                row = self._validate(0, {"step": 0, "tokens": 0, "epochs": 0.0,
                                         "elapsed_s": self.state.elapsed_s()})
            except Interrupted as cut:
                raise cut.with_row(progress.pending_row or {"step": 0}) from None
            self._record(row)
            self.say(f"step {0:>6}/{self.max_iters} | val loss {row['val_loss']:.4f} | "
                     f"val ppl {row['val_ppl']:.2f}")
            self._after_evaluation()
        elif progress.pending_row is not None:
            self._after_step(progress.step, progress.pending_row,
                             progress.pending_row.get("lr", 0.0))

    def _after_step(self, step: int, row: dict[str, Any] | None, lr: float) -> None:
        """Evaluation, HellaSwag and the metrics row of a finished step. A stop that
        cuts an evaluation short raises Interrupted carrying the step's row, before
        anything of it is recorded."""
        logged = row
        base = {"step": step, "tokens": step * self.tokens_per_step,
                "epochs": self._epochs(step), "lr": lr, "elapsed_s": self.state.elapsed_s()}
        try:
            if self.cadence.validates(step):
                row = self._validate(step, dict(row or base))
                self.say(f"step {step:>6}/{self.max_iters} | val loss {row['val_loss']:.4f} | "
                         f"val ppl {row['val_ppl']:.2f}")
            if self.cadence.scores(step):
                row = dict(row or base)
                self._fault("hellaswag", step)
                with evaluation_point(self.state.optimizer, self.state.pruner):
                    row.update(hellaswag_scores(self.state.model, self.hellaswag_examples,
                                                self.runtime, self.dist, self.stopping))
                self.say(f"step {step:>6}/{self.max_iters} | hellaswag acc "
                         f"{row['hellaswag_acc']:.4f} | acc_norm {row['hellaswag_acc_norm']:.4f}"
                         f" ({row['hellaswag_examples']:,} examples)")
        except Interrupted as cut:
            raise cut.with_row(logged or base) from None
        if row is not None:
            self._record(row)
        if self.cadence.on_interval(step):
            self._after_evaluation()

    def _validate(self, step: int, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with the validation loss, and a text sample written beside it."""
        cfg, state = self.cfg, self.state
        self._fault("eval", step)
        with evaluation_point(state.optimizer, state.pruner):  # Schedule-Free's average
            val = validation_loss(self.fwd, self.val, self.runtime, self.dist, self.stopping)
            loss = val.loss
            state.progress.best_val_loss = min(state.progress.best_val_loss, loss)
            row.update(val_loss=loss, val_loss_se=val.se, val_ppl=math.exp(min(loss, 700.0)),
                       sparsity=state.pruner.sparsity())
            # Under FSDP every process takes part in each forward pass, so all sample
            # (the same seed gives the same text) and rank 0 writes.
            if cfg.sample_tokens and (self.dist.main or state.sharded):
                text = sample(state.model, cfg, self.runtime, seed=cfg.seed + step)
                if self.dist.main:
                    self.run.append_sample(step, text)
        return row

    def _epochs(self, step: int) -> float:
        """Passes over the training split after ``step`` steps."""
        return epochs.epochs(step * self.tokens_per_step, self.n_train_tokens)

    def _record(self, row: dict[str, Any]) -> None:
        if self.dist.main:
            self.run.append_metrics(row)
            self.tracker.log(row, row["step"])

    # ---- saving and ending -----------------------------------------------------------

    def _stopped(self, why: str) -> int:
        step = self.state.progress.step
        self._summarize(INTERRUPTED, exit_status=EXIT_INTERRUPTED)
        self.say(f"stopped at step {step} ({why}); checkpoint saved. Run the same command "
                 f"again (e.g. `make`) to resume.\n{self.run.path}")
        # Under torchrun a non-zero exit reads as a crashed worker; the launcher takes
        # "interrupted" from summary.json instead.
        return 0 if launch.under_torchrun() else EXIT_INTERRUPTED

    def _out_of_memory(self, error: Exception) -> int:
        peak = self.runtime.peak_memory_mb()
        if self.runtime.device_type == "cuda":
            torch.cuda.empty_cache()  # room to write the summary and its plot
        self._summarize(FAILED, error=f"out of memory: {str(error).splitlines()[0]}",
                        exit_status=EXIT_OUT_OF_MEMORY)
        self.say(memory.oom_advice(self.cfg, self.runtime.device_type, self.predicted,
                                   self.budget, self.state.progress.step + 1,
                                   self.checkpointer.last_saved, peak, self.dist.world))
        return EXIT_OUT_OF_MEMORY

    def _summarize(self, status: str, error: str | None = None,
                   exit_status: int = 0) -> Summary:
        """Write summary.json (and loss.png) for the run as it stands. A stop signal
        that arrives meanwhile waits until it is written: when another process fails,
        the launcher sends this one SIGTERM at once, often while it records its own
        failure after the training loop's handlers are gone."""
        if not self.dist.main:
            return NO_SUMMARY
        with processes.stop_signals_deferred():
            return self._write_summary(status, error, exit_status)

    def _write_summary(self, status: str, error: str | None, exit_status: int) -> Summary:
        cfg, run, state = self.cfg, self.run, self.state
        step, train_time = state.progress.step, state.progress.train_time_s
        rows = run.read_metrics()
        tok_s = ((step - self.start_step) * self.tokens_per_step
                 / max(train_time - self.train_time_at_start, 1e-9)
                 if step > self.start_step else None)
        trained = step > self.start_step
        summary = Summary(
            status=status, iters=step, max_iters=self.max_iters,
            tokens=step * self.tokens_per_step,
            **reporting.figures_of(rows, self.runtime.peak_memory_mb() if trained else None),
            val_tokens=self.val.n_tokens,
            epochs_trained=self._epochs(step),
            train_split_tokens=self.n_train_tokens,
            tokens_per_sec=tok_s,
            **flops.speed_figures(state.model, cfg, self.runtime.device_type,
                                  self.runtime.name(), tok_s),
            predicted_peak_memory_mb=self.predicted.peak / memory.MiB,
            micro_batch=cfg.batch_size, gradient_accumulation=cfg.gradient_accumulation,
            wall_time_s=state.elapsed_s(),
            device=self.runtime.name(), dtype=cfg.dtype,
            n_params=state.model.num_params(),
            optimizer=cfg.optimizer, pruning=cfg.pruning_method,
            target_sparsity=state.pruner.target, final_sparsity=state.pruner.sparsity(),
            optimizer_hparams=choices.optimizer_hparams(cfg),
            pruning_hparams={name: getattr(cfg, name) for name in
                             choices.PRUNING_METHODS[cfg.pruning_method].hparams},
            config_hash=self.requested.config_hash(), torch_version=torch.__version__,
            git_commit=git_commit(), exit_status=exit_status, provenance=self.made_from,
            nonfinite_skipped_steps=state.progress.nonfinite_skips["total"],
            sparse_kernel_layers=self.sparse_layers, error=error or None)
        run.write_summary(summary)
        if rows:
            run.plot_loss()
        return summary
