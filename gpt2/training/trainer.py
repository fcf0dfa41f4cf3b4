"""The training loop.

Exact resume is a design rule here, not a feature bolted on: batches are a pure
function of (seed, step), sampling uses its own generator, and a checkpoint holds
model, optimizer, grad-scaler, pruning and RNG state. Stopping after step k and
resuming therefore gives the same losses as never stopping.
"""

from __future__ import annotations

import builtins
import collections
import concurrent.futures
import contextlib
import math
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from gpt2.config.options import Config, ConfigError, applies, to_dotconfig
from gpt2.data.loader import (TrainBatches, ValBatches, data_fingerprint, open_split,
                              same_data, verify_shards)
from gpt2.data.tokenizer import EOT_TOKEN, decode, encode
from gpt2.eval import hellaswag
from gpt2.model import pretrained
from gpt2.model.gpt import GPT
from gpt2 import faults, processes, storage
from gpt2.training import checkpoint, guards
from gpt2.errors import ProvenanceError, ResumeError
from gpt2.training.device import Runtime, setup_runtime
from gpt2.training import distributed, flops, memory, optimizers, provenance, pruning
from gpt2.training.optimizers import build_optimizer
from gpt2.training.pruning import build_pruner
from gpt2.training.runs import (EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_NONFINITE,
                                EXIT_OUT_OF_MEMORY, RunDir, format_summary, git_commit,
                                set_aside)
from gpt2.training.schedule import lr_at
from gpt2.training.trackers import check_tracker, open_tracker



HELLASWAG_COUNTS = ("correct", "correct_norm", "examples")


class Interrupted(Exception):
    """A stop request arrived during an evaluation, which is abandoned (and redone
    on resume) rather than finished first."""


def hellaswag_scores(model: GPT, examples: list, rt: Runtime,
                     d: distributed.Dist = distributed.Dist(), stopping=None) -> dict[str, Any]:
    """HellaSwag acc and acc_norm, the examples shared among processes.
    ``stopping()`` true between groups of examples raises Interrupted (one process
    only, as in ``evaluate``)."""
    share = d.share(examples)
    totals = dict.fromkeys(HELLASWAG_COUNTS, 0)
    for i in range(0, len(share), 64):
        if stopping is not None and stopping():
            raise Interrupted
        counts = hellaswag.evaluate(model, share[i:i + 64], rt.device, rt.autocast)
        totals = {k: totals[k] + counts[k] for k in HELLASWAG_COUNTS}
    summed = d.sum(torch.tensor([totals[k] for k in HELLASWAG_COUNTS], device=rt.device))
    return hellaswag.accuracies(dict(zip(HELLASWAG_COUNTS, map(int, summed.tolist()))))


def init_pretrained(model: GPT, cfg: Config) -> str:
    """Load CONFIG_INIT_FROM's weights into ``model``; returns where they came from."""
    try:
        folder = pretrained.find(cfg.init_from)
        n_layer, n_head, n_embd = cfg.dims()
        problem = pretrained.mismatch(folder, n_layer, n_head, n_embd, cfg.block_size,
                                      cfg.bias, cfg.tie_weights)
        if problem:
            raise ConfigError("init_from", problem)
        pretrained.load_into(model, folder)
    except pretrained.PretrainedError as e:
        raise ConfigError("init_from", str(e)) from None
    return str(folder)


def total_steps(cfg: Config, batches: TrainBatches) -> int:
    """max_iters and/or epochs: whichever ends training first."""
    limits = []
    if cfg.max_iters:
        limits.append(cfg.max_iters)
    if cfg.epochs:
        limits.append(batches.steps_for_epochs(cfg.epochs))
    return min(limits)


