"""The matrix plan: exactly the valid combinations of what the Matrix menu enables,
each cell a complete, checked configuration; nothing switched on behind the user's
back, and every bad matrix refused before anything runs."""

from __future__ import annotations

import argparse

import pytest
from helpers import REPO, checkpoint_state, run_target

from gpt2.config import axes, kconfig, matrix
from gpt2.config.kconfig import KconfigError
from gpt2.config.matrix import MatrixSettings
from gpt2.config.options import (
    TRAIN,
    Config,
    add_arguments,
    applies,
    config_from_namespace,
    fields,
    opt,
)
from gpt2 import run_folder
from gpt2.errors import UsageError
from gpt2.matrix.plan import PlanError, build_plan, plan_from_dotconfig
from gpt2.config.choices import OPTIMIZERS, PRUNING_METHODS, pair_problem

MATRIX12 = (REPO / "defconfigs" / "gpt2-wikitext103-matrix").read_text()
EXPECTED12 = ["adamw-none-seed1337", "adamw-movement-50-seed1337", "adamw-movement-70-seed1337",
              "adamw-movement-90-seed1337", "adamwspam-none-seed1337",
              "adamwspam-movement-50-seed1337", "adamwspam-movement-70-seed1337",
              "adamwspam-movement-90-seed1337", "adamwprune-none-seed1337",
              "adamwprune-state-50-seed1337", "adamwprune-state-70-seed1337",
              "adamwprune-state-90-seed1337"]


def plan_of(tmp_path, body: str, train_args: list[str] | None = None):
    path = tmp_path / "config"
    path.write_text(body)
    return plan_from_dotconfig(kconfig.load(path), train_args or [])


def parse_cell(argv) -> Config:
    parser = argparse.ArgumentParser()
    add_arguments(parser, TRAIN)
    return config_from_namespace(parser.parse_args(list(argv)), TRAIN)


@pytest.mark.parametrize("name", ["gpt2-wikitext103-matrix", "gpt2-shakespeare-matrix-cpu"])
def test_the_matrix_defconfigs_plan_exactly_twelve_cells(tmp_path, name):
    plan = plan_of(tmp_path, (REPO / "defconfigs" / name).read_text())
    assert [c.id for c in plan.cells] == EXPECTED12
    for c in plan.cells:
        cfg = parse_cell(c.argv)  # what train.py will run is what the plan says
        assert cfg == c.cfg
        assert (cfg.optimizer, cfg.pruning_method, cfg.seed) == (c.optimizer, c.pruning, 1337)
        if c.pruning == "none":
            assert c.sparsity is None and not any("target-sparsity" in a for a in c.argv)
        else:
            assert cfg.target_sparsity == c.sparsity
    assert len({c.cfg.config_hash() for c in plan.cells}) == 12


def test_seeds_multiply_every_combination(tmp_path):
    plan = plan_of(tmp_path, MATRIX12 + 'CONFIG_MATRIX_SEEDS="1337 7 42"\n')
    assert len(plan.cells) == 36
    assert [c.seed for c in plan.cells[:3]] == [1337, 7, 42]
    assert plan.cells[1].id == "adamw-none-seed7"


def test_nothing_is_enabled_behind_the_users_back(tmp_path):
    with pytest.raises(KconfigError, match="no optimizer") as err:
        plan_of(tmp_path, "CONFIG_MATRIX=y\n")
    assert "no pruning method" in str(err.value)
    plan = plan_of(tmp_path, "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_SGD=y\n"
                             "CONFIG_MATRIX_PRUNING_NONE=y\n")
    assert [c.id for c in plan.cells] == ["sgd-none-seed1337"]


def _matrix_kconf(optimizers, methods):
    kconf = kconfig.new_kconfig()
    kconf.syms[matrix.ENABLE].set_value(2)
    for o in optimizers:
        kconf.syms[axes.optimizer_symbol(o)].set_value(2)
    for m in methods:
        kconf.syms[axes.pruning_symbol(m)].set_value(2)
    return kconf


def test_the_matrix_menu_has_one_entry_per_registry_entry():
    kconf = kconfig.new_kconfig()
    names = {s.name for s in kconf.unique_defined_syms}
    assert {n for n in names if n.startswith("MATRIX_OPTIMIZER_")} == {
        axes.optimizer_symbol(o) for o in OPTIMIZERS}
    assert {n for n in names if n.startswith("MATRIX_PRUNING_")} == {
        axes.pruning_symbol(m) for m in PRUNING_METHODS}
    for sym in names & {axes.optimizer_symbol(o) for o in OPTIMIZERS}:
        assert kconf.syms[sym].str_value == "n"  # default off


@pytest.mark.parametrize("optimizer", tuple(OPTIMIZERS))
def test_kconfig_offers_a_pruning_method_only_with_an_optimizer_it_pairs_with(optimizer):
    kconf = _matrix_kconf([optimizer], [])
    for method in PRUNING_METHODS:
        offered = kconf.syms[axes.pruning_symbol(method)].visibility == 2
        assert offered == (pair_problem(optimizer, method) is None), (optimizer, method)


@pytest.mark.slow
def test_every_knob_a_matrix_cell_reads_is_offered_and_no_other():
    """With one optimizer and one method in the matrix, Kconfig shows exactly the
    settings in force in that cell (the axes themselves belong to the Matrix menu)."""
    conditional = [f.name for f in fields() if opt(f.name).when]
    for optimizer in OPTIMIZERS:
        for method in PRUNING_METHODS:
            if pair_problem(optimizer, method):
                continue
            kconf = _matrix_kconf([optimizer], [method])
            cell = Config(optimizer=optimizer, pruning_method=method)
            for name in conditional:
                want = applies(cell, name) and name not in matrix.AXIS_FIELDS
                assert kconfig.is_active(kconf, name) == want, (name, optimizer, method)
            for axis in matrix.AXIS_FIELDS:
                assert not kconfig.is_active(kconf, axis), axis


