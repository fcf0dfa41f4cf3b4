#!/usr/bin/env python3
"""Kconfig's defaults and ranges, written from Config: `make kconfig-sync`.

Each fact about a setting has one owner. ``Config`` (gpt2/config/options.py) owns its
default and its range: train.py run on its own, the config hash and every check read
them there. The Kconfig files own the menus: prompts, help, where an entry sits and
when it shows (its ``depends on``, which tests/config/test_registry.py holds to the
registries' ``hparams``). The ``default`` and ``range`` lines of kconfig/*.kconfig
are copies, and this script writes them: it prints the diff that makes every copy
agree with Config, and ``--write`` applies it. tests/config/test_registry.py fails with
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
import textwrap
from pathlib import Path

import kconfiglib

from gpt2.config import axes, kconfig
from gpt2.config.matrix import grid_symbol
from gpt2.names import choice_symbol
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
    files: dict[Path, list[str]] = {
        root / GENERATED: methods_kconfig().splitlines(keepends=True)}
    docs = root / DOCS
    if docs.exists():
        files[docs] = with_method_tables(docs.read_text()).splitlines(keepends=True)
    kconf = _parse(root)
    defaults = {f.name: f.default for f in fields()}
    for name, value in defaults.items():
        item = (kconf.named_choices.get(name.upper()) if opt(name).choices
                else kconf.syms.get(name.upper()))
        if item is None or not item.nodes:
            continue  # (tests/config/test_registry.py names a field without an entry)
        node = item.nodes[0]
        path = Path(node.filename)
        path = path if path.is_absolute() else root / path
        if path == root / GENERATED:
            continue  # (written whole from the modules)
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


# ---- the menus the method modules declare (gpt2/optim/, gpt2/sparsity/) ----------------

GENERATED = "kconfig/methods.kconfig"
_BANNER = ("# Generated by `make kconfig-sync` from the method modules, gpt2/optim/ and\n"
           "# gpt2/sparsity/ (gpt2/config/methods.py): edit those, not this file.\n")
_CHOICE_TEXT = {"optimizer": """\
The optimizer that updates the weights. Every optimizer applies
weight decay the same way (decoupled, 2-D weights only), so a
comparison compares optimizers, not decay settings.""", "pruning_method": """\
How weights are removed during training. Pruned weights are exactly
zero after every optimizer step and their gradients are cleared.
Each method says below whether a pruned weight may come back."""}


# A method's matrix entry, as the matrix's axes name it (gpt2/config/axes.py).
MATRIX_ENTRY = {"optimizer": axes.optimizer_symbol, "pruning_method": axes.pruning_symbol}


def capability(name: str) -> str:
    """The hidden symbol that says a chosen method reads setting ``name``: each method
    that reads it selects it, the setting depends on it. (For the settings several
    methods read; a method's own settings sit under its entry's ``if``.)"""
    return f"READS_{name.upper()}"


def pairs_with(method: str) -> str:
    """The hidden symbol a matrix optimizer selects for each pruning method it pairs
    with: the method's matrix entry depends on it."""
    return f"MATRIX_PAIRS_WITH_{method.upper()}"


def _help(text: str, indent: str = "\t") -> list[str]:
    lines = [f"{indent}help"]
    for line in textwrap.dedent(text).strip("\n").splitlines():
        lines.append(f"{indent}  {line}".rstrip() if line.strip() else "")
    return lines


def _float_text(value: float) -> str:
    text = f"{value:g}"
    return re.sub(r"e([+-])0*(\d)", lambda m: "e" + ("-" if m[1] == "-" else "") + m[2], text)


def _condition(when) -> str:
    return " && ".join(
        "(" * (len(values) > 1) + " || ".join(choice_symbol(f, v) for v in values)
        + ")" * (len(values) > 1) for f, values in when)


def _setting_lines(s, depends: str) -> list[str]:
    sym = s.name.upper()
    out = []
    if s.choices:
        out += [f"choice {sym}", f'\tprompt "{s.prompt}"',
                f"\tdefault {choice_symbol(s.name, s.default)}"]
        out += [f"\tdepends on {depends}"] if depends else []
        out += _help(s.text) + [""]
        for value, (prompt, text) in s.choices.items():
            out += [f"config {choice_symbol(s.name, value)}", f'\tbool "{prompt}"']
            out += _help(text) + [""]
        return out + ["endchoice", ""]
    kind = type(s.default)
    out.append(f"config {sym}")
    if kind is bool:
        out += [f'\tbool "{s.prompt}"', f"\tdefault {'y' if s.default else 'n'}"]
    elif kind is int:
        out += [f'\tint "{s.prompt}"']
        if s.min is not None and s.max is not None:
            out.append(f"\trange {int(s.min)} {int(s.max)}")
        out.append(f"\tdefault {s.default}")
    elif kind is float:
        out += [f'\tstring "{s.prompt}"', f'\tdefault "{_float_text(s.default)}"']
    else:
        out += [f'\tstring "{s.prompt}"', f'\tdefault "{s.default}"']
    out += [f"\tdepends on {depends}"] if depends else []
    return out + _help(s.text) + [""]


