"""What every method module declares, checked for each of them without naming one
(the registries and tests/methods.json say which there are), and how many product
files still name each method: a method is one module (docs/architecture.md)."""

from __future__ import annotations

import math
import re

import pytest

from helpers import REPO
from gpt2.config import matrix
from gpt2.config.options import Config, check_value, fields
from gpt2.config.registry import (OPTIMIZERS, OPTIMIZER_SETTINGS, PRUNING_METHODS,
                                  PRUNING_SETTINGS)

METHODS = [*OPTIMIZERS.values(), *PRUNING_METHODS.values()]
SETTINGS = {**OPTIMIZER_SETTINGS, **PRUNING_SETTINGS}


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_a_method_declares_what_users_read_of_it(method):
    for text in (method.title, method.summary, method.reference, method.text,
                 method.matrix_text):
        assert text.strip(), method.name
    field_names = {f.name for f in fields()}
    assert set(method.reads) <= field_names, set(method.reads) - field_names


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_method_setting_has_help_and_its_default_is_in_range(name):
    setting, readers = SETTINGS[name]
    assert readers and setting.help and setting.prompt and setting.text.strip()
    assert getattr(Config(), name) == setting.default
    check_value(name, setting.default)  # (raises for a default out of its own range)
    if setting.choices:
        assert setting.default in setting.choices
        assert all(prompt and text.strip() for prompt, text in setting.choices.values())


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_an_optimizers_grids_parse_and_set_its_own_fields(name):
    spec = OPTIMIZERS[name]
    labels = spec.grids
    assert {"lr", "wd"} <= set(labels)
    for grid in spec.tuning_grids:
        values = matrix.parse_grid(grid.default, matrix.is_rate(grid.label))
        assert values and all(math.isfinite(v) for v in values), grid.label
    tuned = spec.tuned(Config(optimizer=name))
    assert set(tuned) <= set(labels)
    assert all(field in spec.reads or field in ("learning_rate", "weight_decay")
               for field in tuned.values()), tuned


# ---- a method's name in the product -------------------------------------------------------

# Where the product may name a method: gpt2/, kconfig/, Kconfig, Makefile, scripts/
# (presets, docs and tests aside). A method is named by its value as a string ("muon"),
# its Kconfig symbols (OPTIMIZER_MUON, MATRIX_OPTIMIZER_MUON) or a setting only it reads
# (muon_lr, MUON_LR). It may be named in two: its module and kconfig/methods.kconfig,
# which is generated from the modules. A pairing is declared once, by the method that
# demands another (Pruning.optimizer), so the demanded one is also named there.
OWN = ("kconfig/methods.kconfig",)
# Where a method's name means something else: (file, name) -> what. ("none", the dense
# baseline, is a value every choice of kgpt's has, not a method's name.)
OTHER_SENSE = {
    ("gpt2/config/choices.py", "magnitude"): "one-shot pruning's magnitude, its own registry",
    ("gpt2/training/oneshot.py", "magnitude"): "one-shot pruning's magnitude, its own registry",
    ("gpt2/cli/matrix_commands.py", "state"): "the status table's cell-state column",
    ("scripts/resume_check.py", "state"): "the key of an optimizer's state_dict",
}


def allowed_files(name: str) -> set[str]:
    """The files that may name method ``name``: its module, the generated Kconfig and
    the modules of the methods that demand it."""
    folder = "gpt2/optim" if name in OPTIMIZERS else "gpt2/sparsity"
    demanding = {f"gpt2/sparsity/{m}.py" for m, spec in PRUNING_METHODS.items()
                 if spec.optimizer == name}
    return {f"{folder}/{name}.py", *OWN, *demanding}


def product_files() -> dict[str, str]:
    paths = [*REPO.glob("gpt2/**/*.py"), *REPO.glob("kconfig/*.kconfig"), REPO / "Kconfig",
             REPO / "Makefile", *REPO.glob("scripts/**/*.py")]
    return {str(p.relative_to(REPO)): p.read_text() for p in sorted(paths) if p.is_file()}


def naming(name: str, symbols: tuple[str, ...], own: list[str]) -> re.Pattern:
    return re.compile("|".join(
        [rf"""["']{re.escape(name)}["']"""]
        + [rf"\b{prefix}_{name.upper()}\b" for prefix in symbols]
        + [rf"\b{s}\b|\b{s.upper()}\b" for s in own]))


def files_naming() -> dict[str, list[str]]:
    files = product_files()
    out = {}
    for registry, settings, symbols in (
            (OPTIMIZERS, OPTIMIZER_SETTINGS, ("OPTIMIZER", "MATRIX_OPTIMIZER")),
            (PRUNING_METHODS, PRUNING_SETTINGS, ("PRUNING_METHOD", "MATRIX_PRUNING"))):
        for name in registry:
            own = [s for s, (_, readers) in settings.items() if readers == (name,)]
            pattern = naming(name, symbols, own)
            out[name] = [path for path, text in files.items() if pattern.search(text)]
    return out


@pytest.mark.slow
def test_a_method_is_named_only_in_its_module_and_the_generated_kconfig():
    found = files_naming()
    for name, paths in found.items():
        if name == "none":
            continue
        elsewhere = [p for p in paths
                     if p not in allowed_files(name) and (p, name) not in OTHER_SENSE]
        assert not elsewhere, f"{name} is named outside its module in {elsewhere}"


@pytest.mark.slow
def test_every_other_sense_of_a_name_is_still_there():
    """An entry of OTHER_SENSE whose file no longer names the method is stale."""
    found = files_naming()
    stale = [(p, n) for p, n in OTHER_SENSE if p not in found[n]]
    assert not stale, f"remove from OTHER_SENSE: {stale}"


@pytest.mark.slow
def test_the_name_count_sees_a_planted_name():
    found = files_naming()["rigl"]
    files = product_files()
    files["gpt2/training/trainer.py"] += '\nif cfg.pruning_method == "rigl": pass\n'
    pattern = naming("rigl", ("PRUNING_METHOD", "MATRIX_PRUNING"), [])
    assert len([p for p, t in files.items() if pattern.search(t)]) == len(found) + 1


def test_a_run_page_gives_each_rate_an_optimizer_has_of_its_own():
    """From the run's record and the optimizer's grids, naming no method in the code:
    Muon's two rates, one rate where Moonlight's scale shares it, Adafactor's own."""
    from gpt2.results.pages import rate_text

    muon = {"optimizer": "muon", "learning_rate": 6e-4, "muon_lr": 0.02}
    assert rate_text(muon) == "0.02 (matrices), 0.0006 (the rest)"
    assert rate_text({**muon, "muon_scale": "moonlight"}) == "0.0006"
    assert rate_text({"optimizer": "adafactor", "learning_rate": 6e-4,
                      "adafactor_lr": 0.01}) == "0.01"
    assert rate_text({"optimizer": "adamw", "learning_rate": 6e-4}) == "0.0006"
    assert rate_text({"optimizer": "gone", "learning_rate": 6e-4}) == "0.0006"


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fsdp_takes_an_optimizer_exactly_when_it_declares_its_update_elementwise(name):
    """FSDP steps each process's shard of a weight: an optimizer whose update needs the
    whole matrix is refused with the reason it declares, every other one is taken."""
    from gpt2.config.options import resolve
    from gpt2.errors import ConfigError

    spec = OPTIMIZERS[name]
    if spec.elementwise:
        assert resolve({"parallel": "fsdp", "optimizer": name}).optimizer == name
    else:
        with pytest.raises(ConfigError, match=re.escape(spec.whole)):
            resolve({"parallel": "fsdp", "optimizer": name})
