"""Speedup over the tuned baseline: the unit of a claim in the optimizer benchmarks.

For every other optimizer's setting at its best grid point (gpt2/matrix/tuning.py), and
the baseline's setting that pairs with it (same pruning, sparsity and budget; also at
its best point), seed by seed:

- **tokens to match**: the tokens the baseline's own validation curve needed to reach
  the optimizer's final loss (linear between evaluations), over the tokens the
  optimizer trained: 1.3 means the baseline needed 30 % more tokens for that loss.
  A baseline that never got there gives a lower bound ("at least"). The curve is the
  baseline's loss *while* it trained, at rates not yet decayed, so it flatters the
  optimizer somewhat; with budgets, the next figure is the sound one.
- **D_eff** (Wen et al. 2025, "Fantastic Pretraining Optimizers"): with three or more
  budgets, the baseline's final losses against tokens are fitted by
  L(D) = a * D^-b + c; an optimizer's final loss l at D tokens is worth
  D_eff = (a / (l - c))^(1/b) baseline tokens, and the speedup is D_eff / D. The fit's
  R^2 and RMSE say how far to trust it; a loss at or below c has no finite D_eff.

Each speedup is a mean over the seeds both completed, with a 95 % Student-t interval
(its spread is the optimizer's and the baseline's seed noise; the fit's own error is
not in it) and the paired comparison's rule: **faster** when the interval lies above
1, **slower** below, else **not distinguishable** (**at least as fast** when it holds 1
but some seeds are lower bounds of 1 or more); one seed gives no verdict.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np

from gpt2.config.axes import label, setting, setting_of
from gpt2.matrix.paired import best_cells, t95
from gpt2.matrix.results import CellResult, finite

VERDICTS = ("faster", "slower", "not distinguishable", "no verdict (one seed)")
MIN_BUDGETS = 3  # distinct budgets a D_eff fit needs


def final_tokens(cell: CellResult) -> float | None:
    """The tokens a cell trained (its last metrics row's count)."""
    counted = [r["tokens"] for r in cell.metrics if finite(r.get("tokens"))]
    return float(counted[-1]) if counted else None


def curve(cell: CellResult) -> list[tuple[float, float]]:
    """(tokens, validation loss) at each of a cell's evaluations."""
    return [(float(r["tokens"]), float(r["val_loss"])) for r in cell.metrics
            if finite(r.get("tokens")) and finite(r.get("val_loss"))]


def tokens_to_reach(points: list[tuple[float, float]], target: float) -> tuple[float, bool]:
    """The tokens at which a validation curve first reaches ``target`` (linear
    between evaluations), and whether it did; when it never does, its last tokens."""
    before = None
    for tokens, loss in points:
        if loss <= target:
            if before is None:
                return tokens, True
            t0, l0 = before
            return t0 + (l0 - target) / (l0 - loss) * (tokens - t0), True
        before = (tokens, loss)
    return (points[-1][0] if points else math.nan), False


def verdict(ratios: list[float]) -> dict[str, Any]:
    """Mean, 95 % half-width and verdict of per-seed speedups."""
    n = len(ratios)
    mean = statistics.fmean(ratios)
    if n < 2:
        return {"n": n, "mean": mean, "ci95": None, "verdict": VERDICTS[3]}
    half = t95(n) * statistics.stdev(ratios) / math.sqrt(n)
    which = 0 if mean - half > 1 else 1 if mean + half < 1 else 2
    return {"n": n, "mean": mean, "ci95": half, "verdict": VERDICTS[which]}


def fit_power_law(tokens: list[float], losses: list[float]) -> dict[str, Any] | None:
    """L(D) = a * D^-b + c by least squares (for each c, a and b from a line in log
    space; c by a search below the lowest loss); None with fewer than 3 points or no
    decreasing fit. Returns a, b, c, R^2, RMSE and the number of points."""
    d, y = np.asarray(tokens, float), np.asarray(losses, float)
    if len(d) < 3 or len(set(d)) < 3:
        return None
    x = np.log(d)

    def fitted(c: float) -> tuple[float, float, float] | None:
        slope, intercept = np.polyfit(x, np.log(y - c), 1)
        if slope >= 0:
            return None
        a, b = math.exp(intercept), -slope
        return a, b, float(np.sum((y - (a * d ** -b + c)) ** 2))

    def sse(c: float) -> float:
        found = fitted(c)
        return math.inf if found is None else found[2]

    top = float(y.min()) * (1 - 1e-9)  # c stays below every loss (log(y - c))
    grid = np.linspace(0.0, top, 401)
    i = int(np.argmin([sse(c) for c in grid]))
    lo, hi = float(grid[max(0, i - 1)]), float(grid[min(400, i + 1)])
    for _ in range(80):  # golden section between the best grid point's neighbours
        m1, m2 = hi - 0.618 * (hi - lo), lo + 0.618 * (hi - lo)
        if sse(m1) <= sse(m2):
            hi = m2
        else:
            lo = m1
    c = min((lo + hi) / 2, float(grid[i]), key=sse)
    if not math.isfinite(sse(c)):
        return None
    a, b, residual = fitted(c)
    sst = float(np.sum((y - y.mean()) ** 2))
    return {"a": a, "b": b, "c": c, "r2": 1 - residual / sst if sst else 1.0,
            "rmse": math.sqrt(residual / len(y)), "points": len(y)}


def effective_tokens(fit: dict[str, Any], loss: float) -> float | None:
    """The baseline tokens the fit says reach ``loss`` (None at or below its floor c)."""
    if loss <= fit["c"]:
        return None
    return (fit["a"] / (loss - fit["c"])) ** (1 / fit["b"])


def _partner(row: dict[str, Any], baseline: str) -> tuple:
    return setting({**row, "optimizer": baseline})


def speedups(cells: list[CellResult], best: list[dict[str, Any]],
             baseline: str) -> dict[str, Any]:
    """Tokens-to-match speedups of every tuned setting of another optimizer over the
    baseline's, and, with 3 or more budgets, the D_eff fit and speedups."""
    bases = {setting(r): r for r in best if r["optimizer"] == baseline and r["best"]}
    rows = []
    for row in best:
        base = bases.get(_partner(row, baseline))
        if row["optimizer"] == baseline or base is None or not row["best"]:
            continue
        mine, theirs = best_cells(cells, row), best_cells(cells, base)
        ratios, bounds = [], []
        for seed in sorted(set(mine) & set(theirs)):
            tokens = final_tokens(mine[seed])
            needed, reached = tokens_to_reach(curve(theirs[seed]), mine[seed].final_val_loss)
            if tokens and finite(needed):
                ratios.append(needed / tokens)
                bounds.append(not reached)
        entry = {"setting": label(row), **setting_of(row), "baseline": baseline,
                 "ratios": ratios, "at_least": any(bounds)}
        entry.update(verdict(ratios) if ratios else
                     {"n": 0, "mean": None, "ci95": None, "verdict": None})
        if entry["at_least"] and entry["verdict"] == VERDICTS[2] and min(ratios) >= 1:
            entry["verdict"] = "at least as fast"  # a bound of 1: faster by an unknown margin
        rows.append(entry)
    fits = _deff(cells, best, baseline, bases)
    return {"baseline": baseline, "tokens_to_match": rows, **fits}


def _deff(cells: list[CellResult], best: list[dict[str, Any]], baseline: str,
          bases: dict[tuple, dict[str, Any]]) -> dict[str, Any]:
    """The D_eff fits (one per baseline setting without its budget) and speedups."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for base in bases.values():
        if base.get("budget") is not None:
            groups.setdefault(setting({**base, "budget": None}), []).append(base)
    fits, rows = [], []
    for group_key, group in groups.items():
        if len({b["budget"] for b in group}) < MIN_BUDGETS:
            continue
        points = [(final_tokens(c), c.final_val_loss) for b in group
                  for c in best_cells(cells, b).values() if final_tokens(c)]
        fit = fit_power_law([p[0] for p in points], [p[1] for p in points])
        if fit is None:
            continue
        span = (min(p[0] for p in points), max(p[0] for p in points))
        fits.append({"setting": label({**group[0], "budget": None}), **fit,
                     "tokens": list(span)})
        for row in best:
            if (row["optimizer"] == baseline or not row["best"] or row.get("budget") is None
                    or setting({**row, "optimizer": baseline, "budget": None}) != group_key):
                continue
            ratios, beyond, outside = [], 0, 0
            for c in best_cells(cells, row).values():
                tokens, d_eff = final_tokens(c), effective_tokens(fit, c.final_val_loss)
                if d_eff is None:
                    beyond += 1
                elif tokens:
                    ratios.append(d_eff / tokens)
                    outside += not span[0] <= d_eff <= span[1]
            # (D_eff past the baseline's budgets is the fit's extrapolation, not a measurement)
            entry = {"setting": label(row), **setting_of(row), "ratios": ratios,
                     "beyond_fit": beyond, "extrapolated": outside}
            entry.update(verdict(ratios) if ratios else
                         {"n": 0, "mean": None, "ci95": None, "verdict": None})
            rows.append(entry)
    return {"fits": fits, "d_eff": rows}
