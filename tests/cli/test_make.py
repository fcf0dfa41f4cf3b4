"""The make front end, end to end: presets, the .config -> train.py bridge with
hostile strings, a short real run, generate, and the errors users meet first."""

from __future__ import annotations

import json

import kconfiglib
import pytest

from helpers import REPO, only_run_dir, run_make

pytestmark = pytest.mark.e2e  # every test here starts processes (tests/conftest.py)

CPU_DEFCONFIG = (REPO / "defconfigs" / "gpt2-shakespeare-cpu").read_text()
SHORT = ("--max-iters 6 --eval-interval 3 --eval-tokens 512 --warmup-iters 2 "
         "--sample-tokens 4 --log-interval 2")


def _q(value: str) -> str:
    return '"' + kconfiglib.escape(value) + '"'


def hostile(tmp_path) -> str:
    """A prompt that would run commands if make or a shell ever interpreted it."""
    m = tmp_path / "pwned"
    return (f"it's \"quoted\" $(shell touch {m}1) `touch {m}2` $$(touch {m}3) ; touch {m}4 "
            f"&& echo ../../etc \\ back\\slash")


@pytest.fixture(scope="module")
def e2e(tmp_path_factory, corpus):
    """`make olddefconfig` from the CPU preset plus local paths, then a short `make`."""
    tmp = tmp_path_factory.mktemp("e2e")
    config = tmp / "config"
    prompt = hostile(tmp)
    config.write_text(CPU_DEFCONFIG + "\n".join([
        f"CONFIG_DATA_DIR={_q(str(tmp / 'my data'))}",
        f"CONFIG_DATA_INPUT={_q(str(corpus))}",
        f"CONFIG_RESULTS_DIR={_q(str(tmp / 'results'))}",
        f"CONFIG_SAMPLE_PROMPT={_q(prompt)}", ""]))
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_make("olddefconfig", env=env).returncode == 0
    proc = run_make(env={**env, "TRAIN_ARGS": SHORT})
    return tmp, config, env, prompt, proc


def test_make_prepares_data_trains_and_prints_the_summary(e2e):
    tmp, _, _, _, proc = e2e
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DATA" in proc.stderr and "TRAIN" in proc.stderr
    run = only_run_dir(tmp / "results")
    assert f"run      {run}" in proc.stdout and "status   completed" in proc.stdout
    assert (tmp / "my data" / "shakespeare" / "train_000000.bin").is_file()
    # training writes the run folder; make, which started it, publishes the pages
    assert (run / "run.html").is_file() and (tmp / "results" / "index.html").is_file()
    # and says what to do next with it
    assert "next     make generate" in proc.stdout and f"open {run / 'run.html'}" in proc.stdout


def test_training_used_the_config_values_and_train_args_won(e2e):
    tmp, config, _, prompt, _ = e2e
    run = only_run_dir(tmp / "results")
    used = json.loads((run / "config.json").read_text())
    assert (used["n_layer"], used["n_embd"], used["block_size"]) == (4, 128, 128)
    assert used["learning_rate"] == 2e-3 and used["device"] == "cpu"
    assert used["max_iters"] == 6 and used["eval_interval"] == 3  # TRAIN_ARGS, last wins
    assert used["sample_prompt"] == prompt
    # The recorded .config is what was trained: the rendering of the settings make
    # resolved, TRAIN_ARGS applied (a copy of the file once contradicted config.json).
    recorded = (run / "config").read_text()
    assert recorded.startswith("# kgpt configuration rendered from its settings")
    assert "CONFIG_MAX_ITERS=6" in recorded and "CONFIG_EVAL_INTERVAL=3" in recorded
    assert "CONFIG_N_LAYER=4" in recorded and 'CONFIG_LEARNING_RATE="0.002"' in recorded


def test_hostile_strings_arrive_verbatim_and_never_execute(e2e):
    tmp, _, _, prompt, _ = e2e
    run = only_run_dir(tmp / "results")
    assert (run / "samples.txt").read_text().count(prompt) == 3  # evals at 0, 3, 6
    assert not list(tmp.glob("pwned*")) and not list(REPO.glob("pwned*"))


