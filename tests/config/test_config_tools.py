"""The configuration tools: repair what training refuses, check what they save,
scripted edits (setconfig), and the kernel's `make defconfig` / `make clean` habits."""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers import BRIDGE, REPO, call_main, run_make, run_target

pytestmark = pytest.mark.e2e  # every test here starts processes (tests/conftest.py)

MATRIX = REPO / "defconfigs" / "gpt2-wikitext103-matrix"


def kgpt(config, *args, env=None):
    """The make bridge on ``config``, in this process (helpers.call_main)."""
    return call_main("bridge", *args, env={"KCONFIG_CONFIG": str(config), **(env or {})},
                     unset=("TRAIN_ARGS", "DRY_RUN", "CELL", "RUN", "SMOKE", "SET"))


@pytest.fixture
def unticked(tmp_path):
    """A full matrix .config whose AdamWSpam optimizer was unticked by hand: its
    SPAM_* settings stay behind with their dependency unmet."""
    config = tmp_path / ".config"
    assert kgpt(config, "defconfig", MATRIX.name).returncode == 0
    text = config.read_text()
    assert "CONFIG_MATRIX_OPTIMIZER_ADAMWSPAM=y" in text and "CONFIG_SPAM_THRESHOLD=" in text
    config.write_text(text.replace("CONFIG_MATRIX_OPTIMIZER_ADAMWSPAM=y",
                                   "# CONFIG_MATRIX_OPTIMIZER_ADAMWSPAM is not set")
                      + "CONFIG_SYMBOL_REMOVED_SINCE=y\n")
    return config


def test_training_stays_strict_and_names_the_repair(unticked):
    proc = kgpt(unticked, "test-matrix", env={"DRY_RUN": "1"})
    assert proc.returncode == 2
    assert "CONFIG_SPAM_THRESHOLD" in proc.stderr and "unmet dependency" in proc.stderr
    assert "make olddefconfig" in proc.stderr


def test_olddefconfig_repairs_leftovers_and_lists_them(unticked):
    proc = kgpt(unticked, "olddefconfig")
    assert proc.returncode == 0, proc.stderr
    for dropped in ("CONFIG_SPAM_THRESHOLD", "CONFIG_SPAM_RESET_INTERVAL",
                    "CONFIG_SYMBOL_REMOVED_SINCE"):
        assert dropped in proc.stderr
    assert "dropped" in proc.stderr
    text = unticked.read_text()
    assert "SPAM_THRESHOLD" not in text and "SYMBOL_REMOVED_SINCE" not in text
    assert "# CONFIG_MATRIX_OPTIMIZER_ADAMWSPAM is not set" in text  # the user's edit kept
    # the repaired file passes the strict loader, and its plan has no AdamWSpam cell
    plan = kgpt(unticked, "test-matrix", env={"DRY_RUN": "1"})
    assert plan.returncode == 0, plan.stderr
    assert "adamwspam" not in plan.stdout and "adamw-none" in plan.stdout


def test_a_removed_setting_names_what_replaced_it(tmp_path):
    """CONFIG_EVAL_BATCHES counted validation micro-batches, so the validation set
    changed with the batch size; CONFIG_EVAL_TOKENS replaced it. An old .config line,
    a setconfig edit or a flag that sets it is refused naming the new setting, and
    olddefconfig drops the line saying why."""
    from gpt2.config import kconfig
    from gpt2.errors import KconfigError

    config = tmp_path / ".config"
    config.write_text((REPO / "defconfigs" / "gpt2-shakespeare-cpu").read_text()
                      + "CONFIG_EVAL_BATCHES=8\n")
    with pytest.raises(KconfigError) as refused:
        kconfig.load(config)
    assert "CONFIG_EVAL_BATCHES: removed: use CONFIG_EVAL_TOKENS instead" in str(refused.value)
    repaired = kconfig.load(config, repair=True)
    assert any("CONFIG_EVAL_BATCHES: removed: use CONFIG_EVAL_TOKENS" in r
               and r.endswith("dropped") for r in repaired.repairs), repaired.repairs
    with pytest.raises(KconfigError, match="removed: use CONFIG_EVAL_TOKENS"):
        kconfig.apply_settings(repaired, ["EVAL_BATCHES=8"])
    proc = kgpt(config, "olddefconfig")
    assert proc.returncode == 0 and "CONFIG_EVAL_TOKENS" in proc.stderr, proc.stderr
    assert "EVAL_BATCHES" not in config.read_text()
    proc = call_main("gpt2/train.py", "--eval-batches=8", "--dry-run")
    assert proc.returncode == 2
    assert "--eval-batches=8 (removed: use --eval-tokens instead" in proc.stderr


@pytest.mark.parametrize("tool", ["savedefconfig", "listnewconfig"])
def test_other_tools_open_the_file_too(unticked, tool, tmp_path):
    out = tmp_path / "defconfig"
    proc = kgpt(unticked, tool, env={"DEFCONFIG_OUT": str(out)})
    assert proc.returncode == 0, proc.stderr
    assert "CONFIG_SPAM_THRESHOLD" in proc.stderr
    if tool == "savedefconfig":
        assert "SPAM" not in out.read_text()


