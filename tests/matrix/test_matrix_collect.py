"""Collecting a matrix folder without training: tables, seed statistics, plots and
the report, from complete, partial, failed and tampered folders."""

from __future__ import annotations

import csv
import json
import math
import os

import pytest

from fake_matrices import PLOTS, bowl, fake_matrix, fake_tuned_matrix
from helpers import run_target
from gpt2.matrix.collect import aggregate, collect, load_cells


def test_seed_statistics_are_mean_sample_std_and_a_student_t_interval(tmp_path):
    ids = ["adamw-none-seed1", "adamw-none-seed2", "adamw-none-seed3"]
    folder = fake_matrix(tmp_path, losses=dict(zip(ids, (1.0, 2.0, 3.0))))
    combos = aggregate(load_cells(folder))
    row = next(r for r in combos if (r["optimizer"], r["pruning"]) == ("adamw", "none"))
    assert row["n"] == 3 and row["seeds"] == [1, 2, 3]
    assert row["final_val_loss_mean"] == pytest.approx(2.0)
    assert row["final_val_loss_std"] == pytest.approx(1.0)
    assert row["final_val_loss_ci95"] == pytest.approx(4.303 / math.sqrt(3))
    ppl = [math.exp(x) for x in (1.0, 2.0, 3.0)]
    assert row["final_val_ppl_mean"] == pytest.approx(sum(ppl) / 3)  # mean of perplexities


def test_one_seed_has_no_spread(tmp_path):
    combos = aggregate(load_cells(fake_matrix(tmp_path, seeds=(7,))))
    assert len(combos) == 4  # adamw: none, magnitude 50; adamwprune: none, state 50
    assert all(r["n"] == 1 and r["final_val_loss_std"] is None for r in combos)


@pytest.mark.slow
def test_missing_failed_and_nan_cells_are_listed_not_averaged(tmp_path):
    folder = fake_matrix(tmp_path, losses={"adamw-none-seed2": float("nan")},
                         skip={"adamw-none-seed3"}, status={"adamw-magnitude-50-seed1": "failed"})
    cells = load_cells(folder)
    assert [c.status for c in cells[:4]] == ["completed", "completed", "pending", "failed"]
    row = aggregate(cells)[0]
    assert row["n"] == 1 and row["seeds"] == [1]
    assert row["missing"] == ["adamw-none-seed2 (NaN loss)", "adamw-none-seed3 (pending)"]
    problems = collect(folder).missing
    assert "adamw-magnitude-50-seed1: failed (RuntimeError: boom)" in problems
    with open(folder / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12  # every planned cell has a row, whatever its state
    assert rows[2]["status"] == "pending" and rows[2]["final_val_loss"] == ""
    def no_constants(name):
        raise AssertionError(f"summary.json holds {name}: not valid JSON")

    summary = json.loads((folder / "summary.json").read_text(), parse_constant=no_constants)
    assert summary["cells"][1]["final_val_loss"] is None  # the NaN loss, as null
    assert {p.name for p in (folder / "plots").iterdir()} == PLOTS | {"plots.json"}
    report = (folder / "report.md").read_text()
    assert ("Not drawn, having nothing to show: Final validation loss vs learning rate, per "
            "optimizer (star: best point) (no learning-rate grid") in report
    assert "plots/lr_sweep.png" not in report
    for needle in ("`adamw-none-seed3`: pending", "`adamw-magnitude-50-seed1`: failed — "
                   "RuntimeError: boom", "`adamw-none-seed2`: NaN loss", "ppl 95 % CI"):
        assert needle in report


@pytest.mark.slow
def test_the_report_says_when_a_cell_ran_another_config_than_planned(tmp_path):
    folder = fake_matrix(tmp_path, seeds=(1,),
                         tamper={"adamw-none-seed1": {"learning_rate": 0.5}})
    cells = load_cells(folder)
    assert cells[0].config_diff == ["learning_rate"]
    assert all(c.config_diff == [] for c in cells[1:])
    collect(folder)
    report = (folder / "report.md").read_text()
    assert "DIFFERS: learning_rate" in report and report.count("| matches |") == 3


def test_results_are_sorted_by_perplexity(tmp_path):
    folder = fake_matrix(tmp_path, seeds=(1,), losses={"adamwprune-state-50-seed1": 3.0,
                                                       "adamw-none-seed1": 5.0})
    collect(folder, plots=False)
    table = (folder / "report.md").read_text().split("## Results")[1].split("\n\n")[1]
    firsts = [line.split("|")[2].strip() + "/" + line.split("|")[3].strip()
              for line in table.splitlines()[2:]]
    assert firsts[0] == "adamwprune/state" and firsts[-1] == "adamw/none"


@pytest.mark.e2e
def test_make_plots_and_report_rebuild_a_folder_without_training(tmp_path):
    folder = fake_matrix(tmp_path, seeds=(1,), skip={"adamw-none-seed1"})
    proc = run_target("report", f"RUN={folder}")
    assert proc.returncode == 0, proc.stderr
    assert "not in the results: adamw-none-seed1: pending" in proc.stdout
    assert (folder / "report.md").is_file() and (folder / "summary.csv").is_file()
    os.remove(folder / "report.md")
    proc = run_target("plots", f"RUN={folder}")
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in (folder / "plots").iterdir()} == PLOTS | {"plots.json"}
    assert not (folder / "report.md").exists()


