"""The matrix's plots, drawn from :class:`CellResult` objects only.

Only usable cells (completed, finite final validation loss) are drawn, except in the
throughput and memory bars, which show any figure a cell recorded. Every cell a plot
leaves out is named in that plot's notes with the reason, so the report can say what a
picture is missing. A plot with nothing to draw is still written, with a message, so a
report never links to a file that is not there.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpt2.config.options import record_view
from gpt2.config.registry import OPTIMIZERS
from gpt2.run_folder import COMPLETED, FAILED, PENDING
from gpt2.storage import own_folder, save_figure, write_text_atomic
from gpt2.training.schedule import lr_at, schedule_of
from gpt2.config.axes import AXES, AXIS, COMPARED, label, percent, setting, value_tag
from gpt2.matrix import sparsity_report
from gpt2.matrix.results import CellResult, finite, grid_label

DPI = 120
PLOTS_INDEX = "plots.json"  # beside the PNGs: each one's file, title and notes, in order
NO_CELLS = "no completed cells"
# Line styles for sparsity levels (dense is always solid) and for pruning methods.
DASHES = ["--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2))]
MARKERS = ["o", "^", "v", "D", "P", "X"]
# The axes the plots draw as facets of their own (colour, panel, line style, x);
# any other compared axis is named in the legend.
FACETS = ("optimizer", "pruning", "target_sparsity")


@dataclass
class Plot:
    filename: str  # e.g. "val_loss.png"
    title: str  # one-line caption for the report
    notes: list[str]  # e.g. ["adamw / movement 90% seed 1338: failed", ...]
    # Why it was not drawn (nothing to show: no grid, no pruned cell); None: drawn.
    skipped: str | None = None


def make_plots(cells: list[CellResult], out_dir: Path, all_cells: list[CellResult] | None = None,
               grids: dict | None = None, fits: list[dict] | None = None,
               oneshot: list[dict] | None = None) -> list[Plot]:
    """Write every plot into out_dir (created if needed) and return what was written.
    ``cells``: one grid point per setting (the tuned cells); ``all_cells``: every
    grid point, for the loss-against-learning-rate plot; ``fits``: the baseline's
    power-law fits over budgets (gpt2/matrix/speedup.py), drawn in budget_fit.png
    when there are any; ``oneshot``: the one-shot baselines (oneshot_cells.rows), in
    sparsity_families.png with the other ways to a sparsity, where there are two."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no window, no display needed
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    own_folder(out_dir)
    everything = cells if all_cells is None else all_cells
    plots = []
    def lr_sweep(plt, _):
        return _lr_sweep(plt, everything, grids or {})

    def budget_fit(plt, cells):
        return _budget_fit(plt, cells, fits)

    drawings = [("lr_sweep.png", lr_sweep),
                ("val_loss.png", _val_loss),
                ("val_loss_tokens_time.png", _val_loss_tokens_time),
                ("ppl_heatmap.png", _ppl_heatmap),
                ("ppl_vs_sparsity.png", _ppl_vs_sparsity),
                ("sparsity_vs_step.png", _sparsity_vs_step),
                ("throughput_memory.png", _throughput_memory),
                ("lr_schedule.png", _lr_schedule)]
    # Only where there is a fit: a matrix without budgets gets no empty picture.
    drawings += [("budget_fit.png", budget_fit)] if fits else []
    found, _ = sparsity_report.tables(cells, oneshot or [])
    if any(len({r.family for r in rows if r.method != "dense"}) > 1 for rows in found.values()):
        drawings.append(("sparsity_families.png", lambda plt, _: _sparsity_families(plt, found)))
    for filename, draw in drawings:
        fig, title, notes = draw(plt, cells)
        if isinstance(fig, str):  # nothing to draw: no picture (a stale one goes), and why
            (out_dir / filename).unlink(missing_ok=True)
            plots.append(Plot(filename, title, notes, skipped=fig))
            continue
        _save(plt, fig, out_dir / filename)
        plots.append(Plot(filename, title, notes))
    # The HTML report (gpt2/results/pages.py) captions each picture from this.
    write_text_atomic(out_dir / PLOTS_INDEX, json.dumps(
        {"plots": [dataclasses.asdict(p) for p in plots]}, indent=2) + "\n")
    return plots


