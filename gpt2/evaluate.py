"""Score a model on HellaSwag: ``python gpt2/evaluate.py [--run-dir DIR | --init-from gpt2]``.

A trained run (its ckpt.pt, default results/latest) or pretrained GPT-2 weights
(a release from the Hugging Face cache, or a folder). Prints acc and acc_norm and
writes them as JSON: hellaswag.json in the run folder, or
results/eval/hellaswag-<weights>.json. The validation file is downloaded once when
absent (this is not training), or taken from --hellaswag-path.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run by path (python gpt2/evaluate.py): run as the module instead, `python -m
    # gpt2.evaluate`, so gpt2/ is not first on the import path, where its files would
    # shadow libraries' modules of the same names (evaluate, config, data, ...).
    import os

    os.execv(sys.executable, [sys.executable, "-m", "gpt2.evaluate", *sys.argv[1:]])

import json
import re

import torch

from gpt2.config.argparser import StrictArgumentParser
from gpt2.config.options import field_arg, resolve
from gpt2.config.datasets import characters
from gpt2.errors import CheckpointError, ConfigError, DataError, StorageError
from gpt2.eval import hellaswag
from gpt2.model import pretrained
from gpt2.model.gpt import GPT
from gpt2.model.build import model_config
from gpt2.storage import make_folder, write_text_atomic
from gpt2.training import trained
from gpt2.config.choices import DEVICES
from gpt2.runtime.device import resolve_device, setup_runtime
from gpt2.training.evaluation import hellaswag_scores
from gpt2 import run_folder


def main(argv: list[str] | None = None) -> int:
    p = StrictArgumentParser(prog="gpt2/evaluate.py", description=__doc__.split("\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--run-dir", default="results/latest",
                       help="run folder holding ckpt.pt (default: results/latest)")
    which.add_argument("--init-from", help="pretrained weights instead: gpt2, gpt2-medium, "
                       "gpt2-large, gpt2-xl, or a Hugging Face format folder")
    p.add_argument("--examples", type=field_arg("hellaswag_examples"), default=0,
                   help="score the first N examples (default 0: all 10,042)")
    p.add_argument("--hellaswag-path", help="local hellaswag_val.jsonl (default: "
                   "data/hellaswag/hellaswag_val.jsonl, downloaded when absent)")
    p.add_argument("--data-dir", default="data", help="where the file is kept (default data)")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="auto, cuda, cpu or mps (default auto)")
    p.add_argument("--json", help="write the result here instead of the default place")
    args = p.parse_args(argv)
    try:
        return _evaluate(args)
    except (ConfigError, DataError, StorageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _evaluate(args) -> int:
    if args.init_from:
        if pretrained.is_release(args.init_from):
            cfg = resolve({"model_size": args.init_from, "init_from": args.init_from})
        else:
            try:
                n_layer, n_head, n_embd, positions = pretrained.dims(
                    pretrained.find(args.init_from))
            except pretrained.PretrainedError as e:
                raise ConfigError("init_from", str(e)) from None
            cfg = resolve({"model_size": "custom", "n_layer": n_layer, "n_head": n_head,
                           "n_embd": n_embd, "block_size": positions,
                           "init_from": args.init_from})
        model = GPT(model_config(cfg))
        source = pretrained.init_from(model, cfg)
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(args.init_from).name or "weights")
        out = Path(args.json or Path("results") / "eval" / f"hellaswag-{name}.json")
        step = None
    else:
        ckpt_path = Path(args.run_dir) / run_folder.CKPT
        if not ckpt_path.is_file():
            print(f"error: no checkpoint at {ckpt_path}: train first (`make`), or pass "
                  "--run-dir or --init-from (with make: RUN=results/<run> or INIT_FROM=gpt2)",
                  file=sys.stderr)
            return 2
        try:
            cfg, model, state = trained.model(Path(args.run_dir))
        except CheckpointError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if characters(cfg.dataset):
            print(f"error: {args.run_dir} is a character-level model ({cfg.dataset}), and "
                  "HellaSwag is scored in GPT-2 BPE tokens", file=sys.stderr)
            return 2
        source, step = str(ckpt_path), state["step"]
        out = Path(args.json or Path(args.run_dir) / "hellaswag.json")
    path = Path(args.hellaswag_path) if args.hellaswag_path else \
        hellaswag.fetch(hellaswag.default_path(args.data_dir))
    examples = hellaswag.load(path, args.examples)
    # The run's precision on a GPU; float32 on the CPU, where it is the fast one.
    dtype = "float32" if resolve_device(args.device) == "cpu" else cfg.dtype
    runtime = setup_runtime(args.device, dtype, cfg.tf32, 0)
    model = model.to(runtime.device)
    with torch.inference_mode():
        scores = hellaswag_scores(model, examples, runtime)
    print(f"hellaswag acc {scores['hellaswag_acc']:.4f} | acc_norm "
          f"{scores['hellaswag_acc_norm']:.4f} | {scores['hellaswag_examples']:,} examples | "
          f"{source}" + (f" (step {step})" if step is not None else ""))
    make_folder(out.parent)
    write_text_atomic(out, json.dumps({**scores, "weights": source, "step": step,
                                       "file": str(path), "device": runtime.name()},
                                      indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from gpt2.processes import survive_lost_terminal

    survive_lost_terminal()  # (what it prints shows control characters, never sends them)
    sys.exit(main())
