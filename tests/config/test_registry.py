"""Kconfig, the typed Config, argparse and the registries agree: a menu entry that
never reaches the trainer, or a registry entry with no menu, fails here."""

from __future__ import annotations

import argparse
import subprocess

import kconfiglib
import pytest

from helpers import PY, REPO
from gpt2.config import axes, kconfig, matrix, slurm
from gpt2.config.options import (DATA, TRAIN, Config, add_arguments, applies, config_from_namespace,
                                 field_type, fields, opt, parse_float, to_argv)
from gpt2.names import choice_symbol, flag
from gpt2.config.choices import (ATTENTION_BACKENDS, DST_ANNEALS, CHECKPOINTING, COMPILE_BACKENDS,
                                 COMPILE_MODES, COMPILE_STYLES, MODEL_ACTIVATIONS, MODEL_INITS,
                                 MODEL_PRECISIONS,
                                 MODEL_NORMS, MODEL_POSITIONS,
                                 DEVICES, DTYPES, LR_SCHEDULES, NONFINITE_POLICIES,
                                 OPTIMIZERS, PARALLEL_MODES, PRUNING_METHODS, PRUNING_RAMPS,
                                 PRUNING_SCOPES, PRUNING_STRUCTURES, SPARSE_KERNELS,
                                 TRACKERS, WSD_SHAPES, implemented, pair_problem)
from gpt2.config.axes import AXES
from gpt2.config.registry import OPTIMIZER_SETTINGS, PRUNING_SETTINGS
from gpt2.config.datasets import DATASETS
from gpt2.config.sizes import MODEL_SIZE_CHOICES

KCONF = kconfig.new_kconfig()
MATRIX_SYMBOLS = {matrix.ENABLE, *(a.symbol for a in AXES if not a.entries), matrix.JOBS,
                  matrix.TUNE, matrix.BRANCH, matrix.EXTEND, matrix.ROUNDS, matrix.ONESHOT,
                  matrix.ONESHOT_FINETUNE,
                  matrix.SWEEP, *map(axes.optimizer_symbol, OPTIMIZERS),
                  *map(matrix.backend_symbol, slurm.BACKENDS),
                  *map(axes.pruning_symbol, PRUNING_METHODS),
                  matrix.BASELINE, matrix.TARGET_LOSS,
                  *(matrix.grid_symbol(g, o) for o in OPTIMIZERS for g in matrix.tuning_grids(o))}
KTYPE = {bool: kconfiglib.BOOL, int: kconfiglib.INT, float: kconfiglib.STRING,
         str: kconfiglib.STRING}
REGISTRIES = {"model_size": MODEL_SIZE_CHOICES, "dataset": tuple(DATASETS),
              "optimizer": tuple(OPTIMIZERS), "pruning_method": tuple(PRUNING_METHODS),
              "device": DEVICES, "dtype": DTYPES,
              "pruning_ramp": PRUNING_RAMPS, "pruning_scope": PRUNING_SCOPES,
              "tracker": TRACKERS, "activation_checkpointing": CHECKPOINTING,
              "compile": COMPILE_MODES, "parallel": PARALLEL_MODES,
              "nonfinite": NONFINITE_POLICIES,
              "compile_mode": COMPILE_STYLES, "attention_backend": ATTENTION_BACKENDS,
              "lr_schedule": LR_SCHEDULES, "wsd_shape": WSD_SHAPES,
              "pruning_structure": PRUNING_STRUCTURES, "dst_drop_anneal": DST_ANNEALS,
              "sparse_kernel": SPARSE_KERNELS, "compile_backend": COMPILE_BACKENDS,
              "model_norm": MODEL_NORMS, "model_position": MODEL_POSITIONS,
              "model_activation": MODEL_ACTIVATIONS, "model_init": MODEL_INITS,
              "model_precision": MODEL_PRECISIONS,
              # the methods' own choices, from their modules
              **{name: tuple(s.choices) for name, (s, _)
                 in (*OPTIMIZER_SETTINGS.items(), *PRUNING_SETTINGS.items()) if s.choices}}


def test_the_registries_hold_exactly_the_golden_list_of_methods():
    """A module added, removed, renamed, reordered, or reading other settings than
    tests/methods.json says: the list is written by hand, so a method changes in two
    places on purpose (its module, and this list)."""
    from helpers import METHODS

    for registry, golden in ((OPTIMIZERS, METHODS["optimizers"]),
                             (PRUNING_METHODS, METHODS["pruning_methods"])):
        assert list(registry) == list(golden)
        assert {n: list(m.reads) for n, m in registry.items()} == golden


