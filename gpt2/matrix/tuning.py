"""The tuned comparison of a matrix: each optimizer x pruning x sparsity setting at its
best grid point, and the warnings when a best point sits on the edge of its grid
(the optimum may lie beyond it). collect.py writes it into summary.json and the
plots; report.py opens report.md with it.
"""

from __future__ import annotations

from typing import Any

from gpt2.config.axes import AXES, label, setting, value_tag
from gpt2.config.matrix import grid_symbol, tuning_grids
from gpt2.matrix.results import CellResult, finite
from gpt2.config.options import applies, fields, opt
from gpt2.matrix.plan_file import planned_config


def has_grid(plan: dict[str, Any]) -> bool:
    """Whether any axis of the plan's grid has more than one value."""
    return any(len(axis["values"]) > 1 for axes in grids(plan).values()
               for axis in axes.values())


def grids(plan: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """{optimizer: {axis label: {"field", "values"}}} of a plan (empty before grids)."""
    return plan["axes"].get("grids") or {}


def tuned(plan: dict[str, Any], combos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each setting at its best grid point: the lowest mean final validation loss
    among the points whose every seed completed with a finite loss. Rows are the
    aggregate rows of those points plus "points" (grid points planned), "eligible"
    (points that count) and "edges" (warnings: a best value at the end of a grid
    axis of more than one value means the optimum may lie beyond it). A setting with
    no eligible point is listed with "best" None."""
    settings: dict[tuple, list[dict[str, Any]]] = {}
    for row in combos:
        settings.setdefault(setting(row), []).append(row)
    out = []
    for rows in settings.values():
        eligible = [r for r in rows if r["n"] == r["planned"] and finite(r["final_val_loss_mean"])]
        best = min(eligible, key=lambda r: r["final_val_loss_mean"], default=None)
        row = {**(best or rows[0]), "best": best is not None, "points": len(rows),
               "eligible": len(eligible), "edges": []}
        if best is not None:
            row["edges"] = _edges(row, best["grid"], grids(plan).get(row["optimizer"], {}))
        out.append(row)
    return out


def edge_points(row: dict[str, Any], axes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The grid axes on whose end a tuned row's best point sits: {label, field, value,
    values (sorted), side ("top" or "bottom")} each. Zero at the bottom (no weight
    decay) is an end, not an edge to extend past; a y/n setting has no beyond."""
    out = []
    for name, value in row["grid"].items():
        values = sorted(axes.get(name, {}).get("values", []))
        if (len(values) < 2 or isinstance(value, bool) or values[0] < value < values[-1]
                or value == values[0] == 0):
            continue
        out.append({"label": name, "field": axes[name]["field"], "value": value,
                    "values": values, "side": "bottom" if value == values[0] else "top"})
    return out


def _edges(row: dict[str, Any], point: dict[str, Any],
           axes: dict[str, dict[str, Any]]) -> list[str]:
    optimizer = row["optimizer"]
    out = []
    for e in edge_points({**row, "grid": point}, axes):
        name = e["label"]
        where = (f"CONFIG_{grid_symbol(name, optimizer)}"
                 if name in tuning_grids(optimizer) else "CONFIG_MATRIX_SWEEP")
        out.append(f"{label(row)}: the best {name} ({e['field']}) {value_tag(e['value'])} is "
                   f"the {'smallest' if e['side'] == 'bottom' else 'largest'} of its grid "
                   f"({' '.join(map(value_tag, e['values']))}): under-tuned, the optimum may "
                   f"lie beyond it; extend {where}")
    return out


def tuned_cells(cells: list[CellResult], best: list[dict[str, Any]]) -> list[CellResult]:
    """The cells of each setting's best point (every cell of a setting that has none,
    so its failures stay visible)."""
    chosen = {setting(r): tuple(r["grid"].items()) if r["best"] else None for r in best}
    return [c for c in cells if chosen.get(c.setting) in (None, c.point)]


def grid_settings(cells: list[CellResult]) -> list[str]:
    """Every setting a grid axis of the cells sets, in order of first appearance: the
    columns of the tables."""
    return list(dict.fromkeys(name for c in cells for name in c.settings))


def point_settings(plan: dict[str, Any], optimizer: str,
                   point: dict[str, Any]) -> dict[str, Any]:
    """A grid point by the settings it sets: {"lr": 0.02, "adam_lr": 8e-3} of a cell
    whose optimizer has a rate of its own, <own>_lr, for its "lr" -> {"<own>_lr": 0.02,
    "learning_rate": 8e-3}. Tables show these, so a column means one setting whatever
    the optimizer (one optimizer's "lr" is not another's)."""
    axes = grids(plan).get(optimizer, {})
    return {axes[label]["field"] if label in axes else label: value
            for label, value in point.items()}


def settings_that_differ(plan: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The settings (that change results) in force at other values in some
    optimizer's cells than in another's, grids aside: {optimizer: {field: value}},
    e.g. SPAM's threshold and reset interval, or the learning rate an untuned
    optimizer keeps. A setting that varies within an optimizer's cells (min_lr
    following a tuned rate) reads "follows its grid"."""
    per: dict[str, dict[str, set]] = {}
    axis_fields = {a.field for a in AXES}
    gridded: dict[str, set[str]] = {}
    for cell in plan["cells"]:
        cfg = planned_config(cell["args"])
        optimizer = cell["optimizer"]
        gridded.setdefault(optimizer, set()).update(
            point_settings(plan, optimizer, cell.get("grid") or {}))
        values = per.setdefault(optimizer, {})
        for f in fields():
            if opt(f.name).hashed and f.name not in axis_fields and applies(cfg, f.name):
                values.setdefault(f.name, set()).add(getattr(cfg, f.name))
    if len(per) < 2:
        return {}
    names = dict.fromkeys(name for values in per.values() for name in values)
    out: dict[str, dict[str, str]] = {optimizer: {} for optimizer in per}
    for name in names:
        seen = {o: frozenset(v.get(name, ())) for o, v in per.items()}
        if len(set(seen.values())) < 2:
            continue  # the same everywhere
        for optimizer, values in seen.items():
            if not values or name in gridded[optimizer]:
                continue  # not in force here, or shown with the grids
            out[optimizer][name] = (value_tag(next(iter(values))) if len(values) == 1
                                    and isinstance(next(iter(values)), (int, float))
                                    else str(next(iter(values))) if len(values) == 1
                                    else "follows its grid")
    return {o: d for o, d in out.items() if d}
