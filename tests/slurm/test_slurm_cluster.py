"""The local Slurm cluster (scripts/slurm_cluster.py) does what the matrix's Slurm backend
will rely on: job arrays, a signal reaching the job's process, requeue with a restart count.
A few seconds in all; skipped (with the reason) where Slurm cannot be had."""

from __future__ import annotations

import sys
import textwrap

import pytest

from slurm import wait_for

pytestmark = pytest.mark.slurm

# A job's process: says it started (with its restart count), then waits; on SIGTERM it
# writes which signal reached it and exits 0, as kgpt's checkpoint-and-stop will.
HANDLER = textwrap.dedent("""\
    import os, signal, sys, time
    out = sys.argv[1]
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")

    def stop(sig, frame):
        with open(f"{out}/signal-{restart}", "w") as f:
            f.write(f"{sig} {os.environ['SLURM_JOB_ID']}")
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    open(f"{out}/started-{restart}", "w").close()
    time.sleep(120)
""")


@pytest.fixture
def handler_job(slurm_cluster, tmp_path):
    """Submits HANDLER as a batch job (its process is the batch step's, through exec);
    (job id, its output folder); the job is cancelled afterwards whatever happened."""
    (tmp_path / "handler.py").write_text(HANDLER)
    out = tmp_path / "out"
    out.mkdir()
    job = slurm_cluster.sbatch(f"--output={tmp_path}/slurm-%j.out", "--requeue",
                               f"--wrap=exec {sys.executable} {tmp_path}/handler.py {out}")
    wait_for(lambda: (out / "started-0").exists(), 15, f"job {job} to start")
    yield job, out
    slurm_cluster.run("scancel", "--full", job, check=False)
    slurm_cluster.wait_gone(job)


def test_start_is_idempotent_and_env_names_the_conf(slurm_cluster):
    again = slurm_cluster.script("start")
    assert again.returncode == 0 and again.stdout.startswith("already up"), again.stderr
    status = slurm_cluster.script("status")
    assert status.returncode == 0 and status.stdout.startswith("up:"), status.stdout
    env = slurm_cluster.script("env")
    assert env.stdout.strip() == f"export SLURM_CONF={slurm_cluster.state}/slurm.conf"
    assert slurm_cluster.run("sinfo", "-h", "-o", "%a %l").stdout.split() == ["up", "infinite"]


def test_job_array_runs_every_task(slurm_cluster, tmp_path):
    job = slurm_cluster.sbatch("--array=0-2", f"--output={tmp_path}/slurm-%A_%a.out",
                               f"--wrap=echo $SLURM_ARRAY_TASK_ID > {tmp_path}/task-"
                               "$SLURM_ARRAY_TASK_ID")
    slurm_cluster.wait_gone(job, timeout=30)
    for task in range(3):
        assert (tmp_path / f"task-{task}").read_text().strip() == str(task)
    # The completion log (no slurmdbd, so no sacct) has each task, completed.
    done = wait_for(lambda: len(slurm_cluster.completions(job, "ArrayJobId")) == 3 and
                    slurm_cluster.completions(job, "ArrayJobId"), 10, "3 completion lines")
    assert sorted(c["ArrayTaskId"] for c in done) == ["0", "1", "2"]
    assert {c["JobState"] for c in done} == {"COMPLETED"}


def test_scancel_signal_reaches_the_jobs_process(slurm_cluster, handler_job):
    job, out = handler_job
    # Without --full (or --batch) scancel signals the job's steps but not its batch step,
    # and a plain batch job has no other: the process hears nothing and keeps running.
    slurm_cluster.run("scancel", "--signal=TERM", job)
    try:
        wait_for(lambda: (out / "signal-0").exists(), 1.5, "")
        reached_anyway = True
    except AssertionError:
        reached_anyway = False
    assert not reached_anyway, "plain scancel --signal reached the batch step"
    assert slurm_cluster.queued(job) == ["RUNNING"]

    slurm_cluster.run("scancel", "--signal=TERM", "--full", job)
    wait_for(lambda: (out / "signal-0").exists(), 10, "SIGTERM to reach the job")
    assert (out / "signal-0").read_text() == f"15 {job}"
    slurm_cluster.wait_gone(job)
    # The handler exited 0: Slurm saw the job complete, not fail or be cancelled.
    states = wait_for(lambda: [c["JobState"] for c in slurm_cluster.completions(job)], 10,
                      "the job's completion line")
    assert states == ["COMPLETED"]


def test_requeue_runs_the_job_again(slurm_cluster, handler_job):
    job, out = handler_job
    assert slurm_cluster.job(job)["Restarts"] == "0"
    slurm_cluster.run("scontrol", "requeue", job)
    # Requeue stops the running job with SIGTERM first, so it can save its state.
    wait_for(lambda: (out / "signal-0").exists(), 10, "requeue's SIGTERM to reach the job")
    wait_for(lambda: slurm_cluster.job(job).get("JobState") == "PENDING", 15,
             "the requeued job to be pending")
    # Slurm holds a requeued job (Reason=BeginTime) until its credential expires.
    slurm_cluster.start_requeued(job)
    wait_for(lambda: (out / "started-1").exists(), 15, "the requeued job to run again")
    info = slurm_cluster.job(job)
    assert info["Restarts"] == "1" and info["JobState"] == "RUNNING"
