"""The make bridge's table of targets (gpt2/cli/__init__.py) against the Makefile:
`make help` is written from the table, so a target missing from it would be missing
from the help, and one the Makefile lacks would be advertised but fail."""

from __future__ import annotations

import pytest

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


@pytest.mark.e2e
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


@pytest.mark.e2e
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


@pytest.mark.e2e
def test_make_train_reads_the_config_once_and_train_py_parses_its_flags_once(tmp_path,
                                                                             monkeypatch):
    """`make train` reads .config in the bridge, once, and resolves it into one checked
    Config (TRAIN_ARGS applied); train.py gets that Config as flags and no file, and
    builds and checks its Config once. Both name the same run folder. (Once, the
    bridge read the file 7 times and checked 7 Configs, passed flags *and* --dotconfig,
    and train.py read the file again and merged the flags over it.)"""
    from gpt2 import train
    from gpt2.cli import main, run_commands
    from gpt2.config import kconfig, options
    from gpt2.run_folder import RunDir
    from gpt2.training import trainer
    from helpers import run_make

    config = tmp_path / "config"
    config.write_text("CONFIG_MODEL_SIZE_CUSTOM=y\nCONFIG_N_LAYER=2\nCONFIG_N_HEAD=2\n"
                      "CONFIG_N_EMBD=32\nCONFIG_BLOCK_SIZE=32\nCONFIG_MAX_ITERS=40\n"
                      "CONFIG_WARMUP_ITERS=4\n"
                      'CONFIG_VAL_FRACTION="0.05"\nCONFIG_DEVICE_CPU=y\nCONFIG_DTYPE_FLOAT32=y\n'
                      f'CONFIG_RESULTS_DIR="{tmp_path / "results"}"\n')
    assert run_make("olddefconfig", env={"KCONFIG_CONFIG": str(config)}).returncode == 0
    monkeypatch.setenv("KCONFIG_CONFIG", str(config))
    monkeypatch.setenv("TRAIN_ARGS", "--max-iters=30 --stop-at-step=5")
    calls = {"load": 0, "validate": 0}

    def counted(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(kconfig, "load", counted("load", kconfig.load))
    monkeypatch.setattr(options, "validate", counted("validate", options.validate))
    started = []
    monkeypatch.setattr(run_commands, "run_child",
                        lambda label, module, argv, dry_run_flag=None: started.append(
                            (module, argv)) or 0)
    monkeypatch.setattr(run_commands, "check_hardware", lambda cfg: None)
    assert main(["train"]) == 0
    assert calls == {"load": 1, "validate": 1}
    ((module, argv),) = started
    assert module == "gpt2.train" and "--dotconfig" not in " ".join(argv)
    assert argv.count("--max-iters=30") == 1 and "--max-iters=40" not in argv
    assert argv[-1] == "--stop-at-step=5" and "--val-fraction=0.05" in argv
    # train.py: its flags, parsed and checked once, no file read
    calls.update(load=0, validate=0)
    trained = []
    monkeypatch.setattr(trainer, "train", lambda cfg, **kw: trained.append((cfg, kw)) or 0)
    assert train.main(argv) == 0
    assert calls == {"load": 0, "validate": 1}
    ((cfg, kw),) = trained
    assert (cfg.max_iters, cfg.val_fraction, kw["stop_at_step"]) == (30, 0.05, 5)
    assert kw["dotconfig"] is None  # the run folder records the Config, rendered
    expected = RunDir(cfg, None).path
    assert expected.name.startswith("gpt2-") and cfg.n_layer == 2
    monkeypatch.setattr(run_commands, "train_and_publish",
                        lambda argv, run, one=None: trained.append(run) or 0)
    assert main(["train"]) == 0 and trained[-1].path == expected
