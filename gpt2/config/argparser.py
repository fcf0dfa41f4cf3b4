"""The argument parser every kgpt entry point uses.

Three differences from argparse's defaults, all because everything else here is
strict: a flag must be spelt out (argparse would take ``--max-it 20`` for
``--max-iters 20``, and a later flag sharing the prefix would silently change what
it means), an unknown flag is answered with the closest known one, and every number
has a range. A flag declared with a bare ``type=int`` or ``type=float`` is refused as soon
as its parser parses (a programming error any test finds): it takes :class:`Bounded`, or
a Config field's parser (``options.field_arg``, bounded by ``Opt.min``/``max``), so ``--seed -1``, ``--calibration-samples 99999999999`` or
``--finetune-lr inf`` are one-line errors before any work, never a traceback after it.
"""

from __future__ import annotations

import argparse
import difflib
import math
from typing import Callable

from gpt2.names import flag, removed_note


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


class Bounded:
    """A command-line number and its range, as an argparse ``type``: ``kind`` (int or
    float) from ``low`` to ``high`` inclusive (``low_open``: above ``low``). A value out
    of range, not a number, or (a float) NaN or infinite is argparse's one-line error
    naming the flag. ``why`` says where a bound comes from."""

    def __init__(self, kind: type, low: float, high: float, why: str = "",
                 low_open: bool = False):
        self.kind, self.low, self.high, self.why, self.low_open = kind, low, high, why, low_open
        self.bounds = (low, high)
        self.__name__ = "whole number" if kind is int else "number"  # (argparse's message)

    def __call__(self, text: str):
        try:
            value = int(text, 10) if self.kind is int else float(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a {self.__name__}") from None
        if self.kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < self.low or value > self.high or (self.low_open and value == self.low):
            low, high = (f"{b:,}" if self.kind is int else f"{b:g}" for b in self.bounds)
            raise argparse.ArgumentTypeError(
                f"{value!r} is out of range: {'above' if self.low_open else 'from'} {low} to "
                f"{high}"
                + (f" ({self.why})" if self.why else ""))
        return value


def bounded_parser(parse: Callable[[str], object], low: float | None, high: float | None):
    """``parse`` marked as bounded by ``low`` and ``high``: a Config field's parser, whose
    range is checked where the field's value is (options.check_value)."""
    parse.bounds = (low, high)  # type: ignore[attr-defined]
    return parse


class StrictArgumentParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def unbounded(self) -> list[str]:
        """The flags declared with a bare ``type=int`` or ``type=float`` (argument groups
        share the parser's list of actions)."""
        return ["/".join(a.option_strings) or a.dest for a in self._actions
                if a.type in (int, float)]

    def error(self, message: str):
        """The error and where the flags are listed, not the whole usage (train.py's
        is a hundred lines, and the error would scroll away above it)."""
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists every flag)\n")

    def parse_known_args(self, args=None, namespace=None):
        loose = self.unbounded()
        if loose:  # (a programming error, found by any test that parses)
            raise TypeError(f"{self.prog}: {', '.join(loose)}: a number flag needs a range "
                            "(type=Bounded(...)), not a bare int or float")
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        ns, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {unknown_flags(self, unknown)}")
        return ns