def test_every_choice_field_uses_its_registry():
    choice_fields = {f.name for f in fields() if opt(f.name).choices}
    assert choice_fields == set(REGISTRIES)
    for name, registry in REGISTRIES.items():
        assert opt(name).choices == tuple(registry), name


def test_the_code_implements_exactly_the_listed_choices():
    """The configuration's lists (plain names, gpt2/config/choices.py) and the code that
    implements them: the same names in the same order, checked as the code imports."""
    from gpt2.model.gpt import SDPA_BACKENDS
    from gpt2.training.trackers import _MODULES

    assert ("auto", *SDPA_BACKENDS) == ATTENTION_BACKENDS
    assert set(_MODULES) == set(TRACKERS) - {"none"}
    from gpt2.runtime.device import Runtime

    for dtype in DTYPES:  # every dtype the menu offers has a torch dtype behind it
        assert str(Runtime("cpu", dtype).torch_dtype) == f"torch.{dtype}"


def test_an_entry_listed_in_one_place_only_stops_the_import():
    implemented(("a", "b"), {"a": 1, "b": 2}, "things")
    for code in ({"a": 1}, {"a": 1, "b": 2, "c": 3}, {"b": 2, "a": 1}):
        with pytest.raises(RuntimeError, match="things: gpt2/config/choices.py lists"):
            implemented(("a", "b"), code, "things")