def _save(plt, fig, path: Path) -> None:
    # Through kgpt's durable write: a killed `make plots` never leaves a half-written
    # PNG, and a full disk is one line.
    try:
        save_figure(fig, path, dpi=DPI, bbox_inches="tight")
    finally:
        plt.close(fig)


def _optimizers(cells: list[CellResult]) -> list[str]:
    return list(dict.fromkeys(c.optimizer for c in cells))  # the plan's order


def _methods(cells: list[CellResult]) -> list[str]:
    # Dense first; the stable sort keeps the plan's order among the pruning methods.
    return sorted(dict.fromkeys(c.pruning for c in cells), key=lambda m: m != "none")


def _order(cells: list[CellResult]) -> list[CellResult]:
    """The axes' order (gpt2/config/axes.py): names as the plan lists them (dense first),
    numbers ascending."""
    seen = {a.name: list(dict.fromkeys(c.axes.get(a.name) for c in cells)) for a in AXES}
    seen["pruning"] = _methods(cells)

    def rank(c: CellResult) -> tuple:
        return tuple(seen[a.name].index(c.axes.get(a.name)) if str in a.kind
                     else c.axes.get(a.name) or 0 for a in AXES)

    return sorted(cells, key=rank)


def _groups(cells: list[CellResult]) -> dict[tuple, list[CellResult]]:
    """Usable cells by combination, in plot order."""
    groups: dict[tuple, list[CellResult]] = {}
    for c in _order(cells):
        if c.usable:
            groups.setdefault(c.setting, []).append(c)
    return groups


def _has_ppl(c: CellResult) -> bool:
    return c.usable and finite(c.final_val_ppl)


def _ppl_stats(cells: list[CellResult]) -> dict[tuple, tuple[float, float, int]]:
    """(mean, sample std, number of seeds) of the final perplexity per combination."""
    values: dict[tuple, list[float]] = {}
    for c in filter(_has_ppl, _order(cells)):
        values.setdefault(c.setting, []).append(c.final_val_ppl)
    return {k: (float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, len(v))
            for k, v in values.items()}


def _why(c: CellResult) -> str:
    if c.status != COMPLETED:
        return "pending (never started)" if c.status == PENDING else c.status
    if finite(c.final_val_loss):
        return "no final val perplexity"
    loss = c.final_val_loss
    return "final val loss is " + ("missing" if loss is None else "NaN" if math.isnan(loss)
                                   else "infinite")


def _skipped(cells: list[CellResult], drawn=lambda c: c.usable) -> list[str]:
    return [f"{c.label} seed {c.seed}: {_why(c)}" for c in _order(cells) if not drawn(c)]


def _styles(cells: list[CellResult]) -> tuple[dict, dict, dict]:
    """Colour and line width per optimizer, line style per sparsity level: the same in every
    plot. Widths shrink along the plan so that curves which coincide (the learning rate,
    the sparsity schedule) still show every optimizer's colour."""
    opts = _optimizers(cells)
    colour = {o: f"C{i % 10}" for i, o in enumerate(opts)}
    width = {o: 1.4 + 1.6 * (len(opts) - 1 - i) / max(len(opts) - 1, 1)
             for i, o in enumerate(opts)}
    levels = sorted({c.target_sparsity for c in cells if c.target_sparsity is not None})
    dash = {None: "-"} | {s: DASHES[i % len(DASHES)] for i, s in enumerate(levels)}
    return colour, dash, width