@pytest.mark.e2e
def test_make_report_without_a_matrix_says_what_to_run(tmp_path):
    proc = run_target("report", f"RUN={tmp_path / 'nothing'}")
    assert proc.returncode == 2 and "run a matrix first" in proc.stderr
    assert "Traceback" not in proc.stderr
    (tmp_path / "plain").mkdir()
    proc = run_target("plots", f"RUN={tmp_path / 'plain'}")
    assert proc.returncode == 2 and "neither a matrix folder" in proc.stderr


# ---- the tuned comparison ----------------------------------------------------------------

@pytest.mark.slow
def test_the_tuned_table_takes_each_optimizers_best_point_and_flags_edges(tmp_path):
    folder = fake_tuned_matrix(tmp_path, bowl)
    collected = collect(folder)
    summary = json.loads((folder / "summary.json").read_text())
    best = {r["optimizer"]: r for r in summary["tuned"]}
    assert best["adamw"]["grid"] == {"lr": 2e-3, "wd": 0.1}
    assert best["adamw"]["final_val_loss_mean"] == pytest.approx(4.01)  # mean over seeds
    assert best["muon"]["grid"] == {"lr": 0.04, "wd": 0.01}
    assert best["adamw"]["edges"] == []
    edge, wd_edge = collected.warnings
    assert edge.startswith("muon / none: the best lr (muon_lr) 0.04 is the largest of its grid "
                           "(0.01 0.02 0.04)") and "CONFIG_MATRIX_LR_MUON" in edge
    assert wd_edge.startswith("muon / none: the best wd (muon_weight_decay) 0.01 is the largest")
    report = (folder / "report.md").read_text()
    # the report opens with the tuned table, its warnings, the grids and the LR plot
    order = [report.index(s) for s in ("## Tuned comparison", "| 1 | muon | none | — | 6e-4 | "
                                       "0.1 | 0.04 | 0.01 |", "**Under-tuned**", edge, "- **muon**: lr 0.01 "
                                       "0.02 0.04 (`muon_lr`); wd 0 0.01 (`muon_weight_decay`)",
                                       "(plots/lr_sweep.png)", "## Results, every grid point")]
    assert order == sorted(order)
    assert "- **adamw**: lr 1e-3 2e-3 4e-3 (`learning_rate`); wd 0.1 (`weight_decay`), not " \
           "tuned" in report
    with open(folder / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    # columns are the settings a grid sets: Muon's "lr" is muon_lr, not AdamW's rate
    assert list(rows[0])[6:10] == ["learning_rate", "weight_decay", "muon_lr",
                                   "muon_weight_decay"]
    assert rows[0]["learning_rate"] == "0.001" and rows[0]["muon_lr"] == ""


def test_a_point_with_a_failed_seed_cannot_be_the_best(tmp_path):
    failed = "adamw-none-lr4e-3-seed2"
    folder = fake_tuned_matrix(tmp_path, lambda c: 1.0 if c.point[0][1] == 4e-3 else bowl(c),
                               status={failed: "failed"})
    collect(folder, plots=False)
    best = {r["optimizer"]: r for r in json.loads((folder / "summary.json").read_text())["tuned"]}
    assert best["adamw"]["grid"]["lr"] == 2e-3 and best["adamw"]["eligible"] == 2
    assert best["adamw"]["points"] == 3


def test_the_best_point_is_chosen_by_final_loss_not_by_the_best_loss_on_the_way(tmp_path):
    """A rate that dips lowest mid-run and then diverges is not the tuned point: the
    result a setting delivers is its final loss. AdamW at 4e-3 and Muon at 0.01 reach
    3.0 at step 10 (below every final loss) and end worse than the bowl's best."""
    def dips(cell) -> float:
        point = dict(cell.point)
        return 3.0 if point["lr"] in (4e-3, 0.01) else bowl(cell)

    folder = fake_tuned_matrix(tmp_path, bowl, best_of=dips)
    collect(folder, plots=False)
    best = {r["optimizer"]: r for r in json.loads((folder / "summary.json").read_text())["tuned"]}
    assert best["adamw"]["grid"] == {"lr": 2e-3, "wd": 0.1}
    assert best["adamw"]["final_val_loss_mean"] == pytest.approx(4.01)
    assert best["muon"]["grid"] == {"lr": 0.04, "wd": 0.01}


def test_a_best_point_at_the_bottom_of_its_grid_is_flagged_as_an_edge(tmp_path):
    """The smallest value is an edge as much as the largest (the optimum may lie below
    it); a zero at the bottom (no weight decay) is not, since nothing lies below it."""
    def falling(cell) -> float:  # lower rates better; Muon best without weight decay
        point = dict(cell.point)
        return 4.0 + point["lr"] + (0.01 if point.get("wd") else 0.0)

    folder = fake_tuned_matrix(tmp_path, falling, seeds=(1,))
    collected = collect(folder, plots=False)
    best = {r["optimizer"]: r for r in json.loads((folder / "summary.json").read_text())["tuned"]}
    assert best["adamw"]["grid"] == {"lr": 1e-3, "wd": 0.1}
    assert best["muon"]["grid"] == {"lr": 0.01, "wd": 0.0}
    assert len(collected.warnings) == 2, collected.warnings  # each optimizer's rate
    adamw, muon = collected.warnings
    assert adamw.startswith("adamw / none: the best lr (learning_rate) 1e-3 is the smallest "
                            "of its grid (1e-3 2e-3 4e-3)") and "CONFIG_MATRIX_LR_ADAMW" in adamw
    assert muon.startswith("muon / none: the best lr (muon_lr) 0.01 is the smallest of its "
                           "grid (0.01 0.02 0.04)")
    assert best["muon"]["edges"] == [muon]  # wd 0 at the bottom: no warning


def test_plots_of_settings_show_the_tuned_cells_and_the_lr_plot_every_point(tmp_path):
    from gpt2.matrix import plots

    folder = fake_tuned_matrix(tmp_path, bowl, seeds=(1,))
    seen = {}
    real = plots.make_plots

    def spy(cells, out_dir, all_cells=None, grids=None, fits=None, oneshot=None):
        seen["tuned"], seen["all"] = [c.cell for c in cells], [c.cell for c in all_cells]
        return real(cells, out_dir, all_cells=all_cells, grids=grids, fits=fits,
                    oneshot=oneshot)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "make_plots", spy)
        collect(folder)
    assert seen["tuned"] == ["adamw-none-lr2e-3-seed1", "muon-none-lr0.04-wd0.01-seed1"]
    assert len(seen["all"]) == 9


