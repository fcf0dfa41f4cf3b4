"""``make compare RUN="a b …"``: what differs between runs, and how they did.

The runs may be single runs, matrix cells or both (folders, matrix folders for all
their cells, globs). Written into ``<results>/compare-<hash>/``, named after the set
of runs so that two comparisons never overwrite each other:

    compare.md    the two tables below, and which folders they are
    compare.csv   one row per run: its folder and label, the differing settings, the
                  figures, as plain numbers
    compare.png   validation (and training) loss against step, tokens and wall time

and printed: the settings whose values differ between the runs (each as the run
recorded it in config.json; "-" where a setting is not in force, such as Muon's
settings in an AdamW run) and the headline figures (catalog.FIGURES) that any of
them has.
"""

from __future__ import annotations

import csv
import hashlib
import io
from pathlib import Path
from typing import Any

from gpt2.config.axes import value_tag
from gpt2.config.options import applies, fields, from_record
from gpt2.errors import ConfigError, ResultsError
from gpt2.results.catalog import FIGURES, Run, number
from gpt2.storage import own_folder, save_figure, write_text_atomic

# Settings every run has its own value of, and which the folder names already say.
IDENTITY = ("run_name", "results_dir")
NOT_IN_FORCE = "-"
PLOT_FILE = "compare.png"
FILES = ("compare.md", "compare.csv", PLOT_FILE)  # all a comparison folder holds


def _in_force(run: Run) -> set[str]:
    """The settings in force in ``run`` (all it records, when its config.json is not
    one this kgpt can read)."""
    try:
        cfg = from_record(run.config)
    except (ConfigError, TypeError, ValueError):
        return set(run.config)
    return {f.name for f in fields() if applies(cfg, f.name)}


def differing_settings(runs: list[Run]) -> list[str]:
    """Settings (in Config's order) whose value differs between the runs where they
    are in force. One in force in some runs only, at one value, does not differ: the
    setting that puts it in force (Muon's momentum: the optimizer) already does."""
    known = [f.name for f in fields()]
    names = known + sorted({k for r in runs for k in r.config} - set(known))
    in_force = [_in_force(r) for r in runs]
    out = []
    for name in names:
        if name in IDENTITY:
            continue
        values = {repr(r.config.get(name)) for r, force in zip(runs, in_force) if name in force}
        if len(values) > 1:
            out.append(name)
    return out


# How a setting is named in a run's label ("" for one whose value says it).
SHORT = {"learning_rate": "lr", "min_lr": "min lr", "weight_decay": "wd",
         "max_iters": "steps", "target_sparsity": "sparsity", "batch_size": "batch",
         "gradient_accumulation": "accumulation", "optimizer": "", "pruning_method": "",
         "pruning_structure": "", "dataset": "", "model_size": ""}
LABEL_SETTINGS = 4  # at most this many settings in a label: a longer one is a table row


def labels(runs: list[Run], settings: list[str] | None = None,
           fallback: bool = True) -> list[str]:
    """Each run's readable name among ``runs``: the settings that differ between them
    and are in force in it ("muon, lr 4e-3, 100 steps"), or (``fallback``; else "") its
    folder's name when they say nothing, too much, or the same for two runs."""
    settings = differing_settings(runs) if settings is None else settings
    out = []
    for run in runs:
        force = _in_force(run)
        parts = []
        for name in [s for s in settings if s in force][:LABEL_SETTINGS]:
            value = run.config.get(name)
            text = (value_tag(value) if isinstance(value, float) else
                    ("y" if value else "n") if isinstance(value, bool) else str(value))
            short = SHORT.get(name, name.replace("_", " "))
            parts.append(f"{text} {short}" if short == "steps" else
                         f"{short} {text}" if short else text)
        out.append(", ".join(parts))
    if (not all(out) or len(set(out)) < len(out)
            or len(settings) > LABEL_SETTINGS):
        return [label(r) if fallback else "" for r in runs]
    return out


def setting_text(run: Run, name: str, in_force: set[str] | None = None) -> str:
    in_force = _in_force(run) if in_force is None else in_force
    if name not in in_force:
        return NOT_IN_FORCE
    value = run.config.get(name)
    if isinstance(value, bool):
        return "y" if value else "n"
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value is None else str(value)


def figures_present(runs: list[Run]) -> list[str]:
    return [f.key for f in FIGURES if any(r.figure(f.key) is not None for r in runs)]


