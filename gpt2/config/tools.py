"""kconfiglib's interactive tools, with kgpt's value checks: ``python -m gpt2.config.tools
menuconfig|guiconfig|oldconfig`` (the make bridge, gpt2/cli, runs it with KCONFIG_CONFIG set).

Kconfig has no float type, so kgpt keeps floats, run names and matrix lists in
string symbols, and kconfiglib's tools accept any text for them: menuconfig would
save ``CONFIG_LEARNING_RATE="1e-3x"`` and the error would surface only at the next
``make``. Here each tool's own input check also asks ``kconfig.value_problem``, so a
bad value is refused with the reason while it is typed, as an out-of-range int is.
"""

from __future__ import annotations

import sys

import kconfiglib

from gpt2.config.kconfig import KCONFIG_FILE, value_problem

TOOLS = ("menuconfig", "guiconfig", "oldconfig")


def _problem(sym: kconfiglib.Symbol, text: str) -> str | None:
    if sym.orig_type != kconfiglib.STRING:
        return None  # bools and ints: kconfiglib checks them itself
    problem = value_problem(sym.name, text)
    return f"CONFIG_{sym.name}={text!r}: {problem}" if problem else None


def _menuconfig() -> None:
    import menuconfig

    original = menuconfig._check_valid

    def check(sym, text):
        if not original(sym, text):
            return False
        problem = _problem(sym, text)
        if problem:
            menuconfig._error(problem)
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
