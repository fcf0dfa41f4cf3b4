"""Every preset in defconfigs/ loads strictly, is minimal (savedefconfig output), and
the values train.py ends up with are exactly the values in the .config."""

from __future__ import annotations

import json

import kconfiglib
import pytest

from helpers import REPO, run_target
from gpt2.config import kconfig
import argparse
import shlex

from gpt2.config.options import (DATA, TRAIN, add_arguments, applies, config_from_namespace,
                                 field_type, fields, opt)
from gpt2.names import choice_symbol
from gpt2.config.axes import AXES
from gpt2.matrix.plan import plan_from_dotconfig
from gpt2.config.sizes import MODEL_SIZES

DEFCONFIGS = sorted(p.name for p in (REPO / "defconfigs").iterdir())
MATRIX_DEFCONFIGS = [n for n in DEFCONFIGS
                     if "CONFIG_MATRIX=y" in (REPO / "defconfigs" / n).read_text().splitlines()]
SINGLE_DEFCONFIGS = [n for n in DEFCONFIGS if n not in MATRIX_DEFCONFIGS]
REQUIRED = {"gpt2-shakespeare-cpu", "gpt2-shakespeare-conservative", "gpt2-shakespeare-simple",
            "gpt2-shakespeare-l4", "gpt2-shakespeare-w7900", "gpt2-shakespeare-h100",
            "gpt2-wikitext103-matrix", "gpt2-shakespeare-matrix-cpu", "gpt2-wikitext103-tune",
            "gpt2-shakespeare-tune-cpu"}


def test_the_gpu_presets_of_gpt2_124m_take_the_same_tokens_per_step():
    """So their losses compare step for step: the L4, W7900 and H100 presets differ in
    how the 64 x 1024 tokens of a step are split into micro-batches, not in the step."""
    steps = {}
    for name in ("gpt2-shakespeare-l4", "gpt2-shakespeare-w7900", "gpt2-shakespeare-h100",
                 "gpt2-shakespeare-simple"):
        cfg, _ = kconfig.to_config(kconfig.load(REPO / "defconfigs" / name))
        assert cfg.model_size == "gpt2", name
        steps[name] = cfg.tokens_per_step()
    assert set(steps.values()) == {64 * 1024}, steps


def test_the_product_presets_exist():
    assert REQUIRED <= set(DEFCONFIGS)
    assert {"gpt2-wikitext103-matrix", "gpt2-shakespeare-matrix-cpu"} <= set(MATRIX_DEFCONFIGS)


def test_the_gpt2_124m_comparisons_train_on_enough_data_for_their_length():
    """On tiny Shakespeare's 302k training tokens the tune preset made 65 passes and
    the matrix 434: comparisons of how fast each optimizer memorises. WikiText-103's
    ~120M training tokens keep every cell under CONFIG_EPOCH_WARNING."""
    for name, passes in (("gpt2-wikitext103-tune", 0.17), ("gpt2-wikitext103-matrix", 1.1)):
        for cell in plan_from_dotconfig(kconfig.load(REPO / "defconfigs" / name), []).cells:
            cfg = cell.cfg
            assert (cfg.dataset, cfg.model_size) == ("wikitext103", "gpt2"), name
            assert cfg.max_iters * cfg.tokens_per_step() / 120e6 <= passes < cfg.epoch_warning


@pytest.mark.parametrize("name", DEFCONFIGS)
def test_defconfig_loads_strictly_and_starts_with_a_comment_block(name):
    path = REPO / "defconfigs" / name
    loaded = kconfig.load(path)
    if name in MATRIX_DEFCONFIGS:
        assert plan_from_dotconfig(loaded, []).cells  # every cell's config is checked
    else:
        kconfig.to_config(loaded)
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and len(first) > 10, "first line must describe the preset"


@pytest.mark.parametrize("name", DEFCONFIGS)
def test_savedefconfig_reproduces_the_defconfig(tmp_path, name):
    path = REPO / "defconfigs" / name
    loaded = kconfig.load(path)
    out = tmp_path / "defconfig"
    loaded.kconf.write_min_config(str(out))
    # ("# CONFIG_X is not set" is how Kconfig writes a switch turned off: a setting)
    body = [line for line in path.read_text().splitlines()
            if not line.startswith("#") or line.endswith(" is not set")]
    assert out.read_text().splitlines() == body


