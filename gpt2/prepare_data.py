"""Tokenize a dataset once: ``python gpt2/prepare_data.py --dataset shakespeare``.

Writes data/<dataset>/train_*.bin and val_*.bin (shards of uint16 GPT-2 BPE tokens)
and meta.json; training memory-maps them. A no-op when already up to date; a
killed run resumes where it stopped. ``--input PATH`` reads local .txt, .jsonl or
.parquet files instead of downloading.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    # Run by path (python gpt2/prepare_data.py): run as the module instead, `python -m
    # gpt2.prepare_data`, so gpt2/ is not first on the import path, where its files would
    # shadow libraries' modules of the same names (evaluate, config, data, ...).
    import os

    os.execv(sys.executable, [sys.executable, "-m", "gpt2.prepare_data", *sys.argv[1:]])

from gpt2 import processes
from gpt2.config.argparser import StrictArgumentParser
from gpt2.config.options import DATA, add_arguments, config_from_namespace
from gpt2.data.prepare import PrepareInterrupted, prepare
from gpt2.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, ConfigError, DataError, StorageError


def main(argv: list[str] | None = None) -> int:
    parser = StrictArgumentParser(prog="gpt2/prepare_data.py",
                                  description=__doc__.split("\n")[0])
    add_arguments(parser, DATA)
    parser.add_argument("--url", help="download from this mirror instead of the dataset's "
                        "public URL (the pinned sha256 is still checked)")
    args = parser.parse_args(argv)
    try:
        cfg = config_from_namespace(args, DATA)
        prepare(cfg.dataset, cfg.data_dir, cfg.data_input, cfg.val_fraction, url=args.url,
                text_field=cfg.data_text_field, shard_tokens=cfg.shard_tokens,
                workers=cfg.prepare_workers, streaming=cfg.data_streaming,
                train_shards=cfg.data_train_shards)
        if cfg.hellaswag_interval:  # training evaluates on it and never downloads
            from gpt2.eval import hellaswag  # (torch, for its scoring: only when asked)

            hellaswag.fetch(hellaswag.file_of(cfg))
    except (ConfigError, DataError, StorageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PrepareInterrupted as e:
        print(f"\n{e}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    processes.survive_lost_terminal()  # a closed terminal must not end a preparation
    sys.exit(main())
