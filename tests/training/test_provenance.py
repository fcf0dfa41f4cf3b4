"""A result belongs to the code and data that made it. After an edit of a kgpt
source file, or a new corpus, `make` (single run and matrix) never reports or resumes
the old result as current: it refuses and says what changed, or retrains with the
old folder kept (IF_CHANGED=rerun), or keeps it as asked (IF_CHANGED=reuse).

The edits happen in a copy of the project, never in this checkout."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, run_make
from gpt2.errors import StorageError
from gpt2.training import provenance

pytestmark = pytest.mark.e2e

TINY = """CONFIG_DATASET_SHAKESPEARE_CHAR=y
CONFIG_MODEL_SIZE_CUSTOM=y
CONFIG_N_LAYER=1
CONFIG_N_HEAD=2
CONFIG_N_EMBD=32
CONFIG_BLOCK_SIZE=32
CONFIG_BATCH_SIZE=4
CONFIG_MAX_ITERS=8
CONFIG_WARMUP_ITERS=2
CONFIG_LEARNING_RATE="3e-3"
CONFIG_MIN_LR="3e-4"
CONFIG_EVAL_INTERVAL=4
CONFIG_EVAL_TOKENS=128
CONFIG_LOG_INTERVAL=4
CONFIG_CHECKPOINT_INTERVAL=4
CONFIG_SAMPLE_TOKENS=0
CONFIG_DEVICE_CPU=y
CONFIG_DTYPE_FLOAT32=y
CONFIG_CPU_THREADS=1
CONFIG_DATA_WORKERS=0
CONFIG_RUN_NAME="tiny"
"""
MATRIX = """CONFIG_MATRIX=y
CONFIG_MATRIX_OPTIMIZER_ADAMW=y
CONFIG_MATRIX_PRUNING_NONE=y
"""
EDITED = "gpt2/optim/algorithms/optimizers.py"


def project_copy(tmp: Path) -> Path:
    """What `make` needs of the project, copied: a tree whose code a test may edit."""
    copy = tmp / "project"
    for name in ("gpt2", "scripts", "kconfig", "defconfigs"):
        shutil.copytree(REPO / name, copy / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("Makefile", "Kconfig"):
        shutil.copy(REPO / name, copy / name)
    return copy


def setup(tmp: Path, corpus: Path, extra: str = "") -> tuple[Path, dict]:
    project = project_copy(tmp)
    text = tmp / "corpus.txt"
    shutil.copy(corpus, text)
    config = tmp / "config"
    config.write_text(TINY + extra + f'CONFIG_DATA_INPUT="{text}"\nCONFIG_DATA_DIR="{tmp}/data"\n'
                      f'CONFIG_RESULTS_DIR="{tmp}/results"\n')
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_make("olddefconfig", env=env, cwd=project).returncode == 0
    return project, env


def make(project: Path, env: dict, *args: str, **more: str):
    proc = run_make(*args, env={**env, **more}, cwd=project)
    return proc.returncode, proc.stdout + proc.stderr


def edit_code(project: Path) -> None:
    with open(project / EDITED, "a") as f:
        f.write("\n# an edit that could change results\n")


def new_corpus(tmp: Path) -> None:
    """Another corpus: two thirds of it (the real one, or the shorter synthetic one)."""
    text = tmp / "corpus.txt"
    old = text.read_text()
    text.write_text(old[: len(old) * 2 // 3])


def run_folders(results: Path) -> list[str]:
    return sorted(p.name for p in results.iterdir() if p.is_dir() and not p.is_symlink())


def test_code_identity_covers_every_source_file_and_names_what_changed(tmp_path):
    current = provenance.code_identity()
    assert set(current["files"]) == {p.relative_to(REPO).as_posix()
                                     for p in (REPO / "gpt2").rglob("*.py")
                                     if "__pycache__" not in p.parts}
    recorded = {"code": json.loads(json.dumps(current)),
                "data": {"dataset": "shakespeare", "sha256": "a", "train_tokens": 1}}
    now = {"code": current, "data": dict(recorded["data"])}
    assert provenance.changes(recorded, now) == []
    recorded["code"]["files"][EDITED] = "0" * 16
    recorded["code"]["sources"] = "0" * 16
    (what,) = provenance.changes(recorded, now)
    assert what.startswith(f"code: changed {EDITED} ")
    now["data"]["sha256"] = "b"
    assert provenance.changes(recorded, now)[1].startswith("data: shakespeare was prepared")
    assert "no code or data identity" in provenance.changes(None, now)[0]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=kgpt", "-c", "user.email=kgpt@test",
                           "-c", "commit.gpgsign=false", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """A small git checkout laid out like the project (gpt2/model.py committed, and a
    .gitignore naming gpt2/scratch.py), which provenance takes for the project (REPO):
    its git commands run there and its files are hashed there, so this checkout's git
    state is never touched."""
    root = tmp_path / "checkout"
    (root / "gpt2").mkdir(parents=True)
    (root / "gpt2" / "model.py").write_text("WIDTH = 1\n")
    (root / ".gitignore").write_text("gpt2/scratch.py\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    monkeypatch.setattr(provenance, "REPO", root)
    provenance.code_identity.cache_clear()
    yield root
    provenance.code_identity.cache_clear()  # the next caller hashes the real project


def fresh_identity() -> dict:
    provenance.code_identity.cache_clear()
    return provenance.code_identity()


def test_a_new_untracked_module_is_part_of_the_code(checkout):
    """A module not yet added to git is code that runs: leaving it out would let a
    result made with it pass for one of the committed code. Ignored files and
    non-Python files are not code."""
    before = fresh_identity()
    assert list(before["files"]) == ["gpt2/model.py"]
    (checkout / "gpt2" / "new.py").write_text("DEPTH = 2\n")
    (checkout / "gpt2" / "scratch.py").write_text("ignored\n")
    (checkout / "gpt2" / "notes.txt").write_text("not code\n")
    assert provenance.source_files() == ["gpt2/model.py", "gpt2/new.py"]
    after = fresh_identity()
    assert list(after["files"]) == ["gpt2/model.py", "gpt2/new.py"]
    assert after["sources"] != before["sources"]
    data = {"dataset": "shakespeare", "sha256": "a", "train_tokens": 1}
    (what,) = provenance.changes({"code": before, "data": data}, {"code": after, "data": data})
    assert what.startswith("code: added gpt2/new.py ")


def test_uncommitted_changes_are_recorded_as_dirty(checkout):
    """The commit alone does not say what ran when tracked files were edited after it."""
    head = git(checkout, "rev-parse", "HEAD").strip()
    clean = fresh_identity()
    assert (clean["commit"], clean["dirty"]) == (head, False)
    assert provenance.short(clean) == f"src {clean['sources']} @ {head[:10]}"
    (checkout / "gpt2" / "model.py").write_text("WIDTH = 2\n")
    edited = fresh_identity()
    assert (edited["commit"], edited["dirty"]) == (head, True)
    assert provenance.short(edited).endswith(f"@ {head[:10]} (dirty)")


@pytest.fixture
def unpacked(tmp_path) -> Path:
    """kgpt's sources unpacked without a .git of their own inside another git
    repository whose .gitignore names them (parent/.gitignore: kgpt/). Git run there
    answers for the parent: `git ls-files` succeeds and lists nothing."""
    parent = tmp_path / "parent"
    tree = parent / "kgpt"
    shutil.copytree(REPO / "gpt2", tree / "gpt2", ignore=shutil.ignore_patterns("__pycache__"))
    (parent / ".gitignore").write_text("kgpt/\n")
    (parent / "README").write_text("another project\n")
    git(parent, "init", "-q")
    git(parent, "add", "-A")
    git(parent, "commit", "-q", "-m", "parent")
    (parent / "README").write_text("another project, edited\n")  # the parent is dirty
    return tree


def test_a_tree_inside_another_repository_hashes_its_files_on_disk(unpacked):
    """Asking git there hashed nothing: an edit of a source file changed no hash, and
    stale results were reused under new code. The files on disk are the code, and the
    parent's commit and dirty flag say nothing of it."""
    assert git(unpacked, "ls-files", "--", "gpt2") == ""  # the trap: git sees nothing
    on_disk = sorted(p.relative_to(unpacked).as_posix() for p in (unpacked / "gpt2").rglob("*.py"))
    assert EDITED in on_disk
    assert provenance.source_files(unpacked) == on_disk
    before = provenance.code_of(unpacked)
    assert sorted(before["files"]) == on_disk
    assert (before["commit"], before["dirty"]) == (None, None)  # not the parent's
    assert provenance.short(before) == f"src {before['sources']}"
    edit_code(unpacked)
    after = provenance.code_of(unpacked)
    assert after["sources"] != before["sources"]
    data = {"dataset": "shakespeare", "sha256": "a", "train_tokens": 1}
    (what,) = provenance.changes({"code": before, "data": data}, {"code": after, "data": data})
    assert what.startswith(f"code: changed {EDITED} ")


