"""The make bridge's table of targets (gpt2/cli/__init__.py) against the Makefile:
`make help` is written from the table, so a target missing from it would be missing
from the help, and one the Makefile lacks would be advertised but fail."""

from __future__ import annotations

import re
import subprocess

from helpers import PY, REPO
from gpt2.cli import DEFAULT_TARGET, RUNNABLE, SECTIONS, TARGETS
from gpt2.cli.help import text as help_text

MAKEFILE = (REPO / "Makefile").read_text().replace("\\\n", " ")


def makefile_variable(name: str) -> list[str]:
    return re.search(rf"^(?:override )?{name} :?= (.*)$", MAKEFILE, re.M)[1].split()


def expand(words: list[str]) -> list[str]:
    out = []
    for word in words:
        ref = re.fullmatch(r"\$\((\w+)\)", word)
        out += expand(makefile_variable(ref[1])) if ref else [word]
    return out


def phony() -> set[str]:
    return set(expand(re.search(r"^\.PHONY: (.*)$", MAKEFILE, re.M)[1].split()))


def rule_targets() -> set[str]:
    """Every target a rule of the Makefile names, variables expanded."""
    names = re.findall(r"^([^\s#.][^:=\n]*?):(?![=:])", MAKEFILE, re.M)
    return set(expand(" ".join(names).split()))


def test_every_target_of_the_makefile_is_in_the_table_and_back():
    table = {t.name.replace("<name>", "%") for t in TARGETS}
    users = phony() | {"defconfig-%"}
    assert table == users
    assert rule_targets() - {"$(VENV)/.installed"} == users  # no rule is left out of .PHONY


def test_the_table_says_which_targets_the_bridge_runs():
    """Targets whose recipe is `$(KGPT) $@` have a function in the table; the ones the
    Makefile runs on its own (pytest, rm) are marked as such."""
    through_bridge = set(expand(["$(CONFIG_TARGETS)", "$(RUN_TARGETS)"]))
    assert re.search(r"^\$\(CONFIG_TARGETS\) \$\(RUN_TARGETS\):.*\n\t\$\(Q\)\$\(KGPT\) \$@$",
                     MAKEFILE, re.M)
    assert re.search(r"^defconfig-%:.*\n\t\$\(Q\)\$\(KGPT\) defconfig \"\$\$KGPT_DEFCONFIG\"$",
                     MAKEFILE, re.M)
    assert re.search(r"^help:\n\t@\$\(or \$\(PYTHON\),python3\) -m gpt2\.cli help$", MAKEFILE,
                     re.M)
    assert set(RUNNABLE) == through_bridge | {"help"}
    assert {t.name for t in TARGETS if t.run is None} == phony() - through_bridge - {"help"}
    assert makefile_variable(r"\.DEFAULT_GOAL") == [DEFAULT_TARGET]


def test_every_function_of_the_table_exists():
    for target in TARGETS:
        if target.run:
            assert callable(target.function()), target


def test_help_lists_every_target_under_its_section():
    text = help_text()
    for target in TARGETS:
        if target.section is None:
            continue
        assert target.section in SECTIONS, target
        assert re.search(rf"^  {re.escape(target.name)}( \(default\))? +\S", text, re.M), target
    assert "  all (default)     prepare the data" in text
    headings = [line for line in text.splitlines() if line and not line.startswith(" ")]
    assert headings[1:len(SECTIONS) + 1] == [f"{h}:" for h in SECTIONS.values()]


def test_help_needs_only_the_standard_library():
    """`make help` runs the system python3 before .venv exists: nothing outside the
    standard library (torch, numpy, kconfiglib, yaml) may be imported on its way."""
    script = (
        "import runpy, sys\n"
        "before = set(sys.modules)\n"  # what site loaded (.pth hooks) is not help's doing
        "sys.argv = ['gpt2.cli', 'help']\n"
        "try:\n"
        "    runpy.run_module('gpt2.cli', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "loaded = {m.partition('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(loaded - set(sys.stdlib_module_names) - {'gpt2'}))\n")
    proc = subprocess.run([PY, "-c", script], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"
    assert proc.stdout.startswith("kgpt: train GPT-2 models")


def test_commands_on_a_named_run_folder_do_not_read_the_config(tmp_path):
    """The commands on a run or matrix folder read only the folder (it holds its own
    configuration): with RUN= naming one, a stale .config (settings added since it was
    written, here an invalid one too) is not in the way; without RUN= it still names
    the run, and is checked."""
    from helpers import run_make

    stale = tmp_path / "stale.config"
    stale.write_text("CONFIG_MAX_ITERS=10\n")
    folder = tmp_path / "run"
    folder.mkdir()
    env = {"KCONFIG_CONFIG": str(stale)}
    expected = {"export": f"{folder} has no checkpoint",
                "generate": f"no checkpoint at {folder}/ckpt.pt",
                "prune-oneshot": "METHOD= is needed",
                "results": f"{folder} holds no runs or matrices",
                "compare": f"{folder} is neither a run folder",
                "tensorboard": f"{folder} is neither a run folder",
                "plots": f"{folder} is neither a matrix folder",
                "report": f"{folder} is neither a matrix folder",
                "matrix-status": f"{folder} is not a matrix folder"}
    for target, says in expected.items():
        proc = run_make(target, f"RUN={folder}", env=env)
        assert proc.returncode == 2 and says in proc.stderr, (target, proc.stderr)
        assert "missing" not in proc.stderr
    proc = run_make("export", env=env)
    assert proc.returncode == 2 and "setting(s) are missing" in proc.stderr
