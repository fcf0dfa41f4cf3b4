"""Static HTML pages of the results: ``results/index.html``, ``<run>/run.html`` and
``<matrix>/report.html`` (beside report.md).

Every page is one self-contained file: the stylesheet and the small script that sorts
and filters its tables (templates/style.css, tables.js) are written into it, links
and pictures are relative paths, and nothing is fetched, so a page opens from disk,
from a copy of the folder, or from a server, the same. Pages are rendered with Jinja2
from the files of the runs only (gpt2/results/catalog.py), so they can be rebuilt at
any time (`make results`) and are rebuilt after each run and matrix.

    write_index(Path("results"))            # index.html: every run and matrix
    write_run_page(Path("results/tiny-…"))  # one run's page
    write_matrix_page(Path("results/matrix-…"))
    write_all(Path("results"))              # all of them: `make results`
"""

from __future__ import annotations

import datetime
import functools
import os
import re
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

from gpt2.names import symbol
from gpt2.config.options import (Config, applies, fields, from_record, opt, record_view,
                                 run_tags)
from gpt2.config.registry import OPTIMIZERS
from gpt2.errors import ConfigError, ResultsError, StorageError
from gpt2.matrix.collect import MATRIX_SUMMARY, csv_rows, load_cells
from gpt2.matrix.plots import PLOTS_INDEX
from gpt2.matrix.results import finite
from gpt2.matrix.runner import fmt_duration
from gpt2.matrix.tuning import grid_settings
from gpt2.config.axes import AXES
from gpt2.results import catalog, charts, compare, report_html
from gpt2.results.catalog import FIGURES, Matrix, Run, number
from gpt2 import run_folder, storage
from gpt2.run_folder import (CONFIG_JSON, COMPLETED, FAILED, INTERRUPTED, NO_SUMMARY, RUNNING,
                             SUMMARY, Summary)
from gpt2.storage import write_text_atomic

INDEX = "index.html"
RUN_PAGE = "run.html"
MATRIX_PAGE = "report.html"
TEMPLATES = Path(__file__).with_name("templates")
# The metrics rows a run page lists: evaluations (every row would be thousands).
EVAL_KEYS = ("step", "tokens", "train_loss", "val_loss", "val_ppl", "lr", "tokens_per_sec",
             "sparsity", "hellaswag_acc_norm")
# The figures the index lists for each run (its page has them all).
INDEX_FIGURES = ("final_val_loss", "final_val_ppl", "tokens_per_sec", "mfu", "peak_memory_mb",
                 "final_sparsity", "hellaswag_acc_norm")
# A run's notes in its user's words, written after the fact (CONFIG_RUN_NOTES is the
# one-line note given before): markdown, shown on the run's page, at most NOTES_LIMIT.
NOTES_FILE = "notes.md"
NOTES_LIMIT = 64 * 1024
FILES = (run_folder.CONFIG, run_folder.CONFIG_JSON, run_folder.SUMMARY, run_folder.METRICS,
         run_folder.PROVENANCE, run_folder.SAMPLES, "hellaswag.json", "train.log", NOTES_FILE)


@functools.lru_cache(maxsize=None)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES),
                             autoescape=jinja2.select_autoescape(["html"]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.globals["style"] = (TEMPLATES / "style.css").read_text()
    env.globals["script"] = (TEMPLATES / "tables.js").read_text()
    env.globals["chart_script"] = (TEMPLATES / "charts.js").read_text()
    env.globals["uplot"] = charts.library  # (read when a page has a chart)
    env.globals["charts"] = False  # a page with a chart passes True: the library comes along
    return env


# Every page kgpt writes says so in its head; a page without it is not replaced.
GENERATOR = '<meta name="generator" content="kgpt">'
LEGACY = re.compile(r"<title>[^<]*\bkgpt\b[^<]*</title>")  # (pages from before the mark)


def ours(page: Path) -> bool:
    """Whether ``page`` is missing or a page kgpt wrote (which it may replace)."""
    if not page.exists() and not page.is_symlink():
        return True
    data = storage.read_regular(page)
    head = (data or b"")[:4096].decode(errors="replace")
    return GENERATOR in head or bool(LEGACY.search(head))


def _render(template: str, path: Path, **context: Any) -> Path:
    """Write the page ``path``. One that is there and not kgpt's (a run.html or an
    index.html of someone's, in a folder RUN= named) is left alone: ResultsError."""
    if not ours(path):
        raise ResultsError(f"{path} is not a page kgpt wrote, so it is left alone: move it "
                           "away for kgpt to write its page there")
    html = _environment().get_template(template).render(
        written=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), **context)
    write_text_atomic(path, html)
    return path


