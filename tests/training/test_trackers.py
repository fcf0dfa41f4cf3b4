"""Experiment trackers (CONFIG_TRACKER): off by default, each library imported only when
selected, a clear install hint when it is missing. Hermetic: every tracker library is
replaced by a fake module in sys.modules, so nothing here needs wandb, trackio or
tensorboard installed, or the network."""

from __future__ import annotations

import math
import subprocess
import sys
import types

import pytest

from helpers import REPO
from gpt2.config import kconfig
from gpt2.config.options import TRAIN, Config, applies, resolve, to_argv, to_dotconfig
from gpt2.errors import ConfigError
from gpt2.names import choice_symbol
from gpt2.training import trackers
from gpt2.training.trackers import (PROJECT_TRACKERS, TRACKERS, Tracker, check_tracker,
                                    open_tracker)

LIBRARIES = ("wandb", "trackio", "tensorboard", "torch.utils.tensorboard")
# tracker -> (module the tracker imports, pip package named in the hint)
MODULES = {"tensorboard": ("torch.utils.tensorboard", "tensorboard"),
           "wandb": ("wandb", "wandb"), "trackio": ("trackio", "trackio")}

ROW = {"step": 20, "tokens": 40960, "train_loss": 4.25, "lr": 6e-4, "grad_norm": None,
       "tokens_per_sec": 1234.5, "sparsity": 0.0, "val_loss": math.nan,
       "val_ppl": math.inf, "flag": True, "note": "text", "elapsed_s": -math.inf}
LOGGED = {"tokens": 40960, "train_loss": 4.25, "lr": 6e-4, "tokens_per_sec": 1234.5,
          "sparsity": 0.0}
CONFIG = {"run_name": "run1", "learning_rate": 6e-4, "tracker": "x"}


# ---- fakes ----------------------------------------------------------------------

class Calls(list):
    def names(self) -> list[str]:
        return [c[0] for c in self]


def fake_wandb() -> types.ModuleType:
    mod = types.ModuleType("wandb")
    mod.calls = Calls()

    class Run:
        def log(self, data, step=None):
            mod.calls.append(("log", dict(data), step))

        def finish(self):
            mod.calls.append(("finish",))

    def init(**kwargs):
        mod.calls.append(("init", kwargs))
        return Run()

    mod.init = init
    return mod


def fake_trackio() -> types.ModuleType:
    mod = types.ModuleType("trackio")
    mod.calls = Calls()
    mod.init = lambda **kwargs: mod.calls.append(("init", kwargs))
    mod.log = lambda metrics, step=None: mod.calls.append(("log", dict(metrics), step))
    mod.finish = lambda: mod.calls.append(("finish",))
    return mod


def fake_tensorboard() -> types.ModuleType:
    mod = types.ModuleType("torch.utils.tensorboard")
    mod.calls = Calls()

    class SummaryWriter:
        def __init__(self, log_dir=None):
            mod.calls.append(("init", {"log_dir": log_dir}))

        def add_scalar(self, tag, scalar_value, global_step=None, walltime=None):
            # (walltime: given only by `make tensorboard`, which reads it back for real)
            mod.calls.append(("add_scalar", tag, scalar_value, global_step))

        def add_text(self, tag, text_string, global_step=None):
            mod.calls.append(("add_text", tag, text_string))

        def flush(self):
            mod.calls.append(("flush",))

        def close(self):
            mod.calls.append(("close",))

    mod.SummaryWriter = SummaryWriter
    return mod


FAKES = {"tensorboard": fake_tensorboard, "wandb": fake_wandb, "trackio": fake_trackio}


def install(monkeypatch, name: str) -> types.ModuleType:
    mod = FAKES[name]()
    monkeypatch.setitem(sys.modules, MODULES[name][0], mod)
    if name == "tensorboard":
        # The fake has no summary submodule: a real one another test imported before
        # (sys.modules keeps it) would hand its hparams to the fake writer. None in
        # sys.modules makes its import fail, as a stand-in without it would.
        monkeypatch.setitem(sys.modules, "torch.utils.tensorboard.summary", None)
    return mod


def logged(mod: types.ModuleType) -> list[tuple[dict, int]]:
    """(metrics, step) per log call, whatever the library's calling convention."""
    if "add_scalar" in mod.calls.names():
        by_step: dict[int, dict] = {}
        # (TensorBoard's tags are grouped, "loss/train_loss": the key is the last part)
        for _, tag, value, step in (c for c in mod.calls if c[0] == "add_scalar"):
            by_step.setdefault(step, {})[tag.rsplit("/", 1)[-1]] = value
        return [(metrics, step) for step, metrics in by_step.items()]
    return [(c[1], c[2]) for c in mod.calls if c[0] == "log"]


# ---- registry and config ----------------------------------------------------------

