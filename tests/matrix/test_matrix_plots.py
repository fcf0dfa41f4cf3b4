"""The matrix plots from synthetic results: every file is written as a PNG whatever the
matrix left behind, and every cell a plot leaves out is named in its notes."""

from __future__ import annotations

import json
import math

import pytest

from gpt2.matrix import plots
from gpt2.matrix.results import CellResult

FILES = ["lr_sweep.png", "val_loss.png", "val_loss_tokens_time.png", "ppl_heatmap.png",
         "ppl_vs_sparsity.png", "sparsity_vs_step.png", "throughput_memory.png", "lr_schedule.png"]
NO_GRID = ("no learning-rate grid (CONFIG_MATRIX_TUNE is off, or each optimizer has one "
           "rate)")
STEPS, EVAL_EVERY, WARMUP, LR = 200, 25, 20, 6e-4
# What the lr schedule plot reads from a run's config.json.
CONFIG = {"learning_rate": LR, "min_lr": LR / 10, "warmup_iters": WARMUP, "decay_lr": True,
          "muon_lr": 0.02}
OFFSET = {"adamw": 0.0, "adamwspam": -0.03, "adamwprune": -0.05}  # final loss, by optimizer


def metrics(final_loss: float, target: float | None, last_step: int = STEPS) -> list[dict]:
    """Rows like the trainer's metrics.jsonl: a train row every 5 steps, an eval row every
    EVAL_EVERY steps (merged into the train row when both fall on one step), step 0 eval."""
    rows = []
    for step in range(0, last_step + 1, 5):
        loss = final_loss + (10.9 - final_loss) * math.exp(-step / 40)
        ramp = min(1.0, max(0.0, (step - 20) / 100))  # pruning from step 20 to 120
        sparsity = 0.0 if target is None else target * (1 - (1 - ramp) ** 3)
        lr = LR * step / WARMUP if step < WARMUP else LR * (
            0.1 + 0.45 * (1 + math.cos(math.pi * (step - WARMUP) / (STEPS - WARMUP))))
        row = {"step": step, "sparsity": sparsity}
        if step:
            row.update(train_loss=loss + 0.05, lr=lr, tokens_per_sec=5e4)
        if step % EVAL_EVERY == 0:
            row.update(val_loss=loss, val_ppl=math.exp(loss))
        rows.append(row)
    return rows


def axes(opt: str, method: str, sparsity: float | None, seed: int) -> dict:
    return {"optimizer": opt, "pruning": method, "target_sparsity": sparsity, "seed": seed}


def cell(opt: str, method: str = "none", sparsity: float | None = None, seed: int = 1337,
         status: str = "completed", loss: float | None = None) -> CellResult:
    name = f"{opt}-{method}" + (f"-{sparsity * 100:g}" if sparsity else "") + f"-seed{seed}"
    if status == "pending":
        return CellResult(name, axes(opt, method, sparsity, seed), status)
    if loss is None:  # a plausible loss: sparser is worse, seeds differ a little
        loss = 3.4 + OFFSET[opt] + 0.8 * (sparsity or 0) ** 2 + 0.01 * (seed - 1337)
    last = STEPS if status == "completed" else 60
    rows = metrics(loss if math.isfinite(loss) else 3.5, sparsity, last)
    if status == "completed":
        rows[-1]["val_loss"] = loss
        rows[-1]["val_ppl"] = math.exp(loss)
    return CellResult(
        name, axes(opt, method, sparsity, seed), status,
        final_val_loss=loss if status == "completed" else None,
        final_val_ppl=math.exp(loss) if status == "completed" else None,
        final_sparsity=rows[-1]["sparsity"], tokens_per_sec=4.1e4 + 3e3 * len(opt) + seed % 7,
        peak_memory_mb=9000.0 + (1500 if opt == "adamwprune" else 0) + seed % 5,
        metrics=rows, config=CONFIG)


FAILED = "adamwspam / movement 90% seed 1337: failed"
PENDING = "adamwprune / state 90% seed 1337: pending (never started)"
NAN = "adamw / movement 70% seed 1338: final val loss is NaN"