def test_same_config_again_reports_the_finished_run(e2e):
    tmp, _, env, _, _ = e2e
    run = only_run_dir(tmp / "results")
    page = (run / "run.html").stat().st_mtime_ns
    # Said without importing torch (every process of make inherits -X importtime)
    proc = run_make(env={**env, "TRAIN_ARGS": SHORT, "PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 0 and "already complete" in proc.stdout, proc.stderr[-3000:]
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines()
                if ln.startswith("import time:")}
    assert "gpt2.training.reporting" in imported and "torch" not in imported
    assert (run / "run.html").stat().st_mtime_ns == page  # nothing new to publish


def test_make_generate_samples_from_the_latest_run(e2e):
    _, _, env, _, _ = e2e
    proc = run_make("generate", "PROMPT=ROMEO: $(shell echo no)", "MAX_NEW_TOKENS=5",
                    "TEMPERATURE=0.9", "TOP_K=20", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ROMEO: $(shell echo no)")  # verbatim, not expanded
    assert "step 6" in proc.stderr  # the final checkpoint of the latest run


def test_dry_run_prints_the_resolved_config_and_runs_nothing(e2e):
    tmp, _, env, _, _ = e2e
    proc = run_make("train", "DRY_RUN=1", env={**env, "TRAIN_ARGS": "--seed 99"})
    assert proc.returncode == 0
    printed = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert printed["config"]["seed"] == 99
    assert only_run_dir(tmp / "results").name != printed["run_dir"].rsplit("/", 1)[-1]


def test_train_args_can_switch_optimizer_and_pruning(e2e):
    """TRAIN_ARGS --optimizer sgd on an AdamW .config: the Adam settings from .config
    stop applying and are left out instead of being refused; a knob that does not
    apply to what TRAIN_ARGS chose is still refused."""
    _, _, env, _, _ = e2e
    switch = "--optimizer sgd --pruning-method movement --target-sparsity 0.9"
    proc = run_make("train", "DRY_RUN=1", env={**env, "TRAIN_ARGS": switch})
    assert proc.returncode == 0, proc.stderr
    used = json.loads(proc.stdout[proc.stdout.index("{"):])["config"]
    assert (used["optimizer"], used["pruning_method"], used["target_sparsity"]) == (
        "sgd", "movement", 0.9)
    proc = run_make("train", "DRY_RUN=1", env={**env, "TRAIN_ARGS": "--muon-lr 0.05"})
    assert proc.returncode == 2 and "CONFIG_MUON_LR" in proc.stderr


def test_help_lists_targets_and_every_defconfig():
    proc = run_make("help")
    assert proc.returncode == 0
    for target in ("menuconfig", "olddefconfig", "savedefconfig", "listnewconfig", "generate",
                   "mrproper", "distclean", "TRAIN_ARGS", "bench-optim",
                   "test-matrix", "plots", "report", "MATRIX_JOBS", "bench"):
        assert target in proc.stdout
    for name in (REPO / "defconfigs").iterdir():
        assert name.name in proc.stdout


def test_unknown_defconfig_lists_the_real_ones(tmp_path):
    proc = run_make("defconfig-nope", env={"KCONFIG_CONFIG": str(tmp_path / "c")})
    assert proc.returncode != 0 and "gpt2-shakespeare-cpu" in proc.stderr


def test_no_config_says_which_command_to_run(tmp_path):
    proc = run_make(env={"KCONFIG_CONFIG": str(tmp_path / "missing")})
    assert proc.returncode != 0 and "make defconfig-gpt2-shakespeare-cpu" in proc.stderr


def test_cuda_config_without_a_gpu_stops_before_any_work(tmp_path, corpus):
    config = tmp_path / "config"
    config.write_text((REPO / "defconfigs" / "gpt2-shakespeare-l4").read_text() + "\n".join([
        f"CONFIG_DATA_DIR={_q(str(tmp_path / 'data'))}", f"CONFIG_DATA_INPUT={_q(str(corpus))}",
        f"CONFIG_RESULTS_DIR={_q(str(tmp_path / 'results'))}", ""]))
    env = {"KCONFIG_CONFIG": str(config), "CUDA_VISIBLE_DEVICES": ""}
    assert run_make("olddefconfig", env=env).returncode == 0
    proc = run_make(env=env)
    assert proc.returncode != 0
    assert "CONFIG_DEVICE" in proc.stderr and "defconfig-gpt2-shakespeare-cpu" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "results").exists()


def test_savedefconfig_round_trips_through_make(tmp_path):
    env = {"KCONFIG_CONFIG": str(tmp_path / "config"), "DEFCONFIG_OUT": str(tmp_path / "min")}
    assert run_make("defconfig-gpt2-shakespeare-l4", env=env).returncode == 0
    assert run_make("savedefconfig", env=env).returncode == 0
    body = [ln for ln in (REPO / "defconfigs" / "gpt2-shakespeare-l4").read_text().splitlines()
            if not ln.startswith("#")]
    assert (tmp_path / "min").read_text().splitlines() == body


def test_the_first_make_says_it_is_setting_up_and_for_how_long(tmp_path):
    """Before .venv exists, the first target creates it, minutes of quiet pip: the
    first line says so. (make -n: the recipe is printed, nothing installed.)"""
    import os
    import shutil
    import subprocess

    for name in ("Makefile", "requirements.txt", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    # (PYTHON: a `make PYTHON=... test` names an existing interpreter, skipping the setup)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "PYTHON")}
    proc = subprocess.run(["make", "--no-print-directory", "-n", "defconfig-gpt2-shakespeare-cpu"],
                          cwd=tmp_path, capture_output=True, text=True, env=env)
    first = proc.stdout.splitlines()[0]
    assert "installing PyTorch and the pinned requirements, once (a few minutes" in first
    assert "python3 -m venv .venv" in proc.stdout