def batch_stream(batches: TrainBatches, start: int, stop: int, workers: int,
                 rt: Runtime, micro_steps: range | None = None
                 ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches for steps [start, stop) in order, prepared ahead by worker threads.
    ``micro_steps``: the micro-batches of each step this process trains on (all of
    them unless the step is shared among processes)."""
    pin = rt.device_type == "cuda"
    micros = range(batches.accumulation) if micro_steps is None else micro_steps

    def make(key: tuple[int, int]):
        x, y = (torch.from_numpy(a) for a in batches.get(*key))
        return (x.pin_memory(), y.pin_memory()) if pin else (x, y)

    keys = ((s, m) for s in range(start, stop) for m in micros)
    if workers == 0:
        for key in keys:
            x, y = make(key)
            yield x.to(rt.device), y.to(rt.device)
        return
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="batches") as pool:
        ahead: collections.deque = collections.deque()
        for key in keys:
            ahead.append(pool.submit(make, key))
            if len(ahead) > 2 * workers:
                x, y = ahead.popleft().result()
                yield x.to(rt.device, non_blocking=pin), y.to(rt.device, non_blocking=pin)
        while ahead:
            x, y = ahead.popleft().result()
            yield x.to(rt.device, non_blocking=pin), y.to(rt.device, non_blocking=pin)


@torch.no_grad()
def evaluate(model: torch.nn.Module, val: ValBatches, rt: Runtime,
             d: distributed.Dist = distributed.Dist(), stopping=None) -> float:
    """Mean validation loss; with several processes each takes every world-th batch.
    ``stopping()`` true between batches raises Interrupted (one process only: with
    several, each must reach the same collective calls)."""
    model.eval()
    total = torch.zeros((), device=rt.device)
    for (x, y), counted in d.share(val.batches):
        if stopping is not None and stopping():
            model.train()
            raise Interrupted
        with rt.autocast():
            loss = model(torch.from_numpy(x).to(rt.device), torch.from_numpy(y).to(rt.device))[1]
        if counted:
            total += loss.float()
    model.train()
    return d.sum(total).item() / len(val.batches)


def sample(model: GPT, cfg: Config, rt: Runtime, seed: int, prompt: str | None = None,
           max_new_tokens: int | None = None) -> str:
    """Text continuation of the prompt. Uses its own generator: sampling during
    training must not move the training RNG (that would break exact resume)."""
    prompt = cfg.sample_prompt if prompt is None else prompt
    ids = encode(prompt) if prompt else [EOT_TOKEN]
    n = cfg.sample_tokens if max_new_tokens is None else max_new_tokens
    gen = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    with rt.autocast():
        out = model.generate(torch.tensor([ids], device=rt.device), n,
                             temperature=cfg.sample_temperature, top_k=cfg.sample_top_k,
                             generator=gen)
    model.train(was_training)
    return prompt + decode(out[0, len(ids):].tolist())


def _rng_state(rt: Runtime) -> dict[str, Any]:
    """This process's random generators (dropout draws from them)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if rt.device_type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any], rt: Runtime) -> None:
    # Generator states are CPU byte tensors whatever the device: set_rng_state
    # refuses a CUDA one (checkpoints load onto the CPU; this guards other callers).
    torch.set_rng_state(state["torch"].cpu())
    if rt.device_type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _restore_rng(saved: list[dict[str, Any]], rt: Runtime, d: distributed.Dist, say) -> None:
    """Each process continues its own random stream, when the checkpoint has one for
    it (the same process count); otherwise resume is exact only without dropout."""
    if len(saved) != d.world:
        say(f"note: the checkpoint was written by {len(saved)} process(es), this run has "
            f"{d.world}: dropout masks will differ from an uninterrupted run")
    _set_rng_state(saved[d.rank % len(saved)], rt)


def _check_threads(saved: int | None, rt: Runtime, say) -> None:
    """On the CPU, torch splits sums among its threads, so another thread count
    rounds differently and the resumed losses drift from an uninterrupted run's.
    Checkpoints written before the count was recorded say nothing."""
    if saved is not None and rt.device_type == "cpu" and saved != torch.get_num_threads():
        say(f"note: the checkpoint was written with {saved} CPU thread(s), this run has "
            f"{torch.get_num_threads()}: losses will differ by rounding from an uninterrupted "
            f"run (resume with --cpu-threads={saved}, CONFIG_CPU_THREADS={saved}, to keep it "
            "exact)")


STOP_SIGNALS = processes.STOP_SIGNALS


class _StopRequest:
    """SIGINT, SIGTERM (also what a trainer gets when the process that started it
    dies), SIGHUP (its terminal closed) and SIGUSR1 (the batch systems' "time is
    nearly up"): finish the current step, checkpoint, and exit. An evaluation in
    progress is abandoned.

    Alone, a second signal aborts without saving. Under torchrun it does not: the
    launcher forwards a signal it got and torchrun may send its own, and every
    process must reach the common step at which all of them save."""

    def __init__(self, second_aborts: bool = True, announce: bool = True):
        self.signal: int | None = None
        self.second_aborts, self.announce = second_aborts, announce
        self._old: dict[int, Any] = {}

    def __enter__(self):
        self._old = processes.on_stop_signals(self._handle, STOP_SIGNALS)
        return self

    def _handle(self, signum, frame):
        if self.signal is not None:
            if self.second_aborts:  # second signal: stop now
                raise KeyboardInterrupt
            return
        self.signal = signum
        if not self.announce:
            return
        print(f"\n{signal.Signals(signum).name} received: saving a checkpoint after this step"
              + (" (send it again to abort without saving)" if self.second_aborts else ""),
              flush=True)

    def __exit__(self, *exc):
        processes.restore(self._old)


def optimizer_step(fwd, model: GPT, optimizer, scaler, pruner, stream, cfg: Config,
                   rt: Runtime, step: int, micro_steps: int | None = None,
                   finite=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step (``step`` counts from 1) over gradient_accumulation
    micro-batches from ``stream``: the training loop's and the benchmark's. Returns the
    mean loss and the gradient norm before clipping, both left on the device.

    With several processes (``fwd`` a DistributedDataParallel, or ``model`` sharded
    by FSDP) this process runs ``micro_steps`` of them and gradients are reduced
    across processes only in the last backward.

    ``finite(loss)`` false (a NaN or infinite loss) raises guards.NonFiniteLoss
    before anything is updated, the gradients cleared."""
    n = cfg.gradient_accumulation if micro_steps is None else micro_steps
    loss_sum = torch.zeros((), device=rt.device)
    for i in range(n):
        x, y = next(stream)
        with distributed.accumulating(fwd, model, last=i == n - 1):
            with rt.autocast():
                # Index, don't unpack: a name bound to the logits would keep the
                # whole (tokens x vocab) tensor alive through backward.
                loss = fwd(x, y)[1]
            if faults.active("nan-loss", step) or faults.active("inf-loss", step):
                loss = loss * float("nan" if faults.active("nan-loss", step) else "inf")
            if i == 0 and faults.active("oom", step):
                raise torch.OutOfMemoryError("CUDA out of memory (injected by KGPT_FAULTS). "
                                             "Tried to allocate 2.00 GiB")
            loss = loss / n
            loss_sum += loss.detach()  # stays on device: no sync per micro-step
            scaler.scale(loss).backward()
        if i == 0:
            faults.signal_self("step", step)  # a signal in the middle of a step
    if finite is not None and not finite(loss_sum):
        optimizer.zero_grad(set_to_none=True)
        raise guards.NonFiniteLoss(step, loss_sum.item())
    grad_norm = None
    scaler.unscale_(optimizer)  # true gradients for clipping and pruning scores
    pruner.before_step()  # pruned weights get no gradient (nor clip-norm share)
    if cfg.grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if hasattr(grad_norm, "full_tensor"):  # FSDP: a sharded (DTensor) norm
            grad_norm = grad_norm.full_tensor()
    scaler.step(optimizer)
    scaler.update()
    pruner.after_step(step)
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def speed_figures(model: GPT, cfg: Config, rt: Runtime, tokens_per_sec) -> dict[str, Any]:
    """Model FLOPs per token, achieved TFLOP/s and MFU (None where the device's peak
    is unknown, e.g. on the CPU)."""
    n_layer, _, n_embd = cfg.dims()
    per_token = flops.flops_per_token(model.num_params(non_embedding=True), n_layer, n_embd,
                                      cfg.block_size)
    achieved = tokens_per_sec * per_token / 1e12 if tokens_per_sec else None
    peak = flops.peak_tflops(rt.name(), cfg.dtype, cfg.tf32) if rt.device_type == "cuda" else None
    return {"flops_per_token": per_token, "achieved_tflops": achieved, "peak_tflops": peak,
            "mfu": flops.mfu(tokens_per_sec, per_token, peak) if tokens_per_sec else None}


def _fmt_time(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def train(cfg: Config, dotconfig: str | None = None, stop_at_step: int | None = None,
          run_dir: str | None = None, resume_step: int | None = None,
          if_changed: str = "refuse") -> int:
    """Run (or resume, or report) the training run ``cfg`` describes; returns an exit
    status (gpt2/training/runs.py): 0 completed, 130 interrupted, 3 stopped by a
    non-finite loss, 4 out of memory. Raises on bad data or a failed step.
    ``run_dir`` overrides the run folder (a matrix cell's); ``resume_step`` resumes
    from that kept checkpoint instead of the newest; ``if_changed`` says what to do
    with a result of other code or data in the folder (provenance.IF_CHANGED)."""
    check_tracker(cfg.tracker, cfg.tracker_project)  # a missing library stops us before any work
    d = distributed.from_env()
    problem = distributed.accumulation_problem(cfg.gradient_accumulation, d.world)
    if problem:  # torchrun may start more processes than CONFIG_NPROC_PER_NODE (nodes)
        raise ConfigError("gradient_accumulation", problem)
    rt = setup_runtime(cfg.device, cfg.dtype, cfg.tf32, cfg.cpu_threads,
                       local_rank=d.local_rank if d.enabled else None)
    run = RunDir(cfg, run_dir)
    distributed.init(d, rt.device_type)
    try:
        with contextlib.ExitStack() as held:  # releases the run folder's lock, however we leave
            return _train(cfg, run, rt, dotconfig, stop_at_step, held, d, resume_step,
                          if_changed)
    finally:
        distributed.shutdown(d)


def _check_provenance(run: RunDir, current: dict[str, Any], if_changed: str,
                      held: contextlib.ExitStack, d: distributed.Dist, say) -> dict | None:
    """A result in the folder made by other code or data is refused, set aside
    (rerun) or taken as it is (reuse), as ``if_changed`` says. Returns the recorded
    provenance that the run goes on from (None: a fresh start)."""
    recorded = provenance.read(run.path)
    state = ("completed" if run.completed() else
             "interrupted" if checkpoint.present(run.ckpt) else None)
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
        how = "resuming" if state == "interrupted" else "reporting"
        say(f"note: {run.path} was made under other code or data; {how} it as asked "
            f"(--if-changed=reuse):\n  {listed}")
        return recorded
    if d.main:  # rerun: nothing is deleted; the old result moves beside the new one
        held.enter_context(run.locked())
        aside = set_aside(run.path)
        say(f"{run.path} was made under other code or data:\n  {listed}\nset it aside as "
            f"{aside.name}; training again (--if-changed=rerun)")
    d.barrier()  # every process sees the emptied folder before it looks for checkpoints
    return None


def _train(cfg: Config, run: RunDir, rt: Runtime, dotconfig: str | None,
           stop_at_step: int | None, held: contextlib.ExitStack,
           d: distributed.Dist = distributed.Dist(), resume_step: int | None = None,
           if_changed: str = "refuse") -> int:
    # Only rank 0 talks and writes; the others compute the same steps silently.
    print = builtins.print if d.main else (lambda *a, **k: None)
    done = run.summary()
    if done and done.get("config_hash") != cfg.config_hash():
        raise ResumeError(f"{run.path} holds a run of another configuration (hash "
                          f"{done.get('config_hash')}, this one {cfg.config_hash()}); choose "
                          "another folder or move it away")
    current = provenance.identity(cfg.data_dir, cfg.dataset)
    recorded = _check_provenance(run, current, if_changed, held, d, print)
    done = run.summary()
    doubt = run.completion_problem()
    if doubt and resume_step is None:
        print(f"note: {doubt}: the run is not complete; resuming it from that checkpoint")
    if run.completed() and resume_step is None:
        if d.main:
            run.point_latest()
        made = ("made under other code or data, reported as --if-changed=reuse asks"
                if provenance.changes(recorded, current) else "same code and data")
        print(f"{run.path} is already complete (same configuration, {made}); summary:")
        print(format_summary(run.path, run.summary()))
        return 0

    train_tokens = open_split(cfg.data_dir, cfg.dataset, "train")
    t_verify = time.perf_counter()
    n_shards, n_bytes = verify_shards(cfg.data_dir, cfg.dataset)
    print(f"data {cfg.dataset}: {n_shards} shard(s), {n_bytes / 2**20:,.1f} MiB, verified "
          f"against their sha256 in {time.perf_counter() - t_verify:.1f}s", flush=True)
    # The run is named and hashed by the configuration as asked for; auto batch may
    # train it with another split of the same sequences per step.
    requested = cfg
    cfg, predicted, budget = memory.check(requested, rt.device_type,
                                          resume_batch=(done or {}).get("micro_batch"),
                                          world=d.world)
    val = ValBatches(open_split(cfg.data_dir, cfg.dataset, "val"), cfg.block_size,
                     cfg.batch_size, cfg.eval_batches)
    batches = TrainBatches(train_tokens, cfg.block_size, cfg.batch_size,
                           cfg.gradient_accumulation, cfg.seed)
    max_iters = total_steps(cfg, batches)
    problem = applies(cfg, "pruning_warmup") and pruning.schedule_problem(cfg, max_iters)
    if problem:
        raise ConfigError("pruning_warmup", problem)
    fingerprint = data_fingerprint(cfg.data_dir, cfg.dataset)
    swag = (hellaswag.load(Path(cfg.hellaswag_file()), cfg.hellaswag_examples)
            if cfg.hellaswag_interval else None)

    torch.manual_seed(cfg.seed)
    model = GPT(cfg.gpt_config())
    resuming = checkpoint.present(run.ckpt)  # even a broken one: never start over silently
    if resume_step is not None and not resuming:
        raise ResumeError(f"--resume-step {resume_step}: {run.path} has no checkpoints")
    if cfg.init_from and not resuming:  # a resume has the weights already
        print(f"weights from {init_pretrained(model, cfg)}")
    model = model.to(rt.device)
    fsdp = d.enabled and cfg.parallel == "fsdp"
    if fsdp:
        distributed.shard(model, d, rt.device_type)
    optimizer = build_optimizer(model, cfg, rt.device_type)
    pruner = build_pruner(model, optimizer, cfg, max_iters)
    scaler = torch.amp.GradScaler(rt.device_type, enabled=rt.needs_grad_scaler)
    # Everything above only reads; from here on this process owns the folder.
    if d.main:
        held.enter_context(run.locked())
        run.create(dotconfig if dotconfig is not None else to_dotconfig(cfg),
                   provenance.with_history(recorded, current))
        if run.summary_damaged():  # kept, and rewritten from the checkpoint and metrics
            aside = run.set_aside_summary()
            print(f"note: {run.summary_path} cannot be read (damaged), so the run is not taken "
                  "as complete; " + ("resuming it from its checkpoint" if resuming else
                                     "it has no checkpoint: starting over")
                  + f"; the damaged file is kept as {aside.name}")
    d.barrier()  # the others read the checkpoint only once rank 0 holds the folder

    start, elapsed0, train_time0, best_val = 0, 0.0, 0.0, math.inf
    skips = {"in_a_row": 0, "total": 0}  # steps skipped for a non-finite loss
    pending_row: dict[str, Any] | None = None  # a step whose evaluation was cut short
    if resuming:
        source = checkpoint.resolve(run.ckpt, resume_step)
        # Onto the CPU: load_state_dict copies each tensor to where its parameter
        # lives, the device never holds two copies, and the generator states stay
        # CPU byte tensors as set_rng_state needs (mapped to CUDA they made every
        # CUDA resume fail; found on an H100).
        state = checkpoint.load(source, map_location="cpu", link=run.ckpt)
        if state["config_hash"] != requested.config_hash():
            raise ResumeError(f"{run.ckpt} belongs to another configuration")
        if not same_data(state["data_fingerprint"], cfg.data_dir, cfg.dataset) \
                and if_changed != "reuse":
            # provenance.json normally catches this first; this guards a folder without it
            raise ResumeError(f"{run.ckpt} was trained on different data ({cfg.dataset} was "
                              f"re-prepared since); move {run.path} away to start over")
        if bool(state.get("sharded")) != fsdp:
            raise ResumeError(f"{run.ckpt} was written with CONFIG_PARALLEL_"
                              f"{'FSDP' if state.get('sharded') else 'DDP'} (or one process); "
                              "resume it the same way")
        # The forget-* faults are deliberate resume bugs: the exact-resume test
        # proves it notices each of them.
        if fsdp:
            distributed.load_full_state(model, optimizer, state["model"], state["optimizer"])
        else:
            model.load_state_dict(state["model"])
            if not faults.active("forget-optimizer"):
                optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        pruner.load_state_dict(state["pruning"])
        if not faults.active("forget-rng"):
            _restore_rng(state["rng"], rt, d, print)
        _check_threads(state.get("cpu_threads"), rt, print)
        # The data stream continues at the saved position: the next unseen batch.
        position, start = state["data_position"], state["step"]
        if position != batches.position(start):
            raise ResumeError(f"{run.ckpt} stopped at data position {position}, which step "
                              f"{state['step']} of this configuration cannot continue from")
        elapsed0, train_time0 = state["elapsed_s"], state["train_time_s"]
        best_val = state["best_val_loss"]
        skips = dict(state["nonfinite_skips"])
        pending_row = state["pending_row"] if not state["after_step_done"] else None
        del state
        if d.main:
            if resume_step is not None:
                aside = checkpoint.set_aside_after(run.ckpt, source)
                if aside:
                    print(f"set aside {len(aside)} newer checkpoint(s) as "
                          f"{', '.join(p.name for p in aside)}")
            skipped = run.truncate_metrics(start - (pending_row is not None))
            if skipped:
                print(f"note: {run.metrics} had {skipped} damaged line(s) (cut short by a crash?): "
                      f"dropped them, kept the intact rows up to step {start}")
            run.truncate_samples(start - (pending_row is not None))
        print(f"resuming {run.path} from step {start}/{max_iters}"
              + (f" (checkpoint of step {resume_step})" if resume_step is not None else ""))
    elif d.main:
        run.truncate_metrics(-1)
        run.truncate_samples(-1)

    n_params = model.num_params()
    tokens_per_step = cfg.tokens_per_step()
    print(f"run {run.path}\nmodel {n_params:,} parameters | {max_iters} steps x "
          f"{tokens_per_step:,} tokens | {rt.name()} {cfg.dtype}"
          + (f" x {d.world} processes" if d.enabled else "") + " | data "
          f"{len(train_tokens):,} train tokens ({batches.windows} windows/epoch)\n"
          f"memory predicted peak {memory.gib(predicted.peak)} (micro-batch {cfg.batch_size}) "
          f"| budget {memory.gib(budget.bytes) if budget.bytes else 'unknown'} "
          f"({budget.source}) | {memory.verdict(predicted.peak, budget.bytes)}", flush=True)
    if rt.compiles(cfg.compile):
        print("compiling the model with torch.compile: the first step takes longer",
              flush=True)
    fwd = torch.compile(model) if rt.compiles(cfg.compile) else model
    # DDP wraps the (compiled) model for training; evaluation runs the model itself.
    train_fwd = fwd
    if d.enabled and not fsdp:
        train_fwd = torch.nn.parallel.DistributedDataParallel(
            fwd, device_ids=[d.local_rank] if rt.device_type == "cuda" else None)
    rt.reset_peak_memory()
    t_start = time.perf_counter()
    last_val: float | None = None

    def elapsed() -> float:
        return elapsed0 + time.perf_counter() - t_start

    # One process can abandon an evaluation for a stop request; several must finish
    # it (each waits for the others in every batch).
    stop = _StopRequest(second_aborts=not distributed.under_torchrun(), announce=d.main)
    stopping = (lambda: stop.signal is not None) if d.world == 1 else None

    def eval_row(step: int, row: dict[str, Any]) -> dict[str, Any]:
        nonlocal best_val, last_val
        faults.signal_self("eval", step)
        last_val = evaluate(fwd, val, rt, d, stopping)
        best_val = min(best_val, last_val)
        row.update(val_loss=last_val, val_ppl=math.exp(min(last_val, 700.0)),
                   sparsity=pruner.sparsity())
        # Under FSDP every process takes part in each forward pass, so all sample
        # (the same seed gives the same text) and rank 0 writes.
        if cfg.sample_tokens and (d.main or fsdp):
            text = sample(model, cfg, rt, seed=cfg.seed + step)
            if d.main:
                run.append_sample(step, text)
        return row

    last_saved: list[int | None] = [start if resuming else None]

    def save(step: int, train_time: float, pending: dict[str, Any] | None = None) -> None:
        """``pending``: the step's metrics row when its evaluation was interrupted;
        resuming redoes that evaluation first."""
        rng = d.gather(_rng_state(rt))  # every process's: dropout differs per rank
        weights, moments = (distributed.full_state(model, optimizer) if fsdp
                            else (model.state_dict(), optimizer.state_dict()))
        last_saved[0] = step
        if not d.main:
            return
        checkpoint.save(run.ckpt, {
            "step": step, "model": weights, "optimizer": moments, "sharded": fsdp,
            "scaler": scaler.state_dict(), "pruning": pruner.state_dict(),
            "rng": rng, "config": requested.to_dict(),
            "config_hash": requested.config_hash(),
            "data_fingerprint": fingerprint, "data_position": batches.position(step),
            "elapsed_s": elapsed(), "train_time_s": train_time, "best_val_loss": best_val,
            "nonfinite_skips": dict(skips), "after_step_done": pending is None,
            "pending_row": pending or {}, "max_iters": max_iters,
            "cpu_threads": torch.get_num_threads()}, step)

    # What summary.json says the result was made from (provenance.json has each file).
    summary_provenance = {"code": {k: v for k, v in current["code"].items() if k != "files"},
                          "data": current["data"]}

    def summarize(status: str, step: int, train_time: float, error: str | None = None,
                  exit_status: int = 0):
        if not d.main:
            return {}
        rows = run.read_metrics()
        vals = [r["val_loss"] for r in rows if "val_loss" in r]
        final_val = vals[-1] if vals else None
        tok_s = ((step - start) * tokens_per_step / max(train_time - train_time0, 1e-9)
                 if step > start else None)
        summary = {
            "status": status, "iters": step, "max_iters": max_iters,
            "tokens": step * tokens_per_step,
            "final_val_loss": final_val,
            "final_val_ppl": math.exp(min(final_val, 700.0)) if final_val is not None else None,
            "best_val_loss": min(vals) if vals else None,
            **next(({k: r[k] for k in ("hellaswag_acc", "hellaswag_acc_norm")}
                    for r in reversed(rows) if "hellaswag_acc" in r), {}),
            "tokens_per_sec": tok_s, **speed_figures(model, cfg, rt, tok_s),
            "peak_memory_mb": rt.peak_memory_mb(),
            "predicted_peak_memory_mb": predicted.peak / memory.MiB,
            "micro_batch": cfg.batch_size, "gradient_accumulation": cfg.gradient_accumulation,
            "wall_time_s": elapsed(),
            "device": rt.name(), "dtype": cfg.dtype, "n_params": n_params,
            "optimizer": cfg.optimizer, "pruning": cfg.pruning_method,
            "target_sparsity": pruner.target, "final_sparsity": pruner.sparsity(),
            "optimizer_hparams": optimizers.hparams(cfg),
            "pruning_hparams": {name: getattr(cfg, name) for name in
                                pruning.PRUNING_METHODS[cfg.pruning_method].hparams},
            "config_hash": requested.config_hash(), "torch_version": torch.__version__,
            "git_commit": git_commit(), "exit_status": exit_status,
            "provenance": summary_provenance,
            "nonfinite_skipped_steps": skips["total"],
        }
        if error:
            summary["error"] = error
        run.write_summary(summary)
        if rows:
            run.plot_loss()
        return summary

    # Named by the folder: matrix cells share a run name, their folders differ.
    tracker = open_tracker(cfg.tracker if d.main else "none", cfg.tracker_project,
                           run.path.name, run.path, cfg.to_dict())

    def record(row: dict[str, Any]) -> None:
        if d.main:
            run.append_metrics(row)
            tracker.log(row, row["step"])

    def after_step(step: int, row: dict[str, Any] | None, lr: float) -> None:
        """Evaluation, HellaSwag and the metrics row of a finished step. Raises
        Interrupted, before anything of it is recorded, when a stop cuts it short."""
        final = step == max_iters
        base = {"step": step, "tokens": step * tokens_per_step, "lr": lr,
                "elapsed_s": elapsed()}
        if step % cfg.eval_interval == 0 or final:
            row = eval_row(step, dict(row or base))
            print(f"step {step:>6}/{max_iters} | val loss {row['val_loss']:.4f} | "
                  f"val ppl {row['val_ppl']:.2f}", flush=True)
        if swag and (step % cfg.hellaswag_interval == 0 or final):
            row = dict(row or base)
            faults.signal_self("hellaswag", step)
            row.update(hellaswag_scores(model, swag, rt, d, stopping))
            print(f"step {step:>6}/{max_iters} | hellaswag acc "
                  f"{row['hellaswag_acc']:.4f} | acc_norm {row['hellaswag_acc_norm']:.4f}"
                  f" ({row['hellaswag_examples']:,} examples)", flush=True)
        if row is not None:
            record(row)

    def finite(loss_sum: torch.Tensor) -> bool:
        return not d.any(not bool(torch.isfinite(loss_sum).item()), rt.device)

    def stopped(step: int, train_time: float, why: str) -> int:
        summarize("interrupted", step, train_time, exit_status=EXIT_INTERRUPTED)
        print(f"stopped at step {step} ({why}); checkpoint saved. Run the same "
              f"command again (e.g. `make`) to resume.\n{run.path}")
        # Under torchrun a non-zero exit reads as a crashed worker; the
        # launcher takes "interrupted" from summary.json instead.
        return 0 if distributed.under_torchrun() else EXIT_INTERRUPTED

    step, train_time = start, train_time0
    try:
        with stop:
            try:
                if start == 0:
                    print(f"step {0:>6}/{max_iters} | evaluating the untrained model "
                          f"({cfg.eval_batches} validation batches)", flush=True)
                    record(eval_row(0, {"step": 0, "tokens": 0, "elapsed_s": elapsed()}))
                    print(f"step {0:>6}/{max_iters} | val loss {last_val:.4f} | val ppl "
                          f"{math.exp(min(last_val, 700.0)):.2f}", flush=True)
                elif pending_row is not None:  # the evaluation a stop cut short
                    after_step(start, pending_row, pending_row.get("lr", 0.0))
            except Interrupted:
                save(start, train_time, pending=pending_row or {"step": start})
                return stopped(start, train_time, signal.Signals(stop.signal).name +
                               " during evaluation; it is redone on resume")
            micros = d.micro_steps(cfg.gradient_accumulation)
            first = 0 if faults.active("forget-data-position") else start
            stream = batch_stream(batches, first, max_iters, cfg.data_workers, rt, micros)
            t_log, tokens_log = time.perf_counter(), 0
            for step_idx in range(start, max_iters):
                t0 = time.perf_counter()
                faults.at_step(step_idx + 1)
                lr = lr_at(step_idx, lr=cfg.learning_rate, min_lr=cfg.min_lr,
                           warmup=cfg.warmup_iters, total=max_iters, decay=cfg.decay_lr)
                optimizers.set_learning_rate(optimizer, lr)
                try:
                    loss_sum, grad_norm = optimizer_step(train_fwd, model, optimizer, scaler,
                                                         pruner, stream, cfg, rt, step_idx + 1,
                                                         len(micros), finite)
                    skips["in_a_row"] = 0
                except guards.NonFiniteLoss as e:
                    if cfg.nonfinite != "skip" or skips["in_a_row"] >= cfg.nonfinite_max_skips:
                        raise guards.NonFiniteLoss(e.step, e.value, skips["in_a_row"] + (
                            cfg.nonfinite == "skip")) from None
                    skips["in_a_row"] += 1
                    skips["total"] += 1
                    print(f"step {e.step:>6}/{max_iters} | loss {e.value} is not finite: "
                          f"step skipped, no update ({skips['in_a_row']} in a row, at most "
                          f"{cfg.nonfinite_max_skips})", flush=True)
                    loss_sum, grad_norm = torch.tensor(e.value), None
                step = step_idx + 1  # only now: a step that raised is not counted as done
                rt.synchronize()
                train_time += time.perf_counter() - t0
                tokens_log += tokens_per_step
                if step == start + 1 and step % cfg.log_interval and step != max_iters:
                    print(f"step {step:>6}/{max_iters} | first step done in "
                          f"{time.perf_counter() - t0:.1f}s; progress every {cfg.log_interval} "
                          "steps", flush=True)

                row: dict[str, Any] | None = None
                final = step == max_iters
                if step % cfg.log_interval == 0 or final:
                    now = time.perf_counter()
                    tok_s = tokens_log / max(now - t_log, 1e-9)
                    row = {"step": step, "tokens": step * tokens_per_step,
                           "train_loss": d.mean(loss_sum.to(rt.device)).item(), "lr": lr,
                           "grad_norm": None if grad_norm is None else grad_norm.item(),
                           "tokens_per_sec": tok_s, "sparsity": pruner.sparsity(),
                           "elapsed_s": elapsed()}
                    if skips["total"]:
                        row["skipped_steps"] = skips["total"]
                    eta = (max_iters - step) * (train_time - train_time0) / (step - start)
                    print(f"step {step:>6}/{max_iters} | loss {row['train_loss']:.4f} | "
                          f"lr {lr:.2e} | {tok_s:>9,.0f} tok/s | ETA {_fmt_time(eta)} | "
                          f"mem {rt.peak_memory_mb():,.0f} MB" + (
                              f" | sparsity {row['sparsity']:.3f}" if pruner.target else ""),
                          flush=True)
                    t_log, tokens_log = now, 0
                try:
                    after_step(step, row, lr)
                except Interrupted:
                    save(step, train_time, pending=row or {"step": step, "lr": lr,
                                                          "tokens": step * tokens_per_step,
                                                          "elapsed_s": elapsed()})
                    return stopped(step, train_time, signal.Signals(stop.signal).name +
                                   " during evaluation; it is redone on resume")
                if step % cfg.eval_interval == 0 or (swag and step % cfg.hellaswag_interval == 0):
                    t_log = time.perf_counter()  # evaluation time is not training speed
                halt = d.any(stop.signal is not None, rt.device) or (
                    stop_at_step is not None and step >= stop_at_step)
                if step % cfg.checkpoint_interval == 0 or final or halt:
                    save(step, train_time)
                if halt and not final:
                    return stopped(step, train_time, signal.Signals(stop.signal).name
                                   if stop.signal else f"--stop-at-step {stop_at_step}")
    except KeyboardInterrupt:
        summarize("interrupted", step, train_time, error="aborted by a second signal",
                  exit_status=EXIT_INTERRUPTED)
        print(f"aborted at step {step}; the last checkpoint in {run.path} is kept")
        return EXIT_INTERRUPTED
    except storage.StorageError as e:
        # A full disk or a folder refusing writes: the last checkpoint is intact and
        # train.py says what to do. The summary may not be writable either.
        with contextlib.suppress(storage.StorageError):
            summarize("failed", step, train_time, error=str(e), exit_status=EXIT_BAD_INPUT)
        raise
    except guards.NonFiniteLoss as e:
        summarize("failed", e.step - 1, train_time, error=str(e), exit_status=EXIT_NONFINITE)
        print(guards.nonfinite_advice(cfg, e, last_saved[0]), flush=True)
        return EXIT_NONFINITE
    except Exception as e:
        if not guards.is_out_of_memory(e):
            summarize("failed", step, train_time, error=f"{type(e).__name__}: {e}",
                      exit_status=1)
            raise
        peak = rt.peak_memory_mb()
        if rt.device_type == "cuda":
            torch.cuda.empty_cache()  # room to write the summary and its plot
        summarize("failed", step, train_time, error=f"out of memory: {str(e).splitlines()[0]}",
                  exit_status=EXIT_OUT_OF_MEMORY)
        print(memory.oom_advice(cfg, rt.device_type, predicted, budget, step + 1,
                                last_saved[0], peak, d.world), flush=True)
        return EXIT_OUT_OF_MEMORY
    finally:
        tracker.close()
    summary = summarize("completed", step, train_time)
    print(format_summary(run.path, summary))
    return 0