def test_registry_starts_with_none_and_none_is_the_default():
    assert TRACKERS[0] == "none"
    assert Config().tracker == "none"
    assert set(PROJECT_TRACKERS) < set(TRACKERS) and "none" not in PROJECT_TRACKERS
    assert set(MODULES) == set(TRACKERS) - {"none"}


def test_tracker_project_without_a_project_tracker_is_refused():
    with pytest.raises(ConfigError, match=r"CONFIG_TRACKER_PROJECT.*no effect with tracker"):
        resolve({"tracker": "none", "tracker_project": "x"})
    with pytest.raises(ConfigError, match="CONFIG_TRACKER_PROJECT"):
        resolve({"tracker_project": "x"})
    with pytest.raises(ConfigError, match="CONFIG_TRACKER_PROJECT"):
        resolve({"tracker": "tensorboard", "tracker_project": "x"})
    for name in PROJECT_TRACKERS:
        assert resolve({"tracker": name, "tracker_project": "x"}).tracker_project == "x"


def test_an_unknown_tracker_is_refused():
    with pytest.raises(ConfigError, match="CONFIG_TRACKER"):
        resolve({"tracker": "mlflow"})


def test_tracker_does_not_change_the_run_folder():
    base = Config().config_hash()
    for name in TRACKERS:
        assert Config(tracker=name, tracker_project="other").config_hash() == base


@pytest.mark.parametrize("name", TRACKERS)
def test_kconfig_shows_the_project_exactly_when_it_is_in_force(name):
    kconf = kconfig.new_kconfig()
    kconf.syms[choice_symbol("tracker", name)].set_value(2)
    assert kconf.named_choices["TRACKER"].selection.name == choice_symbol("tracker", name)
    assert kconfig.is_active(kconf, "tracker_project") == applies(Config(tracker=name),
                                                                  "tracker_project")


@pytest.mark.parametrize("name", TRACKERS)
def test_tracker_round_trips_through_argv_and_dotconfig(tmp_path, name):
    given = {"tracker": name}
    if name in PROJECT_TRACKERS:
        given["tracker_project"] = "my-project"
    cfg = resolve(given)
    argv = to_argv(cfg, TRAIN)
    assert f"--tracker={name}" in argv
    assert ("--tracker-project=my-project" in argv) == (name in PROJECT_TRACKERS)
    path = tmp_path / "config"
    path.write_text(to_dotconfig(cfg))
    back, _ = kconfig.to_config(kconfig.load(path))
    assert (back.tracker, back.tracker_project) == (cfg.tracker, cfg.tracker_project)


# ---- the none tracker ---------------------------------------------------------------

def test_none_tracker_does_nothing_and_imports_nothing(monkeypatch, tmp_path):
    for lib in LIBRARIES:  # importing any of them would now fail
        monkeypatch.setitem(sys.modules, lib, None)
    t = open_tracker("none", "kgpt", "run1", tmp_path, CONFIG)
    assert type(t) is Tracker
    t.log(ROW, 20)
    t.close()
    t.close()
    assert list(tmp_path.iterdir()) == []


def test_scalars_keep_finite_numbers_only():
    assert trackers.scalars(ROW) == LOGGED
    assert trackers.scalars({"step": 1}) == {}
    assert trackers.scalars({"a": 1, "b": False, "c": float("-nan"), "d": 2.5}) == {"a": 1,
                                                                                    "d": 2.5}


# ---- each tracker, with its library faked --------------------------------------------

@pytest.mark.parametrize("name", MODULES)
def test_tracker_logs_finite_numbers_at_the_step_and_close_finishes(monkeypatch, tmp_path,
                                                                     name):
    mod = install(monkeypatch, name)
    t = open_tracker(name, "proj", "run1", tmp_path, CONFIG)
    assert isinstance(t, Tracker) and type(t) is not Tracker and t.name == name
    t.log(ROW, 20)
    t.log({"step": 30, "train_loss": 3.5, "grad_norm": math.nan}, 30)
    assert logged(mod) == [(LOGGED, 20), ({"train_loss": 3.5}, 30)]
    assert mod.calls.names().count("init") == 1
    finish = "close" if name == "tensorboard" else "finish"
    assert finish not in mod.calls.names()
    t.close()
    t.close()  # a second close (e.g. from a finally after an explicit close) is harmless
    assert mod.calls.names().count(finish) == 1
    assert mod.calls.names()[-1] == finish


def test_wandb_run_gets_project_name_config_and_the_run_folder(monkeypatch, tmp_path):
    mod = install(monkeypatch, "wandb")
    open_tracker("wandb", "proj", "run1", tmp_path, CONFIG)
    assert mod.calls[0] == ("init", {"project": "proj", "name": "run1", "config": CONFIG,
                                     "dir": str(tmp_path), "tags": [], "notes": None})