def test_a_checkout_of_its_own_inside_another_repository_uses_its_own_git(unpacked):
    """The same tree made a checkout of its own is asked through git: its commit, an
    untracked new module counted, an ignored file not."""
    (unpacked / ".gitignore").write_text("gpt2/scratch.py\n")
    git(unpacked, "init", "-q")
    git(unpacked, "add", "-A")
    git(unpacked, "commit", "-q", "-m", "kgpt")
    head = git(unpacked, "rev-parse", "HEAD").strip()
    (unpacked / "gpt2" / "new.py").write_text("DEPTH = 2\n")
    (unpacked / "gpt2" / "scratch.py").write_text("ignored\n")
    files = provenance.source_files(unpacked)
    assert EDITED in files and "gpt2/new.py" in files and "gpt2/scratch.py" not in files
    code = provenance.code_of(unpacked)
    assert (code["commit"], code["dirty"]) == (head, False)
    edit_code(unpacked)
    assert provenance.code_of(unpacked)["dirty"] is True


def test_no_source_file_is_an_error_not_a_hash_of_nothing(tmp_path, monkeypatch, capsys):
    """A hash over no file is the same for every version of the code: finding none is
    refused, and a run that starts there stops with one line, not a traceback."""
    from gpt2 import train

    empty = tmp_path / "empty"
    (empty / "gpt2").mkdir(parents=True)
    (empty / "gpt2" / "notes.txt").write_text("not code\n")
    with pytest.raises(StorageError, match=r"there is no \.py file under .*empty/gpt2; run "
                                           r"kgpt from a complete copy of its sources"):
        provenance.source_files(empty)
    ignored = tmp_path / "ignored"
    (ignored / "gpt2").mkdir(parents=True)
    (ignored / "gpt2" / "model.py").write_text("WIDTH = 1\n")
    (ignored / ".gitignore").write_text("gpt2/\n")
    git(ignored, "init", "-q")
    with pytest.raises(StorageError, match=r"git lists no \.py file under .*ignored/gpt2 "
                                           r"\(1 on disk, so git ignores them all"):
        provenance.code_of(ignored)

    monkeypatch.setattr(provenance, "REPO", empty)
    provenance.code_identity.cache_clear()
    try:
        rc = train.main(["--device=cpu", "--cpu-threads=1", f"--data-dir={tmp_path}/data",
                         f"--results-dir={tmp_path}/results", "--run-name=blind"])
    finally:
        provenance.code_identity.cache_clear()  # the next caller hashes the real project
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: cannot tell which code a result is made from: there is "
                          "no .py file under ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_single_run_is_not_reported_under_new_code_or_data(tmp_path, corpus):
    project, env = setup(tmp_path, corpus)
    results = tmp_path / "results"
    rc, out = make(project, env)
    assert rc == 0 and "status   completed" in out, out
    (first,) = run_folders(results)
    recorded = json.loads((results / first / "provenance.json").read_text())
    assert set(recorded) == {"code", "data"} and recorded["code"]["files"][EDITED]
    summary = json.loads((results / first / "summary.json").read_text())
    assert summary["provenance"]["code"]["sources"] == recorded["code"]["sources"]

    edit_code(project)
    rc, out = make(project, env)
    assert rc == 2, out
    assert f"code: changed {EDITED}" in out and "IF_CHANGED=rerun" in out
    assert "IF_CHANGED=reuse" in out and "status   completed" not in out

    rc, out = make(project, env, IF_CHANGED="reuse")
    assert rc == 0 and "reported as --if-changed=reuse asks" in out, out
    rc, out = make(project, env, IF_CHANGED="rerun")
    assert rc == 0 and "set it aside" in out and "status   completed" in out, out
    assert run_folders(results) == [first, f"{first}.superseded-1"]
    again = json.loads((results / first / "provenance.json").read_text())
    assert again["code"]["sources"] != recorded["code"]["sources"]
    assert (results / f"{first}.superseded-1" / "summary.json").is_file()  # nothing lost

    new_corpus(tmp_path)
    rc, out = make(project, env)
    assert rc == 2 and "data: shakespeare-char was prepared again" in out, out


