"""kconfiglib's interactive tools, with kgpt's value checks: ``python -m gpt2.config.tools
menuconfig|guiconfig|oldconfig`` (the make bridge, gpt2/cli, runs it with KCONFIG_CONFIG set).

Kconfig has no float type, so kgpt keeps floats, run names and matrix lists in
string symbols, and kconfiglib's tools accept any text for them: menuconfig would
save ``CONFIG_LEARNING_RATE="1e-3x"`` and the error would surface only at the next
``make``. Here each tool's own input check also asks ``kconfig.value_problem``, so a
bad value is refused with the reason while it is typed, as an out-of-range int is.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import kconfiglib

from gpt2.config.kconfig import (KCONFIG_FILE, KconfigError, load, to_config, to_matrix,
                                 value_problem)
from gpt2.errors import ConfigError

TOOLS = ("menuconfig", "guiconfig", "oldconfig")


def _problem(sym: kconfiglib.Symbol, text: str) -> str | None:
    if sym.orig_type != kconfiglib.STRING:
        return None  # bools and ints: kconfiglib checks them itself
    problem = value_problem(sym.name, text)
    return f"CONFIG_{sym.name}={text!r}: {problem}" if problem else None


def save_problem(kconf: kconfiglib.Kconfig) -> str | None:
    """What the whole configuration breaks, as `make` would say it (a rule across
    settings, such as MIN_LR above LEARNING_RATE, or a matrix setting), or None: the
    tools refuse to save a file `make` would refuse. (The matrix's cells are checked
    once more by `make menuconfig` after the tool exits.)"""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config"
        kconf.write_config(str(path), header="", save_old=False)
        try:
            loaded = load(path, complete=True)
            if to_matrix(loaded) is None:
                to_config(loaded)
        except (KconfigError, ConfigError) as e:
            return str(e).replace(f"{path}:", "line ").replace(str(path), "this configuration")
    return None


def wrapped(text: str, width: int | None = None) -> str:
    """``text`` with each line wrapped to fit a dialog in the terminal (menuconfig
    cuts longer lines at the screen's edge); ``width``: the screen's."""
    width = max(30, (width or shutil.get_terminal_size().columns) - 10)
    return "\n".join(textwrap.fill(line, width, subsequent_indent="  ") if line else ""
                     for line in text.splitlines())


def _screen_width(menuconfig) -> int:
    """The curses screen's width (the terminal's, whatever COLUMNS says)."""
    return menuconfig._stdscr.getmaxyx()[1]


NOT_SAVED = "Not saved: `make` would refuse this configuration. Change it first:\n\n"


def _menuconfig() -> None:
    import menuconfig

    original_save = menuconfig._try_save

    def try_save(save_fn, filename, description):
        if save_fn == menuconfig._kconf.write_config:
            problem = save_problem(menuconfig._kconf)
            if problem:
                menuconfig._error(wrapped(NOT_SAVED + problem, _screen_width(menuconfig)))
                return None
        return original_save(save_fn, filename, description)

    menuconfig._try_save = try_save
    original = menuconfig._check_valid

    def check(sym, text):
        if not original(sym, text):
            return False
        problem = _problem(sym, text)
        if problem:
            menuconfig._error(wrapped(problem, _screen_width(menuconfig)))
        return problem is None

    menuconfig._check_valid = check
    menuconfig._main()


def _guiconfig() -> None:
    import guiconfig
    from tkinter import messagebox

    original = guiconfig._check_valid

    def check(dialog, entry, sym, text):
        if not original(dialog, entry, sym, text):
            return False
        problem = _problem(sym, text)
        if problem:
            messagebox.showerror("Bad value", problem, parent=dialog)
            entry.focus_set()
        return problem is None

    guiconfig._check_valid = check
    original_save = guiconfig._try_save

    def try_save(save_fn, filename, description):
        if save_fn == guiconfig._kconf.write_config:
            problem = save_problem(guiconfig._kconf)
            if problem:
                messagebox.showerror("Not saved", NOT_SAVED + problem)
                return False
        return original_save(save_fn, filename, description)

    guiconfig._try_save = try_save
    guiconfig._main()


def _oldconfig() -> None:
    import oldconfig

    # oldconfig asks again whenever set_value refuses an answer.
    original = kconfiglib.Symbol.set_value

    def set_value(sym, value):
        problem = isinstance(value, str) and _problem(sym, value)
        if problem:
            print(f"  {problem}; try again (empty: keep the default)")
            return False
        return original(sym, value)

    kconfiglib.Symbol.set_value = set_value
    oldconfig._main()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in TOOLS:
        print(f"usage: python -m gpt2.config.tools {{{'|'.join(TOOLS)}}}", file=sys.stderr)
        return 2
    sys.argv = [argv[0], str(KCONFIG_FILE)]  # each tool's _main reads its Kconfig from here
    {"menuconfig": _menuconfig, "guiconfig": _guiconfig, "oldconfig": _oldconfig}[argv[0]]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