@pytest.mark.e2e
def test_importing_the_configuration_imports_no_torch():
    """`make` reads .config through Config on every target, also when there is nothing
    to do: torch (2-10 s of CPU to import) must stay out of it."""
    script = ("import sys\n"
              "from gpt2.config import kconfig, matrix, slurm, options, choices\n"
              "from gpt2.cli import dotconfig\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in "
              "('torch', 'numpy', 'jinja2', 'matplotlib', 'tiktoken')))\n")
    out = subprocess.run([PY, "-c", script], capture_output=True, text=True, cwd=REPO,
                         check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", [f.name for f in fields()])
def test_every_field_has_a_kconfig_entry_of_the_right_type(name):
    if opt(name).choices:
        choice = KCONF.named_choices.get(name.upper())
        assert choice is not None, f"no 'choice {name.upper()}' in Kconfig"
        entries = [s.name for s in choice.syms]
        assert entries == [choice_symbol(name, v) for v in opt(name).choices], (
            f"Kconfig choice {name.upper()} lists {entries}, registry {opt(name).choices}")
    else:
        sym = KCONF.syms.get(name.upper())
        assert sym is not None and sym.nodes, f"no 'config {name.upper()}' in Kconfig"
        assert sym.orig_type == KTYPE[field_type(name)], name


def test_every_kconfig_symbol_reaches_a_field():
    known = {f.name.upper() for f in fields() if not opt(f.name).choices}
    known |= {choice_symbol(f.name, v) for f in fields() for v in opt(f.name).choices}
    known |= MATRIX_SYMBOLS  # read by gpt2/config/kconfig.py:to_matrix
    known |= set(slurm.SYMBOLS)  # read by to_slurm (tests/config/test_slurm_config.py)
    # hidden symbols the methods select (scripts/kconfig_sync.py): which settings are
    # in force, which pruning methods a matrix's optimizers pair with
    from scripts.kconfig_sync import capability, pairs_with
    known |= {capability(name) for m in (*OPTIMIZERS.values(), *PRUNING_METHODS.values())
              for name in m.reads}
    known |= {pairs_with(name) for name in PRUNING_METHODS} | {"MATRIX_PRUNES"}
    orphans = [s.name for s in KCONF.unique_defined_syms if s.name not in known]
    assert not orphans, f"Kconfig symbols no entry point reads: {orphans}"


def test_every_prompted_entry_has_help():
    missing = []
    for node in KCONF.node_iter():
        item = node.item
        if node.prompt and isinstance(item, (kconfiglib.Symbol, kconfiglib.Choice)):
            if not (node.help or "").strip():
                missing.append(item.name or node.prompt[0])
    assert not missing, f"prompted entries without help text: {missing}"


def test_kconfig_defaults_and_ranges_are_written_from_config():
    """Config owns defaults and ranges; the Kconfig files' copies are generated
    (scripts/kconfig_sync.py), so a mismatch comes with the diff that fixes it."""
    from scripts import kconfig_sync

    assert kconfig_sync.diff() == "", ("kconfig/*.kconfig disagree with Config; apply "
                                       "this with `make kconfig-sync`:\n" + kconfig_sync.diff())


def test_the_kconfig_sync_finds_and_fixes_each_kind_of_copy(tmp_path):
    import shutil

    from scripts import kconfig_sync

    shutil.copy(REPO / "Kconfig", tmp_path / "Kconfig")
    shutil.copytree(REPO / "kconfig", tmp_path / "kconfig")
    edits = {"training.kconfig": [("\tdefault 12\n", "\tdefault 13\n"),  # BATCH_SIZE
                                  ("\trange 1 65536\n", "\trange 1 100\n"),
                                  ('\tdefault "6e-4"\n', '\tdefault "7e-4"\n')],
             "model.kconfig": [("layers\"\n\tdefault y\n", "layers\"\n\tdefault n\n")],  # BIAS
             "methods.kconfig": [("\tdefault OPTIMIZER_ADAMW\n", "\tdefault OPTIMIZER_SGD\n")]}
    for name, pairs in edits.items():
        path = tmp_path / "kconfig" / name
        text = path.read_text()
        for old, new in pairs:
            assert text.count(old) >= 1, (name, old)
            text = text.replace(old, new, 1)
        path.write_text(text)
    found = kconfig_sync.diff(tmp_path)
    for line in ("+\tdefault 12", "+\trange 1 65536", '+\tdefault "0.0006"', "+\tdefault y",
                 "+\tdefault OPTIMIZER_ADAMW"):
        assert line in found, (line, found)
    assert len(kconfig_sync.write(tmp_path)) == 3 and kconfig_sync.diff(tmp_path) == ""
    # the same value written another way is no difference
    path = tmp_path / "kconfig" / "training.kconfig"
    path.write_text(path.read_text().replace('\tdefault "0.0006"\n', '\tdefault "6.0e-4"\n'))
    assert kconfig_sync.diff(tmp_path) == ""


def test_kconfig_defaults_equal_config_defaults(tmp_path):
    """An empty .config gives exactly Config(): train.py alone and make agree."""
    empty = tmp_path / "empty"
    empty.write_text("")
    cfg, active = kconfig.to_config(kconfig.load(empty))
    defaults = Config()
    for f in fields():
        assert getattr(cfg, f.name) == getattr(defaults, f.name), f.name


def test_argparse_offers_each_field_with_its_registry_choices():
    parser = argparse.ArgumentParser()
    add_arguments(parser, TRAIN)
    actions = {a.dest: a for a in parser._actions}
    for f in fields(TRAIN):
        assert flag(f.name) in actions[f.name].option_strings
        if opt(f.name).choices:
            assert tuple(actions[f.name].choices) == opt(f.name).choices


@pytest.mark.parametrize("used_by", [TRAIN, DATA])
def test_argv_round_trips_every_value(used_by):
    changed = Config(model_size="custom", n_layer=3, n_head=2, n_embd=64, dropout=0.25,
                     bias=False, learning_rate=1.5e-3, min_lr=1e-5, sample_prompt="-x 'y' \"z\"",
                     run_name="a.b_c-1", data_input="-weird name.txt", val_fraction=0.05,
                     device="cpu", compile="on", epochs=2.5)
    parser = argparse.ArgumentParser()
    add_arguments(parser, used_by)
    back = config_from_namespace(parser.parse_args(to_argv(changed, used_by)), used_by)
    for f in fields(used_by):
        assert getattr(back, f.name) == getattr(changed, f.name), f.name


def test_float_parsing_rejects_non_finite():
    for bad in ("nan", "inf", "1e400", "", "6e-4x"):
        with pytest.raises(ValueError):
            parse_float("learning_rate", bad)


def _kconf_with(assignments: dict[str, str]) -> kconfiglib.Kconfig:
    kconf = kconfig.new_kconfig()
    for choice_field, value in assignments.items():
        kconf.syms[choice_symbol(choice_field, value)].set_value(2)
    return kconf


def _selected(kconf: kconfiglib.Kconfig, choice_field: str) -> str | None:
    sel = kconf.named_choices[choice_field.upper()].selection
    return next((v for v in opt(choice_field).choices
                 if sel is not None and choice_symbol(choice_field, v) == sel.name), None)


@pytest.mark.parametrize("optimizer", tuple(OPTIMIZERS))
@pytest.mark.parametrize("method", tuple(PRUNING_METHODS))
def test_kconfig_offers_exactly_the_valid_pairs(optimizer, method):
    """menuconfig cannot produce a pair the registry refuses, nor hide a valid one."""
    kconf = _kconf_with({"optimizer": optimizer, "pruning_method": method})
    assert _selected(kconf, "optimizer") == optimizer
    took = _selected(kconf, "pruning_method") == method
    assert took == (pair_problem(optimizer, method) is None), (optimizer, method)


@pytest.mark.slow
def test_conditional_fields_are_in_force_exactly_when_kconfig_shows_them():
    """Opt.when (derived from the registries' hparams) and Kconfig's `depends on`
    agree for every optimizer x pruning method x variant: a knob Kconfig offers always
    reaches the trainer, and one it hides is refused on the command line."""
    conditional = [f.name for f in fields() if opt(f.name).when]
    assert {"sgd_momentum", "muon_lr", "spam_threshold", "target_sparsity",
            "pruning_variant"} <= set(conditional)
    for optimizer in OPTIMIZERS:
        for method in PRUNING_METHODS:
            if pair_problem(optimizer, method):
                continue
            kconf = _kconf_with({"optimizer": optimizer, "pruning_method": method})
            cfg = Config(optimizer=optimizer, pruning_method=method)
            for name in conditional:
                assert kconfig.is_active(kconf, name) == applies(cfg, name), (
                    name, optimizer, method)


@pytest.mark.parametrize("dataset", tuple(DATASETS))
def test_the_training_shard_count_is_in_force_exactly_for_fineweb10b(dataset):
    """CONFIG_DATA_TRAIN_SHARDS's `depends on DATASET_FINEWEB10B` and its Opt.when
    agree: menuconfig shows it where `make data` reads it, and nowhere else."""
    kconf = _kconf_with({"dataset": dataset})
    in_force = applies(Config(dataset=dataset), "data_train_shards")
    assert kconfig.is_active(kconf, "data_train_shards") == in_force == (dataset == "fineweb10b")


def test_registry_hparams_are_config_fields():
    names = {f.name for f in fields()}
    for registry in (OPTIMIZERS, PRUNING_METHODS):
        for key, spec in registry.items():
            assert set(spec.hparams) <= names, key


def test_kconfig_int_ranges_equal_config_ranges():
    for f in fields():
        if field_type(f.name) is not int:
            continue
        sym = KCONF.syms[f.name.upper()]
        lo, hi = (int(x.str_value) for x in sym.ranges[0][:2])
        assert (lo, hi) == (opt(f.name).min, opt(f.name).max), f.name


def test_every_mutation_module_and_its_tests_exist():
    """`make test-mutation`'s modules (scripts/mutation.py) name real files, and each
    maps to tests that exist: a renamed module must not drop out of it silently."""
    from helpers import REPO
    from scripts.mutation import MODULES

    for name, module in MODULES.items():
        assert (REPO / module.path).is_file(), name
        assert module.tests and all((REPO / t).is_file() for t in module.tests), name


def test_the_docs_method_tables_are_written_from_the_modules(tmp_path):
    """docs/optimizers-and-pruning.md's two method tables are the modules' declarations:
    a row lost or edited by hand comes back with `make kconfig-sync`."""
    import shutil

    from scripts import kconfig_sync

    shutil.copy(REPO / "Kconfig", tmp_path / "Kconfig")
    shutil.copytree(REPO / "kconfig", tmp_path / "kconfig")
    (tmp_path / "docs").mkdir()
    docs = tmp_path / kconfig_sync.DOCS
    text = (REPO / kconfig_sync.DOCS).read_text()
    last = [line for line in text.splitlines() if line.startswith("| `")]
    optimizer_row = next(line for line in last if line.startswith(f"| `{list(OPTIMIZERS)[-1]}`"))
    pruning_row = next(line for line in last if line.startswith("| `none` |"))
    docs.write_text(text.replace(optimizer_row + "\n", "").replace(pruning_row,
                                                                   "| `none` | edited |"))
    found = kconfig_sync.diff(tmp_path)
    assert f"+{optimizer_row}" in found and f"+{pruning_row}" in found, found
    assert kconfig_sync.write(tmp_path) == [docs] and kconfig_sync.diff(tmp_path) == ""
    assert docs.read_text() == text