def _shared(methods: dict, settings: dict) -> list[str]:
    """The settings read by more than one method, or owned by none (Config's own,
    such as the pruning schedule's): those the readers select a symbol for."""
    read = list(dict.fromkeys(r for m in methods.values() for r in m.reads))
    return [n for n in read if n not in settings or len(settings[n][1]) > 1]


def _entries(field: str, methods: dict, shared: list[str], title: str, pairs) -> list[str]:
    """The choice of ``field`` and, for a matrix, one entry per method."""
    out = [f"choice {field.upper()}", f'\tprompt "{title}"', "\tdepends on !MATRIX",
           f"\tdefault {choice_symbol(field, _defaults()[field])}"]
    out += _help(_CHOICE_TEXT[field]) + [""]
    for name, m in methods.items():
        out += [f"config {choice_symbol(field, name)}", f'\tbool "{m.title}"']
        depends, _ = pairs(name)
        out += [f"\tdepends on {depends}"] if depends else []
        out += [f"\tselect {capability(r)}" for r in m.reads if r in shared]
        out += _help(m.text) + [""]
    out += ["endchoice", "", "if MATRIX", "",
            f'comment "{"Optimizers" if field == "optimizer" else "Pruning methods"} in the '
            'matrix"', ""]
    for name, m in methods.items():
        out += [f"config {MATRIX_ENTRY[field](name)}",
                f'\tbool "{m.title}"']
        _, matrix = pairs(name)
        out += [f"\t{matrix}"] if matrix else []
        out += [f"\tselect {capability(r)}" for r in m.reads if r in shared]
        out += _help(m.matrix_text) + [""]
    return out + ["endif", ""]


def _own_settings(field: str, methods: dict, shared: list[str]) -> list[str]:
    out = []
    for name, m in methods.items():
        own = [s for s in m.settings if s.name not in shared]
        if own:
            sym = choice_symbol(field, name)
            out += [f"if {sym} || {MATRIX_ENTRY[field](name)}", ""]
            for s in own:
                out += _setting_lines(s, _condition(s.when))
            out += ["endif", ""]
    return out


def _baseline(title: str) -> list[str]:
    """The matrix's baseline, the default optimizer unless the user names another."""
    return ["if MATRIX", "", "config MATRIX_BASELINE",
            '\tstring "Baseline of the paired comparison"',
            f'\tdefault "{_defaults()["optimizer"]}"'] + _help(f"""\
The optimizer every other one is compared with in the report:
for each optimizer x pruning x sparsity, the difference of its
final validation loss from the baseline's at the same pruning and
sparsity, each at its own best grid point, seed by seed (paired),
with a 95 % confidence interval and a verdict: better, worse or
not distinguishable. An optimizer's registry name, one of the
matrix's own when it has several (a matrix without {title} must
name its baseline). With one seed no verdict beyond the
evaluation's own noise is given: list 3 or more seeds.""") + ["", "endif", ""]


