"""Grids that extend themselves (CONFIG_MATRIX_TUNE_EXTEND): on a synthetic loss surface
whose optimum lies beyond the configured grid, `make test-matrix` walks the grid out
to it and stops once the best point is inside; the rounds are recorded, and a re-run
plans the same cells in the same folder."""

from __future__ import annotations

import pytest

import json
import math

from helpers import run_target

from gpt2.cli import matrix_commands
from gpt2.config import kconfig
from gpt2.matrix import extend
from gpt2.matrix.plan import plan_from_dotconfig
from gpt2.matrix.plan_file import read_plan


def config_text(results, rounds: int) -> str:
    return (f'CONFIG_MODEL_SIZE_CUSTOM=y\nCONFIG_N_LAYER=2\nCONFIG_N_HEAD=2\nCONFIG_N_EMBD=32\n'
            f'CONFIG_BLOCK_SIZE=32\nCONFIG_MAX_ITERS=20\nCONFIG_WARMUP_ITERS=2\n'
            f'CONFIG_DEVICE_CPU=y\nCONFIG_DTYPE_FLOAT32=y\nCONFIG_RESULTS_DIR="{results}"\n'
            f'CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_NONE=y\n'
            f'CONFIG_MATRIX_TUNE=y\nCONFIG_MATRIX_LR_ADAMW="1e-3 2e-3 4e-3"\n'
            f'CONFIG_MATRIX_WD_ADAMW="0.1"\nCONFIG_MATRIX_TUNE_EXTEND=y\n'
            f'CONFIG_MATRIX_TUNE_ROUNDS={rounds}\n')


class FakeBackend:
    """Trains nothing: writes each pending cell's result from a loss surface in the
    learning rate, as a finished cell leaves it."""

    def __init__(self, loss_of):
        self.loss_of, self.runs = loss_of, []

    def run(self, plan, command, dotconfig, if_changed, detached):
        from gpt2.matrix.runner import write_plan

        plan.folder.mkdir(parents=True, exist_ok=True)
        write_plan(plan, command, dotconfig)
        ran = []
        for cell in plan.cells:
            d = plan.folder / "cells" / cell.id
            if (d / "summary.json").exists():
                continue
            d.mkdir(parents=True)
            loss = self.loss_of(cell.cfg.learning_rate)
            rows = [{"step": 0, "tokens": 0, "val_loss": 11.0},
                    {"step": 20, "tokens": 2560, "val_loss": loss, "train_loss": loss}]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (d / "config.json").write_text(json.dumps(cell.cfg.to_dict()))
            (d / "summary.json").write_text(json.dumps({
                "status": "completed", "config_hash": cell.cfg.config_hash(),
                "final_val_loss": loss, "best_val_loss": loss, "final_val_ppl": math.exp(loss),
                "final_sparsity": 0.0}))
            ran.append(cell.id)
        self.runs.append(ran)
        return 0


def bowl(optimum: float):
    return lambda lr: 4.0 + math.log2(lr / optimum) ** 2 / 10


def run_extension(tmp_path, monkeypatch, rounds: int, optimum: float):
    config = tmp_path / "config"
    config.write_text(config_text(tmp_path / "results", rounds))
    assert run_target("olddefconfig", env={"KCONFIG_CONFIG": str(config)}).returncode == 0
    monkeypatch.setenv("KCONFIG_CONFIG", str(config))
    monkeypatch.delenv("TRAIN_ARGS", raising=False)
    loaded = kconfig.load(config)
    settings = kconfig.to_matrix(loaded)
    plan = plan_from_dotconfig(loaded, [])
    backend = FakeBackend(bowl(optimum))
    backend.run(plan, "make test-matrix", config.read_text(), "refuse", False)
    matrix_commands.collect(plan.folder)
    plan, rc = matrix_commands.extend_grids(loaded, settings, plan, backend,
                                            "make test-matrix", False)
    return config, plan, backend, rc


