"""The make variables a target reads (gpt2/cli/environment.py), in-process: each is
read exactly as typed, and a value that is not one of its forms is refused with the
message a user sees, never read as "off" or as a default. test_input_safety.py sends
hostile values through make itself."""

from __future__ import annotations

import pytest

from gpt2 import REPO
from gpt2.cli import environment as env
from gpt2.errors import UsageError

VARS = ("KCONFIG_CONFIG", "V", "DRY_RUN", "TRAIN_ARGS", "NGPU", "IF_CHANGED", "DETACH", "SLURM",
        "SMOKE")


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    env.say_once.cache_clear()


def refusal(call) -> str:
    with pytest.raises(UsageError) as err:
        call()
    return str(err.value)


def test_the_config_file_and_the_plain_switches(monkeypatch):
    assert env.config_path() == REPO / ".config"
    monkeypatch.setenv("KCONFIG_CONFIG", "/tmp/other config")
    assert str(env.config_path()) == "/tmp/other config"
    monkeypatch.setenv("KCONFIG_CONFIG", "")  # empty: the default, as make passes unset vars
    assert env.config_path() == REPO / ".config"
    assert (env.verbose(), env.dry_run()) == (False, False)
    for value, verbose in (("1", True), ("2", False), ("", False), ("yes", False)):
        monkeypatch.setenv("V", value)
        assert env.verbose() is verbose, value
    for value, dry in (("1", True), ("yes", True), ("0", False), ("", False)):
        monkeypatch.setenv("DRY_RUN", value)
        assert env.dry_run() is dry, value


def test_train_args_split_as_a_shell_would_and_ngpu_goes_first(monkeypatch):
    assert env.train_args() == []
    monkeypatch.setenv("TRAIN_ARGS", "--run-name 'a b' --note=\"$(x)\" ;")
    assert env.train_args() == ["--run-name", "a b", "--note=$(x)", ";"]
    monkeypatch.setenv("NGPU", "2")
    assert env.train_args()[:2] == ["--nproc-per-node=2", "--run-name"]
    monkeypatch.setenv("TRAIN_ARGS", "--flag 'open")
    assert refusal(env.train_args) == (
        "TRAIN_ARGS=\"--flag 'open\": no closing quotation: close each quote you open (a value "
        "with spaces goes in quotes: --flag 'a b')")
    monkeypatch.setenv("TRAIN_ARGS", "")
    for bad in ("0", "-1", "two", "²", "1.5"):
        monkeypatch.setenv("NGPU", bad)
        assert refusal(env.train_args) == (
            f"NGPU={bad!r} is not a number of processes: use e.g. NGPU=2 (one per GPU), or "
            "leave it out for one")
    for ngpu, procs in (("1", 1), ("08", 8)):
        monkeypatch.setenv("NGPU", ngpu)
        assert env.train_args() == [f"--nproc-per-node={procs}"]


def test_if_changed_and_the_zero_one_switches_refuse_anything_else(monkeypatch):
    assert env.if_changed() == "refuse"
    for value in ("refuse", "rerun", "reuse"):
        monkeypatch.setenv("IF_CHANGED", value)
        assert env.if_changed() == value
    monkeypatch.setenv("IF_CHANGED", "Rerun")
    assert refusal(env.if_changed) == (
        "IF_CHANGED='Rerun': use one of refuse, rerun, reuse (what to do with a result made "
        "under other code or data)")
    assert (env.detach(), env.slurm()) == (False, False)
    monkeypatch.setenv("DETACH", "1")
    monkeypatch.setenv("SLURM", "0")
    assert (env.detach(), env.slurm()) == (True, False)
    monkeypatch.setenv("DETACH", "yes")
    assert refusal(env.detach) == ("DETACH='yes': use DETACH=1 (submit the matrix's cells to "
                                   "Slurm and return at once) or leave it out")
    monkeypatch.setenv("SLURM", "true")
    assert refusal(env.slurm) == ("SLURM='true': use SLURM=1 (submit the run to Slurm with the "
                                  "Slurm menu's settings) or leave it out")


def test_smoke_shortens_the_run_and_says_so_once(monkeypatch, capsys):
    assert env.smoke() is None
    monkeypatch.setenv("SMOKE", "x")
    assert refusal(env.smoke) == "SMOKE='x' is not a number of steps: use e.g. SMOKE=20"
    monkeypatch.setenv("SMOKE", "20")
    adjust = env.smoke()
    values = {"max_iters": 2000, "warmup_iters": 100, "learning_rate": 6e-4}
    out = adjust(values)
    assert out["max_iters"] == 20 and out["warmup_iters"] == 1
    assert values["max_iters"] == 2000  # the caller's values are not changed
    adjust(values)
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err == ("  SMOKE   20 steps, the schedule scaled with them: max_iters 2000 -> 20, "
                   "warmup_iters 100 -> 1, run_name gpt2 -> gpt2-smoke\n")


def test_smoke_scales_every_step_count_of_the_schedule(monkeypatch):
    """Each interval shrinks by N / max_iters (here 1/100) to the value a full run's
    schedule has at that length: an unscaled pruning frequency or checkpoint interval
    would never fire in the short run. The method's own step counts (SPAM's reset
    interval) and the rates are left alone."""
    monkeypatch.setenv("SMOKE", "10")
    values = {"max_iters": 1000, "warmup_iters": 100, "eval_interval": 260,
              "log_interval": 200, "checkpoint_interval": 500, "pruning_warmup": 300,
              "pruning_frequency": 400, "hellaswag_interval": 700, "schedule_iters": 900,
              "spam_reset_interval": 500, "learning_rate": 6e-4, "run_name": "x"}
    out = env.smoke()(values)
    assert {k: out[k] for k in values} == {
        "max_iters": 10, "warmup_iters": 1, "eval_interval": 3, "log_interval": 2,
        "checkpoint_interval": 5, "pruning_warmup": 3, "pruning_frequency": 4,
        "hellaswag_interval": 7, "schedule_iters": 9, "spam_reset_interval": 500,
        "learning_rate": 6e-4, "run_name": "x-smoke"}
    # An interval never shrinks to 0 (an update every step, or none at all).
    out = env.smoke()({"max_iters": 1000, "pruning_frequency": 20, "checkpoint_interval": 20})
    assert (out["pruning_frequency"], out["checkpoint_interval"]) == (1, 1)
