"""The report's sparsity sections from made-up results whose answer is known: which
rows the equal-cost table holds and in what order, and when a best rate moved."""

from __future__ import annotations

from gpt2.matrix import sparsity_report
from gpt2.matrix.results import CellResult


def cell(optimizer, pruning, sparsity, seed, loss, structure=None, steps=100, lr=None):
    axes = {"optimizer": optimizer, "pruning": pruning,
            "target_sparsity": sparsity if pruning != "none" else None, "seed": seed}
    if structure:
        axes["structure"] = structure if pruning != "none" else None
    name = "-".join(str(v) for v in axes.values() if v is not None)
    return CellResult(cell=name, axes=axes, status="completed", final_val_loss=loss,
                      device="cpu (2 cores)", grid={"lr": lr} if lr else {},
                      config={"pruning_structure": structure or "unstructured"},
                      metrics=[{"step": 50}, {"step": steps}])


def test_the_equal_cost_table_orders_families_and_pairs_one_shot_with_its_dense_cells():
    cells = [cell("adamw", "none", None, s, 5.0 + s / 10) for s in (1, 2)]
    cells += [cell("adamw", "rigl", 0.5, s, 5.3) for s in (1, 2)]
    cells += [cell("adamw", "magnitude", 0.5, s, 5.2) for s in (1, 2)]
    one = [{"cell": c.cell, "axes": c.axes, "optimizer": "adamw", "seed": c.seed,
            "method": "wanda", "structure": "unstructured", "sparsity": 0.5,
            "dense_val_loss": c.final_val_loss, "val_loss": 5.6, "val_loss_ft": 5.4,
            "finetune_steps": 10, "finetune_tokens": 640, "calibration_tokens": 100}
           for c in cells[:2]]
    one.append({**one[0], "method": "sparsegpt", "val_loss": None, "val_loss_ft": None})
    # a dense cell at another grid point than the tuned one: not in the table
    one.append({**one[0], "cell": "adamw-none-lr9e-3-1", "val_loss": 9.9, "val_loss_ft": 9.8})
    lines = sparsity_report.equal_cost_lines(cells, one, 0.07)
    text = "\n".join(lines)
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert [r.split("|")[2].strip() + "/" + r.split("|")[3].strip() for r in rows] == [
        "dense/dense", "magnitude/pruned during training", "rigl/dynamic sparse",
        "wanda/one-shot", "wanda/one-shot + fine-tune 10 steps"]
    assert "| 0 % | dense | dense | 5.1500 ± 0.0707 (n=2) |  | 100 |" in text
    # Δ paired by seed: (5.3 - 5.1, 5.3 - 5.2)
    assert ("| 50 % | rigl | dynamic sparse | 5.3000 ± 0.0000 (n=2) | +0.1500 ± 0.0707 (n=2) "
            "| 100 |") in text
    assert "| 5.4000 ± 0.0000 (n=2) | +0.2500 ± 0.0707 (n=2) | 100 + 10 |" in text
    assert "9.9" not in text and "9.8" not in text
    assert "Seed noise (pooled SD of the final loss within a setting, unpaired): 0.0700" in text
    assert "1 one-shot pruning(s) not done yet" in text
    assert "No cell ran a sparse kernel" in text
    # 2:4 cells that ran the kernel (on a GPU): the note points at wall time instead
    gpu = [cell("adamw", "magnitude", 0.5, 1, 5.2, structure="2:4")]
    gpu[0].device, gpu[0].sparse_kernel_layers = "NVIDIA H100 80GB HBM3", 48
    assert "ran pruned Linears' forward on the sparse kernel" in "\n".join(
        sparsity_report.equal_cost_lines(gpu, [], None))
    assert sparsity_report.equal_cost_lines(cells[:2], [], None) == []  # nothing pruned


def best(optimizer, pruning, sparsity, lr, budget=None):
    row = {"optimizer": optimizer, "pruning": pruning,
           "target_sparsity": sparsity if pruning != "none" else None, "grid": {"lr": lr},
           "best": True}
    if budget:
        row["budget"] = budget
    return row


