"""How kgpt's processes outlive what is above them: the process that started them,
the terminal, and each other (docs/reliability.md).

* ``start``: a child in a session of its own that gets SIGTERM when its parent
  dies, however it dies (``kill -9`` of make's process group included), so a
  trainer, a data preparation or a matrix cell saves its work and exits instead of
  running on unsupervised, holding its folder's lock.
* ``stop_signals_handled_by``: the one list of signals that mean "save and stop":
  SIGINT (Ctrl-C), SIGTERM, SIGHUP (the terminal closed) and SIGUSR1 (batch
  systems' "time is nearly up"). A hangup ignored on entry (``nohup``) stays ignored.
* ``survive_lost_terminal``: writes to stdout/stderr that fail because the
  terminal closed (EIO) or the reader of a pipe left (EPIPE) go to /dev/null from
  then on, instead of crashing the process. The run folder keeps the metrics and
  the summary, so nothing is lost.
* ``lock_folder``: an exclusive lock on a folder itself, not on a file in it, so
  deleting a file cannot let a second process in.
* ``terminal_safe``: text with its control characters shown, not sent. Much of what
  kgpt prints comes from outside it (a prompt, a sample, a path, a record's error, a
  value a user typed), and an escape sequence printed raw would drive the user's
  terminal (clear it, retitle it, make a link, hide a line behind a carriage return).
  ``survive_lost_terminal`` puts every write to stdout and stderr through it, so each
  entry point shows such text instead of obeying it; kgpt's own progress bar writes
  to ``raw_stream`` (its carriage returns are its own).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)

# C0 and C1 control characters but tab and newline, DEL; Unicode's bidirectional marks,
# embeddings, overrides and isolates (which reorder what follows), the zero-width
# characters and the line and paragraph separators; and surrogates (a file name's
# undecodable bytes, an escape in a JSON string: 0x9b, the 8-bit CSI, is one).
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e"
                     "\u2060-\u206f\ufeff\ud800-\udfff]")


def terminal_safe(text: str) -> str:
    """``text`` for a terminal: each control character but tab and newline written as
    its escape (ESC as \\x1b, U+202E as \\u202e), so what it would do is shown instead."""
    return CONTROL.sub(_shown, text)


def _shown(match: re.Match) -> str:
    code = ord(match.group())
    if 0xdc80 <= code <= 0xdcff:  # (an undecodable byte, as os.fsdecode keeps it)
        return f"\\x{code - 0xdc00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


# ---- children bound to their parent ---------------------------------------------------

def _find_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up here, not in the child: a forked child must not import anything.
_PRCTL = _find_prctl()
PR_SET_PDEATHSIG = 1


def _bind_to_parent(parent: int) -> None:
    """In the child, before exec: a session of its own (a terminal's Ctrl-C reaches
    only the parent, which passes on one signal), and SIGTERM when the parent dies."""
    os.setsid()
    if _PRCTL is None:
        return  # not Linux: the child finishes its work on its own
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before prctl took effect: don't start
        os._exit(128 + signal.SIGTERM)


def start(cmd: list[str], **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **popen)`` in a new session, sent SIGTERM when this
    process dies (Linux's PR_SET_PDEATHSIG; kgpt's entry points checkpoint, or keep
    their finished shards, and exit on it).

    Call it from the main thread: Linux sends the signal when the *thread* that
    started the child ends."""
    return subprocess.Popen(cmd, preexec_fn=functools.partial(_bind_to_parent, os.getpid()),
                            **popen)


# ---- stop signals ------------------------------------------------------------------------