@pytest.mark.e2e
def test_the_grid_walks_out_to_an_optimum_beyond_it_and_stops_there(tmp_path, monkeypatch):
    """The optimum is at 1.6e-2, past 1e-3 2e-3 4e-3: rounds add 8e-3, 1.6e-2, 3.2e-2;
    then 1.6e-2 is inside the grid and nothing more is added."""
    config, plan, backend, rc = run_extension(tmp_path, monkeypatch, rounds=5, optimum=1.6e-2)
    assert rc == 0
    record = json.loads((plan.folder / extend.EXTENSIONS).read_text())
    assert [[p["value"] for p in r["added"]] for r in record["rounds"]] == \
        [[8e-3], [1.6e-2], [3.2e-2]]
    assert "best lr 4e-3 at the top of 1e-3 2e-3 4e-3" in record["rounds"][0]["added"][0]["why"]
    assert backend.runs[1:] == [["adamw-none-lr8e-3-seed1337"], ["adamw-none-lr0.016-seed1337"],
                                ["adamw-none-lr0.032-seed1337"]]
    summary = json.loads((plan.folder / "summary.json").read_text())
    (best,) = summary["tuned"]
    assert best["grid"]["lr"] == 1.6e-2 and best["edges"] == []
    report = (plan.folder / "report.md").read_text()
    assert "## Grid extension" in report and "- round 3: adamw lr + 0.032" in report
    # the same .config plans the extended cells, in the configured matrix's folder
    again = plan_from_dotconfig(kconfig.load(config), [])
    assert again.folder == plan.folder and len(again.cells) == 6
    assert read_plan(plan.folder)["added"] == {"adamw": {"lr": [8e-3, 1.6e-2, 3.2e-2]}}


@pytest.mark.e2e
def test_extension_stops_after_its_rounds(tmp_path, monkeypatch):
    _, plan, backend, _ = run_extension(tmp_path, monkeypatch, rounds=2, optimum=6.4e-2)
    record = json.loads((plan.folder / extend.EXTENSIONS).read_text())
    assert len(record["rounds"]) == 2 and len(backend.runs) == 3
    report = (plan.folder / "report.md").read_text()
    assert "under-tuned" in report.lower()  # the best is still on the edge, and it says so


def test_a_point_past_what_the_setting_takes_is_not_added():
    assert extend.beyond([1e-3, 2e-3, 4e-3], "top") == 8e-3
    assert extend.beyond([1e-3, 2e-3, 4e-3], "bottom") == 5e-4
    assert extend.beyond([0.0, 0.1], "bottom") is None
    assert extend.beyond([1e-3, 3e-3], "top") == 9e-3
    row = {"optimizer": "adamw", "pruning": "none", "best": True, "grid": {"lr": 8.0}}
    plan = {"axes": {"grids": {"adamw": {"lr": {"field": "learning_rate",
                                                 "values": [2.0, 4.0, 8.0]}}}}}
    assert extend.next_points(plan, [row]) == []  # 16 is past learning_rate's 10


def test_two_settings_at_opposite_ends_extend_both_ends_whatever_their_order():
    """AdamW's dense best sits at the bottom of 1e-3 2e-3 4e-3, its pruned best at the
    top: one round adds 5e-4 and 8e-3, both, and the same two points whichever row the
    collected table lists first (one point per grid, taken from the first row, would
    walk only one way and depend on the table's order)."""
    grid = {"adamw": {"lr": {"field": "learning_rate", "values": [1e-3, 2e-3, 4e-3]}}}
    plan = {"axes": {"grids": grid}}
    dense = {"optimizer": "adamw", "pruning": "none", "target_sparsity": None, "best": True,
             "grid": {"lr": 1e-3}}
    pruned = {"optimizer": "adamw", "pruning": "magnitude", "target_sparsity": 0.5,
              "best": True, "grid": {"lr": 4e-3}}
    ahead = extend.next_points(plan, [dense, pruned])
    assert [(p["label"], p["value"]) for p in ahead] == [("lr", 5e-4), ("lr", 8e-3)]
    assert extend.next_points(plan, [pruned, dense]) == ahead
    assert "at the bottom of" in ahead[0]["why"] and "at the top of" in ahead[1]["why"]
    # a second setting at an end already extended adds nothing more
    assert len(extend.next_points(plan, [dense, pruned, {**dense, "pruning": "movement"}])) == 2
