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
import json
import os
import secrets
import stat
import shutil
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from gpt2.names import symbol
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


# ---- reading what kgpt wrote -------------------------------------------------------------

# The most a reader takes in (a run's metrics, a plan, a HellaSwag file are far
# smaller), and the most a small JSON record may be: a file past it is read as damaged,
# not loaded (a 3 GB summary.json of holes once cost `make results` 4 GB of memory).
READ_LIMIT = 1 << 30
RECORD_LIMIT = 16 << 20


def read_regular(path: Path, follow: bool = True, limit: int = READ_LIMIT) -> bytes | None:
    """The bytes of ``path`` when it is a regular file that can be read; None when it is
    missing, unreadable, larger than ``limit`` bytes, or something else by that name. A
    FIFO planted under a file's name (in a shared results folder) would otherwise block
    the reader forever: the file is opened without waiting (O_NONBLOCK) and checked
    before it is read. ``follow=False``: a link under that name is not followed either
    (None), for what is published from a run's folder (its notes, samples, report),
    where a link to a file elsewhere would put that file on a page."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)  # (a file that grows meanwhile is cut here, and refused)
        return data if len(data) <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def read_text(path: Path, follow: bool = True) -> str:
    """A text file kgpt wrote (samples, a log) as text, undecodable bytes replaced; ""
    when it is missing or cannot be read (read_regular)."""
    return (read_regular(path, follow) or b"").decode(errors="replace")


def open_append(path: Path, setting: str | None = RESULTS_SETTING, binary: bool = False):
    """``path`` opened for appending (created if missing), as a log or a record kgpt
    adds to. Only a regular file: a link planted under the name is not followed (the
    appends would land in the file it points to) and a FIFO is not waited on; either
    is a StorageError saying so, as a full disk or a read-only folder is."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        with writing(path, setting):
            fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # a link, a FIFO, a folder
            raise StorageError(f"{path} is not a regular file (a link, a folder or a pipe), so "
                               "kgpt does not write to it: move it away, then run the same "
                               "command again") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StorageError(f"{path} is not a regular file (a pipe or a device), so kgpt does "
                           "not write to it: move it away, then run the same command again")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab" if binary else "a")


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when there is none: missing, unreadable, not a
    regular file, not JSON (or not UTF-8), nested past Python's recursion limit, or
    some other JSON value. Every small JSON file kgpt reads back (summaries, status,
    records) is read here, and its caller says what None means for it; one past
    RECORD_LIMIT is none too."""
    data = read_regular(path, limit=RECORD_LIMIT)
    if data is None:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # ValueError: bad JSON or bad UTF-8
        return None
    return value if isinstance(value, dict) else None


# ---- durable writes ------------------------------------------------------------------

def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (the folder's entry is what names the file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_temp(path: Path, form: str = ".{name}.{tag}.tmp") -> tuple[BinaryIO, Path]:
    """A new, empty file beside ``path`` for writing it, named ``form`` (``name``:
    path's name, ``tag``: random). It is created exclusively (O_EXCL, O_NOFOLLOW): a
    file or a link planted under a predictable temporary name in a shared folder
    would otherwise be written through, overwriting the file it points to. Its mode
    is 0666 less the umask, as any new file's."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = path.with_name(form.format(name=path.name, tag=secrets.token_hex(6)))
        try:
            return os.fdopen(os.open(tmp, flags, 0o666), "wb"), tmp
        except FileExistsError:
            continue  # (someone's file by that name: another name)


def write_durably(path: Path, write: Callable[[BinaryIO], Any],
                  setting: str | None = None, form: str = ".{name}.{tag}.tmp") -> None:
    """Write ``path`` through ``write(file)``; readers see the old file or the new one,
    never half of it. The bytes go to a new temporary file (open_temp) that is
    fsynced, then renamed over ``path``, then the folder is fsynced: a kill leaves
    the old file, and so does a power cut, where the rename could otherwise reach the
    disk before the bytes and leave an empty or cut file under the final name. A
    full disk or a folder that refuses writes is a StorageError naming ``path``
    (``setting``: the symbol that moves the folder), with the temporary file gone.
    A link by that name is not kgpt's file: it is refused, never replaced (refuse_link)."""
    refuse_link(path, setting, what="file")
    if path.exists() and not path.is_file():
        raise StorageError(f"{path} is a folder or a pipe, not a file kgpt writes, so it is "
                           "left alone: move it away, then run the same command again")
    with writing(path, setting):
        f, tmp = open_temp(path, form)
        try:
            with f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        fsync_dir(path.parent)


def write_bytes_atomic(path: Path, data: bytes, setting: str | None = RESULTS_SETTING) -> None:
    """``data`` as the file ``path``, durably (write_durably)."""
    write_durably(path, lambda f: f.write(data), setting)


def write_text_atomic(path: Path, text: str) -> None:
    """:func:`write_bytes_atomic` of ``text`` in UTF-8. A character UTF-8 has no bytes for
    (a lone surrogate: an undecodable byte of a folder's name, an escape in a JSON
    string read back) is written as its escape, never a UnicodeEncodeError."""
    write_bytes_atomic(path, text.encode(errors="backslashreplace"))


def save_figure(fig, path: Path, **savefig: Any) -> None:
    """A matplotlib figure as a file, written as :func:`write_bytes_atomic` writes
    (the format from ``path``'s suffix)."""
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lstrip(".") or "png", **savefig)
    write_bytes_atomic(path, buf.getvalue())


