"""The argument parser every kgpt entry point uses.

Two differences from argparse's defaults, both because everything else here is
strict: a flag must be spelt out (argparse would take ``--max-it 20`` for
``--max-iters 20``, and a later flag sharing the prefix would silently change what
it means), and an unknown flag is answered with the closest known one.
"""

from __future__ import annotations

import argparse
import difflib

from gpt2.config.names import flag, removed_note


# What users of other trainers type for a setting (nanoGPT's and Hugging Face's
# spellings), where the closest spelling by letters would name another setting
# (--lr is nearer --min-lr than --learning-rate).
THEIR_NAMES = {"lr": "learning_rate", "learning_rate": "learning_rate", "wd": "weight_decay",
               "bs": "batch_size", "micro_batch_size": "batch_size", "iters": "max_iters",
               "steps": "max_iters", "max_steps": "max_iters", "warmup": "warmup_iters",
               "warmup_steps": "warmup_iters", "lr_decay_iters": "schedule_iters",
               "gradient_accumulation_steps": "gradient_accumulation",
               "grad_clip_norm": "grad_clip", "max_grad_norm": "grad_clip", "out_dir":
               "results_dir", "output_dir": "results_dir", "seq_len": "block_size"}


def suggestion(parser: argparse.ArgumentParser, arg: str) -> str:
    """' (did you mean --x?)' for an unknown ``--flag`` or ``--flag=value``, or ''."""
    if not arg.startswith("--"):
        return ""
    name = arg[2:].split("=", 1)[0]
    gone = removed_note(name.replace("-", "_"), flag)
    if gone:
        return f" ({gone})"
    known = [o for o in parser._option_string_actions if o.startswith("--")]
    for candidate in (THEIR_NAMES.get(name.replace("-", "_")), name.replace("_", "-")):
        if candidate and flag(candidate) in known:
            return f" (did you mean {flag(candidate)}?)"
    close = difflib.get_close_matches(arg.split("=", 1)[0], known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def unknown_flags(parser: argparse.ArgumentParser, args: list[str]) -> str:
    """The unknown arguments, each flag with its closest known spelling."""
    return ", ".join(a + suggestion(parser, a) for a in args)


class StrictArgumentParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        """The error and where the flags are listed, not the whole usage (train.py's
        is a hundred lines, and the error would scroll away above it)."""
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists every flag)\n")

    def parse_args(self, args=None, namespace=None):
        ns, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {unknown_flags(self, unknown)}")
        return ns