def on_stop_signals(handler: Callable, signals: tuple[int, ...] = STOP_SIGNALS) -> dict:
    """Install ``handler`` for the stop signals; returns the old handlers, for
    ``restore``. Off the main thread nothing is installed (Python allows it only
    there), and a SIGHUP that is ignored (``nohup``) is left ignored."""
    old = {}
    for sig in signals:
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        try:
            old[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass
    return old


def restore(old: dict) -> None:
    for sig, handler in old.items():
        signal.signal(sig, handler)


@contextlib.contextmanager
def stop_signals_handled_by(handler: Callable, signals: tuple[int, ...] = STOP_SIGNALS):
    """``with stop_signals_handled_by(handler): ...``: the one way kgpt installs a
    handler for the stop signals (``on_stop_signals``) and puts the old ones back,
    however the block is left."""
    old = on_stop_signals(handler, signals)
    try:
        yield
    finally:
        restore(old)


@contextlib.contextmanager
def stop_signals_deferred(signals: tuple[int, ...] = STOP_SIGNALS):
    """Hold the stop signals while a short block runs (a record being written): one
    that arrives meanwhile is sent again when the block is done, to whatever
    handler was there before (the default one ends the process then)."""
    received: list[int] = []
    old = on_stop_signals(lambda signum, frame: received.append(signum), signals)
    try:
        yield
    finally:
        restore(old)
        for sig in dict.fromkeys(received):
            os.kill(os.getpid(), sig)


# ---- output that survives a lost terminal -------------------------------------------------

_GONE = (errno.EIO, errno.EPIPE)  # the terminal closed / the reader of the pipe left


class _SurvivingStream:
    """A text stream whose writes never fail because nobody reads them any more, and
    whose text reaches the terminal with its control characters shown (terminal_safe)."""

    def __init__(self, stream):
        self._stream = stream

    def _survive(self, op: str, *args):
        try:
            return getattr(self._stream, op)(*args)
        except OSError as e:
            if e.errno not in _GONE:
                raise
        self._to_devnull()
        with contextlib.suppress(OSError, ValueError):
            return getattr(self._stream, op)(*args)

    def _to_devnull(self) -> None:
        """Point the stream's descriptor at /dev/null, so text still buffered and
        child processes started later write there too."""
        try:
            fd = self._stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        except (AttributeError, OSError, ValueError):  # no descriptor (a test's capture)
            self._stream = open(os.devnull, "w")

    def write(self, text: str) -> int:
        self._survive("write", terminal_safe(text))
        return len(text)  # (what the caller gave: the escapes may be longer)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._survive("flush")

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def survive_lost_terminal() -> None:
    """From now on, stdout and stderr write to /dev/null once their terminal or pipe
    is gone (EIO, EPIPE) instead of raising, and show control characters rather than
    send them (terminal_safe). Call it first thing in an entry point."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _SurvivingStream):
            setattr(sys, name, _SurvivingStream(stream))


def raw_stream(stream):
    """The stream under survive_lost_terminal's guard, for kgpt's own text that needs
    its control characters (a progress bar's carriage returns)."""
    return stream._stream if isinstance(stream, _SurvivingStream) else stream


# ---- folder locks -------------------------------------------------------------------------

def folder_locked(path: Path) -> bool:
    """Whether a process holds :func:`lock_folder`'s lock on ``path`` (a run being
    trained), asked without taking the lock: trying it would make a run that starts
    in that instant find its folder busy. Read from /proc/locks (Linux); False where
    that cannot tell."""
    try:
        st = os.stat(path)
        text = Path("/proc/locks").read_text()
    except OSError:
        return False
    lock_file = Path(path) / ".lock"  # the fallback on filesystems without folder locks
    device_of = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"  # as the kernel writes it
    inodes = {st.st_ino}
    with contextlib.suppress(OSError):
        inodes.add(lock_file.stat().st_ino)
    for line in text.splitlines():
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 5940 fe:00:2146329 0 EOF" (a "->" marks a waiter)
        if len(parts) >= 6 and parts[1] == "FLOCK" and "->" not in parts:
            device, _, inode = parts[5].rpartition(":")
            if inode.isdigit() and int(inode) in inodes and device == device_of:
                return True
    return False


def lock_folder(path: Path, wait_s: float = 0.0,
                waiting: Callable[[], None] | None = None) -> int | None:
    """Lock the folder ``path`` (which must exist) exclusively, for as long as the
    returned descriptor is open in this process or a child it is passed to; the
    kernel drops the lock when they die, however they die. None when another
    process still holds it after ``wait_s`` seconds (math.inf: as long as it
    takes); ``waiting()`` is called once when the wait begins. Signal handlers run
    while it waits.

    The folder's own descriptor is locked, not a lock file in it: a deleted
    ``.lock`` would let a second process lock a new file of that name. A filesystem
    that cannot lock a folder (NFS emulates flock with byte-range locks, which need
    a file open for writing) gets a ``.lock`` file in it instead."""
    fd, fallback = os.open(path, os.O_RDONLY | os.O_DIRECTORY), False
    deadline, told = time.monotonic() + wait_s, False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                pass
            except OSError as e:
                if fallback or e.errno not in (errno.EBADF, errno.EINVAL, errno.ENOLCK,
                                               errno.EOPNOTSUPP):
                    raise
                fallback = True
                os.close(fd)
                fd = -1
                fd = os.open(Path(path) / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
                continue
            if time.monotonic() >= deadline:
                break
            if waiting is not None and not told:
                waiting()
                told = True
            time.sleep(0.2)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    os.close(fd)
    return None