def test_a_moved_learning_rate_is_named_per_optimizer():
    plan = {"axes": {"grids": {
        "adamw": {"lr": {"field": "learning_rate", "values": [1e-3, 2e-3, 4e-3]}},
        "muon": {"lr": {"field": "muon_lr", "values": [0.01, 0.02]}}}}}
    rows = [best("adamw", "none", None, 2e-3), best("adamw", "magnitude", 0.5, 4e-3),
            best("adamw", "rigl", 0.5, 2e-3), best("muon", "none", None, 0.02),
            best("muon", "magnitude", 0.5, 0.02)]
    text = "\n".join(sparsity_report.lr_moved_lines(plan, rows))
    assert ("- adamw, learning_rate: dense 2e-3; magnitude 50% 4e-3 (up x2); rigl 50% 2e-3 "
            "(same) — **moved**") in text
    assert "- muon, muon_lr: dense 0.02; magnitude 50% 0.02 (same) — unmoved" in text
    # no rate grid, or no pruned point: nothing to say
    assert sparsity_report.lr_moved_lines({"axes": {}}, rows) == []
    assert sparsity_report.lr_moved_lines(plan, rows[:1]) == []


def test_the_whole_table_with_structures_and_one_shot_rows_at_both_targets():
    """Every row in full, where N:M and unstructured cells, one-shot at both targets and
    pending prunings of two methods meet; a cell without metrics costs "n/a" steps."""
    cells = [cell("sgd", "none", None, s, 5.0 + s / 10, structure="unstructured")
             for s in (1, 2)]
    cells += [cell("sgd", "magnitude", 0.5, s, 5.25, structure=st)
              for s in (1, 2) for st in ("unstructured", "2:4")]
    cells += [cell("sgd", "set", 0.5, 1, 5.4)]  # (no structure axis in force for SET)
    cells[-1].metrics = []

    def shot(c, method, structure, loss, tuned):
        return {"cell": c.cell, "axes": c.axes, "optimizer": "sgd", "seed": c.seed,
                "method": method, "structure": structure, "sparsity": 0.5,
                "dense_val_loss": c.final_val_loss, "val_loss": loss, "val_loss_ft": tuned,
                "finetune_steps": 7 if tuned else 0, "finetune_tokens": None,
                "calibration_tokens": 100}
    # a foreign grid point first (skipped, not the end of the list), then the rest
    one = [{**shot(cells[0], "magnitude", "2:4", 9.1, None), "cell": "sgd-none-lr1-1"}]
    one += [shot(c, "magnitude", "2:4", 5.5, None) for c in cells[:2]]
    one += [shot(cells[0], "wanda", "2:4", None, None), shot(cells[1], "sparsegpt", "2:4",
                                                           None, None)]
    rows = [line for line in sparsity_report.equal_cost_lines(cells, one, None)
            if line.startswith("| ") and "---" not in line][1:]
    assert rows == [
        "| 0 % | dense | dense | 5.1500 ± 0.0707 (n=2) |  | 100 |",
        "| 50 % | magnitude | pruned during training | 5.2500 ± 0.0000 (n=2) | "
        "+0.1000 ± 0.0707 (n=2) | 100 |",
        "| 50 % | set | dynamic sparse | 5.4000 (n=1) | +0.3000 (n=1) | n/a |",
        "| 50 % 2:4 | magnitude | pruned during training | 5.2500 ± 0.0000 (n=2) | "
        "+0.1000 ± 0.0707 (n=2) | 100 |",
        "| 50 % 2:4 | magnitude | one-shot | 5.5000 ± 0.0000 (n=2) | +0.3500 ± 0.0707 (n=2) "
        "| 100 + calibration |"]
    text = "\n".join(sparsity_report.equal_cost_lines(cells, one, None))
    assert "2 one-shot pruning(s) not done yet" in text and "9.1" not in text


def test_a_structure_set_in_the_configuration_alone_names_the_row_and_the_kernel_note():
    """No structure axis, CONFIG_PRUNING_STRUCTURE=2:4 for every pruned cell: the rows say
    2:4; the kernel note goes by what each cell's summary says it ran, not by its
    setting (auto may have found the kernel slower, or failing, and stayed dense)."""
    dense = cell("adamw", "none", None, 1, 5.0)
    pruned = cell("adamw", "magnitude", 0.5, 1, 5.2)
    pruned.config = {"pruning_structure": "2:4", "sparse_kernel": "auto"}
    pruned.device = dense.device = "NVIDIA A100-SXM4-40GB"
    pruned.sparse_kernel_layers = 24
    lines = sparsity_report.equal_cost_lines([dense, pruned], [], None)
    assert any(line.startswith("| 50 % 2:4 | magnitude |") for line in lines)
    assert ("1 of the 1 2:4 cells ran pruned Linears' forward on the sparse kernel from the end "
            f"of their ramp (`{pruned.cell}` 24 layers;") in "\n".join(lines)
    for layers in (0, None):  # checked and kept dense; or a GPU or setting that cannot
        pruned.sparse_kernel_layers = layers
        assert "No cell ran a sparse kernel" in "\n".join(
            sparsity_report.equal_cost_lines([dense, pruned], [], None))