BAD = [
    ("state without AdamWPrune", "CONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_STATE=y\n",
     ["CONFIG_MATRIX_PRUNING_STATE", "unmet dependency"]),
    ("sparsity of 1", 'CONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_MAGNITUDE=y\n'
     'CONFIG_MATRIX_SPARSITIES="0.5 1"\n', [":4:", "CONFIG_MATRIX_SPARSITIES", "strictly between"]),
    ("sparsity that is not a number", 'CONFIG_MATRIX_OPTIMIZER_ADAMW=y\n'
     'CONFIG_MATRIX_PRUNING_MAGNITUDE=y\nCONFIG_MATRIX_SPARSITIES="half"\n',
     ["CONFIG_MATRIX_SPARSITIES", "'half' is not a number"]),
    ("a sparsity twice", 'CONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_MAGNITUDE=y\n'
     'CONFIG_MATRIX_SPARSITIES="0.5 0.5"\n', ["CONFIG_MATRIX_SPARSITIES", "twice"]),
    ("no seeds", 'CONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_NONE=y\n'
     'CONFIG_MATRIX_SEEDS=""\n', ["CONFIG_MATRIX_SEEDS", "at least one"]),
    ("a negative seed", 'CONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_NONE=y\n'
     'CONFIG_MATRIX_SEEDS="1 -2"\n', ["CONFIG_MATRIX_SEEDS", "'-2' is not a seed"]),
    ("the single-run sparsity", 'CONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_MAGNITUDE=y\n'
     'CONFIG_TARGET_SPARSITY="0.5"\n', ["CONFIG_TARGET_SPARSITY", "unmet dependency", "!MATRIX"]),
    ("the single-run optimizer", 'CONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_NONE=y\n'
     'CONFIG_OPTIMIZER_SGD=y\n', ["CONFIG_OPTIMIZER_SGD", "unmet dependency"]),
    ("a knob of an optimizer not in the matrix", 'CONFIG_MATRIX_OPTIMIZER_ADAMW=y\n'
     'CONFIG_MATRIX_PRUNING_NONE=y\nCONFIG_SPAM_THRESHOLD="10"\n',
     ["CONFIG_SPAM_THRESHOLD", "unmet dependency", "MATRIX_OPTIMIZER_ADAMWSPAM"]),
    ("a baseline not in the matrix", 'CONFIG_MATRIX_OPTIMIZER_ADAMWSPAM=y\n'
     'CONFIG_MATRIX_OPTIMIZER_MUON=y\nCONFIG_MATRIX_PRUNING_NONE=y\n',
     ["CONFIG_MATRIX_BASELINE: adamw is not in this matrix (its optimizers: adamwspam, muon)",
      "CONFIG_MATRIX_OPTIMIZER_ADAMW"]),
    ("an unknown one-shot method", 'CONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_NONE=y\n'
     'CONFIG_MATRIX_PRUNING_MAGNITUDE=y\nCONFIG_MATRIX_ONESHOT="wanda obs"\n',
     ["CONFIG_MATRIX_ONESHOT: obs: not a one-shot method (one of magnitude, wanda, sparsegpt)"]),
    ("one-shot without a pruned cell", 'CONFIG_MATRIX_OPTIMIZER_ADAMW=y\n'
     'CONFIG_MATRIX_PRUNING_NONE=y\nCONFIG_MATRIX_ONESHOT="wanda"\n',
     ["CONFIG_MATRIX_ONESHOT: one-shot baselines prune at the sparsities of the matrix's "
      "pruned cells, and it has none"]),
    ("one-shot without dense cells", 'CONFIG_MATRIX_OPTIMIZER_ADAMW=y\n'
     'CONFIG_MATRIX_PRUNING_MAGNITUDE=y\nCONFIG_MATRIX_ONESHOT="wanda"\n',
     ["CONFIG_MATRIX_ONESHOT", "unmet dependency", "MATRIX_PRUNING_NONE"]),
]