def test_a_table_mixing_code_versions_says_so(tmp_path):
    def made(cell):
        code = "1111" if cell.optimizer == "adamw" else "2222"
        return {"code": {"sources": code, "torch": "2.13.0", "commit": None},
                "data": {"dataset": "shakespeare", "sha256": "abcd"}}

    folder = fake_tuned_matrix(tmp_path, bowl, seeds=(1,), provenance=made)
    collected = collect(folder, plots=False)
    assert any("2 different code or data versions" in w for w in collected.warnings)
    report = (folder / "report.md").read_text()
    assert "**Warning: these results were made by 2 different code or data versions" in report
    assert "src 1111" in report and "src 2222" in report


# ---- paired differences, noise and what a report may claim ------------------------------

SEED_SHIFT = {1: -0.3, 2: 0.0, 3: 0.3}  # seed noise far larger than the effect


def shifted(muon_gain: dict[int, float]):
    """AdamW at 4.0 (best point 2e-3) and Muon at 4.0 - muon_gain[seed] (best point
    0.04), both moved by the seed's shared shift."""
    def loss(cell) -> float:
        point = dict(cell.point)
        if cell.optimizer == "adamw":
            base = 4.0 + abs(math.log2(point["lr"] / 2e-3)) / 10
        else:
            base = 4.0 - muon_gain[cell.seed] + (0.04 - point["lr"]) + 0.01 * (not point["wd"])
        return base + SEED_SHIFT[cell.seed]
    return loss


