"""Start a multi-process run through torchrun, and report it like a single one.

``train.py --nproc-per-node N`` (or ``make NGPU=N``) re-runs itself under
``python -m torch.distributed.run --standalone --nproc_per_node N``; set
TORCHRUN_ARGS to torchrun's rendezvous flags (``--nnodes 2 --node_rank 0
--rdzv_backend c10d --rdzv_endpoint host:29500``) to join several machines instead
of ``--standalone``.

The launcher stays between the user and torchrun for two things:

* signals: torchrun runs in its own session, so a Ctrl-C (or a hangup, or any stop
  signal) reaches only the launcher, which sends one SIGTERM to each worker. The
  workers agree on a step, save there and exit cleanly, and torchrun ends without
  calling anything a crash. If the launcher itself is killed (kill -9), torchrun
  gets SIGTERM (gpt2/processes.py) and passes it to the workers, which save the
  same way.
* the exit status: a worker cannot say "interrupted" through torchrun (any non-zero
  exit is a failure there), so the launcher reads the run's summary.json, the
  completion marker, and exits 0 (completed), 130 (interrupted) or non-zero.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from pathlib import Path

from gpt2 import processes
from gpt2 import run_folder
from gpt2.run_folder import COMPLETED, FAILED, INTERRUPTED, read_summary
from gpt2.errors import EXIT_INTERRUPTED, EXIT_NONFINITE, EXIT_OUT_OF_MEMORY

def under_torchrun(environ=os.environ) -> bool:
    """This process is one of torchrun's workers."""
    return "TORCHELASTIC_RUN_ID" in environ or "LOCAL_RANK" in environ


def torchrun_command(script: str, argv: list[str], nproc: int,
                     environ=os.environ) -> list[str]:
    rendezvous = shlex.split(environ.get("TORCHRUN_ARGS", "")) or ["--standalone"]
    return [sys.executable, "-m", "torch.distributed.run", *rendezvous,
            f"--nproc_per_node={nproc}", script, *argv]


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def launch(script: str, argv: list[str], nproc: int, folder: Path) -> int:
    cmd = torchrun_command(script, argv, nproc)
    print(f"launching {nproc} processes: {shlex.join(cmd[1:4])} ...", flush=True)
    started = time.time()
    proc = processes.start(cmd)
    forwarded = False

    def forward(signum, frame):
        nonlocal forwarded
        if forwarded:
            return
        forwarded = True
        workers = _children(proc.pid) or [proc.pid]
        print(f"\n{signal.Signals(signum).name} received: asking {len(workers)} processes to "
              "save a checkpoint and stop", flush=True)
        for pid in workers:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    with processes.stop_signals_handled_by(forward):
        rc = proc.wait()
    summary = read_summary(folder)  # (None: none, or unreadable, which says nothing)
    summary_path = folder / run_folder.SUMMARY
    # The completion marker, not torchrun's exit status, says how the run ended; a
    # summary older than this launch (a crash before any was written) says nothing,
    # unless the workers found the run already complete (they exit 0 and write none).
    fresh = summary_path.is_file() and summary_path.stat().st_mtime >= started
    complete = rc == 0 and run_folder.completed(folder)
    status = summary.status if summary and (fresh or complete) else None
    if status in (COMPLETED, INTERRUPTED):
        if rc:  # e.g. a worker aborted while tearing down, after the run was saved
            print(f"note: torchrun exited with status {rc} after the run had "
                  f"{status} and saved everything (summary.json); judging by that",
                  file=sys.stderr, flush=True)
        return 0 if status == COMPLETED else EXIT_INTERRUPTED
    if status == FAILED and summary.exit_status in (EXIT_NONFINITE, EXIT_OUT_OF_MEMORY):
        return summary.exit_status  # the run said what happened and what to try
    print(f"error: the run failed in one of its {nproc} processes (torchrun exit status "
          f"{rc}); the messages above say which and why. Its last checkpoint is kept: run the "
          "same command again to resume from it.", file=sys.stderr, flush=True)
    return rc or 1
