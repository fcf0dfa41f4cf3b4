"""The tuned comparison of a matrix: each optimizer x pruning x sparsity setting at its
best grid point, and the warnings when a best point sits on the edge of its grid
(the optimum may lie beyond it). collect.py writes it into summary.json and the
plots; report.py opens report.md with it.
"""

from __future__ import annotations

from typing import Any

from gpt2.config.matrix import GRIDS, grid_symbol
from gpt2.matrix.results import CellResult, finite, pruning_label, value_tag


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
        key = (row["optimizer"], row["pruning"], row["target_sparsity"])
        settings.setdefault(key, []).append(row)
    out = []
    for (optimizer, pruning, target), rows in settings.items():
        eligible = [r for r in rows if r["n"] == r["planned"] and finite(r["final_val_loss_mean"])]
        best = min(eligible, key=lambda r: r["final_val_loss_mean"], default=None)
        row = {**(best or rows[0]), "best": best is not None, "points": len(rows),
               "eligible": len(eligible), "edges": []}
        if best is not None:
            row["edges"] = _edges(optimizer, pruning, target, best["grid"],
                                  grids(plan).get(optimizer, {}))
        out.append(row)
    return out


def _edges(optimizer: str, pruning: str, target, point: dict[str, Any],
           axes: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for label, value in point.items():
        values = sorted(axes.get(label, {}).get("values", []))
        # Zero at the bottom (no weight decay) is an end, not an edge to extend past;
        # a y/n setting has no beyond.
        if (len(values) < 2 or isinstance(value, bool) or values[0] < value < values[-1]
                or value == values[0] == 0):
            continue
        where = (f"CONFIG_{grid_symbol(label, optimizer)}" if label in GRIDS
                 else "CONFIG_MATRIX_SWEEP")
        out.append(f"{optimizer} / {pruning_label(pruning, target)}: the best {label} "
                   f"({axes[label]['field']}) {value_tag(value)} is the "
                   f"{'smallest' if value == values[0] else 'largest'} of its grid "
                   f"({' '.join(map(value_tag, values))}): under-tuned, the optimum may lie "
                   f"beyond it; extend {where}")
    return out


def tuned_cells(cells: list[CellResult], best: list[dict[str, Any]]) -> list[CellResult]:
    """The cells of each setting's best point (every cell of a setting that has none,
    so its failures stay visible)."""
    chosen = {(r["optimizer"], r["pruning"], r["target_sparsity"]):
              tuple(r["grid"].items()) if r["best"] else None for r in best}
    return [c for c in cells if chosen.get(c.setting) in (None, c.point)]


def grid_labels(cells: list[CellResult]) -> list[str]:
    """Every grid axis label of the cells, in order of first appearance."""
    return list(dict.fromkeys(label for c in cells for label in c.grid))