def test_unreadable_lines_are_not_repaired(unticked):
    """A repair drops what Kconfig does not take, never a line it cannot read."""
    text = unticked.read_text().replace("CONFIG_MAX_ITERS=", "CONFIG_MAX_ITERS=x")
    unticked.write_text(text)
    proc = kgpt(unticked, "olddefconfig")
    assert proc.returncode == 2 and "is not an integer" in proc.stderr
    assert unticked.read_text() == text  # left as it was, for the user to fix


def test_oldconfig_refuses_a_float_that_is_not_a_number(tmp_path):
    config = tmp_path / ".config"
    assert kgpt(config, "defconfig").returncode == 0
    config.write_text("".join(line for line in config.read_text().splitlines(keepends=True)
                              if not line.startswith("CONFIG_LEARNING_RATE=")))
    proc = subprocess.run([*BRIDGE, "oldconfig"], input="1e-3x\n2e-3\n",
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "KCONFIG_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stderr
    assert "'1e-3x' is not a number" in proc.stdout
    assert 'CONFIG_LEARNING_RATE="2e-3"' in config.read_text()


def test_setconfig_edits_are_checked_like_the_file(tmp_path):
    config = tmp_path / ".config"
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_target("defconfig", env=env).returncode == 0  # no name: the default preset
    assert "CONFIG_N_LAYER=4" in config.read_text()  # gpt2-shakespeare-cpu
    ok = run_target("setconfig", "SET=LEARNING_RATE=1e-3 MAX_ITERS=500 OPTIMIZER=muon "
                    "CONFIG_MUON_LR=0.01", env=env)
    assert ok.returncode == 0, ok.stderr
    text = config.read_text()
    for line in ('CONFIG_LEARNING_RATE="1e-3"', "CONFIG_MAX_ITERS=500",
                 "CONFIG_OPTIMIZER_MUON=y", 'CONFIG_MUON_LR="0.01"'):
        assert line in text
    for bad, says in (("LEARNING_RATE=1e-3x", "'1e-3x' is not a number"),
                      ("LEARNIN_RATE=1e-3", "did you mean LEARNING_RATE?"),
                      ("OPTIMIZER=adamv", "not one of sgd"),
                      ("SPAM_THRESHOLD=10", "unmet dependency"),
                      ("MIN_LR=0.5", "is above learning_rate"),
                      ("RUN_NAME=../x", "not a valid run name")):
        proc = kgpt(config, "setconfig", env={"SET": bad})
        assert proc.returncode == 2 and says in proc.stderr, (bad, proc.stderr)
        assert config.read_text() == text  # nothing written


def test_guiconfig_without_a_display_says_what_to_use(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    proc = subprocess.run([*BRIDGE, "guiconfig"], capture_output=True, text=True,
                          cwd=REPO, env={**env, "KCONFIG_CONFIG": str(tmp_path / "c")})
    assert proc.returncode == 2 and "make menuconfig" in proc.stderr


def test_make_clean_keeps_the_users_defconfig():
    plan = run_make("-n", "clean")
    assert plan.returncode == 0
    removed = " ".join(line for line in plan.stdout.splitlines() if "rm " in line)
    assert ".pytest_cache" in removed and "defconfig" not in removed


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_config_path_that_is_not_a_file_is_refused(tmp_path, kind):
    """A FIFO made `make defconfig-X` hang; a directory was renamed to <dir>.old."""
    target = tmp_path / "target"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
        (target / "keep").write_text("mine")
    proc = subprocess.run([*BRIDGE, "defconfig"], capture_output=True, text=True,
                          cwd=REPO, timeout=60, env={**os.environ, "KCONFIG_CONFIG": str(target)})
    assert proc.returncode == 2 and "KCONFIG_CONFIG" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]
    if kind == "directory":
        assert (target / "keep").read_text() == "mine"


def test_dry_run_of_generate_and_hellaswag_runs_nothing(tmp_path):
    for target, script in (("generate", "gpt2/generate.py"), ("eval-hellaswag",
                                                              "gpt2/evaluate.py")):
        proc = run_target(target, "DRY_RUN=1", f"RUN={tmp_path / 'no-such-run'}",
                          env={"KCONFIG_CONFIG": str(tmp_path / "none")})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(script) and "no-such-run" in proc.stdout


def test_help_puts_each_variable_under_its_target():
    text = subprocess.run([*BRIDGE, "help"], capture_output=True, text=True,
                          cwd=REPO).stdout
    generate = text[text.index("  generate "):text.index("  eval-hellaswag ")]
    hellaswag = text[text.index("  eval-hellaswag "):text.index("\n\n", text.index(
        "  eval-hellaswag "))]
    assert "MAX_NEW_TOKENS" in generate and "NUM_SAMPLES" in generate
    assert "MAX_NEW_TOKENS" not in hellaswag and "EXAMPLES" in hellaswag
    for target in ("setconfig", "guiconfig", "defconfig "):
        assert target in text


@pytest.fixture
def matrix_config(tmp_path):
    config = tmp_path / ".config"
    assert kgpt(config, "defconfig", "gpt2-shakespeare-matrix-cpu").returncode == 0
    return config


def test_per_run_tools_act_on_a_named_cell_of_a_matrix(matrix_config):
    """A matrix .config locked out generate, eval-hellaswag, memcheck and bench ("this
    configuration describes a test matrix")."""
    cell = "adamwspam-movement-70-seed1337"
    # (bench and resume-check share one path, generate and eval-hellaswag another)
    for target, script in (("bench", "scripts/bench.py"), ("generate", "gpt2/generate.py")):
        unnamed = kgpt(matrix_config, target, env={"DRY_RUN": "1"})
        assert unnamed.returncode == 2 and "CELL=" in unnamed.stderr, (target, unnamed.stderr)
    for target, script in (("bench", "scripts/bench.py"),
                           ("resume-check", "scripts/resume_check.py"),
                           ("generate", "gpt2/generate.py"),
                           ("eval-hellaswag", "gpt2/evaluate.py")):
        named = kgpt(matrix_config, target, env={"DRY_RUN": "1", "CELL": cell})
        assert named.returncode == 0 and named.stdout.startswith(script), (target, named)
        if target in ("bench", "resume-check"):  # the cell's own configuration
            assert "--optimizer=adamwspam" in named.stdout and "--target-sparsity=0.7" in \
                named.stdout
        else:  # the cell's own folder
            assert f"/cells/{cell}" in named.stdout
    by_run = kgpt(matrix_config, "generate", env={"DRY_RUN": "1", "RUN": cell})
    assert f"/cells/{cell}" in by_run.stdout
    typo = kgpt(matrix_config, "bench", env={"DRY_RUN": "1", "CELL": cell[:-1]})
    assert typo.returncode == 2 and f"did you mean {cell}?" in typo.stderr


def test_memcheck_checks_every_cell_of_a_matrix(matrix_config):
    proc = kgpt(matrix_config, "memcheck")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "-seed1337 " in line]
    assert len(lines) == 12 and all("fits" in line for line in lines)
    assert "the heaviest cell, " in proc.stdout and "predicted peak" in proc.stdout
    one = kgpt(matrix_config, "memcheck", env={"CELL": "adamw-none-seed1337",
                                               "TRAIN_ARGS": "--memory-budget-mb=1000"})
    assert one.returncode == 4 and "does not fit" in one.stdout  # 1.7 GiB in 1000 MiB
    assert "adamw / none" in one.stdout and "heaviest" not in one.stdout