def table(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """The comparison as (header, rows): run, status, differing settings, figures."""
    settings = differing_settings(runs)
    keys = figures_present(runs)
    header = ["run", "status", *settings, *(f.label for f in FIGURES if f.key in keys)]
    rows = []
    for run, name in zip(runs, labels(runs, settings)):
        force = _in_force(run)
        rows.append([name, run.status, *(setting_text(run, s, force) for s in settings),
                     *(_figure_text(run, k) for k in keys)])
    return header, rows


def csv_rows(runs: list[Run]) -> tuple[list[str], list[list[Any]]]:
    """The comparison for a spreadsheet or pandas: the values as the runs recorded
    them, numbers as plain numbers ("" where a setting is not in force or a figure is
    missing), beside each run's folder and label."""
    settings = differing_settings(runs)
    keys = figures_present(runs)
    header = ["folder", "run", "status", *settings, *keys]
    rows = []
    for run, name in zip(runs, labels(runs, settings)):
        force = _in_force(run)
        rows.append([str(run.path), name, run.status,
                     *(run.config.get(s) if s in force else "" for s in settings),
                     *("" if run.figure(k) is None else run.figure(k) for k in keys)])
    return header, rows


def _figure_text(run: Run, key: str) -> str:
    value = run.figure(key)
    figure = next(f for f in FIGURES if f.key == key)
    return "n/a" if value is None else figure.format(value)


def label(run: Run) -> str:
    """A run's name in the tables and the legend: its folder, with its matrix for a
    cell (cells of two matrices can share a name)."""
    return f"{run.matrix.name}/{run.name}" if run.matrix else run.name


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest entry; numbers right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if _numeric(c) else c.ljust(w)
                         for c, w in zip(cells, widths)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _numeric(text: str) -> bool:
    return text.replace(",", "").replace(".", "").replace(" %", "").replace("-", "") \
        .replace("e", "").isdigit()


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    def esc(x: str) -> str:
        return x.replace("|", "\\|")

    return "\n".join(["| " + " | ".join(map(esc, header)) + " |",
                      "|" + "---|" * len(header),
                      *("| " + " | ".join(map(esc, r)) + " |" for r in rows)])


def folder_for(runs: list[Run], results: Path) -> Path:
    """``<results>/compare-<hash of the runs' folders>``: one folder per set of runs."""
    key = "\n".join(sorted(str(r.path.resolve()) for r in runs))
    return results / f"compare-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def curves(run: Run, x: str, y: str) -> tuple[list[float], list[float]]:
    """(x, y) of the metrics rows that have both (x: step, tokens or elapsed_s)."""
    points = [(number(r.get(x)), number(r.get(y))) for r in run.metrics()]
    points = [(a, b) for a, b in points if a is not None and b is not None]
    return [a for a, _ in points], [b for _, b in points]


def _y_limits(runs: list[Run]) -> tuple[float, float] | None:
    """The loss range after each run's first evaluation past step 0: the untrained
    model's loss (~10.8) would squash the curves that matter into a sliver."""
    values = []
    for run in runs:
        evals = [s for s, _ in zip(*curves(run, "step", "val_loss")) if s > 0]
        if not evals:
            return None
        for key in ("val_loss", "train_loss"):
            values += [y for x, y in zip(*curves(run, "step", key)) if x >= evals[0]]
    lo, hi = min(values), max(values)
    margin = 0.05 * (hi - lo or 1.0)
    return lo - margin, hi + margin


def plot(runs: list[Run], path: Path) -> None:
    """Validation loss (markers) and training loss (thin, faint) of every run against
    optimizer step, tokens seen and wall time, one colour per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_x = (("step", "optimizer step"), ("tokens", "tokens"), ("elapsed_s", "wall time (s)"))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), dpi=110, sharey=True)
    colours = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20")
    for i, (run, name) in enumerate(zip(runs, labels(runs))):
        colour = colours(i % colours.N)
        for ax, (x, _) in zip(axes, axes_x):
            tx, ty = curves(run, x, "train_loss")
            if tx:
                ax.plot(tx, ty, color=colour, linewidth=0.8, alpha=0.35)
            vx, vy = curves(run, x, "val_loss")
            if vx:
                ax.plot(vx, vy, color=colour, linewidth=1.6, marker="o", markersize=3,
                        label=name if ax is axes[0] else None)
    limits = _y_limits(runs)
    for ax, (_, name) in zip(axes, axes_x):
        ax.set_xlabel(name)
        ax.grid(alpha=0.3)
        if limits:
            ax.set_ylim(*limits)
    axes[0].set_ylabel("loss (val: line with markers, train: faint)")
    fig.legend(loc="lower center", ncol=min(len(runs), 3), fontsize=8, frameon=False)
    fig.suptitle(f"{len(runs)} runs: validation and training loss"
                 + ("; the untrained model's loss (step 0) above the axis" if limits else ""))
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(runs) - 1) // 3), 1, 1))
    try:
        own_folder(path.parent)
        save_figure(fig, path)
    finally:
        plt.close(fig)


def write(runs: list[Run], out: Path) -> tuple[str, Path]:
    """Write compare.md, compare.csv and compare.png into ``out``; returns the
    printable table and the folder."""
    header, rows = table(runs)
    own_folder(out)
    others = sorted({p.name for p in out.iterdir()} - set(FILES))
    if others:
        raise ResultsError(f"{out} holds files a comparison does not write ({', '.join(others)[:200]}"
                           "), so it is left alone: move them away to compare these runs again")
    # Files of these names are kgpt's only beside a compare.md it wrote, which is
    # written first for that reason: a user's own compare.csv there is left alone.
    present = [name for name in FILES if (out / name).exists() or (out / name).is_symlink()]
    if present and not _ours(out / "compare.md"):
        raise ResultsError(f"{out} holds {', '.join(present)} that kgpt did not write (no "
                           "compare.md of kgpt's beside them), so it is left alone: move them "
                           "away to compare these runs again")
    settings = differing_settings(runs)
    md = [f"{MD_TITLE}{len(runs)} runs", "",
          ("Settings that differ: " + ", ".join(f"`{s}`" for s in settings) + "."
           if settings else "The runs have the same settings."),
          "", markdown_table(header, rows), "", f"![loss curves]({PLOT_FILE})", "",
          "## Folders", "", *(f"- `{name}`: {r.path}" for r, name in
                                zip(runs, labels(runs, settings))), ""]
    write_text_atomic(out / "compare.md", "\n".join(md))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for row in [*csv_rows(runs)[:1], *csv_rows(runs)[1]]:
        writer.writerow(row)
    write_text_atomic(out / "compare.csv", buf.getvalue())
    plot(runs, out / PLOT_FILE)
    return text_table(header, rows), out


MD_TITLE = "# Comparison of "


def _ours(path: Path) -> bool:
    """Whether ``path`` is a compare.md kgpt wrote (a regular file opening with its title)."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(MD_TITLE)).decode(errors="replace") == MD_TITLE
    except OSError:
        return False

