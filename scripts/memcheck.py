#!/usr/bin/env python3
"""`make memcheck`: will the configured run fit, and what takes the memory?

Prints the estimator's prediction (gpt2/estimates/memory.py) for the configuration
on this machine's device, term by term, next to the device's free memory (or
CONFIG_MEMORY_BUDGET_MB) with a verdict; then what each memory saver would give
and the largest micro-batch that fits. Allocates nothing on the device: it is the
same check training makes before it starts.

    make memcheck
    make memcheck TRAIN_ARGS="--batch-size 32 --activation-checkpointing full"
    make memcheck CARD=h100              # for a card this machine does not have
    make memcheck CARD=24GB              # for any GPU with that much memory
    python scripts/memcheck.py --model-size gpt2-xl --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


from gpt2.config.argparser import StrictArgumentParser
from gpt2.config.choices import CARDS
from gpt2.config.kconfig import KconfigError
from gpt2.config.options import TRAIN, add_arguments, config_from_namespace
from gpt2.errors import EXIT_OUT_OF_MEMORY, ConfigError, StorageError
from gpt2.storage import write_text_atomic
from gpt2.training import epochs
from gpt2.estimates import memory
from gpt2.matrix.plan import PlanError
from gpt2.runtime.device import check_dtype, resolve_device


# CARD=24GB / 80GiB: a memory size instead of a card's name.
SIZE_RE = re.compile(r"^([0-9]{1,5}(?:\.[0-9]{1,3})?) ?(GB|GiB)\Z", re.IGNORECASE)


def card_budget(text: str, source: str) -> memory.Budget:
    """The memory of the card ``text`` names (a CARDS key) or gives (24GB, 80GiB):
    what a run may use on it, for a prediction made without it."""
    size = SIZE_RE.match(text.strip())
    if size:
        value, unit = float(size.group(1)), size.group(2).lower()
        name, nbytes = f"a {size.group(1)} {size.group(2)} GPU", value * (
            2**30 if unit == "gib" else 1e9)
    elif text.strip().lower() in CARDS:
        name, gb = CARDS[text.strip().lower()]
        name, nbytes = f"{name} ({gb:g} GB)", gb * 1e9
    else:
        raise ConfigError("target_card", f"{text!r} is neither a card kgpt knows ("
                          f"{', '.join(CARDS)}) nor a memory size such as 24GB or 80GiB")
    if nbytes <= 0:
        raise ConfigError("target_card", f"{text!r}: a card has more than no memory")
    return memory.Budget(int(nbytes), f"{name}, {source}: predicted, not measured on that "
                         "card", 0)


def card_for(cfg, given: str | None) -> memory.Budget | None:
    """The card to predict against instead of this machine's device: CARD= when given;
    else, for a run that asks for CUDA where torch sees no GPU, CONFIG_TARGET_CARD
    (None: this machine's device, as training would see it)."""
    if given:
        return card_budget(given, "from CARD")
    if cfg.device == "cuda" and not cuda_here():
        if not cfg.target_card:
            raise ConfigError("device", "the configuration asks for CUDA and this machine has "
                              "no GPU: name the card to predict for, `make memcheck CARD=l4` "
                              f"(one of {', '.join(CARDS)}) or `CARD=24GB`, or set "
                              "CONFIG_TARGET_CARD")
        return card_budget(cfg.target_card, "CONFIG_TARGET_CARD")
    return None


def cuda_here() -> bool:
    import torch

    return torch.cuda.is_available()


def per_process(cfg) -> str:
    """How a step divides among NGPU processes: the figures below are one process's."""
    n = cfg.nproc_per_node
    if n <= 1:
        return ""
    return (f" ({cfg.gradient_accumulation // n} on each of {n} processes, "
            f"{cfg.parallel.upper()}: the figures are per process)")


def report(cfg, device_type: str, card: memory.Budget | None = None) -> tuple[str, dict]:
    b = card or memory.budget(cfg, device_type)
    est = memory.estimate(cfg, device_type, runtime_bytes=b.runtime_bytes)
    n_layer, n_head, n_embd = cfg.dims()
    lines = [
        f"memcheck {cfg.model_size} ({n_layer} layers x {n_embd} wide, context "
        f"{cfg.block_size}) | {device_type} {cfg.dtype} | micro-batch {cfg.batch_size} x "
        f"{cfg.gradient_accumulation} accumulation{per_process(cfg)} | {cfg.optimizer} / "
        f"{cfg.pruning_method}",
        f"predicted peak, at the {est.phase}{memory.bound_note(cfg, device_type)}:",
        memory.breakdown(est, b),
        "",
        "activations by checkpointing: " + " | ".join(
            f"{mode} {memory.gib(v)}" for mode, v in est.activations_by_mode.items()),
    ]
    savers = {setting: memory.estimate(other, device_type, runtime_bytes=b.runtime_bytes).peak
              for setting, other in memory.savers(cfg)}
    for setting, peak in savers.items():
        lines.append(f"with {setting}: {memory.gib(peak)} ({memory.verdict(peak, b.bytes)})")
    fit = memory.largest_fitting_batch(cfg, device_type, b.bytes, b.runtime_bytes)
    per_step = cfg.batch_size * cfg.gradient_accumulation
    if b.bytes is None:
        lines.append("largest micro-batch: unknown (no memory figure for this device)")
    elif fit is None:
        lines.append(f"largest micro-batch: none of the divisors of {per_step} fits; try a "
                     "memory saver above")
    else:
        lines.append(f"largest micro-batch that fits with {per_step} sequences per step: "
                     f"{fit[0]} x {fit[1]} accumulation"
                     + ("" if cfg.auto_batch else " (CONFIG_AUTO_BATCH=y picks it)"))
    data = {"device_type": device_type, "dtype": cfg.dtype, "batch_size": cfg.batch_size,
            "gradient_accumulation": cfg.gradient_accumulation, "phase": est.phase,
            "terms": {t.key: t.bytes for t in est.terms}, "peak_bytes": est.peak,
            "budget_bytes": b.bytes, "budget_source": b.source,
            "verdict": memory.verdict(est.peak, b.bytes),
            "activations_by_mode": est.activations_by_mode, "with_savers": savers,
            "largest_fitting_batch": fit, "config": cfg.to_dict()}
    return "\n".join(lines), data


def fits(data: dict) -> bool:
    return data["budget_bytes"] is None or data["peak_bytes"] <= data["budget_bytes"]


def check_matrix(path: str, cell_id: str | None, train_flags: list[str],
                 card: str | None = None) -> tuple[str, list[dict]]:
    """Every cell of the test matrix ``path`` describes (or the one named): a line per
    cell, then the full report of the heaviest, which decides whether the matrix
    fits; ``train_flags`` apply to every cell, as TRAIN_ARGS do."""
    from gpt2.config import kconfig
    from gpt2.matrix.plan import plan_from_dotconfig

    plan = plan_from_dotconfig(kconfig.load(path, complete=True), train_flags)
    cells = [c for c in plan.cells if cell_id in (None, c.id)]
    if not cells:
        raise ConfigError("matrix", f"{cell_id!r} is not a cell of {plan.folder.name}; "
                          "`make test-matrix DRY_RUN=1` lists them")
    reports = []
    for cell in cells:
        budget = card_for(cell.cfg, card)
        device = "cuda" if budget else resolve_device(cell.cfg.device)
        if not budget:
            check_dtype(device, cell.cfg.dtype)
        reports.append((cell, *report(cell.cfg, device, budget)))
    passes = epochs.notes(cell.cfg for cell in cells)
    if len(reports) == 1:
        return "\n".join([reports[0][1], *passes]), [reports[0][2]]
    lines = [f"memcheck {plan.folder.name}: {len(reports)} cells, each as it would start"]
    for cell, _, data in reports:
        lines.append(f"  {cell.id:<44} {memory.gib(data['peak_bytes']):>10}  {data['verdict']}")
    heaviest = max(reports, key=lambda r: r[2]["peak_bytes"])
    lines += ["", f"the heaviest cell, {heaviest[0].id}:", heaviest[1], *passes]
    return "\n".join(lines), [{"cell": cell.id, **data} for cell, _, data in reports]


def main(argv: list[str] | None = None) -> int:
    parser = StrictArgumentParser(prog="scripts/memcheck.py", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, TRAIN)
    own = parser.add_argument_group("memcheck")
    own.add_argument("--json", metavar="PATH", help="also write the figures here")
    own.add_argument("--matrix", metavar="DOTCONFIG", help="check every cell of the test "
                     "matrix this .config describes; the other flags apply to every cell")
    own.add_argument("--cell", metavar="ID", help="with --matrix: only this cell")
    own.add_argument("--card", metavar="CARD", help="predict for this GPU instead of this "
                     f"machine's device: one of {', '.join(CARDS)}, or a memory size such as "
                     "24GB (without it, a CUDA configuration on a machine with no GPU is "
                     "predicted for CONFIG_TARGET_CARD)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    try:
        if args.matrix:
            ours = StrictArgumentParser(add_help=False)
            for name in ("--json", "--matrix", "--cell", "--card"):
                ours.add_argument(name)
            text, figures = check_matrix(args.matrix, args.cell,
                                         ours.parse_known_args(argv)[1], args.card)
        else:
            cfg = config_from_namespace(args, TRAIN)
            budget = card_for(cfg, args.card)
            device = "cuda" if budget else resolve_device(cfg.device)
            if not budget:
                check_dtype(device, cfg.dtype)
            text, data = report(cfg, device, budget)
            text = "\n".join([text, *epochs.notes([cfg])])
            figures = [data]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (KconfigError, PlanError) as e:
        print("error: " + str(e).replace("\n", "\n  "), file=sys.stderr)
        return 2
    print(text)
    if args.json:
        try:
            write_text_atomic(Path(args.json), json.dumps(figures if args.matrix else figures[0],
                                                          indent=2) + "\n")
        except StorageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    # Exit status for scripts: 0 fits (or tight); 4, the out-of-memory status of
    # docs/reliability.md, when it is predicted not to fit (any cell of a matrix). (1
    # is a bug's.)
    return 0 if all(fits(d) for d in figures) else EXIT_OUT_OF_MEMORY


if __name__ == "__main__":
    from gpt2.processes import survive_lost_terminal

    survive_lost_terminal()  # (what it prints shows control characters, never sends them)
    sys.exit(main())
