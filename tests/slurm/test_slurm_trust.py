"""The trust boundary on a real Slurm (the local cluster of scripts/slurm_cluster.py): a
.config is data, and never decides what code runs on the cluster; kgpt knows its jobs
by the ids it recorded, so a job renamed (or a neighbour's job given kgpt's name)
never makes it submit a cell twice or lose track of one.

No cell trains here: the jobs are submitted held (--hold) and cancelled at the end.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_make
from matrix_helpers import folder_of, run_matrix, tiny_matrix
from gpt2.slurm import script
from slurm import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.reliability]

SLURM = "CONFIG_MATRIX_BACKEND_SLURM=y\nCONFIG_SLURM_CPUS=1\n"


def with_setting(config: Path, name: str, value: str) -> None:
    """Set CONFIG_<name> in the complete .config ``config`` (its line replaced)."""
    lines = [ln for ln in config.read_text().splitlines()
             if not ln.startswith(f"CONFIG_{name}=") and ln != f"# CONFIG_{name} is not set"]
    config.write_text("\n".join(lines + [f"CONFIG_{name}={value}"]) + "\n")


def listed(cluster) -> set[str]:
    """Every job (array task) squeue lists."""
    return set(cluster.run("squeue", "-h", "--array", "-o", "%i").stdout.split())


def test_a_config_that_would_run_code_on_the_node_is_refused_and_submits_nothing(
        tmp_path, data_dir, slurm_cluster):
    """The attack: --export=ALL,BASH_ENV=<the .config> has bash source the .config as
    the job starts, and a .config line is valid shell, so a value's $(...) runs on the
    compute node. Refused when the .config is read, before anything is planned or
    submitted. (Abbreviated, as sbatch would also take it, it is refused the same way:
    test_slurm_config.py, without a cluster.)"""
    config = tiny_matrix(tmp_path, data_dir, extra=SLURM)
    pwned = tmp_path / "pwned"
    with_setting(config, "SAMPLE_PROMPT", f'"$(touch {pwned})"')
    before = listed(slurm_cluster)
    with_setting(config, "SLURM_EXTRA_OPTIONS", f'"--export=ALL,BASH_ENV={config}"')
    proc = run_matrix(config, "DETACH=1", env=slurm_cluster.env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "CONFIG_SLURM_EXTRA_OPTIONS" in proc.stderr and "--export: refused" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists()
    assert not pwned.exists()
    assert listed(slurm_cluster) == before


@pytest.mark.parametrize("shebang,runs", [(script.SHEBANG, False), ("#!/bin/bash", True)])
def test_a_job_script_sources_nothing_from_the_submitting_environment(
        tmp_path, slurm_cluster, shebang, runs):
    """Defence in depth: a job gets the submitting shell's environment, and kgpt's
    scripts read no BASH_ENV from it. The plain #!/bin/bash control shows the attack
    reaches the compute node when the script does not stop it."""
    pwned = tmp_path / "pwned"
    hostile = tmp_path / "hostile.config"
    hostile.write_text(f'CONFIG_SAMPLE_PROMPT="$(touch {pwned})"\n')
    job = tmp_path / "job.sbatch"
    text = script.render(["a job"], [f"--output={tmp_path}/job.out", "--cpus-per-task=1"],
                         [sys.executable, "-c", "print('ran')"])
    job.write_text(text.replace(script.SHEBANG, shebang, 1))
    env = {**slurm_cluster.env, "BASH_ENV": str(hostile)}
    out = subprocess.run(["sbatch", "--parsable", str(job)], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    slurm_cluster.wait_gone(out.stdout.strip(), timeout=60)
    wait_for(lambda: (tmp_path / "job.out").exists(), 10, "the job's output")
    assert (tmp_path / "job.out").read_text() == "ran\n"
    assert pwned.exists() == runs


def test_a_renamed_job_is_still_kgpts_and_nothing_is_submitted_twice(tmp_path, data_dir,
                                                                     slurm_cluster):
    """sbatch takes any unique prefix of an option, so --jo=renamed is --job-name: refused.
    A job renamed anyway (scontrol update, by the user) is found by its recorded id: a
    second DETACH=1 submits nothing and keeps the report job that waits for the array.
    A neighbour's job under kgpt's name is not taken for kgpt's."""
    config = tiny_matrix(tmp_path, data_dir, extra=SLURM)
    env = slurm_cluster.env
    with_setting(config, "SLURM_EXTRA_OPTIONS", '"--jo=renamed"')
    proc = run_matrix(config, "DETACH=1", env=env)
    assert proc.returncode == 2 and "--jo (sbatch's --job-name): kgpt sets it" in proc.stderr, \
        proc.stdout + proc.stderr
    with_setting(config, "SLURM_EXTRA_OPTIONS", '"--hold"')
    folder = folder_of(config)
    decoy = slurm_cluster.sbatch("--hold", f"--job-name=kgpt-{folder.name}",
                                 f"--output={tmp_path}/decoy.out", "--wrap=true")
    jobs = []
    try:
        first = run_matrix(config, "DETACH=1", env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "4 to submit" in first.stdout
        recorded = json.loads((folder / "slurm" / "jobs.json").read_text())
        array, report = recorded["arrays"][0]["job"], recorded["reports"][0]["job"]
        jobs = [array, report]
        assert decoy not in jobs
        slurm_cluster.run("scontrol", "update", f"JobId={array}", "JobName=renamed")
        again = run_matrix(config, "DETACH=1", env=env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "4 already queued or running on Slurm, 0 to submit" in again.stdout, again.stdout
        recorded = json.loads((folder / "slurm" / "jobs.json").read_text())
        assert [a["job"] for a in recorded["arrays"]] == [array]
        assert [r["job"] for r in recorded["reports"]] == [report]
        # (an array's tasks are written <array>_*)
        assert re.search(rf"afterany:{array}(_\*)?\(", slurm_cluster.job(report)["Dependency"])
        # matrix-status counts the held cells as queued, and not the decoy.
        shown = run_make("matrix-status", f"RUN={folder}", env=env)
        assert shown.returncode == 0 and "4 queued" in shown.stdout, shown.stdout
        # An id in jobs.json is believed only with its user and kgpt's script: the
        # decoy's id written into the record (a neighbour's edit, or an id the
        # controller reused) is never cancelled, by a new report job or by cancel.
        recorded["reports"].append({"job": decoy, "after": [array]})
        recorded["arrays"].append({"job": decoy, "array": "0", "cells": {}})
        (folder / "slurm" / "jobs.json").write_text(json.dumps(recorded))
        cancelled = run_make("matrix-cancel", f"RUN={folder}", env=env)
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert "cancelled 4 queued cell(s) and the report job " + report in cancelled.stdout
        assert slurm_cluster.queued(decoy) == ["PENDING"]
        assert slurm_cluster.queued(array) == [] and slurm_cluster.queued(report) == []
    finally:
        slurm_cluster.run("scancel", decoy, *jobs, check=False)
    for job in [decoy, *jobs]:
        slurm_cluster.wait_gone(job)


def test_a_single_run_renamed_on_slurm_is_not_submitted_again(tmp_path, data_dir,
                                                              slurm_cluster):
    """`make SLURM=1` records the job it submits and asks for it by id."""
    from test_slurm_config import CPU

    config = tmp_path / "config"
    config.write_text(CPU + f'CONFIG_DATA_DIR="{data_dir}"\n'
                      f'CONFIG_RESULTS_DIR="{tmp_path / "results"}"\n'
                      'CONFIG_SLURM_EXTRA_OPTIONS="--hold"\n')
    env = {**slurm_cluster.env, "KCONFIG_CONFIG": str(config)}
    assert run_make("olddefconfig", env=env).returncode == 0
    first = run_make("train", "SLURM=1", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    job = re.search(r"as job (\d+)", first.stdout)[1]
    try:
        slurm_cluster.run("scontrol", "update", f"JobId={job}", "JobName=renamed")
        again = run_make("train", "SLURM=1", env=env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"already pending as Slurm job {job}: nothing submitted" in again.stdout
    finally:
        slurm_cluster.run("scancel", job, check=False)
    slurm_cluster.wait_gone(job)