def test_smoke_runs_any_config_for_n_steps_with_its_schedule_scaled(tmp_path, data_dir):
    """`--max-iters 10` on the CPU preset failed on its 20 warmup steps; SMOKE=N scales
    warmup, evaluation, checkpoint and pruning schedules and says so."""
    import json

    config, results = tmp_path / ".config", tmp_path / "results"
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_target("defconfig", env=env).returncode == 0
    # (tiny Shakespeare's characters: a 65-row table, quicker, the same schedules)
    assert run_target("setconfig", f"SET=DATA_DIR={data_dir} RESULTS_DIR={results} "
                      "CPU_THREADS=1 DATASET=shakespeare-char", env=env).returncode == 0
    proc = run_target("train", "SMOKE=4", "TRAIN_ARGS=--eval-tokens=256 --sample-tokens=0",
                      env=env)  # (fewer validation tokens: quicker, same schedule)
    assert proc.returncode == 0, proc.stderr
    assert "SMOKE   4 steps" in proc.stderr and "warmup_iters 20 -> 0" in proc.stderr
    (run,) = results.glob("shakespeare-cpu-smoke-*")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["iters"] == 4
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val_loss" in r] == [0, 1, 2, 3, 4]  # 50 of 300 -> 1
    matrix = tmp_path / "matrix"
    assert kgpt(matrix, "defconfig", "gpt2-shakespeare-matrix-cpu").returncode == 0
    plan = kgpt(matrix, "test-matrix", env={"DRY_RUN": "1", "SMOKE": "6"})
    assert plan.returncode == 0 and "-smoke-" in plan.stdout
    assert "--max-iters=6" in plan.stdout and "--pruning-warmup=1" in plan.stdout


def test_test_matrix_on_a_single_run_suggests_the_preset_for_this_machine(tmp_path):
    import torch

    config = tmp_path / ".config"
    assert kgpt(config, "defconfig").returncode == 0
    proc = kgpt(config, "test-matrix")
    preset = ("gpt2-wikitext103-matrix" if torch.cuda.is_available()
              else "gpt2-shakespeare-matrix-cpu")
    assert proc.returncode == 2 and f"make defconfig-{preset}`" in proc.stderr