def matrix() -> list[CellResult]:
    """The 12-combination matrix with a second seed for three combinations, one failed cell,
    one pending cell and one NaN loss."""
    cells = []
    for opt in ("adamw", "adamwspam", "adamwprune"):
        method = "state" if opt == "adamwprune" else "movement"
        cells.append(cell(opt))
        for s in (0.5, 0.7, 0.9):
            if (opt, s) == ("adamwspam", 0.9):
                cells.append(cell(opt, method, s, status="failed"))
            elif (opt, s) == ("adamwprune", 0.9):
                cells.append(cell(opt, method, s, status="pending"))
            else:
                cells.append(cell(opt, method, s))
    cells += [cell("adamw", seed=1338), cell("adamw", "movement", 0.7, seed=1338, loss=math.nan),
              cell("adamwprune", "state", 0.5, seed=1338)]
    return cells


def render(cells, out_dir):
    """make_plots, plus the texts and the main axes' tick labels of each figure as it is
    saved, by file name."""
    drawn = {}
    save = plots._save

    def recording_save(plt, fig, path):
        main = fig.axes[0]  # not the colour bar
        drawn[path.name] = {
            "texts": [t.get_text() for ax in fig.axes for t in ax.texts],
            "xticks": [t.get_text() for t in main.get_xticklabels()],
            "yticks": [t.get_text() for t in main.get_yticklabels()],
        }
        save(plt, fig, path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "_save", recording_save)
        return plots.make_plots(cells, out_dir), drawn


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The full matrix, drawn once for the tests that read it."""
    out = tmp_path_factory.mktemp("full") / "new" / "plots"  # created, parents too
    return out, *render(matrix(), out)


def assert_pngs(out_dir, result, min_bytes=8000):
    """Every plot accounted for: drawn as a real PNG of some substance, or, with nothing
    to show, not drawn at all (no picture of a message) with the reason recorded."""
    assert [p.filename for p in result] == FILES
    assert all(p.title for p in result)
    for p in result:
        if p.skipped:
            assert not (out_dir / p.filename).exists(), p.filename
            continue
        data = (out_dir / p.filename).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), p.filename
        assert len(data) > min_bytes, (p.filename, len(data))
    # No temp files left; plots.json captions them, in order, for the HTML report.
    drawn = [p.filename for p in result if not p.skipped]
    assert sorted(p.name for p in out_dir.iterdir()) == sorted([*drawn, plots.PLOTS_INDEX])
    index = json.loads((out_dir / plots.PLOTS_INDEX).read_text())["plots"]
    assert [(p["filename"], p["title"], p["notes"], p["skipped"]) for p in index] == \
        [(p.filename, p.title, p.notes, p.skipped) for p in result]


def test_full_matrix_writes_every_plot_and_names_what_it_skipped(full):
    out, result, drawn = full
    assert_pngs(out, result, min_bytes=25000)
    notes = {p.filename: p.notes for p in result}
    assert [p.filename for p in result if p.skipped] == ["lr_sweep.png"]
    for name in ("val_loss.png", "val_loss_tokens_time.png", "ppl_heatmap.png",
                 "ppl_vs_sparsity.png", "lr_schedule.png"):
        assert notes[name] == [NAN, FAILED, PENDING], name
    assert result[0].skipped == NO_GRID and notes["lr_sweep.png"] == []
    assert notes["sparsity_vs_step.png"] == [NAN, FAILED, PENDING]
    assert notes["throughput_memory.png"] == [
        "adamwprune / state 90% seed 1337: no tokens/s or peak memory (pending)"]
    assert "no completed cells" not in drawn["ppl_heatmap.png"]["texts"]


def test_heatmap_marks_means_unplanned_and_missing_cells(full):
    heat = full[2]["ppl_heatmap.png"]
    assert heat["yticks"] == ["adamw", "adamwspam", "adamwprune"]
    assert heat["xticks"] == ["none", "movement 50%", "movement 70%", "movement 90%",
                              "state 50%", "state 70%", "state 90%"]
    texts = heat["texts"]
    assert len(texts) == 3 * 7
    # adamw dense has two seeds (loss 3.4 and 3.41): mean ± sample std of the perplexities.
    ppl = [math.exp(3.4), math.exp(3.41)]
    mean, std = sum(ppl) / 2, abs(ppl[0] - ppl[1]) / math.sqrt(2)
    assert texts[0] == f"{mean:.1f}±{std:.1f}"
    assert "±" not in texts[2]  # adamw / movement 70%: the NaN seed is left out
    assert texts.count("—") == 9  # movement for adamwprune, state for the other two
    assert texts.count("failed") == 1 and texts.count("missing") == 1
    assert texts.count("NaN") == 0


def test_a_combination_with_only_nan_seeds_reads_nan(tmp_path):
    _, drawn = render([cell("adamw"), cell("adamw", "movement", 0.5, loss=math.nan)], tmp_path)
    assert drawn["ppl_heatmap.png"]["texts"][1] == "NaN"


def test_throughput_bars_say_n_a_for_cells_without_figures(full):
    bars = full[2]["throughput_memory.png"]
    assert bars["texts"].count(" n/a") == 2  # the pending cell, in both charts
    assert "adamwprune / state 90% seed 1337 (pending)" in bars["yticks"]
    assert "adamwspam / movement 90% seed 1337 (failed)" in bars["yticks"]


@pytest.mark.parametrize("status", ["failed", "pending"])
def test_all_cells_unusable_still_writes_every_plot(tmp_path, status):
    cells = [cell("adamw", status=status), cell("adamw", "movement", 0.5, status=status)]
    result, drawn = render(cells, tmp_path)
    assert_pngs(tmp_path, result)
    for p in result:
        if p.filename == "throughput_memory.png" and status == "failed":
            continue  # failed runs still report their partial throughput
        if p.filename == "lr_sweep.png":
            assert p.skipped == NO_GRID  # no grid to draw in the first place
            continue
        assert p.skipped == "no completed cells" and p.filename not in drawn, p.filename
    assert f"adamw / movement 50% seed 1337: {plots._why(cells[1])}" in result[1].notes


def test_no_cells_at_all(tmp_path):
    assert_pngs(tmp_path, plots.make_plots([], tmp_path))


def test_single_completed_dense_cell(tmp_path):
    result, drawn = render([cell("adamw")], tmp_path)
    assert_pngs(tmp_path, result)
    notes = {p.filename: p.notes for p in result}
    skipped = {p.filename: p.skipped for p in result if p.skipped}
    # a dense matrix: no sparsity pictures (the old one was three squares at 0 %)
    assert skipped == {"sparsity_vs_step.png": "no pruned cells",
                       "ppl_vs_sparsity.png": "no pruned cells", "lr_sweep.png": NO_GRID}
    assert all(not n for n in notes.values())
    assert drawn["ppl_heatmap.png"]["texts"] == [f"{math.exp(3.4):.1f}"]


def test_rewriting_replaces_old_plots(tmp_path):
    (tmp_path / "val_loss.png").write_bytes(b"old")
    plots.make_plots([cell("adamw")], tmp_path)
    assert (tmp_path / "val_loss.png").read_bytes().startswith(b"\x89PNG")


def test_the_lr_sweep_tells_a_rate_not_yet_run_from_one_that_failed(tmp_path):
    """A matrix stopped halfway (seen on an H100: the report said "every cell failed or
    diverged" of rates whose cells were pending): a rate with a cell that failed or
    diverged is marked so; a rate whose cells have not all run yet is said to be not run
    to the end, and is not drawn as a failure."""
    cells = []
    for lr, seeds in ((1e-3, ("completed", "completed")), (2e-3, ("completed", "pending")),
                      (4e-3, ("pending", "interrupted")), (8e-3, ("completed", "failed"))):
        for seed, status in zip((1337, 1338), seeds):
            c = cell("adamw", seed=seed, status=status,
                     loss=math.nan if (lr, seed) == (8e-3, 1337) else None)
            c.cell += f"-lr{lr:g}"
            c.grid = {"lr": lr}
            cells.append(c)
    grids = {"adamw": {"lr": {"values": [1e-3, 2e-3, 4e-3, 8e-3]}}}
    result = plots.make_plots(cells, tmp_path, grids=grids)
    notes = {p.filename: p.notes for p in result}["lr_sweep.png"]
    assert [n for n in notes if " at lr " in n] == ["adamw / none at lr 2e-3: not run to the end yet",
                     "adamw / none at lr 4e-3: not run to the end yet",
                     "adamw / none at lr 8e-3: every cell failed or diverged"]
