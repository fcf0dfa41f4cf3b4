"""Shared fixtures: the real corpus, a prepared copy of it, a Hugging Face model.

Everything is offline and hermetic: data and results go to pytest's tmp folders,
never into the checkout. The helpers tests call are in helpers.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import corpus_path, synthetic_corpus

# A hangup ignored on entry (the suite run under nohup, as a CI job may be) stays ignored
# in every process kgpt starts, by design; the tests of what SIGHUP does need its
# default disposition, which the processes they start inherit from here.
signal.signal(signal.SIGHUP, signal.SIG_DFL)


# Fixtures of which a machine holds one, or that cost a minute to build: under
# pytest-xdist (`-n 2 --dist loadgroup`, the Makefile) every test using one runs on the
# same worker, so each is built once and no two workers start a Slurm cluster. One
# group for both: the Slurm matrix tests compare with the reference matrix.
SHARED_FIXTURES = {"slurm_cluster": "shared", "matrix_reference": "shared"}


# ---- tiers: a test that starts a process or trains is an end-to-end test, and says so ------
#
# `make test-fast` runs the unit tier (KGPT_TIER=unit): every test not marked e2e,
# reliability or slurm, in this process. There, a test that starts a process (make,
# train.py, torchrun, a compile worker) or trains through the loop (builds a Trainer)
# while it, or a fixture it is the first to use, runs fails and says to mark it e2e:
# the fast tier stays in-process and below the loop by construction, whatever machine
# measures it. git is not a process of ours (provenance asks it).
NOT_OURS = {"git"}


class TierError(AssertionError):
    pass


def _end_to_end(item) -> bool:
    return any(item.get_closest_marker(m) for m in ("e2e", "reliability", "slurm"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _unit_tier_guard(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _unit_tier_guard(item):
        yield


class _unit_tier_guard:
    """While a unit test (or a fixture it first uses) runs: starting a process of ours,
    or building the training loop, is a TierError naming the test and what it started
    (KGPT_TIER_RECORD=FILE: written there instead, one line each, to classify a whole
    suite in one run)."""

    def __init__(self, item):
        self.item, self.popen = item, subprocess.Popen.__init__
        self.trainer = None

    def _refuse(self, what: str) -> None:
        record = os.environ.get("KGPT_TIER_RECORD")
        if record:
            with open(record, "a") as f:
                f.write(f"{self.item.nodeid}\t{what}\n")
            return
        raise TierError(f"{self.item.nodeid} {what}: an end-to-end test; mark it "
                        "@pytest.mark.e2e (or its file pytestmark = pytest.mark.e2e), so "
                        "`make test-fast` leaves it out")

    def __enter__(self):
        if _end_to_end(self.item) or os.environ.get("KGPT_TIER") != "unit":
            return self
        guard, popen = self, self.popen

        def guarded(process, args, *a, **kw):
            program = Path(str(args[0] if isinstance(args, (list, tuple)) else
                               str(args).split()[0])).name
            if program not in NOT_OURS:
                guard._refuse(f"starts a process ({program})")
            return popen(process, args, *a, **kw)

        subprocess.Popen.__init__ = guarded
        from gpt2.training import trainer

        self.trainer = trainer.Trainer, trainer.Trainer.__init__
        real_init = self.trainer[1]

        def loop(*a, **kw):
            guard._refuse("trains through the loop (builds a Trainer)")
            return real_init(*a, **kw)

        trainer.Trainer.__init__ = loop
        return self

    def __exit__(self, *exc):
        subprocess.Popen.__init__ = self.popen
        if self.trainer is not None:
            self.trainer[0].__init__ = self.trainer[1]
        return False


# tryfirst: xdist's own hook turns the marks into the worker's node ids (test@group);
# after it, a mark added here is never seen.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = next((g for name, g in SHARED_FIXTURES.items() if name in item.fixturenames),
                     None)
        if group is None and _uses_module_fixture(item):
            # A module's fixture (a trained run, a prepared folder) is built once per
            # worker that runs one of its tests: its tests stay on one worker, so it is
            # built once (test_make's `make` run was built twice, 36 s each).
            group = f"module:{item.module.__name__}"
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session):
    """Under `--dist loadgroup`, every grouped test's id must carry its group, or xdist
    sends its tests to any worker: each builds the shared fixture again, two Slurm
    clusters collide. pytest 9.2 lost the groups that way without a word (pytest-xdist
    issue 1386; requirements.txt pins 9.1.1): say so instead."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") and not _group_suffix(item.nodeid)]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist dropped the group of {len(lost)} tests (e.g. {lost[0]}): this "
            "pytest and pytest-xdist do not group with --dist loadgroup; use the versions "
            "requirements.txt pins")


