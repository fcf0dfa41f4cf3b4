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


def suggestion(parser: argparse.ArgumentParser, arg: str) -> str:
    """' (did you mean --x?)' for an unknown ``--flag`` or ``--flag=value``, or ''."""
    if not arg.startswith("--"):
        return ""
    gone = removed_note(arg[2:].split("=", 1)[0].replace("-", "_"), flag)
    if gone:
        return f" ({gone})"
    known = [o for o in parser._option_string_actions if o.startswith("--")]
    close = difflib.get_close_matches(arg.split("=", 1)[0], known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def unknown_flags(parser: argparse.ArgumentParser, args: list[str]) -> str:
    """The unknown arguments, each flag with its closest known spelling."""
    return ", ".join(a + suggestion(parser, a) for a in args)


class StrictArgumentParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        ns, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {unknown_flags(self, unknown)}")
        return ns