def kconfiglib_values(config_file) -> dict:
    """Read a .config with plain kconfiglib, independently of gpt2.config."""
    kconf = kconfiglib.Kconfig(str(REPO / "Kconfig"), warn_to_stderr=False)
    kconf.load_config(str(config_file))
    values = {}
    for f in fields():
        if opt(f.name).choices:
            selection = kconf.named_choices[f.name.upper()].selection
            if selection is not None:  # None: the choice is not in force
                values[f.name] = selection.name
            continue
        sym = kconf.syms[f.name.upper()]
        if not sym.config_string:
            continue
        typ = field_type(f.name)
        values[f.name] = (sym.tri_value == 2 if typ is bool else int(sym.str_value)
                          if typ is int else float(sym.str_value) if typ is float
                          else sym.str_value)
    return values


@pytest.mark.e2e
@pytest.mark.parametrize("name", SINGLE_DEFCONFIGS)
def test_values_train_py_uses_equal_the_config(tmp_path, name):
    config = tmp_path / "config"
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_target(f"defconfig-{name}", env=env).returncode == 0
    proc = run_target("train", "DRY_RUN=1", env=env)
    assert proc.returncode == 0, proc.stderr
    used = json.loads(proc.stdout[proc.stdout.index("{"):])["config"]
    expected = kconfiglib_values(config)
    _assert_same(used, expected, TRAIN)
    # prepare_data.py's flags, as `make data` would pass them
    proc = run_target("data", "DRY_RUN=1", env=env)
    assert proc.returncode == 0, proc.stderr
    parser = argparse.ArgumentParser()
    add_arguments(parser, DATA)
    argv = shlex.split(proc.stdout.strip().splitlines()[-1])[1:]
    _assert_same(config_from_namespace(parser.parse_args(argv), DATA).to_dict(), expected, DATA)
    if used["model_size"] != "custom":
        preset = MODEL_SIZES[used["model_size"]]
        assert (used["n_layer"], used["n_head"], used["n_embd"]) == (
            preset.n_layer, preset.n_head, preset.n_embd)


@pytest.mark.e2e
@pytest.mark.parametrize("name", MATRIX_DEFCONFIGS)
def test_every_matrix_cell_gets_the_config_values(tmp_path, name):
    """The plan `make test-matrix DRY_RUN=1` prints gives every cell the .config's
    values for every shared setting in force for it; the axes are the cell's own."""
    config = tmp_path / "config"
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_target(f"defconfig-{name}", env=env).returncode == 0
    proc = run_target("test-matrix", "DRY_RUN=1", env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    shared = shlex.split(lines[1].split(":", 1)[1])
    cells = [line.split(None, 1) for line in lines[2:] if line.startswith("  ")]
    assert cells
    expected = kconfiglib_values(config)
    parser = argparse.ArgumentParser()
    add_arguments(parser, TRAIN)
    plan = plan_from_dotconfig(kconfig.load(config), [])
    for cell_id, own in cells:
        used = config_from_namespace(parser.parse_args(shared + shlex.split(own)), TRAIN)
        assert used.run_name == cell_id
        assert cell_id.startswith(f"{used.optimizer}-{used.pruning_method}-")
        # a tuning grid sets its fields per cell (and min_lr with the learning rate)
        gridded = {a.field for a in plan.axes.get(used.optimizer, ())}
        gridded |= {"min_lr"} if "learning_rate" in gridded else set()
        same = {k: v for k, v in expected.items()
                if k != "run_name" and k not in {a.field for a in AXES}
                and k not in gridded and applies(used, k)}
        _assert_same(used.to_dict(), same, TRAIN)


def _assert_same(used: dict, expected: dict, entry: str) -> None:
    for f in fields(entry):
        if opt(f.name).choices and f.name in expected:
            assert choice_symbol(f.name, used[f.name]) == expected[f.name], f.name
        elif f.name in expected:
            assert used[f.name] == expected[f.name], f.name


def test_the_cpu_preset_promises_the_time_readme_measured():
    """`make help` shows each preset's first line; the CPU preset's time must agree
    with the run README reports (it once said 4 minutes against README's 7.5)."""
    import re

    said = re.search(r"about (\d+) minutes \((\d+) with setup\)",
                     (REPO / "defconfigs" / "gpt2-shakespeare-cpu").read_text().splitlines()[0])
    readme = (REPO / "README.md").read_text()
    total = re.search(r"whole first command took (\d+) min (\d+) s", readme)
    wall = re.search(r"wall ([\d.]+) s", readme)
    assert said and total and wall
    assert abs(int(said.group(1)) - float(wall.group(1)) / 60) <= 1
    assert abs(int(said.group(2)) - (int(total.group(1)) + int(total.group(2)) / 60)) <= 1
