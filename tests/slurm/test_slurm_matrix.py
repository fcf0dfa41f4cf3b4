"""The matrix's Slurm backend against a real Slurm (the local cluster of
scripts/slurm_cluster.py): the tiny matrix submitted as a job array gets exactly the
results the local runner gets (tests/conftest.py's matrix_reference), however its
cells are stopped on the way: cancelled, at their time limit, failing.

Cells whose results the test does not need to make again are copied from the local
reference (they are the same code, data and configuration, so the backend counts
them completed and submits only the others). KGPT_FAULTS=slow-steps makes a cell
last long enough to be stopped from outside; it changes nothing computed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, run_make
from matrix_helpers import CELLS, folder_of, read_csv, run_matrix, stable, tiny_matrix
from slurm import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

SLURM = "CONFIG_MATRIX_BACKEND_SLURM=y\nCONFIG_SLURM_CPUS=1\n"


@pytest.fixture
def slurm(slurm_cluster) -> dict[str, str]:
    """The environment make needs to reach the test cluster; the watcher polls fast."""
    return {**slurm_cluster.env, "KGPT_SLURM_POLL_S": "0.5"}


def slurm_matrix(tmp: Path, data_dir: Path, reference: Path, extra: str = "",
                 keep: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """The tiny matrix on the Slurm backend: (.config, folder); the cells not named
    in ``keep`` are copied, completed, from the reference folder."""
    config = tiny_matrix(tmp, data_dir, extra=SLURM + extra)
    folder = folder_of(config)
    for cell in CELLS:
        if keep and cell not in keep:
            shutil.copytree(reference / "cells" / cell, folder / "cells" / cell)
    return config, folder


def metrics(folder: Path, cell: str) -> list[tuple]:
    """A cell's logged losses, learning rates and sparsities, step by step."""
    rows = [json.loads(line) for line in
            (folder / "cells" / cell / "metrics.jsonl").read_text().splitlines()]
    return [tuple(r.get(k) for k in ("step", "loss", "val_loss", "lr", "sparsity"))
            for r in rows]


def logged_step(folder: Path, cell: str) -> int:
    path = folder / "cells" / cell / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return max((json.loads(line).get("step", 0) for line in lines if line.strip()), default=0)


def status(folder: Path) -> dict:
    return json.loads((folder / "status.json").read_text())


def test_a_detached_slurm_matrix_gets_the_local_runners_results(tmp_path, data_dir,
                                                                 matrix_reference, slurm):
    _, reference, _ = matrix_reference
    config, folder = slurm_matrix(tmp_path, data_dir, reference)
    first = run_matrix(config, "DETACH=1", env=slurm)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "4 cells: 0 completed, 0 already queued or running on Slurm, 4 to submit" \
        in first.stdout
    report_job = re.search(r"detached: job (\d+) writes the report", first.stdout)[1]
    # Again while the array is queued or running: nothing is submitted twice, and the
    # report job that waits for the array is kept.
    again = run_matrix(config, "DETACH=1", env=slurm)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 to submit" in again.stdout and "submitted job array" not in again.stdout
    assert f"detached: job {report_job} writes the report" in again.stdout
    jobs = json.loads((folder / "slurm" / "jobs.json").read_text())
    assert len(jobs["arrays"]) == 1 and [r["job"] for r in jobs["reports"]] == [report_job]
    array = jobs["arrays"][0]["job"]
    # The report job writes summary, plots and report once the array has ended.
    wait_for(lambda: (folder / "report.md").exists(), 240, "the report job's report.md", 1)
    assert stable(read_csv(folder)) == stable(read_csv(reference))
    for i, cell in enumerate(CELLS):
        assert metrics(folder, cell) == metrics(reference, cell), cell
        log = (folder / "cells" / cell / "train.log").read_text()
        assert f"Slurm job {array}_{i} " in log, log[:300]
        assert status(folder)[cell]["slurm_job"] == f"{array}_{i}"
    report = (folder / "report.md").read_text()
    assert f"as job array(s) {array} " in report
    assert f"| `{CELLS[3]}` | completed |" in report and f"| {array}_3 |" in report
    script = (folder / "slurm" / "cells.sbatch").read_text()
    assert "#SBATCH --cpus-per-task=1\n" in script and "#SBATCH --signal=B:USR1@300\n" in script
    shown = run_make("matrix-status", f"RUN={folder}", env=slurm)
    assert shown.returncode == 0, shown.stderr
    assert "4 cells: 4 completed" in shown.stdout and f"{array}_2" in shown.stdout


