"""The targets that read results without training: compare (runs side by side),
results (the HTML pages), tensorboard (event files from metrics.jsonl) and export
(a run's model in Hugging Face format)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from gpt2 import REPO
from gpt2.cli.children import run_child
from gpt2.cli.dotconfig import load_existing, run_folder
from gpt2.cli.environment import config_path, split_flags
from gpt2.config import kconfig
from gpt2.config.options import Config
from gpt2.errors import StorageError, UsageError
from gpt2.results import catalog, compare, pages, tensorboard


def results_root() -> Path:
    """CONFIG_RESULTS_DIR of the .config (results/ without one), from the checkout."""
    if not config_path().is_file():
        return REPO / Config.results_dir
    values, _ = kconfig.to_values(load_existing(complete=False))
    return REPO / values.get("results_dir", Config.results_dir)


def run_patterns(target: str, example: str) -> list[str]:
    """RUN="a b ..." split as a shell would; one folder or glob each."""
    patterns = split_flags("RUN")
    if not patterns:
        raise UsageError(f"`make {target}` needs RUN=: {example}")
    return patterns


def cmd_compare() -> int:
    patterns = run_patterns("compare", 'RUN="results/run-a results/run-b" (folders, matrix '
                            'folders or globs such as RUN="results/lr*")')
    runs = catalog.expand(patterns, REPO)
    table, out = compare.write(runs, compare.folder_for(runs, results_root()))
    print(table)
    print(f"\nwritten: {out}/compare.md, compare.csv, {compare.PLOT_FILE}")
    return 0


def cmd_results() -> int:
    """The HTML pages of the results folder (every run, matrix and the index), or of
    the one run or matrix folder RUN= names. A folder that is none of these gets
    nothing: `make results` writes only where kgpt's results are."""
    given = os.environ.get("RUN")
    root = Path(given) if given else results_root()
    if not root.is_dir():
        what = "is not a folder" if root.exists() or root.is_symlink() else "does not exist"
        raise UsageError(f"{root} {what}: train something first (`make`), or name a "
                         "results folder, a run or a matrix with RUN=")
    if catalog.is_matrix(root):
        written, where = pages.matrix_pages(root), root / pages.MATRIX_PAGE
    elif catalog.is_run(root):
        written, where = [pages.write_run_page(root)], root / pages.RUN_PAGE
    else:
        runs, matrices = catalog.scan(root)
        if not runs and not matrices:
            raise UsageError(f"{root} holds no runs or matrices, so it is not a results folder: "
                             "nothing written. Name a results folder, a run or a matrix with "
                             "RUN=, or train something first (`make`)")
        written, where = pages.write_all(root), root / pages.INDEX
    print(f"wrote {len(written)} page(s); open {where.resolve()} in a browser "
          "(no server needed)")
    return 0


def cmd_export() -> int:
    """The newest run (or RUN=, or a matrix's CELL=) in Hugging Face format."""
    folder = run_folder()
    return run_child("EXPORT", "gpt2.export", ["--run-dir", folder, *split_flags("EXPORT_ARGS")])


def cmd_tensorboard() -> int:
    """Event files for the runs RUN= names (default: every run and cell under the
    results folder) from their metrics.jsonl."""
    named = os.environ.get("RUN")
    if named:  # (folders named: the .config is not read)
        runs = catalog.expand(split_flags("RUN"), REPO)
    else:
        root = results_root()
        singles, matrices = catalog.scan(root)
        runs = singles + [c for m in matrices for c in m.cells]
    if not runs:
        raise UsageError(f"no runs under {named or root}: train something first (`make`)")
    written = kept = 0
    refused: list[str] = []
    for run in runs:
        try:
            rows = tensorboard.backfill(run)
        except StorageError as e:  # (a read-only run: the others are still written)
            refused.append(str(e))
            print(f"  skipped  {run.path}: {e}")
            continue
        if rows is None:
            kept += 1
            print(f"  kept     {run.path / tensorboard.FOLDER} (written while it trained)")
        else:
            written += 1
            print(f"  wrote    {run.path / tensorboard.FOLDER} ({rows} rows)")
    if named:  # (the view goes beside the runs named, in their results folder)
        root = Path(os.path.commonpath([str((r.matrix or r.path).parent.resolve())
                                         for r in runs]))
    where = tensorboard.view(root, runs)
    # The venv's own binary, so the line works as printed, with nothing activated.
    binary = Path(sys.executable).parent / "tensorboard"
    program = shlex.quote(str(binary)) if binary.is_file() else "tensorboard"
    print(f"{written} run(s) written, {kept} had event files already. View them: "
          f"{program} --logdir {shlex.quote(str(where))}")
    if refused:
        raise StorageError(f"{len(refused)} run(s) could not be written, the first: "
                           f"{refused[0]}")
    return 0
