"""`make menuconfig` driven for real: a terminal in tmux, keys sent, screen read."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid

import pytest

from helpers import PY, REPO, run_make

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("tmux") is None,
                                 reason="tmux is not installed (.ci/run installs it)")]


class Tmux:
    def __init__(self, command: str, width: int = 120):
        self.name = f"kgpt-{uuid.uuid4().hex[:8]}"
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", str(width), "-y",
                        "40", command], check=True)

    def screen(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-t", self.name, "-p"],
                              capture_output=True, text=True).stdout

    def wait_for(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared on screen:\n{self.screen()}")

    def keys(self, *keys: str, literal: bool = False) -> None:
        for key in keys:
            subprocess.run(["tmux", "send-keys", "-t", self.name, *(["-l"] if literal else []),
                            key], check=True)
            time.sleep(0.15)

    def retype(self, text: str) -> None:
        """Replace the text of the open input dialog with ``text`` and enter it."""
        self.keys("C-a", "C-k")  # start of line, kill to end
        self.keys(text, literal=True)
        self.keys("Enter")

    def save(self) -> None:
        """S, and the file name menuconfig offers."""
        self.keys("S")
        self.wait_for("Filename to save configuration to")
        self.keys("Enter")

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def test_menuconfig_edits_and_saves_a_value(tmp_path):
    config = tmp_path / "config"
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_make("defconfig-gpt2-shakespeare-cpu", env=env).returncode == 0
    done = tmp_path / "exit-status"
    term = Tmux(f"cd {REPO} && KCONFIG_CONFIG={config} TERM=xterm-256color "
                f"make --no-print-directory PYTHON={PY} menuconfig; echo $? > {done}; sleep 30")
    try:
        term.wait_for("Output  --->")
        # G: the last entry, the Output menu, however many menus come before it.
        term.keys("G", "Enter")
        term.wait_for("(shakespeare-cpu) Run name")
        term.keys("Enter")  # edit the run name
        term.wait_for("Run name (string)")
        # A value kconfiglib would take but `make` refuses is refused as it is typed
        # (gpt2/config/tools.py), with the reason, and the dialog asks again.
        term.keys("C-a", "C-k")  # start of line, kill to end
        term.keys("bad/name", literal=True)
        term.keys("Enter")
        term.wait_for("is not a valid run name")
        term.keys("Enter")  # dismiss the error: the input dialog is back
        term.wait_for("Run name (string)")
        term.retype("edited-in-tmux")
        term.wait_for("(edited-in-tmux) Run name")
        term.save()
        term.wait_for("Configuration saved to")
        term.keys("Enter", "Q")
        deadline = time.monotonic() + 30
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert done.read_text().strip() == "0"
    finally:
        term.close()
    text = config.read_text()
    assert 'CONFIG_RUN_NAME="edited-in-tmux"' in text
    assert "CONFIG_N_LAYER=4" in text  # the rest of the preset is intact
    # the saved file passes the strict loader (make checks it after menuconfig too)
    assert run_make("train", "DRY_RUN=1", env=env).returncode == 0


def test_menuconfig_refuses_to_save_a_file_that_breaks_a_rule_and_shows_it_whole(tmp_path):
    """A learning rate below MIN_LR passes each value's own check; saving it is refused
    with the rule, wrapped to the terminal; the file stays as it was, and `make
    setconfig` can repair such a file with edits that only make sense together."""
    config = tmp_path / "config"
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_make("defconfig-gpt2-shakespeare-cpu", env=env).returncode == 0
    before = config.read_text()
    done = tmp_path / "exit-status"
    # A narrow terminal: the rule is longer than a line of it. (COLUMNS, which pytest's
    # capture sets, would tell curses another width than the terminal's.)
    term = Tmux(f"cd {REPO} && unset COLUMNS LINES && KCONFIG_CONFIG={config} TERM=xterm-256color "
                f"make --no-print-directory PYTHON={PY} menuconfig; echo $? > {done}; sleep 30",
                width=64)
    try:
        term.wait_for("Training  --->")
        term.keys("/")  # search: jump to the symbol
        term.wait_for("Jump to symbol")
        term.keys("^LEARNING_RATE$", literal=True)
        term.keys("Enter")
        term.wait_for("(2e-3) Peak learning rate")
        term.keys("Enter")
        term.wait_for("(string)")
        term.retype("1e-6")
        term.wait_for("(1e-6)")
        term.save()
        term.wait_for("Not saved")
        # the whole rule, wrapped inside the dialog, not cut at the screen's edge
        screen = term.wait_for("learning_rate 1e-06", timeout=10)
        assert "CONFIG_MIN_LR (--min-lr): 0.0002 is above" in screen
    finally:
        term.close()
    assert config.read_text() == before
    bad = before.replace('CONFIG_LEARNING_RATE="2e-3"', 'CONFIG_LEARNING_RATE="1e-5"')
    assert bad != before
    config.write_text(bad)
    fixed = run_make("setconfig", 'SET=MIN_LR=1e-4 LEARNING_RATE=1e-3', env=env)
    assert fixed.returncode == 0, fixed.stderr
    assert 'CONFIG_LEARNING_RATE="1e-3"' in config.read_text()
    config.write_text(bad)
    refused = run_make("setconfig", "SET=MAX_ITERS=50", env=env)
    assert refused.returncode != 0 and "is above learning_rate 1e-05" in refused.stderr
    assert config.read_text() == bad
