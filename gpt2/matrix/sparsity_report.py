"""The report's sparsity sections: every way of reaching a sparsity compared at what it
cost, and whether an optimizer's best learning rate moved with sparsity.

Four families reach a sparse model (gpt2/config/choices.py ``family``): pruned during
training (a ramp from dense: magnitude, movement, state), dynamic sparse training
(sparse throughout, the mask moving: SET, RigL), one-shot pruning of the trained dense
model (magnitude, Wanda, SparseGPT; gpt2/matrix/oneshot_cells.py), and one-shot plus
a fine-tune. The first two cost what the dense run costs; one-shot adds a calibration
pass (forward only), the fine-tune its steps. Each table is one optimizer (and budget),
every row at the tuned grid point of its setting.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from gpt2.config.axes import label, sparsity_tag, value_tag
from gpt2.config.choices import PRUNING_METHODS
from gpt2.config.matrix import is_rate
from gpt2.matrix.results import CellResult, finite
from gpt2.matrix.tuning import grids

TARGET_AXES = ("pruning", "target_sparsity", "structure")
ONESHOT_FAMILY = "one-shot"


def _family_rank(family: str) -> int:
    """dense, pruned during training, dynamic sparse, one-shot, one-shot + fine-tune."""
    order = list(dict.fromkeys(c.family for c in PRUNING_METHODS.values()))
    return order.index(family) if family in order else len(order) + family.startswith(
        ONESHOT_FAMILY + " +")


def _context(values: dict[str, Any]) -> str:
    """What a table holds fixed: the optimizer, and the budget where there is one."""
    return label(values, skip=TARGET_AXES)


def _target(values: dict[str, Any], structure: str | None) -> str:
    st = values.get("structure") or structure or "unstructured"
    sp = values.get("target_sparsity")
    return f"{sparsity_tag(sp)} %" + ("" if st == "unstructured" else f" {st}")


def _stats(values: list[float]) -> tuple[float, float | None, int]:
    return (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None,
            len(values))


def _loss(mean: float, sd: float | None, n: int) -> str:
    return f"{mean:.4f}" + (f" ± {sd:.4f}" if sd is not None else "") + f" (n={n})"


def _steps(cell: CellResult) -> int | None:
    steps = [m["step"] for m in cell.metrics if isinstance(m.get("step"), int)]
    return max(steps) if steps else None


@dataclass
class Row:
    """One way of reaching one target in one table: its losses by seed and its cost."""

    order: tuple  # (sparsity, target text): how rows sort
    target: str  # "50 %", "50 % 2:4", "0 %" for dense
    method: str  # "dense", a pruning method, or a one-shot method
    family: str
    losses: dict[int, float]  # {seed: final validation loss}
    cost: str  # training steps, as the table shows them


def tables(tuned: list[CellResult], oneshot: list[dict[str, Any]]
           ) -> tuple[dict[str, list[Row]], int]:
    """({context: its rows, sorted}, one-shot prunings not done): what the equal-cost
    section and plot show. ``tuned``: the cells of each setting's best grid point;
    ``oneshot``: oneshot_cells.rows."""
    tuned_ids = {c.cell for c in tuned}
    out: dict[str, list[Row]] = {}
    groups: dict[tuple, list[CellResult]] = {}
    for c in tuned:
        if c.usable:
            groups.setdefault((_context(c.axes), c.setting), []).append(c)
    for (context, _), members in groups.items():
        first = members[0]
        dense = first.pruning == "none"
        target = "0 %" if dense else _target(first.axes, (first.config or {}).get(
            "pruning_structure"))
        family = PRUNING_METHODS[first.pruning].family
        steps = _steps(first)
        out.setdefault(context, []).append(Row(
            (first.target_sparsity or 0.0, target), target, "dense" if dense else first.pruning,
            family, {c.seed: c.final_val_loss for c in members},
            f"{steps:,}" if steps else "n/a"))
    pending = 0
    by_method: dict[tuple, list[dict[str, Any]]] = {}
    for r in oneshot:
        if r["cell"] not in tuned_ids:
            continue  # a dense grid point other than the tuned one
        by_method.setdefault((_context(r["axes"]), r["method"], r["structure"], r["sparsity"]),
                             []).append(r)
    for (context, method, structure, sparsity), rs in by_method.items():
        done = [r for r in rs if finite(r["val_loss"])]
        pending += len(rs) - len(done)
        if not done:
            continue
        target = _target({"target_sparsity": sparsity, "structure": structure}, None)
        dense_steps = next((row.cost for row in out.get(context, []) if row.method == "dense"),
                           "n/a")
        key = (sparsity, target)
        out.setdefault(context, []).append(Row(
            key, target, method, ONESHOT_FAMILY, {r["seed"]: r["val_loss"] for r in done},
            f"{dense_steps} + calibration"))
        tuned_rows = [r for r in done if finite(r["val_loss_ft"])]
        if tuned_rows:
            k = tuned_rows[0]["finetune_steps"]
            out[context].append(Row(
                key, target, method, f"{ONESHOT_FAMILY} + fine-tune {k} steps",
                {r["seed"]: r["val_loss_ft"] for r in tuned_rows}, f"{dense_steps} + {k:,}"))
    for rows in out.values():
        rows.sort(key=lambda r: (r.order, _family_rank(r.family), r.method))
    return out, pending


def equal_cost_lines(tuned: list[CellResult], oneshot: list[dict[str, Any]],
                     noise: float | None) -> list[str]:
    """"## Sparsity at equal cost": per optimizer (and budget), dense, each pruned
    setting and each one-shot baseline at each target, the loss over seeds and what
    each cost in training steps (see ``tables``). Empty when the matrix prunes nothing."""
    if not any(c.pruning != "none" for c in tuned) and not oneshot:
        return []
    found, pending = tables(tuned, oneshot)
    lines = ["## Sparsity at equal cost", "",
             "Each way of reaching a sparsity, per optimizer, at its tuned grid point: pruned "
             "during training (a ramp from dense), dynamic sparse training (sparse from the "
             "start, the mask moving), one-shot pruning of the trained dense cells "
             "(`make prune-oneshot`), and one-shot plus a fine-tune. The first two cost the "
             "dense run's steps; one-shot adds a forward pass over its calibration windows, "
             "the fine-tune its steps. Validation loss: mean ± SD over seeds. Δ: the "
             "difference from the dense cell of the same seed (the seeds are paired: a "
             "one-shot model is its dense cell pruned), mean ± SD over seeds; a Δ within "
             "its own spread, or one seed's alone, is no evidence of a difference.", ""]
    if noise is not None:
        lines += [f"Seed noise (pooled SD of the final loss within a setting, unpaired): "
                  f"{noise:.4f}.", ""]
    for context, rows in found.items():
        dense = next((r.losses for r in rows if r.method == "dense"), {})
        lines += [f"### {context}", "", "| sparsity | method | family | val loss | Δ vs dense "
                  "(paired) | steps trained |", "|---|---|---|---|---|---|"]
        for row in rows:
            target, method, family, cost = row.target, row.method, row.family, row.cost
            mean, sd, n = _stats(list(row.losses.values()))
            deltas = [loss - dense[seed] for seed, loss in row.losses.items() if seed in dense]
            delta = ""
            if method != "dense" and deltas:
                d_mean, d_sd, d_n = _stats(deltas)
                delta = f"{d_mean:+.4f}" + (f" ± {d_sd:.4f}" if d_sd is not None else "") + (
                    f" (n={d_n})")
            lines.append(f"| {target} | {method} | {family} | {_loss(mean, sd, n)} | {delta} "
                         f"| {cost} |")
        lines.append("")
    if pending:
        lines += [f"{pending} one-shot pruning(s) not done yet: re-run the matrix command "
                  "(completed cells are skipped; the baselines follow).", ""]
    two_four = [c for c in tuned if c.usable and c.pruning != "none" and c.config
                and c.config.get("pruning_structure") == "2:4"]
    ran = [c for c in two_four if c.sparse_kernel_layers]
    if not ran:
        lines += ["No cell ran a sparse kernel (CONFIG_SPARSE_KERNEL: 2:4 cells on an NVIDIA "
                  "GPU, on the weight shapes where its check finds it right and faster), so "
                  "sparse and dense cells did the same work per step (masks on dense "
                  "matmuls): equal steps are equal cost here, and wall time says nothing "
                  "about sparsity.", ""]
    else:
        lines += [f"{len(ran)} of the {len(two_four)} 2:4 cells ran pruned Linears' forward on "
                  "the sparse kernel from the end of their ramp (" + ", ".join(
                      f"`{c.cell}` {c.sparse_kernel_layers}" for c in ran) + " layers; the "
                  "others stayed dense, and each cell's train.log says why): compare their "
                  "wall time and tokens/s with the dense cells' in the Results table, "
                  "measured on one device at one load (see the note on speed).", ""]
    return lines


def lr_moved_lines(plan: dict[str, Any], best: list[dict[str, Any]]) -> list[str]:
    """"## Did the best learning rate move with sparsity?": for each optimizer (and
    budget) with a learning-rate grid, its dense best rate beside each pruned setting's."""
    lines = []
    for optimizer, axes in grids(plan).items():
        rates = [name for name in axes if is_rate(name)]
        if not rates:
            continue
        rows = [r for r in best if r["optimizer"] == optimizer and r["best"]]
        for context in dict.fromkeys(_context(r) for r in rows):
            here = [r for r in rows if _context(r) == context]
            dense = next((r for r in here if r["pruning"] == "none"), None)
            pruned = [r for r in here if r["pruning"] != "none"]
            if dense is None or not pruned:
                continue
            for name in rates:
                base = dense["grid"].get(name)
                parts = []
                for r in pruned:
                    value = r["grid"].get(name)
                    if value is None or base is None:
                        continue
                    how = ("same" if value == base else
                           f"{'up' if value > base else 'down'} x{max(value, base) / min(value, base):g}")
                    parts.append(f"{label(r, skip=('optimizer', 'budget'))} {value_tag(value)} "
                                 f"({how})")
                if parts:
                    moved = any("same" not in p for p in parts)
                    lines.append(f"- {context}, {axes[name]['field']}: dense {value_tag(base)}; "
                                 + "; ".join(parts) + (" — **moved**" if moved else " — unmoved"))
    if not lines:
        return []
    return (["## Did the best learning rate move with sparsity?", "",
             "Each optimizer's best grid point dense and pruned (a point on the grid's edge "
             "is a bound, see the warnings above; one grid step is the resolution):", ""]
            + lines + [""])
