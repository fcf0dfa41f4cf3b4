"""Files that cannot be written: a full disk, a read-only or someone else's folder.

These are not bugs, so they must not end a command with a traceback. Every place
that writes a file kgpt needs (checkpoints, shards, meta.json, the run folder's
records) wraps the write in :func:`writing`, which turns such an error into a
:class:`StorageError` naming the file and what to do; each entry point prints it as
one ``error:`` line and exits with status 2. Whatever was written completely before
stays: a rerun of the same command resumes from it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

from gpt2.config.names import symbol
from gpt2.errors import StorageError

RESULTS_SETTING = symbol("results_dir")  # where to go instead when a folder refuses writes
# The storage is full: nothing is wrong with the command, it needs room.
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
# The storage refuses the write: a read-only mount, a folder of another user.
REFUSED = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def explain(e: OSError, path: str | os.PathLike, setting: str | None = None) -> StorageError | None:
    """The StorageError for ``e`` raised while writing ``path``, or None when ``e`` is
    not about the storage (a bug, which keeps its traceback). ``setting``: the
    Kconfig symbol that moves the folder elsewhere."""
    if e.errno in FULL:
        what = "disk full" if e.errno == errno.ENOSPC else "disk quota exceeded"
        return StorageError(f"{what} while writing {path}: free space and run the same "
                            "command again to resume")
    if e.errno in REFUSED:
        # Named by the file meant, not e.filename: that may be a temporary name.
        elsewhere = f", or set {setting} to a folder you can write" if setting else ""
        return StorageError(f"cannot write {path} ({e.strerror}): make {Path(path).parent} "
                            f"writable{elsewhere}, then run the same command again")
    return None


@contextlib.contextmanager
def writing(path: str | os.PathLike, setting: str | None = None,
            partial: str | os.PathLike | None = None) -> Iterator[None]:
    """Raise a StorageError, not an OSError, when the storage refuses a write of
    ``path`` inside the block. ``partial``: a temporary file the block may leave
    half-written, removed when it fails (on a full disk, its room is needed)."""
    try:
        yield
    except BaseException as e:
        if partial is not None:
            with contextlib.suppress(OSError):  # a read-only folder: nothing was written
                Path(partial).unlink(missing_ok=True)
        problem = explain(e, path, setting) if isinstance(e, OSError) else None
        if problem is None:
            raise
        raise problem from None


# ---- durable writes ------------------------------------------------------------------

def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (the folder's entry is what names the file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of it. A kill mid-write
    leaves the old one; the fsyncs (the bytes before the rename, the folder after it)
    make that hold after a power cut too, where the rename could otherwise reach the
    disk before the bytes and leave an empty or cut file under the final name. A
    full disk or a folder that refuses writes is a StorageError naming ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with writing(path, RESULTS_SETTING, partial=tmp):
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    """:func:`write_bytes_atomic` of ``text`` in UTF-8."""
    write_bytes_atomic(path, text.encode())


def save_figure(fig, path: Path, **savefig: Any) -> None:
    """A matplotlib figure as a file, written as :func:`write_bytes_atomic` writes
    (the format from ``path``'s suffix)."""
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lstrip(".") or "png", **savefig)
    write_bytes_atomic(path, buf.getvalue())


def make_folder(path: Path, setting: str | None = RESULTS_SETTING) -> None:
    """``path`` and the folders above it, as mkdir -p; a folder that refuses writes
    or a path through a file is a StorageError naming it."""
    try:
        with writing(path, setting):
            path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise StorageError(f"cannot make the folder {path}: a file is in the way (it or a "
                           "folder above it is a file)") from None


def replace_folder(staged: Path, dest: Path) -> None:
    """Put the complete folder ``staged`` at ``dest`` (beside it, on the same
    filesystem) in one step, and remove what ``dest`` held. A missing or empty
    ``dest`` is replaced by rename(2); a full one is swapped with ``staged``
    (renameat2's RENAME_EXCHANGE), so a reader or a kill sees the old folder or the
    new one, never a mix, and the old one is then removed."""
    with writing(dest, RESULTS_SETTING):
        try:
            os.rename(staged, dest)  # (onto a missing or empty folder)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            _exchange(staged, dest)
            shutil.rmtree(staged)
        fsync_dir(dest.parent)


def _exchange(a: Path, b: Path) -> None:
    """Swap two folders' names atomically; where the C library has no renameat2
    (not Linux), by two renames."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd, rename_exchange = -100, 2
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL):  # (a filesystem without exchange)
            raise OSError(err, os.strerror(err), str(b))
    aside = b.with_name(f".{b.name}.{os.getpid()}.old")
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def point_link(link: Path, target: str) -> None:
    """Make ``link`` a symlink to ``target`` (a name beside it, so the folder can
    move), replacing any old link in one step. A file or folder by that name is the
    user's: it is refused (StorageError), never replaced."""
    if link.is_symlink() and os.readlink(link) == target:
        return  # nothing to write (a read-only folder can still be reported)
    if link.exists() and not link.is_symlink():
        raise StorageError(f"{link} is a {'folder' if link.is_dir() else 'file'}, not "
                                   "the link kgpt keeps there, so it is left alone: move it "
                                   "away (or rename it) for kgpt to point it at the newest run")
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    with writing(link, RESULTS_SETTING, partial=tmp):
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)