def _curve_panels(plt, cells, key: str, methods: list[str], ylabel: str, scale: float = 1.0,
                  dense_ref: bool = False):
    """One panel per pruning method, one line per combination: the mean over its seeds at
    the steps every seed logged. dense_ref repeats the dense curves faintly in the pruned
    panels, so each pruned curve can be read against its optimizer's dense run."""
    from matplotlib.lines import Line2D

    colour, dash, width = _styles(cells)
    fig, axes = plt.subplots(1, len(methods), sharey=True, squeeze=False, layout="constrained",
                             figsize=(1.5 + 4.2 * len(methods), 4.2))
    missing, shown = [], set()
    for ax, method in zip(axes[0], methods):
        drawn, paired = 0, {c.optimizer for c in cells if c.pruning == method}
        for group in _groups(cells).values():
            opt, m, s = group[0].optimizer, group[0].pruning, group[0].target_sparsity
            # Dense references only for the optimizers this pruning method runs with.
            faint = dense_ref and m == "none" and method != "none" and opt in paired
            if m != method and not faint:
                continue
            series = [{r["step"]: r[key] for r in c.metrics if finite(r.get(key))} for c in group]
            steps = sorted(set.intersection(*map(set, series)))
            if not steps:
                if not faint:
                    missing.append(f"{group[0].label}: no {key} in its metrics")
                continue
            shown |= {opt, s}  # for the legend: the optimizers and sparsity levels drawn
            drawn += not faint
            ax.plot(steps, [scale * np.mean([one[t] for one in series]) for t in steps],
                    color=colour[opt], linestyle=dash[s], alpha=0.3 if faint else 1.0,
                    linewidth=width[opt] + (0.8 if s is None else 0))
        if not drawn:  # every cell of this method failed or is still to run
            ax.text(0.5, 0.5, NO_CELLS, ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"pruning: {method}")
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    handles = [Line2D([], [], color=c, linewidth=width[o], label=o)
               for o, c in colour.items() if o in shown]
    handles += [Line2D([], [], color="0.3", linestyle=d, linewidth=2.2 if s is None else 1.4,
                       label=f"{percent(s)} sparsity" if s is not None else
                       "dense (faint in pruned panels)" if dense_ref and len(methods) > 1
                       else "dense")
                for s, d in dash.items() if s in shown]
    # Centred on the right: clear of the data and of the suptitle above the panels.
    fig.legend(handles=handles, loc="outside right center", fontsize=8)
    return fig, axes[0], missing


def _val_loss(plt, cells):
    title = "Validation loss vs optimizer step, per pruning method"
    if any(len(g) > 1 for g in _groups(cells).values()):
        title += " (mean over seeds)"
    if not _groups(cells):
        return NO_CELLS, title, _skipped(cells)
    fig, axes, missing = _curve_panels(plt, cells, "val_loss", _methods(cells),
                                       "validation loss (nats/token)", dense_ref=True)
    # The untrained loss at step 0 (about ln 50257 = 10.8) would squash the differences
    # that matter; scale the axis to the later evaluations when there are any.
    later = [r["val_loss"] for c in cells if c.usable for r in c.metrics
             if r["step"] > 0 and finite(r.get("val_loss"))]
    if later:
        lo, hi = min(later), max(later)
        pad = 0.06 * (hi - lo) or 0.1
        axes[0].set_ylim(lo - pad, hi + pad)
        title += "; step 0 above the axis"
    fig.suptitle(title)
    return fig, title, _skipped(cells) + missing