# ---- what the templates show -------------------------------------------------------

def when(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M")


def sparkline(run: Run, width: int = 96, height: int = 22) -> str:
    """An inline SVG of the run's validation loss (training loss when it has no
    evaluations yet) against step, from the first evaluation after step 0; empty
    without two points."""
    rows = run.metrics()
    key = "val_loss" if sum(1 for r in rows if number(r.get("val_loss")) is not None) > 1 \
        else "train_loss"
    pts = [(r["step"], number(r.get(key))) for r in rows]
    pts = [(x, y) for x, y in pts if y is not None]
    if sum(1 for x, _ in pts if x > 0) >= 2:
        pts = [(x, y) for x, y in pts if x > 0]  # the untrained model's loss would flatten it
    if len(pts) < 2:
        return ""
    x0, x1 = pts[0][0], pts[-1][0]
    lo, hi = min(y for _, y in pts), max(y for _, y in pts)
    sx = (width - 4) / max(x1 - x0, 1)
    sy = (height - 4) / (hi - lo) if hi > lo else 0.0
    coords = " ".join(f"{2 + (x - x0) * sx:.1f},{height - 2 - (y - lo) * sy:.1f}"
                      for x, y in pts)
    return (f'<svg class="spark" width="{width}" height="{height}" role="img" '
            f'aria-label="{key.replace("_", " ")} from {pts[0][1]:.3f} to {pts[-1][1]:.3f}">'
            f'<polyline fill="none" stroke="#2f5bd3" stroke-width="1.5" points="{coords}"/>'
            "</svg>")


def cell(value: float | None, text: str | None = None) -> dict[str, Any]:
    """A table cell: its text and its sort value (data-v; "" when missing)."""
    if value is None:
        return {"text": "n/a", "v": "", "na": True, "best": False}
    return {"text": text if text is not None else f"{value:g}", "v": repr(float(value)),
            "na": False, "best": False}


def figure_cells(run: Run, keys: list[str]) -> list[dict[str, Any]]:
    out = []
    for key in keys:
        value = run.figure(key)
        out.append(cell(value, None if value is None else catalog.FIGURE[key].format(value)))
    return out


def mark_best(rows: list[dict[str, Any]], keys: list[str], field_name: str = "figures") -> None:
    """Flag the best value of each column that has a direction (catalog.FIGURES),
    unless every row has the same."""
    for i, key in enumerate(keys):
        better = catalog.FIGURE[key].better
        values = [(float(r[field_name][i]["v"]), r) for r in rows if r[field_name][i]["v"]]
        if better and len({v for v, _ in values}) > 1:  # (all equal: nothing stands out)
            best = (min if better == "low" else max)(v for v, _ in values)
            for v, r in values:
                r[field_name][i]["best"] = v == best


def pruning_text(config: dict[str, Any]) -> str:
    """"magnitude 50%", "rigl 50% 2:4": the method, its target and an N:M structure."""
    method = config.get("pruning_method", "none")
    target = number(config.get("target_sparsity"))
    if method == "none" or target is None:
        return method
    structure = config.get("pruning_structure")
    return f"{method} {target * 100:g}%" + (
        f" {structure}" if isinstance(structure, str) and structure != "unstructured" else "")


def kernel_text(summary) -> str | None:
    """What the 2:4 kernel did (summary.json's sparse_kernel_layers; None where it
    cannot run, so nothing is said)."""
    layers = summary.sparse_kernel_layers
    if not isinstance(layers, int) or isinstance(layers, bool):
        return None
    return (f"forward of {layers} Linear layers" if layers else
            "not used (checked and kept dense, or the ramp had not ended: see train.log)")


def model_text(run: Run) -> str:
    c = run.config
    size = c.get("model_size", "?")
    dims = f"{c.get('n_layer')}x{c.get('n_embd')}"
    params = number((run.summary or NO_SUMMARY).n_params)
    count = (f"{params / 1e6:.1f}M" if params >= 1e5 else f"{params / 1e3:.1f}k") if params else ""
    return (f"{size} {dims}" if size == "custom" else str(size)) + (f", {count}" if count else "")


def run_row(run: Run, base: Path, keys: list[str]) -> dict[str, Any]:
    """A run as a row of the index (links relative to ``base``)."""
    planned = (number((run.summary or NO_SUMMARY).max_iters)
               or number(run.config.get("max_iters")))
    done = run.figure("iters")
    return {"name": run.name, "href": _relative(run.path / RUN_PAGE, base),
            "status": "aside" if run.set_aside else run.status,
            "status_text": "set aside" if run.set_aside else run.status,
            "optimizer": run.config.get("optimizer", "?"), "pruning": pruning_text(run.config),
            "model": model_text(run), "dataset": run.config.get("dataset", "?"),
            "steps": cell(done, None if done is None else
                          f"{done:,.0f}" + (f" / {planned:,.0f}" if planned else "")),
            "figures": figure_cells(run, keys), "spark": sparkline(run),
            "updated": when(run.modified()), "updated_v": run.modified(),
            "error": (run.summary or NO_SUMMARY).error, "differs": "",
            "tags": tags_of(run.config), "notes": notes_of(run.config)}


def tags_of(config: dict[str, Any]) -> list[str]:
    return run_tags(config.get("run_tags"))


def notes_of(config: dict[str, Any]) -> str:
    notes = config.get("run_notes")
    return notes.strip() if isinstance(notes, str) else ""


def notes_file(path: Path) -> tuple[str, bool]:
    """``path``/notes.md as safe HTML, and whether it was cut at NOTES_LIMIT. A link by
    that name is not followed: it would publish whatever file it points to."""
    data = storage.read_regular(path / NOTES_FILE, follow=False) or b""
    cut = len(data) > NOTES_LIMIT
    text = data[:NOTES_LIMIT].decode(errors="replace")
    return report_html.safe_markdown(text), cut


def matrix_row(matrix: Matrix, base: Path) -> dict[str, Any]:
    best = matrix.best()
    return {"name": matrix.name, "href": _relative(matrix.path / MATRIX_PAGE, base),
            "planned": matrix.planned, "completed": matrix.count(COMPLETED),
            "failed": matrix.count(FAILED), "running": matrix.count(RUNNING),
            "interrupted": matrix.count(INTERRUPTED),
            "best": best.name if best else None,
            "best_loss": cell(best.figure("final_val_loss") if best else None,
                              f"{best.figure('final_val_loss'):.4f}" if best else None),
            "updated": when(matrix.modified()), "updated_v": matrix.modified()}


def _relative(path: Path, base: Path) -> str:
    """``path`` as a link from a page in ``base`` (both may be relative or absolute)."""
    return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()


# ---- pages ---------------------------------------------------------------------------

def write_index(root: Path) -> Path:
    """``root``/index.html: every matrix and single run under ``root``."""
    runs, matrices = catalog.scan(root)
    keys = [k for k in INDEX_FIGURES if any(r.figure(k) is not None for r in runs)]
    rows = [run_row(r, root, keys) for r in runs]
    # Runs of one name (the same preset, settings changed) are told apart by what
    # differs between them: "lr 4e-3, 100 steps" under the folder's hash.
    named: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        named.setdefault(str(r.config.get("run_name", r.name)), []).append(i)
    for members in named.values():
        if len(members) > 1:
            for i, text in zip(members, compare.labels([runs[i] for i in members],
                                                       fallback=False)):
                rows[i]["differs"] = text
    mark_best([r for r in rows if r["status"] == COMPLETED], keys)
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status_text"]] = statuses.get(r["status_text"], 0) + 1
    return _render("index.html", root / INDEX, root=str(root.resolve()), runs=rows,
                   matrices=[matrix_row(m, root) for m in matrices],
                   figure_labels=[catalog.FIGURE[k].label for k in keys],
                   statuses=sorted(statuses.items()))


def settings_table(run: Run) -> list[dict[str, Any]]:
    """Every setting in force in the run: its value, and whether that is the default."""
    try:
        cfg = from_record(run.config)
    except (ConfigError, TypeError, ValueError):
        return [{"name": k, "symbol": "", "value": v, "default": False, "group": ""}
                for k, v in sorted(run.config.items())]
    out = []
    for f in fields():
        if not applies(cfg, f.name):
            continue
        value = getattr(cfg, f.name)
        out.append({"name": f.name, "symbol": symbol(f.name), "group": opt(f.name).group,
                    "value": _setting_text(value),
                    "default": value == getattr(Config, f.name, None)})
    return out


def _setting_text(value: Any) -> str:
    if isinstance(value, bool):
        return "y" if value else "n"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def samples(run: Run, limit: int = 12) -> list[tuple[str, str]]:
    """(heading, text) of the newest samples.txt entries, newest first."""
    text = storage.read_text(run.path / "samples.txt", follow=False)
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("=== ") and line.endswith(" ==="):
            out.append((line.strip("= "), []))
        elif out:
            out[-1][1].append(line)
    return [(h, "\n".join(lines).strip()) for h, lines in reversed(out)][:limit]


def eval_rows(run: Run) -> tuple[list[str], list[list[str]]]:
    rows = [r for r in run.metrics() if "val_loss" in r]
    keys = [k for k in EVAL_KEYS if any(k in r for r in rows)]
    out = []
    for r in rows:
        line = []
        for k in keys:
            v = r.get(k)
            if isinstance(v, float):
                v = (f"{v:.3e}" if k == "lr" else f"{v:,.0f}" if k == "tokens_per_sec"
                     else f"{v:,.2f}" if k == "val_ppl" else f"{v:.4f}")
            elif isinstance(v, int):
                v = f"{v:,}"
            line.append("" if v is None else str(v))
        out.append(line)
    return keys, out


def batch_text(summary: Summary) -> str | None:
    """ "16 x 4" (micro-batch x gradient accumulation), from what the summary holds."""
    micro, accumulation = summary.micro_batch, summary.gradient_accumulation
    if micro is None and accumulation is None:
        return None
    return f"{'?' if micro is None else micro} x {'?' if accumulation is None else accumulation}"


def code_text(key: str, value: Any) -> Any:
    """A provenance.json code field as the run page shows it."""
    if key == "dirty":
        return {True: "yes: uncommitted changes", False: "no"}.get(value, value)
    if key == "commit" and not value:
        return "unknown (not run from a git checkout)"
    return value


def write_run_page(path: Path) -> Path:
    """``path``/run.html for one run folder (a single run or a matrix cell)."""
    run = catalog.read_run(path, matrix=catalog._matrix_of(path))
    summary = run.summary or NO_SUMMARY
    keys = [f.key for f in FIGURES if run.figure(f.key) is not None]
    code = (run.provenance or {}).get("code") or {}
    data = (run.provenance or {}).get("data") or {}
    parent = run.parent
    eval_keys, evals = eval_rows(run)
    chart = charts.run_chart(run.metrics())
    notes_html, notes_cut = notes_file(path)
    return _render(
        "run.html", path / RUN_PAGE, run=run, status=run.status,
        index=_relative((run.matrix.parent if run.matrix else path.parent) / INDEX, path),
        matrix=({"name": run.matrix.name,
                 "href": _relative(run.matrix / MATRIX_PAGE, path)} if run.matrix else None),
        parent=({**parent, "href": _relative(Path(parent["path"]) / RUN_PAGE, path)
                 if parent.get("path") and Path(parent["path"]).is_dir() else None}
                if parent else None),
        figures=[(catalog.FIGURE[k].label, catalog.FIGURE[k].format(run.figure(k)))
                 for k in keys],
        facts=[(k, v) for k, v in (
            ("model", model_text(run)), ("optimizer", run.config.get("optimizer")),
            ("learning rate", rate_text(run.config)),
            ("pruning", pruning_text(run.config)),
            ("2:4 sparse kernel", kernel_text(summary)),
            ("device", summary.device), ("precision", summary.dtype),
            ("micro-batch x accumulation", batch_text(summary)),
            ("dataset", run.config.get("dataset")),
            ("wall time", fmt_duration(summary.wall_time_s)
             if finite(summary.wall_time_s) else None),
            ("config hash", summary.config_hash)) if v],
        error=summary.error or run.doubt,
        loss_png="loss.png" if (path / "loss.png").is_file() else None,
        chart=chart, charts=chart is not None,
        tags=tags_of(run.config), notes=notes_of(run.config),
        notes_html=markupsafe.Markup(notes_html), notes_cut=notes_cut,  # (allowlisted HTML)
        samples=samples(run), settings=settings_table(run),
        code=[(k, code_text(k, code[k])) for k in ("commit", "dirty", "sources", "torch")
              if k in code],
        data=[(k, data.get(k)) for k in ("dataset", "tokens", "sha256", "train_tokens",
                                         "val_tokens") if k in data],
        eval_keys=eval_keys, evals=evals,
        files=[f for f in FILES if (path / f).is_file() and not (path / f).is_symlink()])


def plot_list(folder: Path) -> list[dict[str, Any]]:
    """The matrix's plots with their titles and notes (plots/plots.json, written with
    them), else every PNG there by name."""
    plots = folder / "plots"
    index = catalog.read_json(plots / PLOTS_INDEX) or {}
    listed = [p for p in index.get("plots", []) if (plots / p.get("filename", "")).is_file()]
    if listed:
        return [{"src": f"plots/{p['filename']}", "title": p.get("title", p["filename"]),
                 "notes": p.get("notes", [])} for p in listed]
    return [{"src": f"plots/{p.name}", "title": p.stem.replace("_", " "), "notes": []}
            for p in sorted(plots.glob("*.png"))]


def write_matrix_page(folder: Path) -> Path:
    """``folder``/report.html: report.md's comparison (report_html.py), every planned cell,
    sortable, with its page, and the plots."""
    matrix = catalog.read_matrix(folder)
    cells = load_cells(folder)
    rows = csv_rows(cells)
    grid = grid_settings(cells)
    present = [a for a in AXES if any(a.name in c.axes for c in cells)]
    keys = ["final_val_loss", "final_val_ppl"]
    table = []
    for c, row in zip(cells, rows):
        page = folder / "cells" / c.cell / RUN_PAGE
        table.append({
            "id": c.cell, "href": f"cells/{c.cell}/{RUN_PAGE}" if page.is_file() else None,
            "axes": [_axis_cell(a, c.axes.get(a.name)) for a in present],
            "grid": [row.get(k) for k in grid], "status": c.status,
            "error": c.error,
            "figures": [cell(number(c.final_val_loss), _fmt(c.final_val_loss, ".4f")),
                        cell(number(c.final_val_ppl), _fmt(c.final_val_ppl, ",.2f"))],
            "sparsity": cell(number(c.final_sparsity), _fmt(c.final_sparsity, ".3f")),
            "speed": cell(number(c.tokens_per_sec), _fmt(c.tokens_per_sec, ",.0f")),
            "memory": cell(number(c.peak_memory_mb), _fmt(c.peak_memory_mb, ",.0f")),
            "wall": cell(number(c.wall_time_s),
                         fmt_duration(c.wall_time_s) if number(c.wall_time_s) is not None else None),
            "job": c.slurm_job or ""})
    mark_best([r for r in table if r["status"] == COMPLETED], keys)
    chart = charts.matrix_chart({c.name: c.metrics() for c in matrix.cells})
    plan = matrix.plan
    axes = plan.get("axes") or {}
    arrays = (catalog.read_json(folder / "slurm" / "jobs.json") or {}).get("arrays")
    return _render(
        "matrix.html", folder / MATRIX_PAGE, matrix=matrix, plan=plan,
        index=_relative(folder.parent / INDEX, folder), cells=table, grid=grid,
        axis_heads=[{"text": a.heading, "num": str not in a.kind} for a in present],
        counts=_counts(c.status for c in cells),
        axes=[(k.replace("_", " "), ", ".join(map(str, v))) for k, v in axes.items()
              if isinstance(v, list) and v],  # (the grids are the table's columns)
        plots=plot_list(folder), chart=chart, charts=chart is not None,
        comparison=markupsafe.Markup(report_html.comparison(folder)),  # (allowlisted HTML)
        arrays=[a["job"] for a in (arrays if isinstance(arrays, list) else [])
                if isinstance(a, dict) and isinstance(a.get("job"), str)],
        files=[f for f in ("report.md", "summary.csv", MATRIX_SUMMARY, "plan.yaml",
                           "status.json") if (folder / f).is_file()])


def _axis_cell(axis, value: Any) -> dict[str, Any]:
    """A matrix table's cell for an axis's value: a number sorted as one, or a name."""
    if str not in axis.kind or isinstance(value, (int, float)):
        return {**cell(value, None if value is None else axis.text(value)), "num": True}
    return {"text": value if value is None else axis.text(value), "v": value,
            "na": value is None, "num": False}


def rate_text(config: dict[str, Any]) -> str | None:
    """The peak learning rate(s) a run trained at: "6e-4", or, for an optimizer with
    rates of its own, each with the parameters it drives: "0.02 (matrices), 6e-4 (the
    rest)" (its module's grids say which)."""
    lr = number(config.get("learning_rate"))
    if lr is None:
        return None
    spec = OPTIMIZERS.get(config.get("optimizer"))
    if spec is None:
        return f"{lr:g}"
    rates = [(number(config.get(field)), part) for field, part in spec.rates(record_view(config))]
    if any(value is None for value, _ in rates):
        return f"{lr:g}"
    if len(rates) == 1:
        return f"{rates[0][0]:g}"
    return ", ".join(f"{value:g} ({part})" for value, part in rates)


def _fmt(value: Any, spec: str) -> str | None:
    return format(value, spec) if number(value) is not None else None


def _counts(statuses) -> list[tuple[str, int]]:
    out: dict[str, int] = {}
    for s in statuses:
        out[s] = out.get(s, 0) + 1
    return sorted(out.items())


def write_all(root: Path) -> list[Path]:
    """Every page under ``root``: each run's, each matrix's and its cells', the index.
    In a shared results folder a run or matrix of another user's is listed in the
    index but its folder is not written into, and one whose page cannot be written is
    skipped with a note: one neighbour's folder never keeps the index from everyone."""
    runs, matrices = catalog.scan(root)
    written: list[Path] = []
    for path, write in [*((r.path, write_run_page) for r in runs),
                        *((m.path, matrix_pages) for m in matrices)]:
        try:
            if path.stat().st_uid != os.geteuid():
                print(f"  note: {path} is another user's: its pages are theirs to write")
                continue
            pages = write(path)
        except (ResultsError, StorageError) as e:
            print(f"  note: no pages for {path}: {e}")
            continue
        written += pages if isinstance(pages, list) else [pages]
    written.append(write_index(root))
    return written


def matrix_pages(folder: Path) -> list[Path]:
    """The pages of a matrix's cells and its own. A cell folder (or cells/) that is a
    link is not the matrix's: its page is not written there (it may be another run's
    folder, whose run.html would be replaced)."""
    cells = [c for c in catalog.read_matrix(folder).cells
             if not (c.path.is_symlink() or c.path.parent.is_symlink())]
    return [*(write_run_page(c.path) for c in cells), write_matrix_page(folder)]


def _noted(write) -> bool:
    """Run ``write``; pages are a convenience, so a failure is printed as a note,
    never raised into the run or matrix they show. True when the pages were written."""
    try:
        write()
    except Exception as e:  # noqa: BLE001 - whatever went wrong, the results stand
        print(f"note: the HTML pages were not updated ({type(e).__name__}: {e}); "
              "`make results` writes them", flush=True)
        return False
    return True


def page_is_current(path: Path) -> bool:
    """The run folder ``path`` has its page, written after its summary: nothing the page
    shows has changed since (a run only reported as complete)."""
    try:
        return (path / RUN_PAGE).stat().st_mtime >= (path / SUMMARY).stat().st_mtime
    except OSError:
        return False


def publish_after_run(path: Path, root: Path | None) -> bool:
    """What starts train.py calls this once it has ended: the run's page and the
    index, unless the page is current (publish_run)."""
    if not (path / CONFIG_JSON).is_file():
        return False  # (it never started: nothing to show)
    return page_is_current(path) or publish_run(path, root)


def publish_run(path: Path, root: Path | None) -> bool:
    """After a run: its page, and the index of ``root`` (a single run's results
    folder; None for a matrix cell, whose matrix is published as a whole)."""
    return _noted(lambda: (write_run_page(path), root is not None and write_index(root)))


def publish_matrix(folder: Path) -> bool:
    """After a matrix is collected: its cells' pages, its page, and the index beside it."""
    return _noted(lambda: (matrix_pages(folder), write_index(folder.parent)))