def test_a_cancelled_cell_saves_a_checkpoint_and_the_rerun_resumes_it_exactly(
        tmp_path, data_dir, matrix_reference, slurm, slurm_cluster):
    _, reference, _ = matrix_reference
    config, folder = slurm_matrix(tmp_path, data_dir, reference, "CONFIG_SLURM_MAX_RUNNING=1\n",
                                  keep=(CELLS[0], CELLS[1]))
    slow = {**slurm, "KGPT_FAULTS": "slow-steps"}
    first = run_matrix(config, "DETACH=1", env=slow)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 to submit" in first.stdout
    assert json.loads((folder / "slurm" / "jobs.json").read_text())["arrays"][0]["array"] \
        == "0-1%1"
    wait_for(lambda: logged_step(folder, CELLS[0]) >= 10, 120, f"{CELLS[0]} to reach step 10",
             0.5)
    # Meanwhile the local runner will not train the same cells beside Slurm.
    local = config.with_name("local-config")
    local.write_text(config.read_text().replace(
        "# CONFIG_MATRIX_BACKEND_LOCAL is not set\nCONFIG_MATRIX_BACKEND_SLURM=y",
        "CONFIG_MATRIX_BACKEND_LOCAL=y\n# CONFIG_MATRIX_BACKEND_SLURM is not set\n"
        "CONFIG_MATRIX_JOBS=1"))
    assert "CONFIG_MATRIX_BACKEND_LOCAL=y" in local.read_text()
    refused = run_matrix(local, env=slurm)
    assert refused.returncode != 0 and "queued or running on Slurm" in refused.stderr, \
        refused.stdout + refused.stderr
    cancel = run_make("matrix-cancel", f"RUN={folder}", env=slurm)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    # One cell was running (at most one at a time), one waiting behind it.
    assert "cancelled 1 queued cell(s) and the report job" in cancel.stdout
    assert "1 running cell(s) told to save a checkpoint" in cancel.stdout
    summary = json.loads((folder / "cells" / CELLS[0] / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert status(folder)[CELLS[0]]["status"] == "interrupted"
    assert not status(folder)[CELLS[0]]["requeued"]
    shown = run_make("matrix-status", f"RUN={folder}", env=slurm)
    assert "2 completed, 1 interrupted, 1 pending" in shown.stdout, shown.stdout
    # The rerun (waiting this time, without the slow steps) resumes the cell and
    # starts the cancelled one; every cell ends as in the local run.
    rerun = run_matrix(config, env=slurm)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "2 completed, 0 already queued or running on Slurm, 2 to submit (1 to resume" \
        in rerun.stdout
    assert re.search(rf"\[[34]/4\] {CELLS[0]} completed in .*: val loss", rerun.stdout)
    assert re.search(r"\[4/4\] .* completed .*\| 0 running, 0 queued, 0 failed", rerun.stdout)
    log = (folder / "cells" / CELLS[0] / "train.log").read_text()
    assert log.count("starts this cell") == 2 and "resum" in log
    assert metrics(folder, CELLS[0]) == metrics(reference, CELLS[0])
    assert stable(read_csv(folder)) == stable(read_csv(reference))


def test_a_cell_at_its_time_limit_checkpoints_requeues_and_finishes_exactly(
        tmp_path, data_dir, matrix_reference, slurm, slurm_cluster):
    _, reference, _ = matrix_reference
    # A one-minute limit, told 25 s before it. Slurm checks limits every 30 s and sends
    # the signal at the first check less than margin + 30 s before the limit: 5 to 35 s
    # into the cell, which lasts over 40 s. (Told 55 s before, it came in the job's
    # first second: the task runner can take that, but not a signal in the moment
    # before it starts listening, which is lost.) On a busy machine it can come while
    # training is still starting: the cell is then requeued with nothing saved, and
    # starts afresh in its next allocation.
    config, folder = slurm_matrix(
        tmp_path, data_dir, reference,
        'CONFIG_SLURM_TIME_LIMIT="1"\nCONFIG_SLURM_SIGNAL_MARGIN=25\n', keep=(CELLS[0],))
    slow = {**slurm, "KGPT_FAULTS": "slow-steps"}
    submitted = run_matrix(config, "DETACH=1", env=slow)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    log = folder / "cells" / CELLS[0] / "train.log"
    wait_for(lambda: log.exists() and "requeued to continue" in log.read_text(), 120,
             "the cell to requeue itself", 0.5)
    # The task logs the requeue, then records it in status.json: wait for the record.
    wait_for(lambda: status(folder)[CELLS[0]].get("requeued"), 30,
             "status.json to record the requeue", 0.5)
    # The next allocation would get the signal again within seconds: give it time
    # to finish, and let it start now rather than once the credential has expired.
    job = status(folder)[CELLS[0]]["slurm_job"]
    wait_for(lambda: slurm_cluster.job(job).get("JobState") == "PENDING", 30, "the requeue")
    slurm_cluster.start_requeued(job, "TimeLimit=10")
    wait_for(lambda: (folder / "report.md").exists(), 180, "the report job", 1)
    text = log.read_text()
    assert "USR1 received: the time limit is near" in text
    assert "allocation 1," in text and "allocation 2," in text
    assert status(folder)[CELLS[0]]["status"] == "completed"
    assert status(folder)[CELLS[0]]["attempts"] == 2
    assert metrics(folder, CELLS[0]) == metrics(reference, CELLS[0])
    assert stable(read_csv(folder)) == stable(read_csv(reference))


def test_a_failing_cell_is_recorded_and_the_rerun_retries_only_it(tmp_path, data_dir,
                                                                   matrix_reference, slurm):
    _, reference, _ = matrix_reference
    config, folder = slurm_matrix(tmp_path, data_dir, reference, keep=(CELLS[0],))
    # A stale run of another configuration in the cell's folder: train.py refuses it.
    squatter = folder / "cells" / CELLS[0]
    squatter.mkdir(parents=True)
    (squatter / "summary.json").write_text(json.dumps({"status": "completed",
                                                       "config_hash": "0000000000"}))
    proc = run_matrix(config, env=slurm)
    assert proc.returncode != 0
    assert re.search(rf"\[3/4\] {CELLS[0]} failed .*another configuration", proc.stdout), \
        proc.stdout
    assert status(folder)[CELLS[0]]["status"] == "failed"
    assert [r["status"] for r in read_csv(folder)] == ["failed", "completed", "completed",
                                                       "completed"]
    shown = run_make("matrix-status", f"RUN={folder}", env=slurm)
    assert "3 completed, 1 failed" in shown.stdout and "another configuration" in shown.stdout
    (squatter / "summary.json").unlink()
    again = run_matrix(config, env=slurm)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 completed, 0 already queued or running on Slurm, 1 to submit (0 to resume, 1 " \
        "to retry)" in again.stdout
    assert stable(read_csv(folder)) == stable(read_csv(reference))


def test_a_report_job_started_while_cells_wait_leaves_the_report_to_a_new_job(
        tmp_path, data_dir, matrix_reference, slurm, slurm_cluster):
    """Slurm can start the report job while a cell waits for another allocation (a
    requeue at the time limit ends the job the afterany dependency waited for). The
    report job then writes nothing and leaves the report to a job that waits for the
    cells still to come. Here the array is held, so its cell waits for certain."""
    _, reference, _ = matrix_reference
    config, folder = slurm_matrix(tmp_path, data_dir, reference,
                                  'CONFIG_SLURM_EXTRA_OPTIONS="--hold"\n', keep=(CELLS[0],))
    submitted = run_matrix(config, "DETACH=1", env=slurm)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    jobs = json.loads((folder / "slurm" / "jobs.json").read_text())
    array, first = jobs["arrays"][0]["job"], jobs["reports"][0]["job"]
    # What the report job runs, run now, while the cell is still held.
    early = subprocess.run([sys.executable, "-m", "gpt2.slurm.task", "report", str(folder)],
                           capture_output=True, text=True, env=slurm, cwd=REPO)
    assert early.returncode == 0, early.stderr
    assert "1 cell(s) still queued or running" in early.stdout and CELLS[0] in early.stdout
    assert not (folder / "report.md").exists()
    reports = [r["job"] for r in json.loads((folder / "slurm" / "jobs.json").read_text())
               ["reports"]]
    # The queued report job waits for the same array: it is kept, not doubled.
    assert reports == [first]
    slurm_cluster.run("scontrol", "release", array)
    wait_for(lambda: (folder / "report.md").exists(), 180, "the report job", 1)
    assert stable(read_csv(folder)) == stable(read_csv(reference))
