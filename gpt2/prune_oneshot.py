"""Prune a trained run once (magnitude, Wanda, SparseGPT) and measure what it lost:
``python -m gpt2.prune_oneshot --run-dir DIR --method wanda --sparsity 0.5``
(``make prune-oneshot RUN=... METHOD=... SPARSITY=...``).

The baselines a during-training pruning result is judged against
(gpt2/training/oneshot.py has the methods and their references). The run's newest
weights are pruned block by block, calibrated on ``--calibration-samples`` windows of
the run's own training split (block_size tokens each, drawn with ``--seed``: the
references draw 128 windows of C4 with seed 0), and scored on the run's validation
windows before and after. The run's own weights are not changed: the result is
written to ``<run>/oneshot/<method>-<sparsity>.json`` (``<method>-2of4.json`` for a
structure), with the pruned weights beside it (``.pt``) when ``--save-weights``.

``--finetune-steps K`` then trains the pruned model K steps of the run's own optimizer
(fresh state, a constant rate: ``--finetune-lr``, by default the run's min_lr) and
batch size, its masks held, on the batches the run would have trained on next; the
result is ``<method>-<tag>-ft<K>.json``, with the loss before the fine-tune as
``val_loss_pruned`` and its cost as ``finetune_tokens``.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    import os

    os.execv(sys.executable, [sys.executable, "-m", "gpt2.prune_oneshot", *sys.argv[1:]])

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from gpt2.config.argparser import Bounded, StrictArgumentParser
from gpt2.config.choices import DEVICES, PRUNING_STRUCTURES, n_of_m, structure_sparsity
from gpt2.config.options import field_arg
from gpt2.data.loader import open_split, train_batches, val_batches
from gpt2.errors import CheckpointError, ConfigError, DataError, StorageError
from gpt2.storage import own_folder, refuse_link, write_bytes_atomic, write_text_atomic
from gpt2.training import oneshot, trained
from gpt2.runtime.device import resolve_device, setup_runtime
from gpt2.training.evaluation import validation_loss
from gpt2.sparsity.algorithms.pruning import measured_sparsity, prune_targets
from gpt2.training.step import batch_stream
from gpt2 import records, run_folder

# Calibration windows are drawn and held at once (samples x block_size tokens, then the
# model's activations for them): 512 times the references' 128 is past any use.
MAX_CALIBRATION = 65536
MAX_NAME = 128  # a result's file name: at most a run name's length (options.RUN_NAME_RE)


def calibration_batches(cfg, samples: int, seed: int, batch_size: int) -> list[np.ndarray]:
    """``samples`` windows of block_size tokens from the run's training split, at
    offsets drawn with ``seed``, in batches."""
    tokens = open_split(cfg.data_dir, cfg.dataset, "train")
    room = len(tokens) - cfg.block_size
    if room < 1:
        raise DataError(f"the training split has {len(tokens)} tokens, fewer than one window "
                        f"of {cfg.block_size}")
    starts = np.random.default_rng(seed).integers(0, room, size=samples)
    xs = np.stack([tokens.read(int(s), cfg.block_size) for s in starts])
    return [xs[i:i + batch_size] for i in range(0, samples, batch_size)]


def main(argv: list[str] | None = None) -> int:
    p = StrictArgumentParser(prog="gpt2/prune_oneshot.py", description=__doc__.split("\n")[0])
    p.add_argument("--run-dir", default="results/latest", help="the trained run")
    p.add_argument("--method", required=True, choices=oneshot.ONESHOT)
    p.add_argument("--sparsity", type=field_arg("target_sparsity"),
                   help="fraction of the target weights pruned, in (0, 1); with --structure "
                   "N:M, 1 - N/M (the default then)")
    p.add_argument("--structure", default="unstructured", choices=PRUNING_STRUCTURES,
                   help="unstructured, or N kept of every M along each row")
    p.add_argument("--calibration-samples", type=Bounded(
                       int, 1, MAX_CALIBRATION, "they are held in memory at once; the "
                       "references use 128"), default=128,
                   help="windows of the training split (default 128, the references')")
    p.add_argument("--seed", type=field_arg("seed"), default=0,
                   help="draws the calibration windows")
    p.add_argument("--finetune-steps", type=field_arg("max_iters"), default=0,
                   help="then train the pruned model this many steps of the run's optimizer "
                   "and batch, its masks held, on the training batches after the run's last "
                   "(default 0: none)")
    p.add_argument("--finetune-lr", type=field_arg("learning_rate"),
                   help="the fine-tune's constant learning rate (default: the run's min_lr, "
                   "where its schedule ended; a tenth of its learning_rate if that is 0)")
    p.add_argument("--device", default="auto", choices=DEVICES)
    p.add_argument("--save-weights", action="store_true",
                   help="also write the pruned model's weights beside the result")
    args = p.parse_args(argv)
    fixed = structure_sparsity(args.structure)
    if args.sparsity is None:
        args.sparsity = fixed
    if args.sparsity is None:
        p.error("--sparsity is needed with unstructured pruning (a fraction in (0, 1))")
    if fixed is not None and abs(args.sparsity - fixed) > 1e-9:
        p.error(f"--structure {args.structure} prunes {fixed:g}, not {args.sparsity:g}")
    if args.finetune_lr is not None and not args.finetune_steps:
        p.error("--finetune-lr without --finetune-steps: say how many steps to fine-tune")
    name = run_folder.oneshot_result(Path("."), args.method, args.sparsity, args.structure,
                                     args.finetune_steps).name
    if len(name) > MAX_NAME:
        p.error(f"--sparsity {args.sparsity!r} would name its result {name[:40]}... ({len(name)} "
                f"characters, past the {MAX_NAME} a result's file name may have): give a "
                "sparsity of fewer digits, e.g. 0.5")
    try:
        return _prune(args)
    except (ConfigError, DataError, StorageError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _prune(args) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / run_folder.CKPT).is_file():
        raise CheckpointError(f"no checkpoint at {run_dir / run_folder.CKPT}: train first "
                              "(`make`), or name the run with RUN=results/<run>")
    path = run_folder.oneshot_result(run_dir, args.method, args.sparsity, args.structure,
                                     args.finetune_steps)
    own_folder(path.parent)  # (a link planted as oneshot/ is refused before any work)
    if path.exists() and not path.is_symlink() and not path.is_file():
        raise StorageError(NOT_A_FILE.format(path=path))
    weights = path.with_suffix(".pt")
    if args.save_weights:  # (as writing it would, after the work)
        refuse_link(weights, what="file")
        if weights.exists() and not weights.is_file():
            raise StorageError(NOT_A_FILE.format(path=weights))
    cfg, model, state = trained.model(run_dir)
    dtype = "float32" if resolve_device(args.device) == "cpu" else cfg.dtype
    runtime = setup_runtime(args.device, dtype, cfg.tf32, 0)
    model = model.to(runtime.device).eval()
    val = val_batches(cfg.dataset, open_split(cfg.data_dir, cfg.dataset, "val"),
                      cfg.block_size, cfg.eval_tokens, cfg.batch_size)
    before = validation_loss(model, val, runtime)
    batches = [torch.from_numpy(b).to(runtime.device) for b in
               calibration_batches(cfg, args.calibration_samples, args.seed, cfg.batch_size)]
    began = time.perf_counter()
    with torch.no_grad(), runtime.autocast():
        out = oneshot.prune_blocks(model, model.transformer.h, batches, args.method,
                                   args.sparsity, n_of_m(args.structure))
    seconds = time.perf_counter() - began
    after = pruned = validation_loss(model, val, runtime)
    targets = prune_targets(model)
    measured = measured_sparsity(targets)
    tuned = {}
    if args.finetune_steps:
        lr = args.finetune_lr or (cfg.min_lr if cfg.min_lr > 0 else cfg.learning_rate / 10)
        batches = train_batches(cfg.dataset, open_split(cfg.data_dir, cfg.dataset, "train"),
                                cfg.block_size, cfg.batch_size, cfg.gradient_accumulation,
                                cfg.seed)
        # The batches the run would have trained on next: none it has seen this epoch.
        stream = batch_stream(batches, state["step"], state["step"] + args.finetune_steps,
                              0, runtime)
        began = time.perf_counter()
        losses = oneshot.finetune(model, cfg, runtime, out["masks"], stream,
                                  args.finetune_steps, lr)
        after = validation_loss(model, val, runtime)
        tuned = {"finetune_steps": args.finetune_steps, "finetune_lr": lr,
                 "finetune_tokens": args.finetune_steps * cfg.tokens_per_step(),
                 "finetune_seconds": round(time.perf_counter() - began, 2),
                 "finetune_train_loss": losses[-1], "val_loss_pruned": pruned.loss}
        measured = measured_sparsity(targets)
    result = {"method": args.method, "target_sparsity": args.sparsity,
              "structure": args.structure, "measured_sparsity": measured,
              "val_loss_before": before.loss, "val_loss": after.loss,
              "val_loss_se": after.se, "val_tokens": after.tokens,
              "calibration_samples": args.calibration_samples, "calibration_seed": args.seed,
              "calibration_tokens": args.calibration_samples * cfg.block_size,
              "step": state["step"], "config_hash": cfg.config_hash(),
              "seconds": round(seconds, 2), "device": runtime.name(),
              "reconstruction_error": out["errors"] or None, **tuned}
    result = records.finite_or_none(result)
    problem = records.problem(result, run_folder.ONESHOT_FIELDS)
    if problem:
        raise ValueError(f"the one-shot result would not read back: {problem}")
    kept = keep_earlier(path, result)
    write_text_atomic(path, json.dumps(result, indent=2, allow_nan=False) + "\n")
    if args.save_weights:
        import io

        buf = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buf)
        write_bytes_atomic(path.with_suffix(".pt"), buf.getvalue())
    print(f"{args.method} {args.structure} {args.sparsity:g}: val loss {before.loss:.4f} -> "
          + (f"{pruned.loss:.4f}, fine-tuned {args.finetune_steps} steps at lr "
             f"{tuned['finetune_lr']:g} -> " if tuned else "")
          + f"{after.loss:.4f} (measured sparsity {measured:.3f} of the block Linears; "
          f"{args.calibration_samples} calibration windows; {seconds:.1f} s)")
    print(f"wrote {path}" + (f" ({kept[1]} was there: kept as {kept[0].name})" if kept else ""))
    return 0


NOT_A_FILE = ("{path} is a folder or a pipe, not a one-shot result: move it away, then run "
              "the same command again")
# What makes two results of one name different computations (the name says method,
# sparsity, structure and fine-tune steps; these it does not).
CALIBRATION = ("calibration_samples", "calibration_seed", "finetune_lr", "step", "config_hash")


def keep_earlier(path: Path, result: dict) -> tuple[Path, str] | None:
    """Before ``result`` is written at ``path``: what is there is kept, renamed
    <name>.earlier-N.json (with its .pt), and (its new name, what it was) returned,
    unless it is a result of the same calibration (seed, windows, fine-tune rate) and
    weights: the same computation, which the new result replaces. So an earlier result
    of another calibration is never lost, and neither is a file that is no result kgpt
    wrote (a damaged one, which a matrix prunes again, a user's, a link: moved, its
    target untouched)."""
    if not (path.exists() or path.is_symlink()):
        return None
    if path.is_symlink() or not path.is_file():
        what = "a link" if path.is_symlink() else "something not a regular file"
    elif (earlier := run_folder.read_oneshot(path)) is None:
        what = "a file that is not a one-shot result kgpt wrote"
    else:
        differ = [f"{k} {earlier.get(k)}" for k in CALIBRATION
                  if earlier.get(k) != result.get(k)]
        if not differ:
            return None
        what = f"the earlier result ({', '.join(differ)})"
    n = 1  # (the first N free for both names: nothing there, not even a link, is replaced)
    while True:
        aside = path.with_name(f"{path.stem}.earlier-{n}.json")
        if not any(p.exists() or p.is_symlink() for p in (aside, aside.with_suffix(".pt"))):
            break
        n += 1
    weights = path.with_suffix(".pt")
    if weights.is_file() and not weights.is_symlink():
        os.replace(weights, aside.with_suffix(".pt"))
    os.replace(path, aside)
    return aside, what


if __name__ == "__main__":
    from gpt2.processes import survive_lost_terminal

    survive_lost_terminal()  # (what it prints shows control characters, never sends them)
    sys.exit(main())
