"""The test-matrix targets: test-matrix (plan the cells, run every one with the
matrix runner, collect their results), and plots and report (collect a matrix
folder again, or redraw a single run's loss curve)."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections import Counter
from pathlib import Path

import torch

from gpt2 import REPO
from gpt2.cli.children import run_child
from gpt2.cli.dotconfig import check_hardware, data_argv, load_existing, matrix_plan
from gpt2.cli.environment import (config_path, detach, dry_run, if_changed, slurm,
                                  train_args)
from gpt2.config import kconfig
from gpt2.config.slurm import BACKEND_SLURM
from gpt2.config.matrix import parse_jobs
from gpt2.errors import UsageError
from gpt2.matrix.collect import collect
from gpt2.matrix.plan import matrix_preset
from gpt2.matrix.results import value_tag
from gpt2.matrix.runner import Runner
from gpt2.matrix.slurm_backend import POLL_S, STATES, SlurmMatrix, read_jobs
from gpt2.results import catalog, pages
from gpt2.training import epochs
from gpt2.training.runs import format_summary, plot_loss, read_summary, scan_metrics


def matrix_jobs(settings) -> int:
    text = os.environ.get("MATRIX_JOBS", "")
    if not text:
        return settings.jobs
    try:
        return parse_jobs(text)
    except ValueError as e:
        raise UsageError(f"MATRIX_JOBS: {e}") from None


def matrix_gpus(plan, jobs: int) -> list[str] | None:
    """One GPU per running cell when cells run side by side on CUDA; None otherwise."""
    if jobs == 1 or not any(c.cfg.device in ("auto", "cuda") for c in plan.cells):
        return None
    if not torch.cuda.is_available():
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = ([v.strip() for v in visible.split(",") if v.strip()] if visible
           else [str(i) for i in range(torch.cuda.device_count())])
    if jobs > len(ids):
        raise UsageError(f"MATRIX_JOBS={jobs} but {len(ids)} GPU(s) are visible: cells would "
                         "share a GPU and their memory figures would mix. Use "
                         f"MATRIX_JOBS={len(ids)} or fewer")
    return ids[:jobs]


def matrix_command(target: str) -> str:
    parts = ["make", target]
    for var in ("TRAIN_ARGS", "MATRIX_JOBS", "IF_CHANGED"):
        if os.environ.get(var):
            parts.append(f"{var}={shlex.quote(os.environ[var])}")
    return " ".join(parts)


def print_plan(plan) -> None:
    """The cells and their effective train.py arguments: what all cells share once,
    the grid each optimizer gets, then what each cell adds."""
    shared = [a for a in plan.cells[0].argv if all(a in c.argv for c in plan.cells)]
    print(f"matrix {plan.folder} ({len(plan.cells)} cells)\nevery cell: {shlex.join(shared)}")
    for optimizer, axes in plan.axes.items():
        if axes:
            print(f"grid {optimizer}: " + " x ".join(
                f"{a.label} {' '.join(map(value_tag, a.values))} ({a.field})" for a in axes))
    for cell in plan.cells:
        own = [a for a in cell.argv if a not in shared]
        print(f"  {cell.id:<34} {shlex.join(own)}")


def cmd_matrix(prepare: bool, target: str = "all") -> int:
    """Run the matrix .config describes: every cell (skipping completed ones, resuming
    interrupted ones), after preparing the data when ``prepare``; then collect."""
    loaded = load_existing(complete=True)
    settings = kconfig.to_matrix(loaded)
    if settings is None:
        raise UsageError(f"{config_path()} is a single-run configuration (CONFIG_MATRIX is "
                         "not set): enable the Test matrix menu in `make menuconfig`, or "
                         f"start from `make defconfig-{matrix_preset()}`; `make` "
                         "trains a single run")
    plan = matrix_plan(loaded, train_args())
    on_slurm = settings.backend == BACKEND_SLURM
    if on_slurm and os.environ.get("MATRIX_JOBS"):
        raise UsageError("MATRIX_JOBS is how many cells run at once on this machine; this "
                         "matrix runs on Slurm, where CONFIG_SLURM_MAX_RUNNING limits that "
                         "(`make setconfig SET=SLURM_MAX_RUNNING=N`)")
    jobs = 1 if on_slurm else matrix_jobs(settings)
    detached = detach()
    if slurm():
        raise UsageError("SLURM=1 submits a single run; where a matrix's cells run is its "
                         "own setting: CONFIG_MATRIX_BACKEND_SLURM (`make setconfig "
                         "SET=MATRIX_BACKEND=slurm`)")
    if detached and not on_slurm:
        raise UsageError("DETACH=1 submits a matrix to Slurm and returns; this matrix runs "
                         "here (CONFIG_MATRIX_BACKEND_LOCAL). Select Slurm in `make menuconfig`"
                         " (Test matrix -> Where the cells run) or `make setconfig "
                         "SET=MATRIX_BACKEND=slurm`")
    if dry_run():
        print_plan(plan)
        print("\n".join(epochs.notes(c.cfg for c in plan.cells)), file=sys.stderr)
        return 0
    cfg = plan.cells[0].cfg
    if not on_slurm:
        check_hardware(cfg)  # (on Slurm the hardware is the compute nodes')
        refuse_if_on_slurm(plan.folder)
    if prepare:
        _, active = kconfig.to_values(loaded)
        rc = run_child("DATA", "gpt2.prepare_data", data_argv(cfg, active))
        if rc:
            return rc
    if on_slurm:
        rc = run_on_slurm(plan, kconfig.to_slurm(loaded), matrix_command(target), detached)
        if rc is None:
            return 0  # detached: the report job collects
    else:
        print(f"  MATRIX  {len(plan.cells)} cells, {jobs} at a time", file=sys.stderr,
              flush=True)
        runner = Runner(plan, jobs=jobs, command=matrix_command(target),
                        gpus=matrix_gpus(plan, jobs), dotconfig=config_path().read_text(),
                        if_changed=if_changed())
        rc = runner.run()
    tell(collect(plan.folder))
    pages.publish_matrix(plan.folder)
    print(f"summary   {plan.folder / 'summary.csv'}\nreport    {plan.folder / 'report.md'}\n"
          f"page      {plan.folder / pages.MATRIX_PAGE}\nplots     {plan.folder / 'plots'}/")
    return rc


def run_on_slurm(plan, settings, command: str, detached: bool) -> int | None:
    """Submit the unfinished cells and watch them (an exit status), or, detached,
    submit a report job behind them and return None."""
    backend = SlurmMatrix(plan.folder, settings, poll_s=poll_seconds())
    print(f"  SLURM   {len(plan.cells)} cells", file=sys.stderr, flush=True)
    waiting = backend.submit(plan, command, config_path().read_text(), if_changed())
    if not waiting:
        return 0  # every cell completed: collect here
    if detached:
        report = backend.submit_report()
        print(f"  detached: job {report} writes the report when the cells end "
              f"({plan.folder / 'report.md'}); `make matrix-status` shows the cells, "
              "`make matrix-cancel` cancels them")
        return None
    return backend.watch(waiting)


def poll_seconds() -> float:
    """How often the watcher asks squeue (KGPT_SLURM_POLL_S; the tests poll faster)."""
    text = os.environ.get("KGPT_SLURM_POLL_S", "")
    try:
        return float(text) if text else POLL_S
    except ValueError:
        raise UsageError(f"KGPT_SLURM_POLL_S={text!r}: write a number of seconds") from None


def refuse_if_on_slurm(folder: Path) -> None:
    """The local runner must not train cells that a Slurm job array of this folder
    is about to train, or training: one cell in two places."""
    if not read_jobs(folder)["arrays"] or not shutil.which("squeue"):
        return
    waiting = SlurmMatrix(folder).tasks()
    if waiting:
        jobs = sorted({t.job for t in waiting.values()})
        raise UsageError(f"{len(waiting)} cells of {folder} are queued or running on Slurm "
                         f"(job {', '.join(jobs)}): wait for them (`make matrix-status`), "
                         "or cancel them (`make matrix-cancel`) before running the matrix here")


def cmd_matrix_status() -> int:
    folder = matrix_folder()
    backend = SlurmMatrix(folder)
    jobs = read_jobs(folder)
    on_slurm = bool(jobs["arrays"]) and shutil.which("squeue") is not None
    if jobs["arrays"] and not on_slurm:
        print("note: this matrix was submitted to Slurm, but squeue is not on PATH here: "
              "queued and running cells show as not started")
    views = backend.views(ask_slurm=on_slurm)
    width = max(len(v.id) for v in views)
    print(f"matrix {folder.resolve()}")
    if jobs["arrays"]:
        print("  Slurm job arrays: " + ", ".join(a["job"] for a in jobs["arrays"])
              + ("; report jobs: " + ", ".join(r["job"] for r in jobs["reports"])
                 if jobs["reports"] else ""))
    print(f"  {'cell':<{width}}  {'state':<11}  {'job':<10}  {'tries':>5}  val loss / why")
    for v in views:
        what = (f"{v.val_loss:.4f}" if isinstance(v.val_loss, (int, float)) else
                v.error or (f"waiting: {v.reason}" if v.reason else ""))
        print(f"  {v.id:<{width}}  {v.state:<11}  {v.job or '-':<10}  {v.attempts:>5}  {what}")
    counts = Counter(v.state for v in views)
    print(f"  {len(views)} cells: " + ", ".join(f"{counts[s]} {s}" for s in STATES
                                                if counts[s]))
    return 0


def cmd_matrix_cancel() -> int:
    return SlurmMatrix(matrix_folder()).cancel()


def matrix_folder() -> Path:
    folder = results_folder().resolve()
    if not (folder / "plan.yaml").is_file():
        raise UsageError(f"{folder} is not a matrix folder (no plan.yaml): run a matrix first "
                         "(`make test-matrix`), or name one with RUN=results/matrix-<name>-<hash>")
    return folder


def cmd_test_matrix() -> int:
    return cmd_matrix(prepare=True, target="test-matrix")


def tell(collected) -> None:
    """What collecting a matrix found: cells missing from its tables, and warnings
    (an under-tuned grid, results of different code) that the report repeats."""
    for problem in collected.missing:
        print(f"  not in the results: {problem}")
    for warning in collected.warnings:
        print(f"  warning: {warning}")


def results_folder() -> Path:
    """RUN=<folder>, else the newest matrix under the configured results folder."""
    if os.environ.get("RUN"):
        return Path(os.environ["RUN"])
    results = "results"
    if config_path().is_file():
        values, _ = kconfig.to_values(load_existing(complete=True))
        results = values.get("results_dir", results)
    return REPO / results / "latest-matrix"


def cmd_collect(report: bool) -> int:
    folder = results_folder()
    if not folder.exists():
        raise UsageError(f"{folder} does not exist: run a matrix first (`make test-matrix`), "
                         "or name a folder with RUN=results/matrix-<name>-<hash>")
    if not catalog.is_matrix(folder):
        if catalog.is_run(folder) and (folder / "metrics.jsonl").is_file():
            return replot_single_run(folder)
        raise UsageError(f"{folder} is neither a matrix folder (plan.yaml) nor a run folder "
                         "(config.json and metrics.jsonl): nothing written")
    tell(collect(folder, report=report))
    pages.publish_matrix(folder)
    print(f"rebuilt summary.csv, summary.json, plots/{', report.md' if report else ''} and "
          f"{pages.MATRIX_PAGE} in {folder.resolve()}")
    return 0


def cmd_plots() -> int:
    return cmd_collect(report=False)


def cmd_report() -> int:
    return cmd_collect(report=True)


def replot_single_run(folder: Path) -> int:
    """Redraw a run's loss.png from what is readable: damaged lines of metrics.jsonl
    (cut by a crash) are skipped and counted; a damaged summary.json is named."""
    rows, skipped = scan_metrics(folder / "metrics.jsonl")
    plot_loss(rows, folder / "loss.png", title=folder.resolve().name)
    summary = read_summary(folder / "summary.json")
    if summary is None:
        print(f"note: {folder / 'summary.json'} cannot be read (damaged); training the run "
              "again with the same command (`make`) resumes it from its checkpoint and "
              "writes a new one")
    else:
        print(format_summary(folder, summary))
    if skipped:
        print(f"note: skipped {skipped} damaged line(s) of {folder / 'metrics.jsonl'}; "
              f"plotted its {len(rows)} intact rows")
    print(f"rebuilt {folder / 'loss.png'}")
    return 0
