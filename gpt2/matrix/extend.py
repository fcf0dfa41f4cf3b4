"""Grids that extend themselves (CONFIG_MATRIX_TUNE_EXTEND).

When a setting's best point sits on the end of one of its optimizer's tuning grids
(gpt2/matrix/tuning.py edge_points), the optimum may lie beyond it. After a matrix has
run, each such edge adds the next point beyond it at the grid's own ratio (the ratio
of the two values at that end: 1e-3 2e-3 4e-3 with the best at 4e-3 adds 8e-3; with
the best at 1e-3, 5e-4), rounded to 4 significant digits. The points join the
optimizer's grid for all its settings, the new cells run, and the matrix is collected
again; until no best point is on an edge or CONFIG_MATRIX_TUNE_ROUNDS rounds are spent.

What was added, when and why is recorded in the matrix folder's extensions.json, so a
re-run of the same .config plans the same cells (plan_from_dotconfig reads it) and the
folder keeps its name: the extended cells are the configured matrix's, continued.
Sweeps (CONFIG_MATRIX_SWEEP) are never extended: only the rates and decays the
optimizers' tuning grids hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpt2 import records, storage
from gpt2.config.axes import label, value_tag
from gpt2.config.matrix import MatrixSettings, is_rate, tuning_grids
from gpt2.config.options import check_value
from gpt2.errors import ConfigError, PlanError
from gpt2.matrix.tuning import edge_points, grids
from gpt2.records import Field

EXTENSIONS = "extensions.json"


# What record() writes: {"rounds": [{"round": n, "added": [point, ...]}, ...]}.
ROUND = {"round": Field(int, 1, 10**6, required=True)}
POINT = {"optimizer": Field(str, required=True), "label": Field(str, required=True),
         "value": Field(float, required=True), "why": Field(str)}


def read(folder: Path, settings: MatrixSettings) -> dict[str, Any]:
    """The folder's extensions.json, checked against the configured grids: {"rounds":
    [{"round": n, "added": [{"optimizer", "label", "value", "why"}]}]} ({"rounds": []}
    when there is none). PlanError for a file kgpt did not write."""
    return _read(folder, {o: {label: None for label in g} for o, g in settings.grids.items()},
                 "was the .config's tuning changed?")


def read_planned(folder: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """extensions.json as the report reads it: each point must be in the grids of the
    plan it extended (plan.yaml's axes.grids hold every added value), so a point the
    matrix never trained is refused, as the planner refuses it."""
    planned = {o: {label: axis.get("values") or [] for label, axis in g.items()}
               for o, g in grids(plan).items()}
    return _read(folder, planned, "it names a point the plan never trained")


def _read(folder: Path, allowed: dict[str, dict[str, list[float] | None]],
          hint: str) -> dict[str, Any]:
    """extensions.json checked as record() writes it; a point is allowed when its
    optimizer and label are in ``allowed`` and (a list there) its value is among them."""
    where = Path(folder) / EXTENSIONS
    data = storage.read_json_object(where)
    if data is None:
        if where.exists() or where.is_symlink():
            raise PlanError(f"{where} cannot be read as a JSON object: not a file kgpt wrote; "
                            "delete it to plan the configured grids again")
        return {"rounds": []}
    rounds = data.get("rounds")
    if not isinstance(rounds, list):
        raise PlanError(f"{where} has no list of rounds: not a file kgpt wrote; delete it to "
                        "plan the configured grids again")
    for n, r in enumerate(rounds, 1):
        problem = records.problem(r, ROUND)
        if problem is None and r["round"] != n:
            problem = f"round {r['round']} where round {n} was written"
        if problem is None and not (isinstance(r.get("added"), list) and r["added"]):
            problem = "a round that added no point"
        if problem:
            raise PlanError(f"{where}: round {n}: {problem}: not a file kgpt wrote; delete it "
                            "to plan the configured grids again")
        for p in r["added"]:
            ok = records.problem(p, POINT) is None
            values = allowed.get(p["optimizer"], {}).get(p["label"], ()) if ok else ()
            if not ok or values == () or (values is not None and p["value"] not in values):
                raise PlanError(f"{where}: {str(p)[:200]} is not a point of this matrix's "
                                f"grids ({hint}); delete it to plan the configured grids "
                                "again")
    return {"rounds": rounds}


def added(record: dict[str, Any]) -> dict[str, dict[str, tuple[float, ...]]]:
    """{optimizer: {label: values added}} of an extensions record, in order."""
    out: dict[str, dict[str, tuple[float, ...]]] = {}
    for r in record["rounds"]:
        for p in r["added"]:
            values = out.setdefault(p["optimizer"], {}).setdefault(p["label"], ())
            if p["value"] not in values:
                out[p["optimizer"]][p["label"]] = values + (p["value"],)
    return out


def beyond(values: list[float], side: str) -> float | None:
    """The next value past one end of a sorted grid at the grid's own ratio there;
    None where there is no ratio (a zero at that end)."""
    a, b = (values[-2], values[-1]) if side == "top" else (values[1], values[0])
    if a <= 0 or b <= 0:
        return None
    return float(f"{b * b / a:.4g}")


def next_points(plan: dict[str, Any], best: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points one more round adds: one per end of an optimizer's grid axis that
    some setting's best point sits on, with why. Two settings at opposite ends of the
    same grid extend both ends in the same round: which setting is listed first
    decides nothing (the first listed at an end only gives the reason)."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in best:
        if not row["best"]:
            continue
        optimizer = row["optimizer"]
        axes = grids(plan).get(optimizer, {})
        for e in edge_points(row, axes):
            key = (optimizer, e["label"], e["side"])
            if e["label"] not in tuning_grids(optimizer) or key in out:
                continue
            value = beyond(e["values"], e["side"])
            if (value is None or value in e["values"]
                    or not _allowed(e["field"], e["label"], value)):
                continue
            out[key] = {
                "optimizer": optimizer, "label": e["label"], "value": value,
                "why": f"{label(row)}: best {e['label']} {value_tag(e['value'])} at the "
                       f"{e['side']} of {' '.join(map(value_tag, e['values']))}"}
    return [out[key] for key in sorted(out)]


def _allowed(field: str, grid: str, value: float) -> bool:
    """Whether ``value`` is one the setting takes (a rate of 20 is not)."""
    try:
        check_value(field, value)
    except ConfigError:
        return False
    return value > 0 or not is_rate(grid)


def record(folder: Path, previous: dict[str, Any], points: list[dict[str, Any]]) -> None:
    """Append a round to extensions.json (its points checked as its readers check them)."""
    problems = [why for p in points if (why := records.problem(p, POINT))]
    if problems or not points:
        raise ValueError(f"extensions.json would not read back: {problems or 'no points'}")
    rounds = previous["rounds"] + [{"round": len(previous["rounds"]) + 1, "added": points}]
    storage.write_text_atomic(Path(folder) / EXTENSIONS,
                              json.dumps({"rounds": rounds}, indent=2, allow_nan=False) + "\n")