def _ppl_heatmap(plt, cells):
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import LogFormatter

    title = "Final validation perplexity (mean±std over seeds; lower is better)"
    stats = _ppl_stats(cells)
    if not stats:
        return NO_CELLS, title, _skipped(cells, _has_ppl)
    opts = _optimizers(cells)
    # A column is a setting without its optimizer: a pruning method and sparsity (and
    # the value of any other compared axis).
    names = {c.setting[1:]: label(c.axes, skip=("optimizer",)) for c in _order(cells)}
    cols = list(names)
    planned: dict[tuple, set[str]] = {}
    for c in cells:
        planned.setdefault(c.setting, set()).add(c.status)
    means = [m for m, _, _ in stats.values()]
    # Log colours: one diverged cell must not wash out the differences between the rest.
    norm = LogNorm(min(means) * 0.98, max(means) * 1.02)
    cmap = plt.get_cmap("viridis_r").with_extremes(bad=(0, 0, 0, 0))
    grid = np.full((len(opts), len(cols)), np.nan)
    fig, ax = plt.subplots(layout="constrained",
                           figsize=(2.5 + 1.25 * len(cols), 1.6 + 0.65 * len(opts)))
    for (i, opt), (j, col) in itertools.product(enumerate(opts), enumerate(cols)):
        combo, box = (opt, *col), None
        if combo in stats:
            mean, std, n = stats[combo]
            grid[i, j] = mean
            r, g, b, _ = cmap(norm(mean))
            ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
            text = f"{mean:.1f}±{std:.1f}" if n > 1 else f"{mean:.1f}"
        elif combo not in planned:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, color="0.93"))
            ink, text = "0.5", "—"
        else:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="0.35", edgecolor="0.55",
                                   hatch="///", linewidth=0))
            text = ("failed" if "failed" in planned[combo]
                    else "NaN" if "completed" in planned[combo] else "missing")
            ink, box = "white", {"facecolor": "0.35", "edgecolor": "none", "pad": 1}  # on hatch
        ax.text(j, i, text, ha="center", va="center", color=ink, fontsize=9, bbox=box)
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto")
    bar = fig.colorbar(image, ax=ax, label="val perplexity")
    bar.ax.yaxis.set_major_formatter(LogFormatter())  # 30, 40 rather than 3×10¹
    bar.ax.yaxis.set_minor_formatter(LogFormatter())
    tilt = len(cols) > 4
    ax.set_xticks(range(len(cols)), [names[col] for col in cols],
                  rotation=30 if tilt else 0, ha="right" if tilt else "center")
    ax.set_yticks(range(len(opts)), opts)
    ax.set_xticks(np.arange(len(cols) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(opts) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=2)
    ax.tick_params(which="minor", length=0)
    ax.set(xlabel="pruning method and target sparsity", ylabel="optimizer", title=title)
    return fig, title, _skipped(cells, _has_ppl)


def _ppl_vs_sparsity(plt, cells):
    title = "Final validation perplexity vs target sparsity (dense run at 0%)"
    stats = _ppl_stats(cells)
    if not stats:
        return NO_CELLS, title, _skipped(cells, _has_ppl)
    if not any(c.pruning != "none" for c in cells):
        return "no pruned cells", title, []
    colour = _styles(cells)[0]
    of = {c.setting: c.axes for c in cells}
    levels = sorted({v["target_sparsity"] for v in of.values()
                     if v.get("target_sparsity") is not None})
    # One line per optimizer, pruning method and value of any other compared axis.
    others = list(dict.fromkeys(tuple((a.name, v.get(a.name)) for a in COMPARED
                                      if a.name not in FACETS) for v in of.values()))
    fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    methods = [m for m in _methods(cells) if m != "none"]
    drawn_dense: set[tuple] = set()
    for opt in _optimizers(cells):
        # One style per pruning method and value of the other axes (2:4 and
        # unstructured magnitude are two lines that must look different).
        def dense_of(values: dict) -> tuple[dict, tuple | None]:
            """The dense cell of a setting: it has only the axes in force without
            pruning (a budget, not a mask structure)."""
            point = {"optimizer": opt, "pruning": "none", "target_sparsity": None}
            kept = {name: (v if AXIS[name].needs({**point, **values}) else None)
                    for name, v in values.items()}
            return kept, stats.get(setting({**point, **kept}))

        for rest in others:
            kept, dense = dense_of(dict(rest))
            if dense and (opt, tuple(kept.items())) not in drawn_dense:
                drawn_dense.add((opt, tuple(kept.items())))
                suffix = label(kept)
                ax.errorbar([0], [dense[0]], yerr=[dense[1]] if dense[2] > 1 else None,
                            marker="s", markersize=8, markeredgecolor="black",
                            color=colour[opt], capsize=3, linestyle="none", zorder=3,
                            label=f"{opt} / dense" + (f" / {suffix}" if suffix else ""))
        for k, (rest, method) in enumerate(itertools.product(others, methods)):
            values = dict(rest)

            def at(method, sparsity):
                return stats.get(setting({"optimizer": opt, "pruning": method,
                                          "target_sparsity": sparsity, **values}))

            dense = dense_of(values)[1]  # each line starts from its setting's dense cell
            points = [(s * 100, *at(method, s)) for s in levels if at(method, s)]
            if not points:
                continue
            if dense:  # the line starts at the dense result: 0% of the weights pruned
                points.insert(0, (0, *dense))
            x, y, err, n = zip(*points)
            suffix = label(values)
            ax.errorbar(x, y, yerr=err if max(n) > 1 else None, color=colour[opt],
                        linestyle=DASHES[k % len(DASHES)], marker=MARKERS[k % len(MARKERS)],
                        capsize=3, label=f"{opt} / {method}" + (f" / {suffix}" if suffix else ""))
    ax.set_xticks([0] + [s * 100 for s in levels])
    ax.set(xlabel="target sparsity (% of prunable weights zeroed)",
           ylabel="final validation perplexity", title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)  # outside: hides no data
    return fig, title, _skipped(cells, _has_ppl)


def _sparsity_families(plt, found):
    """Final validation loss of each way to each target, one panel per optimizer (and
    budget): the dense cells' mean as a line with its seed band, every other row a
    point with its seeds' SD, its family the marker."""
    title = "Validation loss by way of reaching the sparsity (dense: line and band)"
    families = list(dict.fromkeys(r.family for rows in found.values() for r in rows
                                  if r.method != "dense"))
    methods = list(dict.fromkeys(r.method for rows in found.values() for r in rows
                                 if r.method != "dense"))
    colours = plt.get_cmap("tab10")
    width = len(found)
    fig, axes = plt.subplots(1, width, figsize=(6.5 * width, 4.8), squeeze=False,
                             layout="constrained")
    for ax, (context, rows) in zip(axes[0], found.items()):
        targets = list(dict.fromkeys(r.target for r in rows if r.method != "dense"))
        dense = next((r for r in rows if r.method == "dense"), None)
        if dense:
            values = list(dense.losses.values())
            mean = float(np.mean(values))
            ax.axhline(mean, color="black", linestyle="--", linewidth=1, label="dense (mean)")
            if len(values) > 1:
                sd = float(np.std(values, ddof=1))
                ax.axhspan(mean - sd, mean + sd, color="black", alpha=0.08, label="dense ± SD")
        groups = [(f, m) for f in families for m in methods
                  if any(r.family == f and r.method == m for r in rows)]
        for g, (family, method) in enumerate(groups):
            offset = (g - (len(groups) - 1) / 2) * 0.7 / max(len(groups), 1)
            xs, ys, errs = [], [], []
            for i, target in enumerate(targets):
                row = next((r for r in rows if r.target == target and r.family == family
                            and r.method == method), None)
                if row is None:
                    continue
                values = list(row.losses.values())
                xs.append(i + offset)
                ys.append(float(np.mean(values)))
                errs.append(float(np.std(values, ddof=1)) if len(values) > 1 else 0.0)
            ax.errorbar(xs, ys, yerr=errs, linestyle="none", capsize=3,
                        marker=MARKERS[families.index(family) % len(MARKERS)],
                        color=colours(methods.index(method) % 10),
                        label=f"{method} ({family})")
        ax.set_xticks(range(len(targets)), targets)
        ax.set(title=context, xlabel="target sparsity", ylabel="final validation loss")
        ax.grid(alpha=0.3, axis="y")
    # One legend for all panels, below them: inside a panel it hides points.
    handles: dict[str, object] = {}
    for ax in axes[0]:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(text, handle)
    fig.legend(handles.values(), handles.keys(), loc="outside lower center",
               ncol=min(4, len(handles)), fontsize=8, frameon=False)
    fig.suptitle(title)
    return fig, title, ["Each setting at its tuned grid point; error bars: SD over seeds. "
                        "report.md's table has the paired differences and the cost."]


def _sparsity_vs_step(plt, cells):
    title = "Measured sparsity vs optimizer step (faint bands: targets)"
    pruned = [c for c in cells if c.pruning != "none"]
    if not any(c.usable for c in pruned):
        return NO_CELLS if pruned else "no pruned cells", title, _skipped(pruned)
    methods = [m for m in _methods(cells) if m != "none"]
    # All cells, not just the pruned ones, so each optimizer keeps its colour.
    fig, axes, missing = _curve_panels(plt, cells, "sparsity", methods,
                                       "measured sparsity (%)", scale=100)
    for ax, method in zip(axes, methods):
        for s in {c.target_sparsity for c in pruned if c.pruning == method}:
            ax.axhline(s * 100, color="0.5", alpha=0.25, linewidth=5, zorder=0)
    axes[0].set_ylim(-3, 103)
    fig.suptitle(title)
    return fig, title, _skipped(pruned) + missing


def _throughput_memory(plt, cells):
    from matplotlib.ticker import MaxNLocator, StrMethodFormatter

    title = "Training throughput and peak memory per cell"
    order = _order(cells)
    figures = [("tokens_per_sec", "tokens/s", "training throughput (tokens/s)"),
               ("peak_memory_mb", "peak memory", "peak memory (MB)")]
    notes = []
    for c in order:
        lacking = [name for key, name, _ in figures if not finite(getattr(c, key))]
        if lacking:
            notes.append(f"{c.label} seed {c.seed}: no {' or '.join(lacking)} ({c.status})")
    if not any(finite(getattr(c, key)) for c in order for key, _, _ in figures):
        return NO_CELLS, title, notes
    colour = _styles(cells)[0]
    rows = np.arange(len(order))
    fig, axes = plt.subplots(1, 2, sharey=True, layout="constrained",
                             figsize=(11, 1.2 + 0.32 * len(order)))
    for ax, (key, _, xlabel) in zip(axes, figures):
        values = [getattr(c, key) if finite(getattr(c, key)) else 0.0 for c in order]
        bars = ax.barh(rows, values, color=[colour[c.optimizer] for c in order])
        ax.bar_label(bars, [f" {getattr(c, key):,.0f}" if finite(getattr(c, key)) else " n/a"
                            for c in order], fontsize=7)
        ax.set_xlim(0, max(values) * 1.2 or 1)  # room for the value labels
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(rows, [f"{c.label} seed {c.seed}"
                              + ("" if c.status == COMPLETED else f" ({c.status})")
                              for c in order], fontsize=8)
    axes[0].invert_yaxis()  # the plan's first cell on top
    fig.suptitle(title)
    return fig, title, notes


def _lr_schedule(plt, cells):
    """Drawn from each run's recorded config with the trainer's own schedule function, at
    every step (the logged rows are sparse), with the logged values on top as a check.
    An optimizer's rates of its own (Muon's matrices, MARS's biases and norms) follow the
    same shape at their own peaks, dashed."""
    title = "Learning-rate schedule per optimizer (from each run's config; dots: logged)"
    notes = _skipped(cells)
    # The schedule does not depend on pruning, so each optimizer's first usable run shows it.
    sources = {}
    for opt in _optimizers(cells):
        found = next((c for c in _order(cells) if c.optimizer == opt and c.usable
                      and c.config and c.metrics), None)
        if found:
            sources[opt] = found
        else:
            notes.append(f"{opt}: no completed cell with a recorded config")
    if not sources:
        why = "no recorded config" if any(c.usable for c in cells) else NO_CELLS
        return why, title, notes
    colour, _, width = _styles(cells)
    fig, ax = plt.subplots(figsize=(7.5, 4), layout="constrained")
    for opt, c in sources.items():
        cfg, total = c.config, c.metrics[-1]["step"]
        steps = np.arange(1, total + 1)  # row "step": s reports the update with index s - 1
        lrs = np.array([lr_at(s - 1, total=cfg.get("schedule_iters") or total,
                              **schedule_of(cfg)) for s in steps])
        point = f", {grid_label(c.grid)}" if c.grid else ""
        ax.plot(steps, lrs, color=colour[opt], linewidth=width[opt],
                label=f"{opt} ({label(c.axes, skip=('optimizer',))}{point}, seed {c.seed})")
        spec = OPTIMIZERS.get(opt)
        own = [] if spec is None else spec.rates(record_view(cfg))
        for field, part in own:  # rates of its own: the same shape at their own peak
            if field != "learning_rate" and finite(cfg.get(field)):
                ax.plot(steps, lrs * cfg[field] / cfg["learning_rate"], color=colour[opt],
                        linestyle="--", linewidth=width[opt],
                        label=f"{opt}, {part or field.replace('_', ' ')}")
        logged = [r for r in c.metrics if finite(r.get("lr"))]
        ax.plot([r["step"] for r in logged], [r["lr"] for r in logged], "o", markersize=3,
                color=colour[opt])
    ax.set(xlabel="optimizer step", ylabel="learning rate", title=title)
    ax.title.set_fontsize(10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return fig, title, notes


def _lr_sweep(plt, cells: list[CellResult], grids: dict):
    """Final validation loss against each optimizer's learning rate, one line per
    setting: the mean over seeds at each rate, the best over the other grid axes when
    there are several (a profile). The star marks the point the tuned table took; an x
    on the top edge, a rate whose cells all failed or diverged."""
    from matplotlib.transforms import blended_transform_factory

    title = "Final validation loss vs learning rate, per optimizer (star: best point)"
    swept = {o for o, axes in grids.items() if len(axes.get("lr", {}).get("values", [])) > 1}
    if not swept:
        return ("no learning-rate grid (CONFIG_MATRIX_TUNE is off, or each optimizer has one "
                "rate)"), title, []
    mine = [c for c in _order(cells) if c.optimizer in swept and "lr" in c.grid]
    if not any(c.usable for c in mine):
        return NO_CELLS, title, _skipped(mine)
    colour, dash, width = _styles(cells)
    markers = {m: MARKERS[i % len(MARKERS)] for i, m in enumerate(_methods(cells))}
    fig, ax = plt.subplots(figsize=(8, 4.6), layout="constrained")
    top = blended_transform_factory(ax.transData, ax.transAxes)
    notes, failed_drawn = [], False
    settings: dict[tuple, list[CellResult]] = {}
    for c in mine:
        settings.setdefault(c.setting, []).append(c)
    for group in settings.values():
        opt, method, sparsity = group[0].optimizer, group[0].pruning, group[0].target_sparsity
        points: dict[tuple, list[CellResult]] = {}
        for c in group:
            points.setdefault(c.point, []).append(c)
        by_lr: dict[float, list[float]] = {}
        lost: set[float] = set()  # a rate with a cell that failed or diverged
        for point, members in points.items():
            lr = dict(point)["lr"]
            by_lr.setdefault(lr, [])
            if all(m.usable for m in members):
                by_lr[lr].append(float(np.mean([m.final_val_loss for m in members])))
            elif any(m.status == FAILED or (m.status == COMPLETED and not m.usable)
                     for m in members):
                lost.add(lr)
        rates = sorted(by_lr)
        good = [(lr, min(by_lr[lr])) for lr in rates if by_lr[lr]]
        # A rate none of whose points has run to the end yet (a matrix still running,
        # or stopped) is not a failure: it is said so, and drawn nowhere.
        notes += [f"{group[0].label} at lr {value_tag(lr)}: not run to the end yet"
                  for lr in rates if not by_lr[lr] and lr not in lost]
        bad = [lr for lr in rates if not by_lr[lr] and lr in lost]
        name = group[0].label
        if good:
            x, y = zip(*good)
            ax.plot(x, y, color=colour[opt], linestyle=dash[sparsity], marker=markers[method],
                    linewidth=width[opt], label=name)
            bx, by = min(good, key=lambda t: t[1])
            ax.plot([bx], [by], marker="*", markersize=15, color=colour[opt],
                    markeredgecolor="black", linestyle="none", zorder=4)
        for lr in bad:
            ax.plot([lr], [0.97], marker="x", markersize=9, color=colour[opt], transform=top,
                    clip_on=False, linestyle="none", zorder=4,
                    label=None if failed_drawn else "every cell failed or diverged")
            failed_drawn = True
            notes.append(f"{name} at lr {value_tag(lr)}: every cell failed or diverged")
    ax.set_xscale("log")
    lrs = sorted({c.grid["lr"] for c in mine})
    ax.set_xticks(lrs, [value_tag(v) for v in lrs], rotation=30 if len(lrs) > 5 else 0)
    ax.minorticks_off()
    ax.set(xlabel="peak learning rate (Muon: of its block matrices)",
           ylabel="final validation loss", title=title)
    ax.title.set_fontsize(10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return fig, title, notes + [n for n in _skipped(mine) if "failed" not in n and "NaN" not in n]


def _val_loss_tokens_time(plt, cells):
    """Validation loss of each setting against tokens seen and against wall time: a
    step of Muon costs more than a step of AdamW, so equal steps are not equal cost."""
    title = "Validation loss vs tokens and vs wall time (mean over seeds)"
    groups = _groups(cells)
    if not groups:
        return NO_CELLS, title, _skipped(cells)
    colour, dash, width = _styles(cells)
    fig, axes = plt.subplots(1, 2, sharey=True, figsize=(12, 4.4), layout="constrained")
    missing, later = [], []
    for group in groups.values():
        opt, sparsity = group[0].optimizer, group[0].target_sparsity
        rows = [{r["step"]: r for r in c.metrics if finite(r.get("val_loss"))} for c in group]
        steps = sorted(set.intersection(*map(set, rows)))
        if not steps:
            missing.append(f"{group[0].label}: no val_loss in its metrics")
            continue
        loss = [float(np.mean([one[t]["val_loss"] for one in rows])) for t in steps]
        later += [v for t, v in zip(steps, loss) if t > 0]
        style = dict(color=colour[opt], linestyle=dash[sparsity], linewidth=width[opt], marker=".")
        axes[0].plot([rows[0][t].get("tokens", 0) for t in steps], loss, label=group[0].label,
                     **style)
        axes[1].plot([float(np.mean([one[t].get("elapsed_s", 0.0) for one in rows]))
                      for t in steps], loss, **style)
    if later:
        lo, hi = min(later), max(later)
        pad = 0.06 * (hi - lo) or 0.1
        axes[0].set_ylim(lo - pad, hi + pad)
    axes[0].set(xlabel="tokens seen", ylabel="validation loss (nats/token)")
    axes[1].set(xlabel="wall time (s, evaluations included)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.legend(loc="outside right center", fontsize=8)
    fig.suptitle(title + ("; step 0 above the axis" if later else ""))
    return fig, title, _skipped(cells) + missing


def _budget_fit(plt, cells, fits):
    """Final validation loss against tokens trained, one line per setting across its
    budgets (mean over seeds), with the baseline's fitted power law dashed: where an
    optimizer's point lies on the fit is the tokens the baseline would need (D_eff)."""
    from gpt2.matrix.speedup import final_tokens

    title = "Final validation loss vs tokens across budgets (dashed: the baseline's fit)"
    colour, dash, width = _styles(cells)
    series: dict[tuple, list[CellResult]] = {}
    for c in _order(cells):
        if c.usable and final_tokens(c):
            key = (c.optimizer, c.pruning, c.target_sparsity)
            series.setdefault(key, []).append(c)
    if not series:
        return NO_CELLS, title, _skipped(cells)
    fig, ax = plt.subplots(figsize=(8, 4.6), layout="constrained")
    every = []
    for (opt, method, sparsity), members in series.items():
        by: dict[float, list[float]] = {}
        for c in members:
            by.setdefault(final_tokens(c), []).append(c.final_val_loss)
        xs = sorted(by)
        every += xs
        ax.errorbar(xs, [np.mean(by[x]) for x in xs],
                    yerr=[np.std(by[x], ddof=1) if len(by[x]) > 1 else 0.0 for x in xs],
                    color=colour[opt], linestyle=dash[sparsity], marker="o", capsize=3,
                    linewidth=width[opt], label=label(members[0].axes, skip=("budget",)))
    grid = np.geomspace(min(every) / 1.5, max(every) * 1.5, 100)
    for fit in fits:
        ax.plot(grid, fit["a"] * grid ** -fit["b"] + fit["c"], color="0.3", linestyle="--",
                linewidth=1.2, label=f"fit {fit['setting']} (R² {fit['r2']:.3f})")
    ax.set_xscale("log")
    ax.set(xlabel="tokens trained", ylabel="final validation loss", title=title)
    ax.title.set_fontsize(10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return fig, title, _skipped(cells)
