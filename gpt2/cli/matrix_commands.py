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

from gpt2 import REPO
from gpt2.cli.children import run_child
from gpt2.cli.dotconfig import check, check_hardware, data_argv, load_existing, matrix_plan
from gpt2.cli.environment import (config_path, detach, dry_run, if_changed, slurm,
                                  train_args)
from gpt2.config import kconfig
from gpt2.config.matrix import parse_jobs
from gpt2.errors import EXIT_INTERRUPTED, UsageError
from gpt2.matrix import extend, oneshot_cells
from gpt2.matrix.collect import aggregate, collect, load_cells
from gpt2.matrix.plan import matrix_preset
from gpt2.matrix.plan_file import read_plan
from gpt2.matrix.tuning import tuned
from gpt2.config.axes import label, setting, value_tag
from gpt2.matrix.paired import seed_noise
from gpt2.matrix.results import grid_label
from gpt2.matrix.backend import backend_for, backend_of
from gpt2.matrix.slurm_backend import POLL_S, read_jobs
from gpt2.run_folder import STATES
from gpt2.results import catalog, pages
from gpt2.training import epochs
from gpt2.run_folder import METRICS, format_summary, plot_loss, read_summary, scan_metrics


def matrix_jobs(settings) -> int:
    text = os.environ.get("MATRIX_JOBS", "")
    if not text:
        return settings.jobs
    try:
        return parse_jobs(text)
    except ValueError as e:
        raise UsageError(f"MATRIX_JOBS: {e}") from None


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
    for cell_id, (parent, step) in plan.branches.items():
        print(f"branch {cell_id}: from {parent} at step {step} (its cooldown)")


def cmd_matrix(prepare: bool, target: str = "all", loaded=None) -> int:
    """Run the matrix .config describes (``loaded``, when the target has read it):
    every cell (skipping completed ones, resuming interrupted ones), after preparing
    the data when ``prepare``; then collect."""
    loaded = loaded or load_existing(complete=True)
    settings = kconfig.to_matrix(loaded)
    if settings is None:
        raise UsageError(f"{config_path()} is a single-run configuration (CONFIG_MATRIX is "
                         "not set): enable the Test matrix menu in `make menuconfig`, or "
                         f"start from `make defconfig-{matrix_preset()}`; `make` "
                         "trains a single run")
    plan = matrix_plan(loaded, train_args())
    if slurm():
        raise UsageError("SLURM=1 submits a single run; where a matrix's cells run is its "
                         "own setting: CONFIG_MATRIX_BACKEND_SLURM (`make setconfig "
                         "SET=MATRIX_BACKEND=slurm`)")
    jobs = matrix_jobs(settings)
    backend = backend_for(settings.backend, plan.folder, jobs=jobs,
                          jobs_given=bool(os.environ.get("MATRIX_JOBS")),
                          cell_ended=lambda d: pages.publish_after_run(d, None),
                          settings=kconfig.to_slurm(loaded), poll_s=poll_seconds())
    detached = detach()
    backend.check(detached)
    if dry_run():
        print_plan(plan)
        print("\n".join(epochs.notes(c.cfg for c in plan.cells)), file=sys.stderr)
        return 0
    cfg = plan.cells[0].cfg
    if backend.runs_here:
        check_hardware(cfg)
    if prepare:
        _, active = kconfig.to_values(loaded)
        rc = run_child("DATA", "gpt2.prepare_data", data_argv(cfg, active))
        if rc:
            return rc
    print(backend.describe(plan), file=sys.stderr, flush=True)
    rc = backend.run(plan, matrix_command(target), loaded.text, if_changed(),
                     detached)
    if rc is None:
        return 0  # detached: the report job collects
    tell(collect(plan.folder))
    if settings.extend_rounds and rc == 0:
        plan, rc = extend_grids(loaded, settings, plan, backend, matrix_command(target),
                                detached)
        if rc is None:
            return 0  # detached: the report job collects; a re-run goes on extending
    if settings.oneshot and rc == 0:
        rc = run_oneshot(plan.folder)
    pages.publish_matrix(plan.folder)
    print(f"summary   {plan.folder / 'summary.csv'}\nreport    {plan.folder / 'report.md'}\n"
          f"page      {plan.folder / pages.MATRIX_PAGE}\nplots     {plan.folder / 'plots'}/")
    print(top_lines(plan.folder))
    return rc


def top_lines(folder: Path, n: int = 3) -> str:
    """The ``n`` settings of lowest loss (each at its tuned grid point, mean over seeds)
    with the seed noise to read them by, and what to run next."""
    planned = read_plan(folder)
    cells = load_cells(folder, planned)
    best = [r for r in tuned(planned, aggregate(cells)) if r["best"]]
    best.sort(key=lambda r: r["final_val_loss_mean"])
    lines = [f"lowest    {label(r)}: val loss {r['final_val_loss_mean']:.4f}"
             + (f" ± {r['final_val_loss_std']:.4f} over {r['n']} seeds"
                if r.get("final_val_loss_std") is not None else "")
             + (f" ({grid_label(r['grid'])})" if r["grid"] else "") for r in best[:n]]
    noise = seed_noise(cells)
    if len(best) > 1 and noise is not None:
        lines.append(f"          (seed noise {noise:.4f}: a smaller gap is no difference; "
                     "report.md compares them)")
    if best:
        first = next(c for c in cells if c.usable and c.setting == setting(best[0])
                     and c.point == tuple(best[0]["grid"].items()))
        lines.append(f"next      make generate CELL={first.cell}   (text from the best cell)")
    return "\n".join(lines)


