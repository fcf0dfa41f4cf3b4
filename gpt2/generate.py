"""Sample text from a trained run: ``python gpt2/generate.py --prompt "ROMEO:"``.

Loads ckpt.pt from a run folder (default: results/latest) and rebuilds the model
from the configuration stored in the checkpoint, which must be the folder's own (a
ckpt.pt pointed at another run's checkpoint is refused, as training refuses it).
Sampling settings default to the ones the run used for its own samples.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run by path (python gpt2/generate.py): run as the module instead, `python -m
    # gpt2.generate`, so gpt2/ is not first on the import path, where its files would
    # shadow libraries' modules of the same names (evaluate, config, data, ...).
    import os

    os.execv(sys.executable, [sys.executable, "-m", "gpt2.generate", *sys.argv[1:]])

import dataclasses

import torch

from gpt2.config.argparser import Bounded, StrictArgumentParser
from gpt2.config.options import check_value, field_arg
from gpt2.data.tokenizer import tokenizer_for
from gpt2.errors import CheckpointError, ConfigError, DataError, StorageError
from gpt2.model.gpt import GPT
from gpt2.model.build import model_config
from gpt2.config.choices import DEVICES
from gpt2.runtime.device import setup_runtime
from gpt2.training.evaluation import sample
from gpt2.training import trained
from gpt2 import run_folder


# Samples one command draws: enough to read, not a silent hour of sampling.
MAX_SAMPLES = 1000


def main(argv: list[str] | None = None) -> int:
    p = StrictArgumentParser(prog="gpt2/generate.py", description=__doc__.split("\n")[0])
    p.add_argument("--run-dir", default="results/latest",
                   help="run folder holding ckpt.pt (default: results/latest)")
    p.add_argument("--prompt", help="text to continue (default: the run's sample prompt)")
    p.add_argument("--max-new-tokens", type=field_arg("sample_tokens"),
                   help="tokens to generate per sample")
    p.add_argument("--temperature", type=field_arg("sample_temperature"),
                   help="sampling temperature (>0)")
    p.add_argument("--top-k", type=field_arg("sample_top_k"),
                   help="sample among the k most likely tokens (0: all)")
    p.add_argument("--num-samples", type=Bounded(int, 1, MAX_SAMPLES, "more: run again with "
                                                 "another --seed"), default=1,
                   help="independent samples (default 1)")
    p.add_argument("--seed", type=field_arg("seed"), default=0, help="sampling seed (default 0)")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="auto, cuda, cpu or mps (default auto)")
    args = p.parse_args(argv)

    ckpt_path = Path(args.run_dir) / run_folder.CKPT
    if not ckpt_path.is_file():
        print(f"error: no checkpoint at {ckpt_path}: train first (`make`), or pass --run-dir "
              "(with make: `make generate RUN=results/<run>`)", file=sys.stderr)
        return 2
    try:
        # (verified, this run's own, a configuration and weights that fit each other)
        cfg, state = trained.load(Path(args.run_dir))
        overrides = {"sample_prompt": args.prompt, "sample_tokens": args.max_new_tokens,
                     "sample_temperature": args.temperature, "sample_top_k": args.top_k}
        overrides = {k: v for k, v in overrides.items() if v is not None}
        for name, value in overrides.items():
            check_value(name, value)
        check_value("seed", args.seed)
        check_value("seed", args.seed + args.num_samples - 1)  # (each sample's own seed)
        cfg = dataclasses.replace(cfg, **overrides)
        # The model sees at most block_size tokens: a longer prompt would be cut silently.
        n_prompt = len(tokenizer_for(cfg.dataset).encode(cfg.sample_prompt))
        if n_prompt > cfg.block_size:
            print(f"error: the prompt is {n_prompt} tokens, longer than the model's context of "
                  f"{cfg.block_size}: shorten it", file=sys.stderr)
            return 2
        runtime = setup_runtime(args.device, "float32", cfg.tf32, 0)
    except (ConfigError, DataError, CheckpointError, StorageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = GPT(model_config(cfg)).to(runtime.device)
    model.load_state_dict(state["model"])
    print(f"# {ckpt_path} (step {state['step']}), temperature {cfg.sample_temperature}, "
          f"top-k {cfg.sample_top_k}, {cfg.sample_tokens} tokens", file=sys.stderr)
    with torch.inference_mode():
        for i in range(args.num_samples):
            if args.num_samples > 1:
                print(f"--- sample {i + 1} ---")
            print(sample(model, cfg, runtime, seed=args.seed + i))
    return 0


if __name__ == "__main__":
    from gpt2.processes import survive_lost_terminal

    survive_lost_terminal()  # (what it prints shows control characters, never sends them)
    sys.exit(main())