def test_wandb_run_gets_the_runs_tags_and_notes(monkeypatch, tmp_path):
    mod = install(monkeypatch, "wandb")
    config = {**CONFIG, "run_tags": "baseline ablation:warmup", "run_notes": "warmup 50 vs 100"}
    open_tracker("wandb", "proj", "run1", tmp_path, config)
    assert mod.calls[0][1]["tags"] == ["baseline", "ablation:warmup"]
    assert mod.calls[0][1]["notes"] == "warmup 50 vs 100"


def test_trackio_run_gets_project_name_and_config(monkeypatch, tmp_path):
    mod = install(monkeypatch, "trackio")
    open_tracker("trackio", "proj", "run1", tmp_path, CONFIG)
    assert mod.calls[0] == ("init", {"project": "proj", "name": "run1", "config": CONFIG})


def test_tensorboard_writes_under_the_run_folder_and_records_the_config(monkeypatch, tmp_path):
    mod = install(monkeypatch, "tensorboard")
    open_tracker("tensorboard", "ignored", "run1", tmp_path, CONFIG)
    assert mod.calls[0] == ("init", {"log_dir": str(tmp_path / "tensorboard")})
    (text,) = [c for c in mod.calls if c[0] == "add_text"]
    assert text[1] == "config" and '"learning_rate": 0.0006' in text[2]


@pytest.mark.parametrize("name", PROJECT_TRACKERS)
def test_empty_project_is_refused(monkeypatch, tmp_path, name):
    mod = install(monkeypatch, name)
    with pytest.raises(ConfigError, match="CONFIG_TRACKER_PROJECT"):
        open_tracker(name, "  ", "run1", tmp_path, CONFIG)
    assert mod.calls == []


# ---- missing or broken library -----------------------------------------------------

@pytest.mark.parametrize("name", MODULES)
def test_missing_library_names_the_symbol_flag_and_the_install_command(monkeypatch, tmp_path,
                                                                         name):
    module, package = MODULES[name]
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    with pytest.raises(ConfigError) as info:
        open_tracker(name, "proj", "run1", tmp_path, CONFIG)
    message = str(info.value)
    assert info.value.name == "tracker"
    assert "\n" not in message
    for part in (f"CONFIG_TRACKER_{name.upper()}", f"--tracker {name}",
                 f"the {package} package is not installed", f"pip install {package}",
                 # the Python running kgpt, not .venv's pip (PYTHON= may name another)
                 f"{sys.executable} -m pip install {package}", "CONFIG_TRACKER_NONE"):
        assert part in message, (part, message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", MODULES)
def test_check_tracker_fails_early_without_starting_a_run(monkeypatch, name):
    mod = install(monkeypatch, name)
    check_tracker(name, "proj")
    assert mod.calls == []  # imported, nothing started
    monkeypatch.setitem(sys.modules, MODULES[name][0], None)
    with pytest.raises(ConfigError, match=f"pip install {MODULES[name][1]}"):
        check_tracker(name, "proj")
    with pytest.raises(ConfigError, match="CONFIG_TRACKER "):
        check_tracker("mlflow", "proj")


def test_check_tracker_none_needs_nothing(monkeypatch):
    for lib in LIBRARIES:
        monkeypatch.setitem(sys.modules, lib, None)
    check_tracker("none", "")


def test_broken_library_says_it_failed_to_import(monkeypatch, tmp_path):
    def fail(module_name):
        raise ImportError("cannot import name 'x' from 'some_dependency'",
                          name="some_dependency")

    monkeypatch.setattr(trackers.importlib, "import_module", fail)
    with pytest.raises(ConfigError, match=r"wandb package could not be imported \(cannot "
                       r"import name 'x'.*pip install wandb"):
        open_tracker("wandb", "proj", "run1", tmp_path, CONFIG)


# ---- import hygiene --------------------------------------------------------------------

@pytest.mark.e2e
def test_importing_trackers_and_options_imports_no_tracker_library():
    """In a fresh interpreter (this one may have imported anything): importing the
    module, the config that takes its registry and the entry point tries to import
    none of the libraries (a spy on the import system sees attempts too, so an import
    wrapped in try/except counts even where the library is not installed), and there
    is no import cycle."""
    code = ("import sys\n"
            f"LIBS = {LIBRARIES!r}\n"
            "seen = set()\n"
            "class Spy:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name in LIBS:\n"
            "            seen.add(name)\n"
            "        return None\n"
            "sys.meta_path.insert(0, Spy())\n"
            "import gpt2.training.trackers\n"
            "import gpt2.config.options\n"
            "import gpt2.train\n"
            "print(sorted(seen | {m for m in LIBS if m in sys.modules}))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
