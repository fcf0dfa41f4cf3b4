"""The Slurm settings without a cluster: every symbol of the Slurm menu reaches the
scripts, bad values are refused naming the symbol, options kgpt sets itself cannot
be given twice, the scripts say what they should. Fast; no Slurm needed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from helpers import REPO, run_make
from gpt2.config import kconfig, slurm
from gpt2.config.slurm import SlurmSettings, time_limit_seconds
from gpt2.errors import SlurmError
from gpt2.matrix.slurm_backend import array_spec
from gpt2.slurm import commands, script, single_run, task

CPU = "CONFIG_MODEL_SIZE_CUSTOM=y\nCONFIG_DEVICE_CPU=y\nCONFIG_DTYPE_FLOAT32=y\n"


@pytest.fixture(scope="module")
def complete(tmp_path_factory):
    """A complete .config (as `make olddefconfig` leaves it), made once: each test
    changes a copy."""
    path = tmp_path_factory.mktemp("config") / "config"
    path.write_text(CPU)
    proc = run_make("olddefconfig", env={"KCONFIG_CONFIG": str(path)})
    assert proc.returncode == 0, proc.stderr
    return path.read_text()


def dotconfig(tmp_path, complete: str, settings: dict[str, str] | None = None):
    """The complete .config with ``settings`` (symbol -> value as written) changed."""
    lines = complete.splitlines()
    for name, value in (settings or {}).items():
        i = next(i for i, ln in enumerate(lines) if ln.startswith(f"CONFIG_{name}=")
                 or ln == f"# CONFIG_{name} is not set")
        lines[i] = f"CONFIG_{name}={value}"
    path = tmp_path / "config"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.e2e
def test_every_slurm_symbol_reaches_the_settings(tmp_path, complete):
    path = dotconfig(tmp_path, complete, {
        "SLURM_PARTITION": '"gpu,gpu-long"', "SLURM_ACCOUNT": '"proj-42"',
        "SLURM_QOS": '"high"', "SLURM_TIME_LIMIT": '"1-12:00"', "SLURM_SIGNAL_MARGIN": "600",
        "SLURM_GPUS": "4", "SLURM_CPUS": "32", "SLURM_MEM": '"240G"',
        "SLURM_MAX_RUNNING": "8", "SLURM_NODES": "2",
        "SLURM_EXTRA_OPTIONS": '"--constraint=h100 --exclusive"'})
    assert set(slurm.SYMBOLS) <= set(re.findall(r"CONFIG_(SLURM_\w+)=", path.read_text()))
    got = kconfig.to_slurm(kconfig.load(path, complete=True))
    assert got == SlurmSettings(partition="gpu,gpu-long", account="proj-42", qos="high",
                                time_limit="1-12:00", signal_margin=600, gpus=4, cpus=32,
                                mem="240G", max_running=8, nodes=2,
                                extra_options=("--constraint=h100", "--exclusive"))
    # ... and each one is an #SBATCH line of a job that asks for them.
    assert script.resources(got, nodes=2) == [
        "--nodes=2", "--ntasks-per-node=1", "--partition=gpu,gpu-long", "--account=proj-42",
        "--qos=high", "--time=1-12:00", "--mem=240G", "--cpus-per-task=32", "--gres=gpu:4",
        "--constraint=h100", "--exclusive"]
    assert script.requeueing(got) == ["--signal=B:USR1@600", "--requeue", "--open-mode=append"]
    default = tmp_path / "default"
    default.write_text(complete)
    assert kconfig.to_slurm(kconfig.load(default, complete=True)) == SlurmSettings()


def test_the_backend_choice_offers_exactly_the_backends():
    kconf = kconfig.new_kconfig()
    entries = [s.name for s in kconf.named_choices["MATRIX_BACKEND"].syms]
    assert entries == [f"MATRIX_BACKEND_{b.upper()}" for b in slurm.BACKENDS]


@pytest.mark.parametrize("text,seconds", [
    ("90", 5400), ("1:30", 90), ("4:00:00", 14400), ("2-00", 172800), ("2-3:04", 183840),
    ("2-3:04:05", 183845), ("0:45", 45)])
def test_time_limits_read_as_slurm_reads_them(text, seconds):
    assert time_limit_seconds(text) == seconds


@pytest.mark.e2e
@pytest.mark.parametrize("symbol,value,says", [
    ("SLURM_TIME_LIMIT", "4h", "not a Slurm time limit"),
    ("SLURM_TIME_LIMIT", "0", "longer than 0"),
    ("SLURM_MEM", "32 GB", "not a memory size"),
    ("SLURM_PARTITION", "gpu;reboot", "not a Slurm name"),
    ("SLURM_EXTRA_OPTIONS", "--output=/tmp/x", "--output: kgpt sets it"),
    ("SLURM_EXTRA_OPTIONS", "--time=10", f"set {slurm.TIME_LIMIT}"),
    ("SLURM_TIME_LIMIT", "\u0661\u0660", "not a Slurm time limit"),  # Arabic-Indic "10"
    ("SLURM_EXTRA_OPTIONS", "--comment=$(reboot)", "--comment=$(reboot): not a value of"),
    ("SLURM_EXTRA_OPTIONS", "-C h100", "write sbatch's long options"),
])
def test_a_bad_slurm_value_is_refused_naming_the_symbol(tmp_path, complete, symbol, value,
                                                        says):
    path = dotconfig(tmp_path, complete, {symbol: f'"{value}"'})
    with pytest.raises(kconfig.KconfigError) as e:
        kconfig.load(path, complete=True)
    assert f"CONFIG_{symbol}" in str(e.value) and says in str(e.value)
    # The configuration tools refuse it as it is typed, with the same reason.
    assert says in kconfig.value_problem(symbol, value)


@pytest.mark.parametrize("options,says", [
    # Options that change what runs on the node: refused however they are written.
    ("--export=ALL,BASH_ENV=/home/me/.config", "--export: refused, it sets the job's "
                                               "environment"),
    ("--export=LD_PRELOAD=/tmp/x.so", "--export: refused"),
    ("--exp=ALL,PYTHONPATH=/tmp", "--exp: sbatch reads it as one of --export, --export-file"),
    ("--get-u", "--get-u (sbatch's --get-user-env): refused"),
    ("--export-file=/tmp/env", "--export-file: refused"),
    ("--get-user-env", "--get-user-env: refused"),
    ("--propagate", "--propagate: refused"),
    ("--container=/tmp/bundle", "--container: refused"),
    ("--uid=0", "--uid: refused"),
    ("--bbf=/tmp/stage.sh", "--bbf: refused"),
    # Options kgpt writes itself, abbreviated as sbatch allows.
    ("--outp=/tmp/x", "--outp (sbatch's --output): kgpt sets it"),
    ("--arr=0-3", "--arr (sbatch's --array): kgpt sets it"),
    ("--sig=USR1@1", "--sig (sbatch's --signal): kgpt sets it"),
    ("--signal=B:USR1@1", "--signal: kgpt sets it"),
    ("--chd=/tmp", "--chd (sbatch's --chdir): kgpt sets it"),
    ("--dep=afterok:1", "--dep (sbatch's --dependency): kgpt sets it"),
    ("--jo=renamed", "--jo (sbatch's --job-name): kgpt sets it"),
    ("--clusters=other", "--clusters: kgpt sets it"),
    # Prefixes of several options, unknown options, options not on the list.
    ("--e=x", "--e: sbatch reads it as one of"),
    ("--outputt=/tmp/x", "--outputt: not an sbatch option"),
    ("--begin=now+1hour", "--begin: not one of the sbatch options kgpt passes on"),
    ("--mem-per-cpu=4G", "--mem-per-cpu: not one of the sbatch options"),
    # Values of the allowed ones.
    ("--gres=gpu:a100:2", "set the GPUs with SLURM_GPUS"),
    ("--gres=nvme:1,GPU:1", "set the GPUs with SLURM_GPUS"),
    ("--constraint", "--constraint needs a value"),
    ("--contiguous=yes", "--contiguous takes no value"),
    ("--mail-type=END,SOMETIMES", "--mail-type=END,SOMETIMES: not a value of --mail-type"),
    ("--exclusive=everyone", "not a value of --exclusive"),
    ("--nodelist=gpu01;reboot", "not a value of --nodelist"),
    ("--constraint=a100 --constr=h100", "--constraint is given twice"),
])
def test_extra_sbatch_options_pass_only_from_the_allowlist(options, says):
    """Each option is judged by the full name sbatch expands it to, never by what was
    typed: sbatch reads any unique prefix as the option (--jo= renames the job)."""
    with pytest.raises(ValueError) as e:
        slurm.parse_extra_options(options)
    assert says in str(e.value)


def test_allowed_options_are_written_under_their_full_names():
    assert slurm.parse_extra_options(
        "--constr=a100&ib --exclus --mail-t=end,FAIL --nodel=gpu[01-04] --comment=ablation-3 "
        "--oversub --nice") == (
        "--constraint=a100&ib", "--exclusive", "--mail-type=end,FAIL", "--nodelist=gpu[01-04]",
        "--comment=ablation-3", "--oversubscribe", "--nice")
    # Every allowed option is sbatch's, and none is one kgpt sets or one that sets the
    # environment.
    assert set(slurm.ALLOWED) <= slurm.SBATCH_OPTIONS
    assert not set(slurm.ALLOWED) & (set(slurm.OWN_OPTIONS) | set(slurm.ENVIRONMENT))
    assert set(slurm.OWN_OPTIONS) | set(slurm.ENVIRONMENT) <= slurm.SBATCH_OPTIONS


def test_the_extra_options_help_lists_exactly_the_allowed_options():
    """The Slurm menu's help is where a user learns what passes: it names every
    allowed option, and no other (so the list cannot drift from the check)."""
    kconf = kconfig.new_kconfig()
    text = kconf.syms[slurm.EXTRA_OPTIONS].nodes[0].help
    listed = text[:text.index("An abbreviation")]
    assert set(re.findall(r"--([a-z][a-z-]*)", listed)) == set(slurm.ALLOWED)


def test_a_users_gres_joins_kgpts_gpus_in_one_line():
    """sbatch keeps only the last --gres line: the GPUs and a user's other generic
    resources must be one."""
    got = script.resources(SlurmSettings(gpus=2, extra_options=slurm.parse_extra_options(
        "--gres=nvme:1 --exclusive")))
    assert [d for d in got if d.startswith("--gres")] == ["--gres=gpu:2,nvme:1"]
    assert got[-1] == "--exclusive"
    alone = script.resources(SlurmSettings(extra_options=("--gres=nvme:1",)))
    assert [d for d in alone if d.startswith("--gres")] == ["--gres=nvme:1"]


@pytest.mark.e2e
def test_a_job_script_runs_nothing_its_environment_names(tmp_path):
    """sbatch hands the job the submitting shell's environment. The script must not run
    a file BASH_ENV names, nor an exported function in place of a builtin (cd), nor
    follow CDPATH: a line of a .config is valid shell, so BASH_ENV=<a .config> would
    run its $(...) values."""
    hostile = tmp_path / "hostile.config"
    hostile.write_text(f'CONFIG_SAMPLE_PROMPT="$(touch {tmp_path}/pwned-bash-env)"\n')
    command = [sys.executable, "-c", "import os; print(os.getcwd())"]
    job = tmp_path / "job.sbatch"
    job.write_text(script.render(["a job"], ["--signal=B:USR1@60"], command))
    job.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / REPO.name).mkdir(parents=True)
    env = {**os.environ, "BASH_ENV": str(hostile), "ENV": str(hostile),
           "CDPATH": str(elsewhere),
           "BASH_FUNC_cd%%": f"() {{ touch {tmp_path}/pwned-function; }}",
           "BASH_FUNC_trap%%": f"() {{ touch {tmp_path}/pwned-function; }}"}
    out = subprocess.run([str(job)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{REPO}\n"  # the builtin cd, into this checkout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "hostile.config",
                                                          "job.sbatch"]


@pytest.mark.e2e
def test_make_refuses_a_bad_slurm_value_before_doing_anything(tmp_path, complete):
    path = dotconfig(tmp_path, complete, {"RESULTS_DIR": f'"{tmp_path / "results"}"',
                                          "SLURM_MEM": '"lots"'})
    proc = run_make("train", env={"KCONFIG_CONFIG": str(path)})
    assert proc.returncode != 0 and "CONFIG_SLURM_MEM" in proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("var,value,says", [
    ("SLURM", "yes", "SLURM='yes': use SLURM=1"),
    ("DETACH", "2", "DETACH='2': use DETACH=1"),
])
def test_slurm_switches_take_only_0_or_1(tmp_path, complete, var, value, says):
    path = dotconfig(tmp_path, complete)
    proc = run_make("train", f"{var}={value}", env={"KCONFIG_CONFIG": str(path)})
    assert proc.returncode != 0 and says in proc.stderr, proc.stderr


@pytest.mark.e2e
def test_detach_needs_the_slurm_backend_and_slurm_1_a_single_run(tmp_path):
    path = tmp_path / "config"
    path.write_text(CPU + "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\n"
                          "CONFIG_MATRIX_PRUNING_NONE=y\n")
    assert run_make("olddefconfig", env={"KCONFIG_CONFIG": str(path)}).returncode == 0
    env = {"KCONFIG_CONFIG": str(path)}
    proc = run_make("test-matrix", "DETACH=1", env=env)
    assert proc.returncode != 0 and "CONFIG_MATRIX_BACKEND_LOCAL" in proc.stderr
    proc = run_make("test-matrix", "SLURM=1", env=env)
    assert proc.returncode != 0 and "CONFIG_MATRIX_BACKEND_SLURM" in proc.stderr


@pytest.mark.e2e
def test_matrix_jobs_is_the_local_backends_and_slurm_refuses_it(tmp_path):
    path = tmp_path / "config"
    path.write_text(CPU + "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\n"
                          "CONFIG_MATRIX_PRUNING_NONE=y\nCONFIG_MATRIX_BACKEND_SLURM=y\n")
    env = {"KCONFIG_CONFIG": str(path)}
    assert run_make("olddefconfig", env=env).returncode == 0
    assert "CONFIG_MATRIX_JOBS" not in path.read_text()
    proc = run_make("test-matrix", "MATRIX_JOBS=2", "DRY_RUN=1", env=env)
    assert proc.returncode != 0 and "CONFIG_SLURM_MAX_RUNNING" in proc.stderr, proc.stderr
    # Written into a Slurm .config, it is a setting whose dependency is off.
    path.write_text(path.read_text() + "CONFIG_MATRIX_JOBS=2\n")
    with pytest.raises(kconfig.KconfigError, match="CONFIG_MATRIX_JOBS"):
        kconfig.load(path, complete=True)


@pytest.mark.parametrize("indices,limit,spec", [
    ([0, 1, 2, 5, 7, 8], 0, "0-2,5,7-8"), ([4], 0, "4"), ([3, 1, 2], 2, "1-3%2"),
    (list(range(100)), 10, "0-99%10")])
def test_array_spec_names_exactly_the_cells(indices, limit, spec):
    assert array_spec(indices, limit) == spec


def test_a_single_runs_script_says_everything_about_its_job(tmp_path):
    settings = SlurmSettings(time_limit="2:00:00", gpus=8, cpus=64, nodes=2)
    text = single_run.render_script(tmp_path, "gpt2-abc", ["--max-iters=5", "--run-name=a b"],
                                    settings, nproc=8)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash -p"
    directives = [ln.removeprefix("#SBATCH ") for ln in lines if ln.startswith("#SBATCH ")]
    assert directives == [
        "--job-name=kgpt-gpt2-abc", f"--output={tmp_path}/slurm/gpt2-abc-%j.out", "--nodes=2",
        "--ntasks-per-node=1", "--time=2:00:00", "--cpus-per-task=64", "--gres=gpu:8",
        "--signal=B:USR1@300", "--requeue", "--open-mode=append"]
    assert lines[-2] == f"cd {REPO}"
    # The flags reach the task runner as bash reads them: one word each, quoted.
    assert lines[-1] == (f"exec {sys.executable} -m gpt2.slurm.task run --per-node -- "
                         "--max-iters=5 '--run-name=a b'")
    one = single_run.render_script(tmp_path, "gpt2-abc", [], SlurmSettings(), nproc=1)
    assert "--per-node" not in one and "#SBATCH --nodes=1\n" in one


def test_a_path_sbatch_would_split_is_refused(tmp_path):
    with pytest.raises(SlurmError, match="cannot take this path"):
        script.safe_path(tmp_path / "my results")


def test_the_rendezvous_comes_from_slurms_environment(monkeypatch):
    monkeypatch.setattr(commands, "run", lambda argv: "node07\nnode08\n"
                        if argv[:3] == ["scontrol", "show", "hostnames"] else "")
    env = {"SLURM_JOB_NODELIST": "node[07-08]", "SLURM_JOB_ID": "123456", "SLURM_NNODES": "2"}
    assert task.rendezvous(env) == ["--nnodes=2", "--rdzv_backend=c10d",
                                    "--rdzv_endpoint=node07:23456", "--rdzv_id=123456"]


def test_without_slurm_the_error_says_where_to_run(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SlurmError, match="`sbatch` is not on PATH: run this on a machine of "
                                         "the cluster"):
        commands.submit(REPO / "x.sbatch")


def stub_scontrol(tmp_path, job_id: str) -> dict[str, str]:
    """The environment of job ``job_id`` with a stand-in scontrol that appends what it
    is asked to tmp_path/scontrol."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/scontrol\n")
    (bin_dir / "scontrol").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": job_id}