def extend_grids(loaded, settings, plan, backend, command: str, detached: bool):
    """CONFIG_MATRIX_TUNE_EXTEND: while some best point sits on the end of its
    optimizer's grid and rounds are left, add the points beyond (gpt2/matrix/extend.py),
    run the new cells and collect. Returns the plan and the last run's status."""
    rc = 0
    while True:
        record = extend.read(plan.folder, settings)
        if len(record["rounds"]) >= settings.extend_rounds:
            break
        planned = read_plan(plan.folder)
        best = tuned(planned, aggregate(load_cells(plan.folder, planned)))
        points = extend.next_points(planned, best)
        if not points:
            break
        extend.record(plan.folder, record, points)
        print(f"grid extension, round {len(record['rounds']) + 1} of at most "
              f"{settings.extend_rounds}:")
        for p in points:
            print(f"  {p['optimizer']} {p['label']} + {value_tag(p['value'])}: {p['why']}")
        plan = matrix_plan(loaded, train_args())
        rc = backend.run(plan, command, loaded.text, if_changed(), detached)
        if rc is None or rc:
            return plan, rc
        tell(collect(plan.folder))
    return plan, rc


def run_oneshot(folder: Path) -> int:
    """CONFIG_MATRIX_ONESHOT: prune each completed dense cell once per method and target
    that is not done yet (gpt2/matrix/oneshot_cells.py), here, one after another; then
    collect. Returns the first failure's status (the rest still run), or 0."""
    planned = read_plan(folder)
    todo = oneshot_cells.pending(folder, planned, load_cells(folder, planned))
    if not todo:
        return 0
    print(f"one-shot baselines: {len(todo)} to prune", file=sys.stderr, flush=True)
    failed = 0
    for what, argv in todo:
        print(f"  {what}", file=sys.stderr, flush=True)
        rc = run_child("ONESHOT", "gpt2.prune_oneshot", argv)
        if rc in (EXIT_INTERRUPTED, 128 + 15, 128 + 1):
            return rc  # stopped: a re-run does the rest
        if rc:
            print(f"one-shot pruning failed ({what}, exit status {rc}); the report lists it "
                  "as not done", file=sys.stderr)
            failed = failed or rc
    tell(collect(folder))
    return failed


def poll_seconds() -> float:
    """How often the watcher asks squeue (KGPT_SLURM_POLL_S; the tests poll faster)."""
    text = os.environ.get("KGPT_SLURM_POLL_S", "")
    try:
        return float(text) if text else POLL_S
    except ValueError:
        raise UsageError(f"KGPT_SLURM_POLL_S={text!r}: write a number of seconds") from None


def cmd_matrix_status() -> int:
    folder = matrix_folder()
    jobs = read_jobs(folder)
    if jobs["arrays"] and not shutil.which("squeue"):
        print("note: this matrix was submitted to Slurm, but squeue is not on PATH here: "
              "queued and running cells show as pending")
    views = backend_of(folder).views()
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
    return backend_of(matrix_folder()).cancel()


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
    if collected.speedup:
        print("speedup over the tuned baseline (report.md has the method and the intervals):")
        for line in collected.speedup:
            print(f"  {line}")
    for problem in collected.missing:
        print(f"  not in the results: {problem}")
    for warning in collected.warnings:
        print(f"  warning: {warning}")


def results_folder() -> Path:
    """RUN=<folder>; else, with a matrix configuration (.config or KCONFIG_CONFIG=),
    that matrix's own folder, as CELL= and the per-run tools follow the configuration;
    else the newest matrix under the configured results folder."""
    if os.environ.get("RUN"):
        return Path(os.environ["RUN"])
    results = "results"
    if config_path().is_file():
        loaded = load_existing(complete=True)
        if kconfig.to_matrix(loaded) is not None:
            return matrix_plan(loaded, train_args()).folder
        check(loaded)
        values, _ = kconfig.to_values(loaded)
        results = values.get("results_dir", results)
    return REPO / results / "latest-matrix"


def cmd_collect(report: bool) -> int:
    folder = results_folder()
    if not folder.exists():
        raise UsageError(f"{folder} does not exist: run a matrix first (`make test-matrix`), "
                         "or name a folder with RUN=results/matrix-<name>-<hash>")
    if not catalog.is_matrix(folder):
        if catalog.is_run(folder) and (folder / METRICS).is_file():
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
    rows, skipped = scan_metrics(folder / METRICS)
    plot_loss(rows, folder / "loss.png", title=folder.resolve().name)
    summary = read_summary(folder)
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