def make_folder(path: Path, setting: str | None = RESULTS_SETTING) -> None:
    """``path`` and the folders above it, as mkdir -p; a folder that refuses writes
    or a path through a file is a StorageError naming it. Only for a folder the user
    names (CONFIG_RESULTS_DIR, CONFIG_DATA_DIR, an --out or --json path), which may be
    a link of theirs; every folder kgpt makes below it is made with own_folder
    (tests/test_architecture.py lists the callers)."""
    try:
        with writing(path, setting):
            path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise StorageError(f"cannot make the folder {path}: a file is in the way (it or a "
                           "folder above it is a file)") from None


def own_folder(path: Path, setting: str | None = RESULTS_SETTING) -> Path:
    """Make ``path`` (make_folder) for kgpt to write into and delete from: it must be
    a folder itself, not a link to one, and this user's. A link (planted in a shared folder, or made
    to move a run's checkpoints elsewhere) would have kgpt write, replace and prune
    files in a folder it does not own: StorageError saying so."""
    refuse_link(path, setting)
    make_folder(path, setting)
    owner = path.stat().st_uid
    if owner != os.geteuid():
        # (in a shared results folder, one made first under kgpt's predictable name by
        # someone else, and left writable, would receive this user's files)
        raise StorageError(f"{path} belongs to another user (uid {owner}), so kgpt does not "
                           f"write into it: set {setting or RESULTS_SETTING} to a folder of "
                           "your own, or ask its owner to move it")
    return path


def refuse_link(path: Path, setting: str | None = RESULTS_SETTING, what: str = "folder") -> None:
    """StorageError when ``path``, a folder kgpt keeps (or a ``what="file"`` it
    writes), is a link. The one rule for every writer: kgpt never writes through a
    link, nor replaces one, where it makes a folder or a file (see own_folder,
    write_durably, open_append)."""
    if path.is_symlink():
        raise StorageError(f"{path} is a link (to {os.readlink(path)}), not a {what} of its "
                           "own: kgpt writes into and deletes from the folders it keeps, so it "
                           "neither follows nor replaces links there. Remove the link (to keep "
                           f"results elsewhere, set {setting or RESULTS_SETTING})")


def new_folder(path: Path) -> Path:
    """A new, empty folder beside ``path`` (``.<name>.<random>``), made by this call
    alone (mkdir fails on any folder, file or link by that name, planted or left by a
    killed command: another name is drawn), with the umask's mode. The caller may
    delete it: nothing else was ever in it."""
    while True:
        folder = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
        try:
            with writing(folder, RESULTS_SETTING):
                os.mkdir(folder)
            return folder
        except FileExistsError:
            continue


def replace_folder(staged: Path, dest: Path) -> None:
    """Put the complete folder ``staged`` at ``dest`` (beside it, on the same
    filesystem) in one step, and remove what ``dest`` held. A missing or empty
    ``dest`` is replaced by rename(2); a full one is swapped with ``staged``
    (renameat2's RENAME_EXCHANGE), so a reader or a kill sees the old folder or the
    new one, never a mix, and the old one is then removed."""
    with writing(dest, RESULTS_SETTING):
        try:
            try:
                os.rename(staged, dest)  # (onto a missing or empty folder)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                _exchange(staged, dest)
                shutil.rmtree(staged)
        except OSError as e:
            if e.errno not in (errno.EBUSY, errno.EXDEV, errno.EINVAL):
                raise
            raise StorageError(f"cannot replace {dest} in one step ({e.strerror}: a mount "
                               "point?): name a new folder") from None
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
    with writing(link, RESULTS_SETTING):
        while True:  # (a random name, made by symlink(2) alone: nothing planted is removed)
            tmp = link.with_name(f".{link.name}.{secrets.token_hex(6)}")
            try:
                tmp.symlink_to(target)
                break
            except FileExistsError:
                continue
        try:
            os.replace(tmp, link)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