def supervise(tmp_path, child: str, signals: tuple[str, ...], job_id: str):
    """Run ``child`` (Python source; it creates the file named by its argument once
    started) under the Slurm task's Supervisor as job ``job_id``, send this process
    ``signals`` once the child is up, and return (exit status, finish status, what
    the supervisor said, what was asked of a stub scontrol)."""
    kills = "".join(f"    os.kill(os.getpid(), signal.{name})\n" for name in signals)
    driver = (
        "import os, signal, sys, threading, time\n"
        "from gpt2.slurm.task import Supervisor\n"
        "said = []\n"
        "s = Supervisor(said.append)\n"
        f"ready = {str(tmp_path / 'ready')!r}\n"
        "def poke():\n"
        "    while not os.path.exists(ready): time.sleep(0.05)\n"
        f"{kills}"
        "threading.Thread(target=poke, daemon=True).start()\n"
        f"rc = s.run([sys.executable, '-c', {child!r}, ready])\n"
        "print(rc, s.finish(rc), '|'.join(said))\n")
    out = subprocess.run([sys.executable, "-c", driver], cwd=REPO,
                         env=stub_scontrol(tmp_path, job_id), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    rc, finished, said = out.stdout.strip().split(" ", 2)
    return rc, finished, said, (tmp_path / "scontrol").read_text()


@pytest.mark.e2e
def test_the_task_runner_stops_its_child_once_and_asks_for_a_requeue_at_the_limit(tmp_path):
    """SIGUSR1 (the time limit is near) reaches the child as one SIGTERM; the child's
    exit 130 (saved) makes the runner ask Slurm for a requeue, here a stand-in
    scontrol that records the request."""
    child = ("import signal, sys, time\n"
             "got = []\n"
             "signal.signal(signal.SIGTERM, lambda s, f: got.append(s))\n"
             "open(sys.argv[1], 'w').close()\n"
             "while not got: time.sleep(0.05)\n"
             "time.sleep(0.3)\n"
             "sys.exit(130 if got == [signal.SIGTERM] else 1)\n")
    rc, finished, said, requeued = supervise(tmp_path, child, ("SIGUSR1", "SIGTERM"), "77")
    assert (rc, finished) == ("130", "0")
    assert "SIGUSR1 received: the time limit is near" in said and "requeued" in said
    assert requeued == "requeue 77\n"


@pytest.mark.e2e
def test_a_child_stopped_before_it_could_save_is_requeued_as_interrupted(tmp_path):
    """The time limit can be signalled seconds into a job, while training is still
    starting (no handler yet): the child dies of the SIGTERM with nothing new to lose,
    and the cell is interrupted and requeued, not failed."""
    child = "import sys, time\nopen(sys.argv[1], 'w').close()\ntime.sleep(60)\n"
    rc, finished, said, requeued = supervise(tmp_path, child, ("SIGUSR1",), "78")
    assert (rc, finished) == ("130", "0")
    assert "still starting when it was stopped" in said and "requeued" in said
    assert requeued == "requeue 78\n"


@pytest.mark.e2e
@pytest.mark.parametrize("told", [True, False])
def test_a_script_told_of_its_time_limit_outlives_the_signal_until_its_command_listens(
        tmp_path, told):
    """Slurm may send the time-limit signal up to a minute early: with a short limit, in
    the job's first moments, before the task runner has a handler. The script ignores
    it until then (a script without --signal keeps the default, which ends it)."""
    command = [sys.executable, "-c",
               "import os, signal; os.kill(os.getpid(), signal.SIGUSR1); print('alive')"]
    text = script.render(["a job"], ["--signal=B:USR1@60"] if told else [], command)
    (tmp_path / "job.sbatch").write_text(text)
    out = subprocess.run(["bash", str(tmp_path / "job.sbatch")], capture_output=True,
                         text=True, timeout=60)
    if told:
        assert (out.returncode, out.stdout) == (0, "alive\n"), out.stderr
    else:
        assert out.returncode == -signal.SIGUSR1 and out.stdout == ""


@pytest.mark.e2e
def test_a_time_limit_signal_before_training_starts_stops_the_cell_and_requeues_it(tmp_path):
    """The signal can come while the cell's task is still importing torch: the task
    listens from its start, logs the signal once the cell's log is open, stops
    training as soon as it starts, and has the job requeued; the cell is interrupted,
    not failed."""
    folder = tmp_path / "matrix"
    folder.mkdir()
    (folder / "plan.yaml").write_text(
        "name: m\nhash: h\ncells:\n- id: c0\n  config_hash: abc\n  args: [--max-iters=1]\n"
        "  optimizer: adamw\n  pruning: none\n  seed: 1\n")
    driver = (
        "import os, signal, sys\n"
        "from gpt2.slurm import task\n"
        "cell = task.run_cell\n"
        "def early(*args):\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)  # before run_cell imports anything\n"
        "    return cell(*args)\n"
        "task.run_cell = early\n"
        f"sys.exit(task.main(['cell', {str(folder)!r}]))\n")
    env = {**stub_scontrol(tmp_path, "79"), "SLURM_ARRAY_TASK_ID": "0"}
    out = subprocess.run([sys.executable, "-c", driver], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "scontrol").read_text() == "requeue 79\n"
    log = (folder / "cells" / "c0" / "train.log").read_text().splitlines()
    assert log[0].startswith("==== ") and log[0].endswith("starts this cell")
    assert log[1] == ("kgpt task: SIGUSR1 received: the time limit is near: stopping "
                      "training at a checkpoint")
    assert "kgpt task: training was still starting when it was stopped; nothing new to " \
        "save" in log
    entry = json.loads((folder / "status.json").read_text())["c0"]
    assert (entry["status"], entry["requeued"], entry["attempts"]) == ("interrupted", True, 1)
