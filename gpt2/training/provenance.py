"""What a result was made from: the code and the data.

A run folder's ``provenance.json`` records, when the run starts:

    code   the kgpt sources that ran (a sha256 over every .py file under gpt2/, path
           and content, plus each file's own hash), the git commit and whether the
           tree had uncommitted changes, and the torch version. Git is asked only
           when the project folder is itself the top of a git checkout; otherwise
           (no git, or kgpt unpacked inside another repository, which may ignore it)
           the files are those on disk and commit and dirty are None, never another
           repository's. Finding no source file at all is an error, not a hash of
           nothing.
    data   the prepared dataset: the sha256 of its whole token stream (meta.json's
           tokens_sha256, "tokens"), the sha256 over its shards' sha256s (data_sha256,
           "sha256") and its token counts

Two results are comparable when their code ``sources`` hash, torch version and data
agree. Data is compared by its tokens, so re-cutting the same corpus into shards of
another size (CONFIG_SHARD_TOKENS) changes nothing; by its shards only where a
record predates the token hash. The commit alone is not the identity: a commit that only touches
docs leaves results valid, and an uncommitted edit does not. A run made under other
code or data is never reported or resumed as if it were current without the user
saying so (``--if-changed``, see :data:`IF_CHANGED`); ``changes`` says what differs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import subprocess
from pathlib import Path
from typing import Any

from gpt2 import REPO, storage
from gpt2.errors import StorageError

SOURCE_DIR = "gpt2"
FILE = "provenance.json"

# What a run does when its folder holds a result of other code or data:
#   refuse  stop and say what changed (exit 2); the default
#   rerun   set the old folder aside (renamed, nothing deleted) and train again
#   reuse   report or resume it anyway, recording the change in provenance.json
IF_CHANGED = ("refuse", "rerun", "reuse")


def _git(*args: str, root: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode(errors="replace") if out.returncode == 0 else None


def own_checkout(root: Path) -> bool:
    """Whether ``root`` is the top level of a git checkout of its own. A tree without
    its own .git inside another repository is not: git there answers for the other
    repository, which may ignore the whole tree (ls-files then lists nothing) and
    whose commit says nothing of this code."""
    top = _git("rev-parse", "--show-toplevel", root=root)
    if not top or not top.strip():
        return False
    try:
        return Path(top.strip()).resolve() == Path(root).resolve()
    except (OSError, RuntimeError):
        return False


def git_commit() -> str | None:
    """The commit of kgpt's own checkout, with "-dirty" after uncommitted changes; None
    outside one (a tree unpacked inside another repository has no commit of its own:
    provenance.own_checkout)."""
    if not own_checkout(REPO):
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _sources(root: Path, use_git: bool) -> list[str]:
    """source_files, git asked or not; never an empty list (StorageError: what was
    found, and what to do)."""
    if use_git:
        listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                      SOURCE_DIR, root=root)
    else:
        listed = None
    on_disk = {p.relative_to(root).as_posix() for p in (root / SOURCE_DIR).rglob("*.py")}
    names = on_disk if listed is None else {n for n in listed.split("\0") if n.endswith(".py")}
    found = sorted(n for n in names if (root / n).is_file())  # tracked but deleted: gone
    if not found:
        where = root / SOURCE_DIR
        if listed is None:
            what = f"there is no .py file under {where}"
        else:
            what = (f"git lists no .py file under {where} ({len(on_disk)} on disk, so "
                    "git ignores them all: see .gitignore and core.excludesFile)")
        raise StorageError(f"cannot tell which code a result is made from: {what}; run kgpt "
                           "from a complete copy of its sources (the gpt2/ package)")
    return found


def source_files(root: Path | None = None) -> list[str]:
    """The .py files under gpt2/ that make up the code, as paths relative to ``root``
    (the project, by default): what git tracks or would track (untracked but not
    ignored: a new module is code too) when ``root`` is the top of its own git
    checkout, else every such file on disk. Raises StorageError when there is none."""
    root = Path(REPO if root is None else root)
    return _sources(root, own_checkout(root))


def code_of(root: Path) -> dict[str, Any]:
    """The identity of the code under ``root``: its sources' hash, the commit and
    whether the tree has uncommitted changes (None unless ``root`` is the top of its
    own git checkout), and the torch version."""
    root = Path(root)
    use_git = own_checkout(root)
    files = {}
    whole = hashlib.sha256()
    for name in _sources(root, use_git):
        digest = hashlib.sha256((root / name).read_bytes()).hexdigest()
        files[name] = digest[:16]
        whole.update(f"{name}\0{digest}\n".encode())
    commit = _git("rev-parse", "HEAD", root=root) if use_git else None
    dirty = _git("status", "--porcelain", "--untracked-files=no", root=root) if use_git else None
    return {"sources": whole.hexdigest()[:16], "commit": commit.strip() if commit else None,
            "dirty": None if dirty is None else bool(dirty.strip()),
            "torch": torch_version(), "files": files}


def torch_version() -> str:
    """torch.__version__, read from the installed package's metadata (the same string)
    without importing torch: `make` on a finished run asks for this identity before it
    knows whether there is any training to do."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # (a torch without metadata)
        import torch

        return str(torch.__version__)


@functools.lru_cache(maxsize=1)
def code_identity() -> dict[str, Any]:
    """The identity of the code this process runs (computed once per process)."""
    return code_of(REPO)