def test_matrix_cells_are_not_reused_under_new_code_or_data(tmp_path, corpus):
    project, env = setup(tmp_path, corpus, MATRIX)
    rc, out = make(project, env, "test-matrix")
    assert rc == 0, out
    folder = next((tmp_path / "results").glob("matrix-tiny-*"))
    cell = folder / "cells" / "adamw-none-seed1337"
    before = json.loads((cell / "summary.json").read_text())

    edit_code(project)
    rc, out = make(project, env, "test-matrix")
    assert rc != 0 and "adamw-none-seed1337" in out and f"changed {EDITED}" in out, out
    assert "IF_CHANGED=rerun" in out
    assert json.loads((cell / "summary.json").read_text()) == before  # nothing ran

    rc, out = make(project, env, "test-matrix", IF_CHANGED="rerun")
    assert rc == 0 and "training them again" in out, out
    assert (folder / "cells" / "adamw-none-seed1337.superseded-1" / "summary.json").is_file()
    after = json.loads((cell / "summary.json").read_text())
    assert after["provenance"]["code"]["sources"] != before["provenance"]["code"]["sources"]
    assert "src " + after["provenance"]["code"]["sources"] in (folder / "report.md").read_text()

    new_corpus(tmp_path)
    rc, out = make(project, env, "test-matrix")
    assert rc != 0 and "data: shakespeare-char was prepared again" in out, out


def test_a_bad_if_changed_is_refused_with_the_choices(monkeypatch):
    from gpt2.cli import environment as bridge
    from gpt2.errors import UsageError

    monkeypatch.setenv("IF_CHANGED", "overwrite")
    with pytest.raises(UsageError, match="use one of refuse, rerun, reuse"):
        bridge.if_changed()
    monkeypatch.setenv("IF_CHANGED", "rerun")
    assert bridge.if_changed() == "rerun"
