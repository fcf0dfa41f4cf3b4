"""run_child: the one way a make target starts an entry point (gpt2.train,
scripts.bench, ...): as a module of this checkout, in a session of its own, with
the stop signals passed on to it."""

from __future__ import annotations

import shlex
import sys

from gpt2 import REPO, processes
from gpt2.cli.environment import dry_run, verbose


def run_child(label: str, module: str, argv: list[str], dry_run_flag: str | None = None) -> int:
    """Run ``python -m <module> <argv>`` from the checkout, so it is this checkout's
    code that runs whichever one the Python's editable install points at; returns
    its exit status.

    DRY_RUN=1 prints the command as ``gpt2/generate.py <argv>`` and runs nothing, or,
    for an entry point with a dry run of its own (``dry_run_flag``), runs that.
    Otherwise ``  LABEL   file.py (N args)`` goes to stderr first (V=1: the whole
    command), so `make generate > out.txt` captures only the child's text.

    The child runs in a session of its own and gets each stop signal we get
    (SIGINT, SIGTERM, SIGHUP, SIGUSR1). A Ctrl-C or a closed terminal reaches make
    and this process, not the child: the child then gets exactly one signal per
    Ctrl-C from here (training saves at the first and aborts at a second), and is
    never killed while it writes its checkpoint, as subprocess.call would do to it
    on KeyboardInterrupt. If this process is killed outright (kill -9 of make's
    process group), the child gets SIGTERM from the kernel (gpt2/processes.py) and
    saves the same way. A child killed by signal N gives 128+N, as a shell says."""
    if dry_run():
        if dry_run_flag is None:
            print(shlex.join([module.replace(".", "/") + ".py", *argv]), flush=True)
            return 0
        argv = [*argv, dry_run_flag]
    cmd = [sys.executable, "-m", module, *argv]
    print(shlex.join(cmd) if verbose()
          else f"  {label:<8}{module.rpartition('.')[2]}.py ({len(argv)} args)",
          file=sys.stderr, flush=True)
    proc = processes.start(cmd, cwd=REPO)

    def forward(signum, frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    with processes.stop_signals_handled_by(forward):
        rc = proc.wait()
    return 128 - rc if rc < 0 else rc