def data_identity(data_dir: str | Path, dataset: str) -> dict[str, Any]:
    """The identity of the prepared data a run reads (from its meta.json)."""
    from gpt2.data.loader import read_meta  # (numpy: `make help` imports this module)

    meta = read_meta(data_dir, dataset)
    identity = {"dataset": dataset, "sha256": meta["data_sha256"][:16],
                "train_tokens": meta["train_tokens"], "val_tokens": meta["val_tokens"]}
    if meta.get("tokens_sha256"):  # absent in data prepared by an older kgpt
        identity["tokens"] = meta["tokens_sha256"][:16]
    return identity


def _data_key(data: dict[str, Any], other: dict[str, Any]) -> tuple:
    """What identifies ``data`` when compared with ``other``: the tokens when both
    records have them, else the shards."""
    if data.get("tokens") and other.get("tokens"):
        return data.get("dataset"), "tokens", data["tokens"]
    return data.get("dataset"), "shards", data.get("sha256")


def identity(data_dir: str | Path, dataset: str,
             parent: dict[str, Any] | None = None) -> dict[str, Any]:
    """The code and data a run starts with, and the run it starts from, if any
    (gpt2/training/trained.py parent_identity: CONFIG_EXTEND_FROM, or CONFIG_INIT_FROM
    naming a run folder), whose checkpoint is part of what the result is made of."""
    record = {"code": code_identity(), "data": data_identity(data_dir, dataset)}
    if parent:
        record["parent"] = parent
    return record


def short(code: dict[str, Any] | None) -> str:
    """One-line form of a code identity: "src 1a2b3c4d5e6f7a8b @ 3af0aff1c2 (dirty)"."""
    if not code:
        return "unrecorded"
    text = f"src {code.get('sources')}"
    if code.get("commit"):
        text += f" @ {code['commit'][:10]}" + (" (dirty)" if code.get("dirty") else "")
    return text


def key(record: dict[str, Any] | None) -> tuple | None:
    """What must agree for two results to be comparable (None: nothing recorded)."""
    if not record or "code" not in record or "data" not in record:
        return None
    data = record["data"]
    return (record["code"].get("sources"), record["code"].get("torch"),
            *_data_key(data, data), _start(record))


def _start(record: dict[str, Any]) -> str | None:
    """The checkpoint a result was made from (its parent's), or None. A run branched
    from a longer one at its cooldown (gpt2/training/schedule.py) is the run trained
    from step 0: its parent's checkpoint is not part of what it is."""
    parent = record.get("parent") or {}
    return parent.get("sha256") if parent.get("how") != "branches" else None


def changes(recorded: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """What differs between a run's recorded provenance and the current one, one
    line each; [] when they agree."""
    if key(recorded) is None:
        return ["it records no code or data identity (made by a kgpt version before "
                "provenance.json)"]
    out = []
    old, new = recorded["code"], current["code"]
    if old.get("sources") != new["sources"]:
        before, after = old.get("files") or {}, new["files"]
        edited = [n for n in after if n in before and before[n] != after[n]]
        added = [n for n in after if n not in before]
        removed = [n for n in before if n not in after]
        what = ([f"changed {', '.join(edited)}"] if edited else []) + (
            [f"added {', '.join(added)}"] if added else []) + (
            [f"removed {', '.join(removed)}"] if removed else [])
        out.append(f"code: {'; '.join(what) or 'sources differ'} (then {short(old)}, "
                   f"now {short(new)})")
    if old.get("torch") != new["torch"]:
        out.append(f"torch: then {old.get('torch')}, now {new['torch']}")
    old_d, new_d = recorded["data"], current["data"]
    if _data_key(old_d, new_d) != _data_key(new_d, old_d):
        _, what, then = _data_key(old_d, new_d)
        now = _data_key(new_d, old_d)[2]
        out.append(f"data: {new_d['dataset']} was prepared again with other content ({what} "
                   f"then {then}, {old_d.get('train_tokens')} train tokens; now "
                   f"{now}, {new_d['train_tokens']} train tokens)")
    old_p, new_p = recorded.get("parent") or {}, current.get("parent") or {}
    if _start(recorded) != _start(current):
        out.append(f"parent run: {new_p.get('path') or old_p.get('path')} then had checkpoint "
                   f"{str(old_p.get('sha256'))[:16]} (step {old_p.get('step')}), now "
                   f"{str(new_p.get('sha256'))[:16]} (step {new_p.get('step')})")
    return out


def read(folder: Path) -> dict[str, Any] | None:
    """A run's provenance.json; None when it has none that can be read, or one of
    another shape (its code, data and parent records must be objects, its history a
    list of them): an unknown origin, never a traceback."""
    record = storage.read_json_object(Path(folder) / FILE)
    if record is None:
        return None
    if any(not isinstance(record.get(k), dict) for k in ("code", "data") if k in record) \
            or not isinstance(record.get("parent", {}) or {}, dict) \
            or not isinstance(record.get("history", []), list) \
            or not all(isinstance(h, dict) for h in record.get("history", [])):
        return None
    return record


def with_history(recorded: dict[str, Any] | None, current: dict[str, Any]) -> dict[str, Any]:
    """The provenance to write when a run goes on under ``current``: the current
    identity, and every earlier one it ran under, oldest first."""
    history = list((recorded or {}).get("history", []))
    if recorded is not None and key(recorded) != key(current):
        history.append({**{k: recorded.get(k) for k in ("code", "data")},
                        **({"parent": recorded["parent"]} if "parent" in recorded else {})})
    return {**current, "history": history} if history else dict(current)