def _group_suffix(nodeid: str) -> bool:
    return nodeid.rfind("@") > nodeid.rfind("]")


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(
        defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


@pytest.fixture(scope="session")
def real_corpus() -> Path:
    """The published tiny Shakespeare, for tests that check its pinned hash."""
    path = corpus_path()
    if path is None:
        pytest.skip("tiny Shakespeare not found: set KGPT_CORPUS or place it at "
                    "../shared/data/tinyshakespeare.txt or data/shakespeare/input.txt")
    return path


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """The real corpus when this machine has it, else a synthetic stand-in."""
    return corpus_path() or synthetic_corpus(tmp_path_factory.mktemp("corpus") / "input.txt")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory, corpus) -> Path:
    """A data folder with shakespeare (GPT-2's tokens) and shakespeare-char (the tiny
    runs' characters, helpers.TINY_DATASET) prepared once for the whole session."""
    from gpt2.data.prepare import prepare

    root = tmp_path_factory.mktemp("data")
    for dataset in ("shakespeare", "shakespeare-char"):
        prepare(dataset, root, input_path=str(corpus), val_fraction=0.1, workers=1)
    return root


@pytest.fixture(scope="session")
def matrix_reference(tmp_path_factory, data_dir):
    """One uninterrupted run of the tiny matrix (matrix_helpers.py) through `make
    test-matrix` on this machine: (its .config, its folder, the make process). The
    local runner's and the Slurm backend's tests compare their results with it."""
    from matrix_helpers import folder_of, run_matrix, tiny_matrix

    tmp = tmp_path_factory.mktemp("reference")
    config = tiny_matrix(tmp, data_dir)
    proc = run_matrix(config)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return config, folder_of(config), proc


@pytest.fixture(scope="session")
def hf_model(tmp_path_factory):
    """A randomly initialised 2-layer GPT-2 saved by transformers in Hugging Face
    format (config.json, model.safetensors): (the transformers model, its folder)."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64,
                                     vocab_size=50257)
    model = transformers.GPT2LMHeadModel(config).eval()
    folder = tmp_path_factory.mktemp("hf-gpt2")
    model.save_pretrained(folder, safe_serialization=True)
    assert (folder / "model.safetensors").is_file()
    return model, folder


@pytest.fixture
def data_copy(data_dir, tmp_path) -> Path:
    """A copy of the prepared data folder that a test may damage."""
    shutil.copytree(data_dir, tmp_path / "data")
    return tmp_path / "data"


@pytest.fixture
def fresh_corpus_dir(tmp_path, corpus) -> Path:
    """An unprepared data folder holding only the raw corpus."""
    d = tmp_path / "data" / "shakespeare"
    d.mkdir(parents=True)
    shutil.copyfile(corpus, d / "input.txt")
    return tmp_path / "data"


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A local single-node Slurm (scripts/slurm_cluster.py) for the session, in a tmp folder,
    stopped at the end. Skips only where Slurm cannot be had (not root, or the packages are
    not installed: `.ci/run` installs them); a cluster that fails to start is a failure."""
    from slurm import Cluster, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    cluster = Cluster.start(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def two_runs(tmp_path_factory, data_dir):
    """Two finished tiny runs that differ only in the learning rate (3e-3 and 1e-3),
    in one results folder: (results folder, [run folder at 3e-3, run folder at 1e-3]).
    Tests that read results use them; none may change them. GPT-2's tokens: export
    and generate's hostile prompts read them as a user's run."""
    from helpers import BPE, TINY, call_main

    from gpt2.results import pages

    results = tmp_path_factory.mktemp("two-runs") / "results"
    folders = []
    for lr in ("3e-3", "1e-3"):
        call_main("gpt2/train.py", *TINY, f"--data-dir={data_dir}",
                  f"--results-dir={results}", f"--run-name=lr{lr}", f"--learning-rate={lr}",
                  "--log-interval=5", "--min-lr=1e-4", BPE, check=True)
        (folder,) = results.glob(f"lr{lr}-*")
        assert not (folder / pages.RUN_PAGE).exists()  # training writes the run folder only
        pages.publish_after_run(folder, results)  # as what starts train.py does
        folders.append(folder)
    return results, folders


@pytest.fixture
def read_only(monkeypatch):
    """``read_only(folder)``: writes under folder fail with EROFS, as on a read-only
    mount. File modes would not do: they do not stop root, as CI containers often run."""
    import builtins
    import errno
    import io

    def make(folder):
        folder = os.path.realpath(folder) + os.sep

        def refuse(*paths):
            for path in paths:
                if isinstance(path, (str, bytes, os.PathLike)) and (
                        os.path.realpath(os.fsdecode(path)) + os.sep).startswith(folder):
                    raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

        def guarded(fn, check):
            return lambda *a, **k: (check(*a, **k), fn(*a, **k))[1]

        writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        for name, check in [
                ("mkdir", lambda p, *a, **k: refuse(p)),
                ("open", lambda p, flags, *a, **k: flags & writes and refuse(p)),
                ("symlink", lambda src, dst, *a, **k: refuse(dst)),
                ("replace", lambda src, dst, *a, **k: refuse(src, dst)),
                ("rename", lambda src, dst, *a, **k: refuse(src, dst)),
                ("unlink", lambda p, *a, **k: refuse(p)), ("remove", lambda p, *a, **k: refuse(p))]:
            monkeypatch.setattr(os, name, guarded(getattr(os, name), check))
        opener = guarded(builtins.open, lambda f, mode="r", *a, **k: set(mode) & set("wax+")
                         and refuse(f))
        monkeypatch.setattr(builtins, "open", opener)
        monkeypatch.setattr(io, "open", opener)

    return make