def methods_kconfig() -> str:
    """kconfig/methods.kconfig as the method modules declare it: the Optimizer and the
    Pruning menus, each with its choice, its matrix entries and its methods' own
    settings, the optimizers' grids, and the hidden symbols that say which settings
    are in force."""
    from gpt2.config.choices import pair_problem
    from gpt2.config.registry import (DEFAULT_OPTIMIZER, OPTIMIZERS, OPTIMIZER_SETTINGS,
                                      PRUNING_METHODS, PRUNING_SETTINGS)
    opt_shared = _shared(OPTIMIZERS, OPTIMIZER_SETTINGS)
    prune_shared = _shared(PRUNING_METHODS, PRUNING_SETTINGS)
    dense = [n for n, m in PRUNING_METHODS.items() if m.family == "dense"]

    def optimizer_pairs(name):
        selects = [pairs_with(p) for p in PRUNING_METHODS
                   if p not in dense and pair_problem(name, p) is None]
        return "", "\n\t".join(f"select {s}" for s in selects)

    def pruning_pairs(name):
        if name in dense:
            return "", ""
        refused = [o for o in OPTIMIZERS if pair_problem(o, name)]
        needs = PRUNING_METHODS[name].optimizer
        depends = (choice_symbol("optimizer", needs) if needs else
                   " && ".join(f"!{choice_symbol('optimizer', o)}" for o in refused))
        return depends, f"depends on {pairs_with(name)}\n\tselect MATRIX_PRUNES"

    out = [_BANNER.rstrip("\n"), "", 'menu "Optimizer"', ""]
    out += _entries("optimizer", OPTIMIZERS, opt_shared, "Optimizer", optimizer_pairs)
    out += _baseline(OPTIMIZERS[DEFAULT_OPTIMIZER].title)
    out += ["# Settings several optimizers read: each of them selects the symbol.", ""]
    for name in opt_shared:
        out += [f"config {capability(name)}", "\tbool", ""]
    for name in opt_shared:
        s, _ = OPTIMIZER_SETTINGS[name]
        out += _setting_lines(s, " && ".join(filter(None, [capability(name),
                                                           _condition(s.when)])))
    out += _own_settings("optimizer", OPTIMIZERS, opt_shared)
    out += ["if MATRIX_TUNE", ""]
    for name, m in OPTIMIZERS.items():
        out += [f'menu "{m.title} grid"',
                f"\tdepends on MATRIX_{choice_symbol('optimizer', name)}", ""]
        for g in m.tuning_grids:
            out += [f"config {grid_symbol(g.label, name)}", f'\tstring "{g.prompt}"']
            out += [f"\tdepends on {g.depends}"] if g.depends else []
            out += [f'\tdefault "{values}" if {cond}' for values, cond in g.defaults]
            out += [f'\tdefault "{g.default}"'] + _help(g.text) + [""]
        out += ["endmenu", ""]
    out += ["endif", "", "endmenu", "", 'menu "Pruning"', ""]
    out += _entries("pruning_method", PRUNING_METHODS, prune_shared, "Pruning method",
                    pruning_pairs)
    out += ["# What the chosen methods read of the shared schedule (kconfig/pruning.kconfig)",
            "# and which pruning methods each matrix optimizer pairs with.", ""]
    for name in prune_shared:
        out += [f"config {capability(name)}", "\tbool", ""]
    out += ["config MATRIX_PRUNES", "\tbool", ""]
    for name in PRUNING_METHODS:
        if name not in dense:
            out += [f"config {pairs_with(name)}", "\tbool", ""]
    out += _own_settings("pruning_method", PRUNING_METHODS, prune_shared)
    out += ['source "kconfig/pruning.kconfig"', "", "endmenu"]
    return "\n".join(out) + "\n"


def _defaults() -> dict:
    return {f.name: f.default for f in fields()}


# ---- the method tables of docs/optimizers-and-pruning.md ---------------------------

DOCS = "docs/optimizers-and-pruning.md"
_TABLE = re.compile(r"(<!-- (optimizers|pruning) table: generated by `make kconfig-sync` "
                    r"from the method modules -->\n)(.*?)(<!-- end of the \2 table -->)", re.S)


def _value(value) -> str:
    if isinstance(value, bool):
        return "y" if value else "n"
    return _float_text(value) if isinstance(value, float) else str(value)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def method_table(kind: str) -> list[str]:
    """The table of every optimizer or pruning method, from the modules: its name, what
    it is, (pruning) its memory per target weight, and the settings it reads with
    their Kconfig symbols and defaults."""
    from gpt2.config.registry import OPTIMIZERS, PRUNING_METHODS, PRUNING_SETTINGS
    defaults = _defaults()
    if kind == "optimizers":
        lines = ["| name | what it is | settings it reads (Kconfig symbol, default) |",
                 "|---|---|---|"]
        for name, m in OPTIMIZERS.items():
            own = ", ".join(f"`{r.upper()}` {_value(defaults[r])}" for r in m.reads)
            lines.append(f"| `{name}` | {_cell(m.summary)} | {own or 'none'} |")
        return lines
    lines = ["| name | what it is | memory per target weight | settings of its own "
             "(Kconfig symbol, default) |", "|---|---|---|---|"]
    for name, m in PRUNING_METHODS.items():
        own = ", ".join(f"`{r.upper()}` {_value(defaults[r])}" for r in m.reads
                        if r in PRUNING_SETTINGS and PRUNING_SETTINGS[r][1] == (name,))
        memory = "none" if m.family == "dense" else _cell(m.memory_words)
        lines.append(f"| `{name}` | {_cell(m.summary)} | {memory} | {own or 'none'} |")
    return lines


def with_method_tables(text: str) -> str:
    """``text`` with each generated table section rewritten from the modules."""
    return _TABLE.sub(lambda m: m[1] + "\n".join(method_table(m[2])) + "\n\n" + m[4], text)


def diff(root: Path = kconfig.KCONFIG_FILE.parent) -> str:
    """The unified diff that makes the Kconfig files under ``root`` agree with Config
    ("" when they do)."""
    out = []
    for path, lines in sorted(expected_files(root).items()):
        old = path.read_text().splitlines(keepends=True) if path.exists() else []
        rel = path.relative_to(root)
        out += difflib.unified_diff(old, lines, f"a/{rel}", f"b/{rel}")
    return "".join(out)


def write(root: Path = kconfig.KCONFIG_FILE.parent) -> list[Path]:
    changed = []
    for path, lines in expected_files(root).items():
        text = "".join(lines)
        if not path.exists() or path.read_text() != text:
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
