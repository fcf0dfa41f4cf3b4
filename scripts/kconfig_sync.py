#!/usr/bin/env python3
"""Kconfig's defaults and ranges, written from Config: `make kconfig-sync`.

Each fact about a setting has one owner. ``Config`` (gpt2/config/options.py) owns its
default and its range: train.py run on its own, the config hash and every check read
them there. The Kconfig files own the menus: prompts, help, where an entry sits and
when it shows (its ``depends on``, which tests/test_registry.py holds to the
registries' ``hparams``). The ``default`` and ``range`` lines of kconfig/*.kconfig
are copies, and this script writes them: it prints the diff that makes every copy
agree with Config, and ``--write`` applies it. tests/test_registry.py fails with
that diff when they disagree, so a changed default is one edit, then one command.

    python -m scripts.kconfig_sync           # the diff (nothing: they agree)
    python -m scripts.kconfig_sync --write   # apply it
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import sys
from pathlib import Path

import kconfiglib

from gpt2.config import kconfig
from gpt2.config.names import choice_symbol
from gpt2.config.options import field_type, fields, opt

_DEFAULT = re.compile(r"^(\s+)default\s+(.*?)\s*$")
_RANGE = re.compile(r"^(\s+)range\s+(\S+)\s+(\S+)\s*$")
_HELP = re.compile(r"^\s+(help|---help---)\s*$")


def _default_text(name: str, value) -> str:
    """Config's default as a Kconfig default's value."""
    kind = field_type(name)
    if opt(name).choices:
        return choice_symbol(name, value)
    if kind is bool:
        return "y" if value else "n"
    if kind is int:
        return str(value)
    if kind is float:
        return f'"{value:g}"'
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _same_default(name: str, written: str, value) -> bool:
    """A Kconfig default's text means Config's default (6e-4 and 0.0006 are one)."""
    if field_type(name) is float and not opt(name).choices:
        try:
            return math.isclose(float(written.strip('"')), value, rel_tol=0, abs_tol=0)
        except ValueError:
            return False
    return written == _default_text(name, value)


def _range_bounds(name: str) -> tuple[str, str] | None:
    o = opt(name)
    if field_type(name) is not int or o.min is None or o.max is None:
        return None
    return str(int(o.min)), str(int(o.max))


def _entry_lines(lines: list[str], start: int) -> range:
    """The lines of the entry whose keyword line is ``start`` (0-based), up to its help
    text or the next unindented line."""
    end = start + 1
    while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
        if _HELP.match(lines[end]):
            break
        end += 1
    return range(start + 1, end)


def _parse(root: Path) -> kconfiglib.Kconfig:
    """The Kconfig tree whose top file is ``root``/Kconfig (sources are relative to
    ``root``)."""
    saved = os.environ.get("srctree")
    os.environ["srctree"] = str(root)
    try:
        return kconfiglib.Kconfig(str(root / "Kconfig"), warn=False, suppress_traceback=False)
    finally:
        if saved is None:
            del os.environ["srctree"]
        else:
            os.environ["srctree"] = saved


def expected_files(root: Path) -> dict[Path, list[str]]:
    """Every Kconfig file under ``root`` with its default and range lines as Config says
    (files that need no change included, as they are)."""
    kconf = _parse(root)
    files: dict[Path, list[str]] = {}
    defaults = {f.name: f.default for f in fields()}
    for name, value in defaults.items():
        item = (kconf.named_choices.get(name.upper()) if opt(name).choices
                else kconf.syms.get(name.upper()))
        if item is None or not item.nodes:
            continue  # (tests/test_registry.py names a field without an entry)
        node = item.nodes[0]
        path = Path(node.filename)
        path = path if path.is_absolute() else root / path
        lines = files.setdefault(path, path.read_text().splitlines(keepends=True))
        for i in _entry_lines(lines, node.linenr - 1):
            m = _DEFAULT.match(lines[i])
            if m and " if " not in m[2] and not _same_default(name, m[2], value):
                lines[i] = f"{m[1]}default {_default_text(name, value)}\n"
            r = _RANGE.match(lines[i])
            bounds = _range_bounds(name)
            if r and bounds and (r[2], r[3]) != bounds:
                lines[i] = f"{r[1]}range {bounds[0]} {bounds[1]}\n"
    return files


def diff(root: Path = kconfig.KCONFIG_FILE.parent) -> str:
    """The unified diff that makes the Kconfig files under ``root`` agree with Config
    ("" when they do)."""
    out = []
    for path, lines in sorted(expected_files(root).items()):
        old = path.read_text().splitlines(keepends=True)
        rel = path.relative_to(root)
        out += difflib.unified_diff(old, lines, f"a/{rel}", f"b/{rel}")
    return "".join(out)


def write(root: Path = kconfig.KCONFIG_FILE.parent) -> list[Path]:
    changed = []
    for path, lines in expected_files(root).items():
        text = "".join(lines)
        if path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.kconfig_sync",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="apply the diff")
    args = parser.parse_args(argv)
    if args.write:
        for path in write():
            print(f"wrote {path}")
        return 0
    text = diff()
    print(text or "kconfig/*.kconfig agree with Config: nothing to change", end="" if text
          else "\n")
    return 1 if text else 0


if __name__ == "__main__":
    sys.exit(main())