def test_a_small_effect_under_large_seed_noise_is_found_by_pairing_seeds(tmp_path):
    """Muon is 0.05 better at every seed, while seeds move both by ±0.3: unpaired
    intervals overlap (the per-optimizer CI is ~±0.75), the paired difference is
    exactly -0.05 with no spread, so the verdict is "better"; a gain that changes sign
    with the seed is "not distinguishable"."""
    folder = fake_tuned_matrix(tmp_path / "a", shifted({1: 0.05, 2: 0.05, 3: 0.05}),
                               seeds=(1, 2, 3))
    collect(folder, plots=False)
    summary = json.loads((folder / "summary.json").read_text())
    (row,) = summary["paired"]
    assert (row["optimizer"], row["baseline"], row["seeds"]) == ("muon", "adamw", [1, 2, 3])
    assert row["differences"] == pytest.approx([-0.05] * 3)
    assert row["mean"] == pytest.approx(-0.05) and row["verdict"] == "better"
    tuned_rows = {r["optimizer"]: r for r in summary["tuned"]}
    assert tuned_rows["adamw"]["final_val_loss_ci95"] > 0.5  # unpaired: hopelessly wide
    report = (folder / "report.md").read_text()
    assert "## Paired differences from adamw" in report
    assert "| muon | none | adamw | 3 | -0.0500 | -0.0500 to -0.0500 | better |" in report
    assert "Seed noise: the final validation loss varies by 0.3000" in report

    folder = fake_tuned_matrix(tmp_path / "b", shifted({1: 0.1, 2: -0.05, 3: 0.02}),
                               seeds=(1, 2, 3))
    collect(folder, plots=False)
    (row,) = json.loads((folder / "summary.json").read_text())["paired"]
    assert row["verdict"] == "not distinguishable"
    assert row["mean"] - row["ci95"] < 0 < row["mean"] + row["ci95"]
    worse = fake_tuned_matrix(tmp_path / "c", shifted({1: -0.1, 2: -0.12, 3: -0.11}),
                              seeds=(1, 2, 3))
    collect(worse, plots=False)
    assert json.loads((worse / "summary.json").read_text())["paired"][0]["verdict"] == "worse"


