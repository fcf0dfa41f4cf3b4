"""A matrix's one-shot baselines (CONFIG_MATRIX_ONESHOT): each completed dense cell is
pruned once by each listed method, at every (structure, sparsity) the matrix's pruned
cells train to, with ``make prune-oneshot``'s entry point (gpt2/prune_oneshot.py),
optionally fine-tuned (CONFIG_MATRIX_ONESHOT_FINETUNE). The results live in each dense
cell's own folder (<cell>/oneshot/), so a re-run skips what is done, and the report
reads them back with the cells (``rows``). What plan.json records of them is
Plan.oneshot's (gpt2/matrix/plan.py).

    pending(folder, plan)    the prunings still to do, each with its command line
    rows(folder, plan, cells)  the results, for the report and summary.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpt2.matrix.results import CellResult, finite
from gpt2.matrix.runner import cell_dir
from gpt2.run_folder import COMPLETED, oneshot_result, read_oneshot


def _result_path(folder: Path, cell_id: str, method: str, target: dict[str, Any],
                 finetune: int) -> Path:
    return oneshot_result(cell_dir(folder, cell_id), method, target["sparsity"],
                          target["structure"], finetune)


def read_result(path: Path, config_hash: str) -> dict[str, Any] | None:
    """A one-shot result of the cell with ``config_hash``; None when missing, damaged
    (run_folder.read_oneshot checks it), or made from another configuration's weights."""
    result = read_oneshot(path)
    if result is None or result.get("config_hash") != config_hash:
        return None
    return result if finite(result.get("val_loss")) else None


def _dense_cells(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in plan["cells"] if c.get("pruning") == "none"]


def pending(folder: Path, plan: dict[str, Any],
            cells: list[CellResult]) -> list[tuple[str, list[str]]]:
    """(what, argv for gpt2.prune_oneshot) for each one-shot pruning not yet done of a
    completed dense cell."""
    one = plan.get("oneshot")
    if not one:
        return []
    done = {c.cell for c in cells if c.status == COMPLETED and c.usable}
    out = []
    for c in _dense_cells(plan):
        if c["id"] not in done:
            continue
        for target in one["targets"]:
            for method in one["methods"]:
                path = _result_path(folder, c["id"], method, target, one["finetune"])
                if read_result(path, c["config_hash"]) is not None:
                    continue
                argv = ["--run-dir", str(cell_dir(folder, c["id"])), f"--method={method}",
                        f"--sparsity={target['sparsity']!r}",
                        f"--structure={target['structure']}"]
                if one["finetune"]:
                    argv.append(f"--finetune-steps={one['finetune']}")
                tag = (target["structure"] if target["structure"] != "unstructured"
                       else f"{target['sparsity']:g}")
                out.append((f"{c['id']}: {method} {tag}", argv))
    return out


def rows(folder: Path, plan: dict[str, Any], cells: list[CellResult]) -> list[dict[str, Any]]:
    """One row per dense cell x method x target: the cell's optimizer, seed and axes,
    the one-shot loss ("val_loss", after pruning) and, with a fine-tune, "val_loss_ft"
    and its cost "finetune_tokens"; "val_loss" None where the pruning is not done."""
    one = plan.get("oneshot")
    if not one:
        return []
    by_id = {c.cell: c for c in cells}
    out = []
    for c in _dense_cells(plan):
        cell = by_id.get(c["id"])
        if cell is None or not cell.usable:
            continue
        for target in one["targets"]:
            for method in one["methods"]:
                result = read_result(_result_path(folder, c["id"], method, target,
                                                  one["finetune"]), c["config_hash"])
                tuned = bool(one["finetune"]) and result is not None
                out.append({
                    "cell": c["id"], "axes": dict(cell.axes), "optimizer": cell.optimizer,
                    "seed": cell.seed, "method": method, **target,
                    "dense_val_loss": cell.final_val_loss,
                    "val_loss": None if result is None else
                    result.get("val_loss_pruned" if tuned else "val_loss"),
                    "val_loss_ft": result["val_loss"] if tuned else None,
                    "finetune_steps": one["finetune"],
                    "finetune_tokens": result.get("finetune_tokens") if tuned else None,
                    "calibration_tokens": None if result is None
                    else result.get("calibration_tokens")})
    return out
