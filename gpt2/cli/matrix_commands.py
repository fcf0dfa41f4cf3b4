"""The test-matrix targets: test-matrix (plan the cells, run every one with the
matrix runner, collect their results), and plots and report (collect a matrix
folder again, or redraw a single run's loss curve)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import torch

from gpt2 import REPO
from gpt2.cli.children import run_child
from gpt2.cli.dotconfig import check_hardware, data_argv, load_existing, matrix_plan
from gpt2.cli.environment import config_path, dry_run, if_changed, train_args
from gpt2.config import kconfig
from gpt2.config.matrix import parse_jobs
from gpt2.errors import UsageError
from gpt2.matrix.collect import collect
from gpt2.matrix.plan import matrix_preset
from gpt2.matrix.results import value_tag
from gpt2.matrix.runner import Runner
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
    jobs = matrix_jobs(settings)
    if dry_run():
        print_plan(plan)
        return 0
    cfg = plan.cells[0].cfg
    check_hardware(cfg)
    if prepare:
        _, active = kconfig.to_values(loaded)
        rc = run_child("DATA", "gpt2.prepare_data", data_argv(cfg, active))
        if rc:
            return rc
    print(f"  MATRIX  {len(plan.cells)} cells, {jobs} at a time", file=sys.stderr, flush=True)
    runner = Runner(plan, jobs=jobs, command=matrix_command(target),
                    gpus=matrix_gpus(plan, jobs), dotconfig=config_path().read_text(),
                    if_changed=if_changed())
    rc = runner.run()
    tell(collect(plan.folder))
    print(f"summary   {plan.folder / 'summary.csv'}\nreport    {plan.folder / 'report.md'}\n"
          f"plots     {plan.folder / 'plots'}/")
    return rc


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
    if not (folder / "plan.yaml").is_file() and (folder / "summary.json").is_file():
        return replot_single_run(folder)
    tell(collect(folder, report=report))
    print(f"rebuilt summary.csv, summary.json, plots/{' and report.md' if report else ''} "
          f"in {folder.resolve()}")
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
