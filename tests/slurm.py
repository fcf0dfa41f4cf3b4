"""Helpers for the tests that use a real Slurm: the local cluster of scripts/slurm_cluster.py
started and stopped through its command line, and sbatch/squeue/scontrol/scancel against it.
The session fixture `slurm_cluster` (conftest.py) hands the tests a Cluster.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scripts import slurm_cluster

REPO = Path(__file__).resolve().parent.parent


def unavailable() -> str | None:
    """Why this machine cannot have a Slurm cluster (not root, packages missing), or None."""
    return slurm_cluster.cannot_run()


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """predicate()'s first true value within timeout seconds; AssertionError naming what."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


@dataclass
class Cluster:
    state: Path

    def script(self, command: str) -> subprocess.CompletedProcess:
        """`python -m scripts.slurm_cluster COMMAND --dir STATE`, run from the checkout."""
        return subprocess.run([sys.executable, "-m", "scripts.slurm_cluster", command,
                               "--dir", str(self.state)], cwd=REPO, capture_output=True,
                              text=True, timeout=120)

    @classmethod
    def start(cls, state: Path) -> Cluster:
        cluster = cls(state)
        r = cluster.script("start")
        if r.returncode:
            # What did start (munge, slurmctld) stops: left running, it held the ports
            # and made every later cluster on this machine fail to start.
            cluster.script("stop")
            raise AssertionError(f"the Slurm cluster did not start:\n{r.stdout}{r.stderr}")
        return cluster

    def stop(self) -> None:
        r = self.script("stop")
        assert r.returncode == 0, f"the Slurm cluster did not stop:\n{r.stdout}{r.stderr}"

    @property
    def env(self) -> dict[str, str]:
        return slurm_cluster.env(self.state)

    @property
    def jobcomp_log(self) -> Path:
        return self.state / "jobcomp.log"

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({r.returncode}):\n"
                                 f"{r.stdout}{r.stderr}")
        return r

    def sbatch(self, *args: str) -> str:
        """Submit a batch job; its id."""
        return self.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]

    def queued(self, job: str) -> list[str]:
        """The states squeue shows for the job (one per array task; [] once it is gone)."""
        r = self.run("squeue", "-h", "-j", job, "-o", "%T", check=False)
        return r.stdout.split() if r.returncode == 0 else []

    def job(self, job: str) -> dict[str, str]:
        """`scontrol show job`'s fields ({} once the controller has forgotten the job)."""
        r = self.run("scontrol", "show", "job", job, check=False)
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout)) if r.returncode == 0 else {}

    def completions(self, job: str, field: str = "JobId") -> list[dict[str, str]]:
        """The completion log's lines whose ``field`` is ``job``, each as its fields:
        the job's own (JobId), or the tasks of job array JOB (ArrayJobId)."""
        if not self.jobcomp_log.exists():
            return []
        return [dict(re.findall(r"(\w+)=(\S*)", line))
                for line in self.jobcomp_log.read_text().splitlines()
                if f"{field}={job} " in line]

    def start_requeued(self, job: str, *updates: str) -> None:
        """Let a requeued job that is PENDING start soon, with ``updates`` (scontrol's
        FIELD=VALUE), rather than once its credential has expired. Not within the
        second of the requeue, though: slurmd refuses a credential made in the second
        its job was revoked ("Killing non-startable batch JobId=...: Job credential
        revoked", and the job fails), so it starts 2 s from now."""
        self.run("scontrol", "update", f"JobId={job}", *updates, "StartTime=now+2")

    def wait_gone(self, job: str, timeout: float = 20) -> None:
        wait_for(lambda: not self.queued(job), timeout, f"job {job} to leave squeue")