def test_with_one_seed_only_a_difference_within_the_evaluation_noise_gets_a_verdict(tmp_path):
    """One seed: a difference larger than the evaluation's own error gets no verdict
    (seed noise is unmeasured) and the report says nothing can be claimed beyond it;
    one within 1.96 x the combined standard error is "not distinguishable"."""
    se = {"final_val_loss_se": 0.02, "val_tokens": 33_000}
    folder = fake_tuned_matrix(tmp_path / "a", shifted({1: 0.2}), seeds=(1,),
                               extra=lambda c: se)
    collect(folder, plots=False)
    (row,) = json.loads((folder / "summary.json").read_text())["paired"]
    assert row["verdict"] == "no verdict (one seed)" and row["ci95"] is None
    assert row["noise"] == pytest.approx(1.96 * math.hypot(0.02, 0.02))
    report = (folder / "report.md").read_text()
    assert "**One seed: no difference beyond the evaluation's own noise can be claimed**" \
        in report
    assert "standard error (over its windows) is 0.0200" in report and "33,000" in report
    folder = fake_tuned_matrix(tmp_path / "b", shifted({1: 0.03}), seeds=(1,),
                               extra=lambda c: se)
    collect(folder, plots=False)
    (row,) = json.loads((folder / "summary.json").read_text())["paired"]
    assert row["verdict"] == "not distinguishable"


def test_the_report_names_every_setting_that_differs_between_optimizers(tmp_path):
    """SPAM's own settings, and Muon's AdamW-part rate where it is not gridded, are
    in the report: a reader sees every value each optimizer trained at."""
    folder = fake_tuned_matrix(tmp_path, lambda c: 4.0, seeds=(1,),
                               optimizers=("adamw", "adamwspam", "muon"))
    collect(folder, plots=False)
    report = (folder / "report.md").read_text()
    spam = next(line for line in report.splitlines() if line.startswith("- **adamwspam**: `"))
    for name in ("spam_threshold", "spam_reset_interval", "spam_warmup", "spam_clip_delay"):
        assert f"`{name}`" in spam
    muon = next(line for line in report.splitlines() if line.startswith("- **muon**: `"))
    # Muon's AdamW part keeps the configured rate while AdamW's is tuned: said so
    assert "`muon_momentum` 0.95" in muon and "`learning_rate` 6e-4" in muon
    row = next(line for line in report.splitlines() if line.startswith("| ") and "| muon |" in line)
    assert "| 6e-4 | 0.1 |" in row  # its AdamW part's rate and decay, though not gridded


def test_the_report_warns_of_epochs_and_of_speeds_that_do_not_compare(tmp_path):
    loads = {1: 0.5, 2: 3.9}
    folder = fake_tuned_matrix(tmp_path, bowl, extra=lambda c: {
        "epochs_trained": 65.1 if c.optimizer == "muon" else 0.5,
        "device": "cpu (2 cores, 2 threads)", "load_avg": loads[c.seed]})
    collect(folder, plots=False)
    report = (folder / "report.md").read_text()
    assert "**Warning: 12 cell(s) trained past 4 epochs over their training split (up to " \
           "65.1" in report
    assert "**Speed figures are not comparable between cells**: speed (tokens/s, wall) was " \
           "measured on cpu (2 cores, 2 threads), at load averages 0.5 to 3.9." in report
    calm = fake_tuned_matrix(tmp_path / "calm", bowl, extra=lambda c: {
        "epochs_trained": 0.5, "device": "NVIDIA H100", "load_avg": 1.0})
    collect(calm, plots=False)
    report = (calm / "report.md").read_text()
    assert "Warning: " not in report and "not comparable" not in report
    assert "Speed (tokens/s, wall) was measured on NVIDIA H100, at load averages 1.0 to 1.0." \
        in report
