"""How kgpt's processes outlive what is above them (docs/reliability.md).

* ``start``: a child in a session of its own that gets SIGTERM when its parent
  dies, however it dies (``kill -9`` of make's process group included), so a
  trainer, a data preparation or a matrix cell saves its work and exits instead of
  running on unsupervised, holding its folder's lock.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from typing import Any


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