@pytest.mark.parametrize("body,needles", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_matrix_is_refused_naming_the_symbol(tmp_path, body, needles):
    with pytest.raises(KconfigError) as err:
        plan_of(tmp_path, "CONFIG_MATRIX=y\n" + body)
    for needle in needles:
        assert needle in str(err.value)


def test_a_baseline_is_needed_only_where_there_is_something_to_pair(tmp_path):
    """One optimizer alone has no comparison, whatever the (default) baseline; with
    several, a baseline among them is taken."""
    alone = plan_of(tmp_path, "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_MUON=y\n"
                              "CONFIG_MATRIX_PRUNING_NONE=y\n")
    assert alone.settings.baseline == "adamw"
    chosen = plan_of(tmp_path, "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMWSPAM=y\n"
                               "CONFIG_MATRIX_OPTIMIZER_MUON=y\nCONFIG_MATRIX_PRUNING_NONE=y\n"
                               'CONFIG_MATRIX_BASELINE="muon"\n')
    assert chosen.settings.baseline == "muon"


def test_an_optimizer_with_no_enabled_partner_is_refused(tmp_path):
    with pytest.raises(PlanError, match="MATRIX_OPTIMIZER_ADAMWPRUNE: adamwprune pairs with none"):
        plan_of(tmp_path, "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\n"
                          "CONFIG_MATRIX_OPTIMIZER_ADAMWPRUNE=y\nCONFIG_MATRIX_PRUNING_MOVEMENT=y\n")


def test_a_cell_whose_config_is_invalid_is_refused_before_anything_runs(tmp_path):
    # Pruning warmup 100 cannot end by 0.75 * 50 steps: every pruned cell is refused.
    with pytest.raises(PlanError) as err:
        plan_of(tmp_path, MATRIX12.replace("CONFIG_MAX_ITERS=2000", "CONFIG_MAX_ITERS=50"))
    (pruned,) = [line for line in str(err.value).splitlines() if "CONFIG_PRUNING_WARMUP" in line]
    assert pruned.startswith("9 cells (adamw-movement-50-seed1337, ")


def test_knobs_reach_exactly_the_cells_that_read_them(tmp_path):
    plan = plan_of(tmp_path, MATRIX12 + 'CONFIG_SPAM_THRESHOLD="123"\n')
    for c in plan.cells:
        assert ("--spam-threshold=123.0" in c.argv) == (c.optimizer == "adamwspam"), c.id
        assert ("--pruning-variant=hybrid" in c.argv) == (c.pruning == "state"), c.id


def test_train_args_apply_to_every_cell_where_they_apply(tmp_path):
    plan = plan_of(tmp_path, MATRIX12, ["--max-iters=3000", "--spam-warmup=20"])
    assert all(c.cfg.max_iters == 3000 for c in plan.cells)
    assert [c.cfg.spam_warmup for c in plan.cells if c.optimizer == "adamwspam"] == [20] * 4
    assert all("--spam-warmup=20" not in c.argv for c in plan.cells if c.optimizer != "adamwspam")


@pytest.mark.parametrize("args,message", [
    (["--optimizer=sgd"], "varies per cell"),
    (["--seed=3"], "varies per cell"),
    (["--target-sparsity=0.3"], "varies per cell"),
    (["--muon-lr=0.1"], "--muon-lr has no effect in any cell"),
    (["--stop-at-step=5"], "not a configuration flag"),
    (["--learning-rate=fast"], "not a number"),
])
def test_bad_train_args_are_refused(tmp_path, args, message):
    with pytest.raises(PlanError, match=message):
        plan_of(tmp_path, MATRIX12, args)


def test_the_plan_folder_follows_what_the_cells_compute(tmp_path):
    base = plan_of(tmp_path, MATRIX12)
    again = plan_of(tmp_path, MATRIX12)
    assert base.folder == again.folder and base.folder.name.startswith("matrix-wikitext103-matrix-")
    # Where logs go or how often it prints cannot change results: same folder, so a
    # re-run with them changed continues the matrix.
    assert plan_of(tmp_path, MATRIX12, ["--log-interval=1"]).folder == base.folder
    assert plan_of(tmp_path, MATRIX12 + "CONFIG_MATRIX_JOBS=2\n").folder == base.folder
    assert plan_of(tmp_path, MATRIX12, ["--learning-rate=1e-3"]).folder != base.folder
    assert plan_of(tmp_path, MATRIX12 + 'CONFIG_MATRIX_SEEDS="1337 1"\n').folder != base.folder


def test_build_plan_orders_cells_by_registry_whatever_the_settings_order():
    s = MatrixSettings(optimizers=("sgd", "muon"), pruning_methods=("none", "magnitude"),
                       sparsities=(0.9, 0.5), seeds=(2, 1))
    ids = [c.id for c in build_plan({}, s, []).cells]
    assert ids == ["sgd-none-seed2", "sgd-none-seed1", "sgd-magnitude-90-seed2",
                   "sgd-magnitude-90-seed1", "sgd-magnitude-50-seed2", "sgd-magnitude-50-seed1",
                   "muon-none-seed2", "muon-none-seed1", "muon-magnitude-90-seed2",
                   "muon-magnitude-90-seed1", "muon-magnitude-50-seed2", "muon-magnitude-50-seed1"]


@pytest.mark.e2e
def test_single_run_targets_and_matrix_targets_refuse_the_other_kind(tmp_path):
    config = tmp_path / "config"
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_target("defconfig-gpt2-shakespeare-cpu", env=env).returncode == 0
    proc = run_target("test-matrix", env=env)
    assert proc.returncode == 2 and "single-run configuration" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert run_target("defconfig-gpt2-wikitext103-matrix", env=env).returncode == 0
    with pytest.raises(KconfigError, match="make test-matrix"):
        kconfig.to_config(kconfig.load(config))


@pytest.mark.e2e
def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    config = tmp_path / "config"
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_target("defconfig-gpt2-wikitext103-matrix", env=env).returncode == 0
    proc = run_target("test-matrix", "DRY_RUN=1", f"TRAIN_ARGS=--results-dir={tmp_path}/r",
                      env=env)
    assert proc.returncode == 0, proc.stderr
    assert "(12 cells)" in proc.stdout
    assert [line.split()[0] for line in proc.stdout.splitlines()[2:]] == EXPECTED12
    assert not (tmp_path / "r").exists()
    for target in ((), ("train",)):  # plain `make` and `make train` run the matrix too
        proc = run_target(*target, "DRY_RUN=1", env=env)
        assert proc.returncode == 0 and "(12 cells)" in proc.stdout, proc.stderr


def _bridge():
    from gpt2.cli import matrix_commands

    return matrix_commands


def test_each_running_cell_gets_its_own_gpu(tmp_path, monkeypatch):
    """On a multi-GPU machine (simulated: no test may need a GPU) cells running side by
    side get one visible GPU each, and more jobs than GPUs is refused."""
    import torch

    from gpt2.matrix.backend import local_gpus

    plan = plan_of(tmp_path, MATRIX12)  # device auto
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert local_gpus(plan, 1) is None  # one cell at a time: leave the machine as is
    assert local_gpus(plan, 2) == ["0", "1"]
    with pytest.raises(UsageError, match="MATRIX_JOBS=4 but 3 GPU"):
        local_gpus(plan, 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert local_gpus(plan, 2) == ["4", "6"]
    cpu = plan_of(tmp_path, MATRIX12 + "CONFIG_DEVICE_CPU=y\n")
    assert local_gpus(cpu, 2) is None


def test_cells_side_by_side_on_the_cpu_split_the_cores(tmp_path):
    from gpt2.matrix.runner import Runner

    plan = plan_of(tmp_path, MATRIX12 + "CONFIG_DEVICE_CPU=y\n")
    cell = plan.cells[0]
    assert "--cpu-threads=4" in Runner(plan, jobs=2, cpu_count=8)._argv(cell)
    assert not any(a.startswith("--cpu-threads=4") for a in Runner(plan, jobs=1)._argv(cell))
    assert Runner(plan, jobs=1)._argv(cell)[-2:] == [f"--run-dir={plan.folder / 'cells' / cell.id}",
                                                     "--if-changed=refuse"]
    pinned = plan_of(tmp_path, MATRIX12 + "CONFIG_DEVICE_CPU=y\nCONFIG_CPU_THREADS=3\n")
    argv = Runner(pinned, jobs=2, cpu_count=8)._argv(pinned.cells[0])
    assert "--cpu-threads=3" in argv and "--cpu-threads=4" not in argv  # the user's choice wins


# ---- grid axes: per-optimizer tuning and sweeps ------------------------------------------

TUNE3 = """CONFIG_MATRIX=y
CONFIG_MATRIX_OPTIMIZER_SGD=y
CONFIG_MATRIX_OPTIMIZER_ADAMW=y
CONFIG_MATRIX_OPTIMIZER_MUON=y
CONFIG_MATRIX_PRUNING_NONE=y
CONFIG_MATRIX_TUNE=y
"""


def test_every_optimizer_has_its_own_tuning_grids_in_kconfig():
    """One grid of each kind per registry entry, whose default parses (a default that
    did not would break every tuning matrix that keeps it)."""
    kconf = _matrix_kconf(OPTIMIZERS, ["none"])
    kconf.syms[matrix.TUNE].set_value(2)
    for optimizer in OPTIMIZERS:
        for label in matrix.tuning_grids(optimizer):
            sym = kconf.syms[matrix.grid_symbol(label, optimizer)]
            assert sym.visibility == 2, sym.name
            values = matrix.parse_grid(sym.str_value, positive=matrix.is_rate(label))
            assert len(values) >= (3 if matrix.is_rate(label) else 1), sym.name
    # every rate an optimizer has is tuned: Muon's AdamW part included
    assert matrix.tuning_grids("muon") == ("lr", "wd", "adam_lr", "adam_wd")


def test_tuning_gives_each_optimizer_its_own_grid(tmp_path):
    plan = plan_of(tmp_path, TUNE3 + 'CONFIG_MATRIX_ADAM_LR_MUON="6e-4"\n')
    assert len(plan.cells) == 9
    by = {o: [c for c in plan.cells if c.optimizer == o] for o in ("sgd", "adamw", "muon")}
    assert [c.id for c in by["adamw"]] == ["adamw-none-lr3e-4-seed1337",
                                           "adamw-none-lr6e-4-seed1337",
                                           "adamw-none-lr1.2e-3-seed1337"]
    assert [c.cfg.learning_rate for c in by["adamw"]] == [3e-4, 6e-4, 1.2e-3]
    # the schedule keeps its shape: min_lr stays a tenth of the peak
    assert [c.cfg.min_lr for c in by["adamw"]] == pytest.approx([3e-5, 6e-5, 1.2e-4])
    assert all(c.cfg.weight_decay == 0.1 for c in by["adamw"])
    assert [c.cfg.learning_rate for c in by["sgd"]] == [0.03, 0.1, 0.3]
    assert all(c.cfg.weight_decay == 5e-4 for c in by["sgd"])
    # Muon's grids are its block matrices' own rate and decay and its AdamW part's
    assert [c.cfg.muon_lr for c in by["muon"]] == [0.01, 0.02, 0.04]
    assert all(c.cfg.learning_rate == 6e-4 and c.cfg.muon_weight_decay == 0.01
               and c.cfg.weight_decay == 0.1 for c in by["muon"])
    assert [c.point for c in by["muon"]][0] == (("lr", 0.01), ("wd", 0.01),
                                                ("adam_lr", 6e-4), ("adam_wd", 0.1))
    for c in plan.cells:
        assert parse_cell(c.argv) == c.cfg
    grids = plan.to_dict()["axes"]["grids"]
    assert grids["muon"]["lr"] == {"field": "muon_lr", "values": [0.01, 0.02, 0.04]}


def test_muons_adamw_part_gets_a_grid_of_its_own_not_adamws_rate(tmp_path):
    """Muon's embeddings, head, gains and biases train at CONFIG_LEARNING_RATE: in a
    tuning matrix that rate has its own grid for Muon (the default grid crosses it
    with Muon's own), never AdamW's tuned value or the configured one."""
    plan = plan_of(tmp_path, TUNE3.replace("CONFIG_MATRIX_OPTIMIZER_SGD=y\n", "")
                   + 'CONFIG_MATRIX_ADAM_LR_MUON="1e-3 4e-3"\nCONFIG_MATRIX_LR_ADAMW="2e-3"\n')
    muon = [c for c in plan.cells if c.optimizer == "muon"]
    assert [(c.cfg.muon_lr, c.cfg.learning_rate) for c in muon] == [
        (m, a) for m in (0.01, 0.02, 0.04) for a in (1e-3, 4e-3)]
    assert muon[1].id == "muon-none-lr0.01-adam_lr4e-3-seed1337"
    # min_lr follows the AdamW part's rate at the configured ratio, as for AdamW
    assert muon[1].cfg.min_lr == pytest.approx(4e-4)
    assert {c.cfg.learning_rate for c in plan.cells if c.optimizer == "adamw"} == {2e-3}
    assert plan.to_dict()["axes"]["grids"]["muon"]["adam_lr"] == {
        "field": "learning_rate", "values": [1e-3, 4e-3]}


def test_a_sweep_can_be_one_optimizers_own_grid(tmp_path):
    """"muon:WARMUP_ITERS=10,20" sweeps Muon's cells only; the same setting may be
    swept for another optimizer with other values, but not for all and one."""
    three = ("CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_OPTIMIZER_ADAMWSPAM=y\n"
             "CONFIG_MATRIX_OPTIMIZER_MUON=y\nCONFIG_MATRIX_PRUNING_NONE=y\n")
    plan = plan_of(tmp_path, three + 'CONFIG_MATRIX_SWEEP="muon:WARMUP_ITERS=10,20 '
                   'adamw:WARMUP_ITERS=50"\n')
    got = {c.id: c.cfg.warmup_iters for c in plan.cells}
    assert {k: v for k, v in got.items() if k.startswith("muon")} == {
        "muon-none-warmup_iters10-seed1337": 10, "muon-none-warmup_iters20-seed1337": 20}
    assert got["adamw-none-seed1337"] == 50
    assert len([k for k in got if k.startswith("adamwspam")]) == 1
    for body, needle in [('"muon:WARMUP_ITERS=10,20 WARMUP_ITERS=5,6"', "swept twice"),
                         ('"nadam:WARMUP_ITERS=10,20"', "nadam before ':' is not an optimizer"),
                         ('"adamw:MUON_LR=0.01,0.02"', "does not apply to adamw cells")]:
        with pytest.raises(KconfigError, match=needle):
            plan_of(tmp_path, three + f"CONFIG_MATRIX_SWEEP={body}\n")


def test_moonlight_muon_tunes_adamws_settings(tmp_path):
    plan = plan_of(tmp_path, TUNE3.replace("SGD", "ADAMW_UNUSED").replace(
        "CONFIG_MATRIX_OPTIMIZER_ADAMW_UNUSED=y\n", "") + "CONFIG_MUON_SCALE_MOONLIGHT=y\n")
    muon = [c for c in plan.cells if c.optimizer == "muon"]
    assert [c.cfg.learning_rate for c in muon] == [3e-4, 6e-4, 1.2e-3]
    assert all(c.cfg.weight_decay == 0.1 for c in muon)
    assert plan.axes["muon"][0].field == "learning_rate"


def test_a_sweep_varies_any_numeric_setting_where_it_applies(tmp_path):
    plan = plan_of(tmp_path, "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\n"
                   "CONFIG_MATRIX_OPTIMIZER_ADAMWSPAM=y\nCONFIG_MATRIX_PRUNING_NONE=y\n"
                   'CONFIG_MATRIX_SWEEP="WARMUP_ITERS=50,100 SPAM_THRESHOLD=100,5000"\n')
    assert [c.id for c in plan.cells] == [
        "adamw-none-warmup_iters50-seed1337", "adamw-none-warmup_iters100-seed1337",
        "adamwspam-none-warmup_iters50-spam_threshold100-seed1337",
        "adamwspam-none-warmup_iters50-spam_threshold5000-seed1337",
        "adamwspam-none-warmup_iters100-spam_threshold100-seed1337",
        "adamwspam-none-warmup_iters100-spam_threshold5000-seed1337"]
    assert [c.cfg.warmup_iters for c in plan.cells[:2]] == [50, 100]
    muon = plan_of(tmp_path, "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_MUON=y\n"
                   'CONFIG_MATRIX_PRUNING_NONE=y\nCONFIG_MATRIX_SWEEP="MUON_SPLIT_QKV=y,n"\n')
    assert [(c.id, c.cfg.muon_split_qkv) for c in muon.cells] == [
        ("muon-none-muon_split_qkvy-seed1337", True),
        ("muon-none-muon_split_qkvn-seed1337", False)]
    assert [c.cfg.spam_threshold for c in plan.cells[2:]] == [100.0, 5000.0] * 2
    assert len({c.cfg.config_hash() for c in plan.cells}) == 6


BAD_GRIDS = [
    ("a setting that does not change results", 'CONFIG_MATRIX_SWEEP="LOG_INTERVAL=1,2"\n',
     KconfigError, ["CONFIG_MATRIX_SWEEP", "LOG_INTERVAL", "identical cells"]),
    ("an unknown setting", 'CONFIG_MATRIX_SWEEP="WARMUP=1,2"\n', KconfigError,
     ["CONFIG_MATRIX_SWEEP", "WARMUP: not a setting"]),
    ("a value out of range", 'CONFIG_MATRIX_SWEEP="DROPOUT=0.1,1.5"\n', KconfigError,
     ["DROPOUT=1.5", "out of range"]),
    ("a setting of no cell", 'CONFIG_MATRIX_SWEEP="PRUNING_WARMUP=1,2"\n', PlanError,
     ["PRUNING_WARMUP applies to no cell"]),
    ("a learning-rate grid that is not numbers",
     'CONFIG_MATRIX_TUNE=y\nCONFIG_MATRIX_LR_ADAMW="3e-4 fast"\n', KconfigError,
     ["CONFIG_MATRIX_LR_ADAMW", "'fast' is not a number"]),
    ("a zero learning rate", 'CONFIG_MATRIX_TUNE=y\nCONFIG_MATRIX_LR_ADAMW="0 1e-3"\n',
     KconfigError, ["CONFIG_MATRIX_LR_ADAMW", "positive"]),
    ("the tuned rate swept again", 'CONFIG_MATRIX_TUNE=y\n'
     'CONFIG_MATRIX_SWEEP="LEARNING_RATE=1e-3,2e-3"\n', PlanError,
     ["LEARNING_RATE is already a tuning grid of adamw", "CONFIG_MATRIX_LR_ADAMW"]),
]


@pytest.mark.parametrize("body,error,needles", [b[1:] for b in BAD_GRIDS],
                         ids=[b[0] for b in BAD_GRIDS])
def test_a_bad_grid_is_refused_naming_the_symbol(tmp_path, body, error, needles):
    with pytest.raises(error) as err:
        plan_of(tmp_path, "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\n"
                          "CONFIG_MATRIX_PRUNING_NONE=y\n" + body)
    for needle in needles:
        assert needle in str(err.value)


def test_train_args_cannot_fix_what_the_grid_varies(tmp_path):
    with pytest.raises(PlanError, match="TRAIN_ARGS sets --learning-rate, which "
                                        "CONFIG_MATRIX_LR_ADAMW varies"):
        plan_of(tmp_path, TUNE3.replace("CONFIG_MATRIX_OPTIMIZER_SGD=y\n", ""),
                ["--learning-rate=1e-3"])
    # Muon's AdamW part has a grid too, so TRAIN_ARGS cannot fix its rate either
    with pytest.raises(PlanError, match="TRAIN_ARGS sets --learning-rate, which "
                                        "CONFIG_MATRIX_ADAM_LR_MUON varies"):
        plan_of(tmp_path, "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_MUON=y\n"
                "CONFIG_MATRIX_PRUNING_NONE=y\nCONFIG_MATRIX_TUNE=y\n", ["--learning-rate=1e-3"])


def test_dry_run_shows_each_optimizers_grid(tmp_path):
    bridge = _bridge()
    plan = plan_of(tmp_path, TUNE3)
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bridge.print_plan(plan)
    text = out.getvalue()
    assert "grid adamw: lr 3e-4 6e-4 1.2e-3 (learning_rate) x wd 0.1 (weight_decay)" in text
    assert ("grid muon: lr 0.01 0.02 0.04 (muon_lr) x wd 0.01 (muon_weight_decay) x adam_lr "
            "3e-4 6e-4 1.2e-3 (learning_rate) x adam_wd 0.1 (weight_decay)") in text
    assert "muon-none-lr0.02-adam_lr6e-4-seed1337" in text and "--muon-lr=0.02" in text


def test_cell_state_skips_only_a_completed_cell_of_the_same_configuration(tmp_path):
    """The matrix's skip logic, from disk only: "completed" needs this configuration's
    hash, the status completed, and a newest checkpoint of the final step (or none
    left); anything else with a checkpoint resumes ("interrupted"), without one starts
    over ("pending")."""
    import json

    from gpt2.matrix.runner import cell_dir, cell_state
    from gpt2.training import checkpoint

    def summary(**kw):
        d = cell_dir(tmp_path, "c")
        d.mkdir(parents=True, exist_ok=True)
        (d / "summary.json").write_text(json.dumps(
            {"status": "completed", "iters": 12, "max_iters": 12, "config_hash": "h", **kw}))

    def checkpoint_of(step):
        checkpoint.save(cell_dir(tmp_path, "c") / "ckpt.pt", checkpoint_state(step), step)

    assert cell_state(tmp_path, "c", "h") == "pending"  # nothing on disk
    summary()
    assert cell_state(tmp_path, "c", "h") == "completed"  # checkpoints deleted afterwards
    assert cell_state(tmp_path, "c", "other") == "pending"  # another configuration's
    summary(status="stopped")
    assert cell_state(tmp_path, "c", "h") == "pending"
    checkpoint_of(4)
    assert cell_state(tmp_path, "c", "h") == "interrupted"
    summary()  # says completed, but the newest checkpoint is of step 4 of 12
    assert cell_state(tmp_path, "c", "h") == "interrupted"
    assert cell_state(tmp_path, "c", "other") == "interrupted"
    checkpoint_of(12)
    assert cell_state(tmp_path, "c", "h") == "completed"
    assert cell_state(tmp_path, "c", "other") == "interrupted"  # resumed as its own run
    (cell_dir(tmp_path, "c") / "summary.json").write_text('{"status": "compl')  # cut short
    assert cell_state(tmp_path, "c", "h") == "interrupted"
    # A checkpoint link whose file is gone is still a run to resume (train.py says
    # what is wrong with it), not a fresh start that would train over it.
    ckpt = cell_dir(tmp_path, "c") / "ckpt.pt"
    target = ckpt.resolve()
    for saved in run_folder.list_checkpoints(ckpt):
        saved.unlink()
    assert ckpt.is_symlink() and not target.exists()
    assert cell_state(tmp_path, "c", "h") == "interrupted"


# ---- what plan.yaml says, and the exact refusals -----------------------------------------

def test_plan_yaml_holds_each_axis_grid_and_cell_under_its_name():
    """plan.yaml is what the collector, the report and a person read back: its keys
    are written out here, not taken from the function that writes them. A tuning
    grid and a sweep combine; a grid point's rate brings min_lr along at the
    configured ratio (here the defaults', 6e-4 : 6e-5); a cell's arguments are only
    the settings given to it."""
    s = MatrixSettings(optimizers=("adamw",), pruning_methods=("magnitude",), sparsities=(0.5,),
                       seeds=(7,), grids={"adamw": {"lr": (1e-3, 2e-3), "wd": (0.1,)}},
                       sweep=(matrix.Sweep("warmup_iters", (10, 20)),))
    plan = build_plan({}, s, [])
    assert (plan.name, plan.results_dir) == ("gpt2", "results")  # the defaults
    ids = ["adamw-magnitude-50-lr1e-3-warmup_iters10-seed7",
           "adamw-magnitude-50-lr1e-3-warmup_iters20-seed7",
           "adamw-magnitude-50-lr2e-3-warmup_iters10-seed7",
           "adamw-magnitude-50-lr2e-3-warmup_iters20-seed7"]
    points = [(1e-3, 10), (1e-3, 20), (2e-3, 10), (2e-3, 20)]
    assert plan.to_dict() == {
        "name": "gpt2", "hash": plan.hash,
        "axes": {"optimizers": ["adamw"], "pruning_methods": ["magnitude"], "sparsities": [0.5],
                 "seeds": [7],
                 "grids": {"adamw": {
                     "lr": {"field": "learning_rate", "values": [1e-3, 2e-3]},
                     "wd": {"field": "weight_decay", "values": [0.1]},
                     "warmup_iters": {"field": "warmup_iters", "values": [10, 20]}}}},
        "baseline": "adamw", "train_args": [],
        "cells": [{"id": cid, "optimizer": "adamw", "pruning": "magnitude",
                   "target_sparsity": 0.5, "seed": 7,
                   "grid": {"lr": lr, "wd": 0.1, "warmup_iters": warmup},
                   "config_hash": cell.cfg.config_hash(),
                   "args": [f"--learning-rate={lr!r}", f"--min-lr={6e-5 * lr / 6e-4!r}",
                            f"--warmup-iters={warmup}", "--weight-decay=0.1", "--seed=7",
                            "--optimizer=adamw", "--pruning-method=magnitude",
                            "--target-sparsity=0.5", f"--run-name={cid}"]}
                  for cid, (lr, warmup), cell in zip(ids, points, plan.cells, strict=True)]}
    assert [c.cfg.min_lr for c in plan.cells] == pytest.approx([1e-4, 1e-4, 2e-4, 2e-4])


def test_a_grid_rate_keeps_the_configured_min_lr_ratio_and_folders_follow_the_config(tmp_path):
    plan = plan_of(tmp_path, TUNE3.replace("CONFIG_MATRIX_OPTIMIZER_SGD=y\n", "").replace(
        "CONFIG_MATRIX_OPTIMIZER_MUON=y\n", "") + 'CONFIG_LEARNING_RATE="1e-3"\n'
        'CONFIG_MIN_LR="5e-5"\nCONFIG_MATRIX_LR_ADAMW="2e-3 4e-3"\nCONFIG_RUN_NAME="tuned"\n'
        'CONFIG_RESULTS_DIR="elsewhere"\n')
    assert [c.cfg.min_lr for c in plan.cells] == pytest.approx([1e-4, 2e-4])  # 1 : 20
    assert (plan.name, plan.results_dir) == ("tuned", "elsewhere")
    assert plan.folder.parent == REPO / "elsewhere"
    moved = plan_of(tmp_path, MATRIX12, [f"--results-dir={tmp_path / 'r'}"])
    assert moved.results_dir == str(tmp_path / "r") and moved.folder.parent == tmp_path / "r"


BASE3 = ("CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_NONE=y\n"
         'CONFIG_MATRIX_PRUNING_MAGNITUDE=y\nCONFIG_MATRIX_SPARSITIES="0.5 0.7"\n'
         "CONFIG_MAX_ITERS=1000\n")
WARMUP = "CONFIG_WARMUP_ITERS (--warmup-iters): {} warmup steps exceed max_iters=1000"


@pytest.mark.parametrize("origin", ["TRAIN_ARGS", "the matrix grid", ".config"])
def test_a_bad_cell_names_where_its_value_came_from_and_every_bad_cell_is_listed(tmp_path,
                                                                                 origin):
    if origin == "TRAIN_ARGS":
        body, args = BASE3, ["--warmup-iters=5000"]
        bad = [("adamw-none-seed1337", 5000), ("adamw-magnitude-50-seed1337", 5000),
               ("adamw-magnitude-70-seed1337", 5000)]
    elif origin == "the matrix grid":  # both bad points of each combination are listed
        body, args = BASE3 + 'CONFIG_MATRIX_SWEEP="WARMUP_ITERS=10,5000,6000"\n', []
        bad = [(f"adamw-{m}-warmup_iters{w}-seed1337", w)
               for m in ("none", "magnitude-50", "magnitude-70") for w in (5000, 6000)]
    else:
        body, args = BASE3 + "CONFIG_WARMUP_ITERS=5000\n", []
        bad = [("adamw-none-seed1337", 5000), ("adamw-magnitude-50-seed1337", 5000),
               ("adamw-magnitude-70-seed1337", 5000)]
        origin = f"{tmp_path / 'config'}:7"
    with pytest.raises(PlanError) as err:
        plan_of(tmp_path, body, args)
    # one line per mistake, naming its cells (the first three, then how many more)
    mistakes: dict[int, list[str]] = {}
    for cid, w in bad:
        mistakes.setdefault(w, []).append(cid)
    assert str(err.value).splitlines() == [
        f"3 cells ({', '.join(cids)}): {origin}: {WARMUP.format(w)}"
        for w, cids in mistakes.items()]


def test_a_mistake_many_cells_share_is_one_line_and_a_cells_own_is_its_own(tmp_path):
    """Three budgets (20, 1000, 2000 steps), two optimizers, dense and two sparsities,
    two seeds, and a pruning warmup of 100: the 8 pruned cells of the 20-step budget
    are refused for one reason, in one line (not 8), and without that budget every
    cell plans. A warmup grid of 10 and 1500 steps adds two mistakes of its own (1500
    is past 20 and past 1000 steps): three lines for 32 refused cells."""
    body = ("CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_OPTIMIZER_LION=y\n"
            "CONFIG_MATRIX_PRUNING_NONE=y\nCONFIG_MATRIX_PRUNING_MAGNITUDE=y\n"
            'CONFIG_MATRIX_SPARSITIES="0.5 0.7"\nCONFIG_MATRIX_MAX_ITERS="20 1000 2000"\n'
            'CONFIG_PRUNING_WARMUP=100\nCONFIG_WARMUP_ITERS=10\nCONFIG_MATRIX_SEEDS="1 2"\n')
    with pytest.raises(PlanError) as err:
        plan_of(tmp_path, body)
    (line,) = str(err.value).splitlines()
    assert line.startswith("8 cells (adamw-magnitude-50-iters20-seed1, "
                           "adamw-magnitude-50-iters20-seed2, adamw-magnitude-70-iters20-seed1 "
                           "and 5 more): ")
    assert "CONFIG_PRUNING_WARMUP (--pruning-warmup): pruning would start after step 100" in line
    alone = plan_of(tmp_path, body.replace('"20 1000 2000"', '"1000 2000"'))
    assert len(alone.cells) == 24
    with pytest.raises(PlanError) as err:
        plan_of(tmp_path, body + 'CONFIG_MATRIX_SWEEP="WARMUP_ITERS=10,1500"\n')
    lines = str(err.value).splitlines()
    assert [line.split(" (")[0] for line in lines] == ["4 cells", "12 cells", "16 cells"]
    assert lines[0].endswith("the matrix grid: CONFIG_WARMUP_ITERS (--warmup-iters): 1500 "
                             "warmup steps exceed max_iters=20")
    assert lines[1].endswith("1500 warmup steps exceed max_iters=1000")


def test_a_sweep_that_applies_to_some_optimizers_only_is_accepted(tmp_path):
    plan = plan_of(tmp_path, "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMWSPAM=y\n"
                   "CONFIG_MATRIX_OPTIMIZER_MUON=y\nCONFIG_MATRIX_PRUNING_NONE=y\n"
                   'CONFIG_MATRIX_SWEEP="SPAM_THRESHOLD=100,5000"\nCONFIG_MATRIX_BASELINE="muon"\n')
    assert [c.id for c in plan.cells] == ["adamwspam-none-spam_threshold100-seed1337",
                                          "adamwspam-none-spam_threshold5000-seed1337",
                                          "muon-none-seed1337"]
    assert {o: [a.field for a in axes] for o, axes in plan.axes.items()} == {
        "adamwspam": ["spam_threshold"], "muon": []}


def test_the_plans_refusals_say_exactly_what_to_do(tmp_path, monkeypatch):
    import torch

    def refusal(body, args=()):
        with pytest.raises(PlanError) as err:
            plan_of(tmp_path, body, list(args))
        return str(err.value)

    assert refusal(MATRIX12, ["--seed=3", "--optimizer=sgd"]) == (
        "TRAIN_ARGS sets --optimizer, --seed, which the matrix varies per cell: change the "
        "Test matrix menu instead (`make menuconfig`)")
    assert refusal(MATRIX12, ["--muon-lr=0.1", "--spam-warmup=5", "--muon-weight-decay=0"]) == (
        "TRAIN_ARGS --muon-lr has no effect in any cell of this matrix; remove it\n"
        "TRAIN_ARGS --muon-weight-decay has no effect in any cell of this matrix; remove it")
    assert refusal("CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMWPRUNE=y\n"
                   "CONFIG_MATRIX_OPTIMIZER_ADAMW=y\nCONFIG_MATRIX_PRUNING_MAGNITUDE=y\n"
                   "CONFIG_MATRIX_PRUNING_MOVEMENT=y\n") == (
        "CONFIG_MATRIX_OPTIMIZER_ADAMWPRUNE: adamwprune pairs with none of the enabled pruning "
        "methods (magnitude, movement); enable one it pairs with, or disable it")
    assert refusal(BASE3 + 'CONFIG_MATRIX_SWEEP="SPAM_THRESHOLD=1,2 MUON_LR=0.1,0.2"\n') == (
        "CONFIG_MATRIX_SWEEP: SPAM_THRESHOLD applies to no cell of this matrix; remove it, or "
        "enable what it applies to\nCONFIG_MATRIX_SWEEP: MUON_LR applies to no cell of this "
        "matrix; remove it, or enable what it applies to")
    tune = TUNE3.replace("CONFIG_MATRIX_OPTIMIZER_SGD=y\n", "").replace(
        "CONFIG_MATRIX_OPTIMIZER_MUON=y\n", "")
    assert refusal(tune + 'CONFIG_MATRIX_SWEEP="WEIGHT_DECAY=0,0.1"\n') == (
        "CONFIG_MATRIX_SWEEP: WEIGHT_DECAY is already a tuning grid of adamw "
        "(CONFIG_MATRIX_LR_ADAMW / CONFIG_MATRIX_WD_ADAMW); sweep it in one place")
    assert "(CONFIG_MATRIX_LR_MUON / CONFIG_MATRIX_WD_MUON / CONFIG_MATRIX_ADAM_LR_MUON / " \
        "CONFIG_MATRIX_ADAM_WD_MUON)" in refusal(TUNE3 + 'CONFIG_MATRIX_SWEEP="LEARNING_RATE=1e-3,2e-3"\n')
    assert refusal(tune + 'CONFIG_MATRIX_SWEEP="DROPOUT=0,0.1"\n', ["--dropout=0.2",
                                                                  "--weight-decay=0"]) == (
        "TRAIN_ARGS sets --weight-decay, which CONFIG_MATRIX_WD_ADAMW varies; remove one\n"
        "TRAIN_ARGS sets --dropout, which CONFIG_MATRIX_SWEEP varies; remove one")
    single = tmp_path / "single"
    single.write_text("CONFIG_MAX_ITERS=10\n")
    for cuda, preset in ((False, "gpt2-shakespeare-matrix-cpu"), (True, "gpt2-wikitext103-matrix")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        with pytest.raises(PlanError) as err:
            plan_from_dotconfig(kconfig.load(single), [])
        assert str(err.value) == (
            f"{single}: CONFIG_MATRIX is not set: this is a single-run configuration. Enable "
            f"the Test matrix menu (`make menuconfig`) or start from `make defconfig-{preset}`")


def test_a_smoke_test_may_adjust_the_base_values_of_every_cell(tmp_path):
    path = tmp_path / "config"
    path.write_text(MATRIX12)
    plan = plan_from_dotconfig(kconfig.load(path), [],
                               adjust=lambda values: {**values, "max_iters": 40, "warmup_iters": 4,
                                                      "pruning_warmup": 5})
    assert {c.cfg.max_iters for c in plan.cells} == {40}
    assert {c.cfg.pruning_warmup for c in plan.cells if c.pruning != "none"} == {5}


def test_a_swept_min_lr_is_kept_beside_a_rate_grid(tmp_path):
    """min_lr follows a grid point's rate only when nothing sets it per cell."""
    plan = plan_of(tmp_path, TUNE3.replace("CONFIG_MATRIX_OPTIMIZER_SGD=y\n", "").replace(
        "CONFIG_MATRIX_OPTIMIZER_MUON=y\n", "") + 'CONFIG_MATRIX_LR_ADAMW="1e-3 2e-3"\n'
        'CONFIG_MATRIX_SWEEP="MIN_LR=1e-5,3e-5"\n')
    assert [(c.cfg.learning_rate, c.cfg.min_lr) for c in plan.cells] == [
        (1e-3, 1e-5), (1e-3, 3e-5), (2e-3, 1e-5), (2e-3, 3e-5)]


@pytest.mark.parametrize("name", ["gpt2-wikitext103-tune", "gpt2-shakespeare-tune-cpu"])
def test_the_tune_presets_tune_every_rate_at_three_seeds(tmp_path, name):
    """The tuning presets compare optimizers as a reviewer would accept: every rate
    each has on a grid of 3 (Muon's AdamW part too), 3 seeds per point."""
    plan = plan_of(tmp_path, (REPO / "defconfigs" / name).read_text())
    assert plan.settings.seeds == (1337, 1338, 1339)
    assert len(plan.cells) == 3 * (3 + 3 + 3 * 3)
    axes = {o: {a.field: len(a.values) for a in axes} for o, axes in plan.axes.items()}
    assert axes["muon"]["muon_lr"] == axes["muon"]["learning_rate"] == 3
    assert axes["adamw"]["learning_rate"] == axes["adamwspam"]["learning_rate"] == 3


def test_one_shot_baselines_take_the_targets_of_the_pruned_cells(tmp_path):
    plan = plan_of(tmp_path, "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\n"
                             "CONFIG_MATRIX_PRUNING_NONE=y\nCONFIG_MATRIX_PRUNING_MAGNITUDE=y\n"
                             'CONFIG_MATRIX_SPARSITIES="0.7 0.5"\n'
                             'CONFIG_MATRIX_STRUCTURES="2:4 unstructured"\n'
                             'CONFIG_MATRIX_ONESHOT="sparsegpt magnitude"\n'
                             "CONFIG_MATRIX_ONESHOT_FINETUNE=40\n")
    assert plan.to_dict()["oneshot"] == {
        "methods": ["magnitude", "sparsegpt"], "finetune": 40,
        "targets": [{"structure": "2:4", "sparsity": 0.5},
                    {"structure": "unstructured", "sparsity": 0.5},
                    {"structure": "unstructured", "sparsity": 0.7}]}
    plain = plan_of(tmp_path, "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\n"
                              "CONFIG_MATRIX_PRUNING_NONE=y\nCONFIG_MATRIX_PRUNING_MAGNITUDE=y\n")
    assert "oneshot" not in plain.to_dict()


@pytest.mark.e2e
def test_cells_that_differ_only_past_six_digits_get_their_own_ids(tmp_path, monkeypatch):
    """WEIGHT_DECAY=0.1,0.1000001 once planned two cells named
    ...weight_decay0.1-seed1337: the second failed as "a run of another configuration"
    forever. Values are written exactly now, and a shared id is refused at plan time,
    naming both values (checked by planting the old six-digit rule)."""
    from gpt2.matrix import plan as plan_module

    config = tmp_path / "config"
    config.write_text("CONFIG_MODEL_SIZE_CUSTOM=y\nCONFIG_DEVICE_CPU=y\nCONFIG_DTYPE_FLOAT32=y\n"
                      "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_ADAMW=y\n"
                      "CONFIG_MATRIX_PRUNING_NONE=y\nCONFIG_MATRIX_PRUNING_MAGNITUDE=y\n"
                      'CONFIG_MATRIX_SPARSITIES="0.7,0.7000001"\n'
                      'CONFIG_MATRIX_SWEEP="WEIGHT_DECAY=0.1,0.1000001"\n')
    assert run_target("olddefconfig", env={"KCONFIG_CONFIG": str(config)}).returncode == 0
    plan = plan_from_dotconfig(kconfig.load(config), [])
    ids = [c.id for c in plan.cells]
    assert len(set(ids)) == len(ids) == 6
    assert "adamw-none-weight_decay0.1000001-seed1337" in ids
    assert "adamw-magnitude-70.00001-weight_decay0.1-seed1337" in ids
    def lossy(values, point=(), shown=None):  # a tag rule that drops digits
        s = values.get("target_sparsity")
        return "-".join([values["optimizer"], values["pruning"],
                         *([f"{s * 100:.6g}"] if s is not None else []),
                         *(f"{k}{v:.6g}" for k, v in point), f"seed{values['seed']}"])

    monkeypatch.setattr(plan_module, "cell_id", lossy)
    with pytest.raises(PlanError) as e:
        plan_from_dotconfig(kconfig.load(config), [])
    assert "two cells would be named adamw-none-weight_decay0.1-seed1337" in str(e.value)
    assert "weight_decay=0.1; weight_decay=0.1000001" in str(e.value)
