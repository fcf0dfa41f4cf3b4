#!/usr/bin/env python3
"""A local single-node Slurm cluster, for testing kgpt's Slurm support against the real thing.

    python -m scripts.slurm_cluster start  [--dir DIR]   # as root; idempotent
    python -m scripts.slurm_cluster status [--dir DIR]   # exit 0 when up, 1 when not
    python -m scripts.slurm_cluster stop   [--dir DIR]   # kills what start started
    eval "$(python -m scripts.slurm_cluster env [--dir DIR])"   # then sbatch, squeue, ...

It needs Debian's packages slurmctld, slurmd, slurm-client and munge (Slurm 22.05); it does
not install them, it names the missing ones and the apt-get line. The daemons run directly
(no systemd), as root, and everything they keep is inside the state directory (default
/tmp/kgpt-slurm): slurm.conf, the munge key and seed, pid and log files, the
controller's saved state and slurmd's spool. Nothing under /etc is written.

- munge: a private munged (pid and log file in the state directory, its socket in
  /tmp/kgpt-munge-<hash of the state directory>/ since munged wants every folder above its
  socket searchable by all) with
  its own key, made by mungekey in the state directory and owned by root as munged requires
  when it runs as root (/etc/munge/munge.key belongs to the munge user). slurm.conf's
  AuthInfo points Slurm at that socket, so this cluster neither needs nor disturbs a system
  munged, and `stop` stops the munged it started.
- slurm.conf: this host (`hostname -s`) is the controller and the one node, with the CPUs
  and RealMemory `slurmd -C` reports; one partition `debug` (Default, MaxTime=INFINITE);
  proctrack/linuxproc and task/none (no cgroups needed); select/cons_tres with
  CR_Core_Memory and DefMemPerCPU = memory / CPUs, so jobs that ask for nothing share the
  node; ReturnToService=2, MinJobAge=2 (finished jobs leave squeue within seconds),
  JobRequeue=1. The controller's and slurmd's ports are the first free pair from 6817 up,
  so a second cluster (the tests' one beside a user's) can run on the same host.
- Accounting: there is no slurmdbd, so `sacct` does not work
  (AccountingStorageType=accounting_storage/none). Job state comes from squeue and
  `scontrol show job` while the job is known (MinJobAge seconds after it ends), and from the
  completion log: JobCompType=jobcomp/filetxt writes one line per finished job
  (JobId=, JobState=COMPLETED|FAILED|CANCELLED|..., ExitCode=, ...) to jobcomp.log in the
  state directory. A requeued job leaves a line for the run that was requeued (with
  JobState=PENDING) as well as one for its end.
- Requeue: `scontrol requeue JOB` sends the batch step SIGTERM (SIGKILL KillWait=5 s later)
  and puts the job back in the queue with SLURM_RESTART_COUNT one higher, but Slurm holds a
  requeued job back (Reason=BeginTime) until the job credential has expired: 120 s by
  default. AuthInfo's cred_expire=5 brings that to about 15-20 s here; `scontrol update
  JobId=JOB StartTime=now+2` once it is PENDING lets it start sooner. Not `now`: a job
  started within the second of its requeue fails ("Job credential revoked").
- `stop` cancels the cluster's jobs, sends SIGTERM to the daemons by their pid files
  (SIGKILL after 10 s), then kills any process left whose environment names this cluster's
  slurm.conf (a job step that outlived its slurmd). The state directory stays, for its
  logs; a later `start` reuses it (the controller reloads its saved state).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_DIR = Path("/tmp/kgpt-slurm")
PACKAGES = {  # executable -> the Debian package that has it
    "slurmctld": "slurmctld", "slurmd": "slurmd",
    "sinfo": "slurm-client", "sbatch": "slurm-client", "squeue": "slurm-client",
    "scontrol": "slurm-client", "scancel": "slurm-client",
    "munged": "munge", "mungekey": "munge", "munge": "munge",
}
DAEMONS = ("slurmd", "slurmctld", "munged")  # the order stop takes them in
START_TIMEOUT = 30.0


class ClusterError(RuntimeError):
    """Something the user must fix, said in one message."""


def which(name: str) -> str | None:
    # Debian puts the daemons in /usr/sbin, which a non-login shell may not have on PATH.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def missing_packages() -> list[str]:
    """The Debian packages this needs and this machine lacks, sorted."""
    return sorted({pkg for exe, pkg in PACKAGES.items() if which(exe) is None})


def install_line(packages: list[str] | None = None) -> str:
    return "apt-get install -y " + " ".join(packages or sorted(set(PACKAGES.values())))


def cannot_run() -> str | None:
    """Why this machine cannot have the cluster (not root, packages missing), or None."""
    if os.geteuid() != 0:
        return "the local Slurm cluster runs its daemons as root; this is not root"
    missing = missing_packages()
    if missing:
        return (f"Slurm packages missing: {', '.join(missing)}; install them with: "
                f"{install_line(missing)}")
    return None


# ---------------------------------------------------------------- the state directory

def conf_path(state: Path) -> Path:
    return state / "slurm.conf"


def pid_file(state: Path, daemon: str) -> Path:
    return state / f"{daemon}.pid"


def log_file(state: Path, daemon: str) -> Path:
    return state / f"{daemon}.log"


def munge_socket(state: Path) -> Path:
    """munged's socket: in a folder of its own under /tmp, since munged wants every folder
    above its socket searchable by all (pytest's /tmp/pytest-of-root, a home are not)."""
    digest = hashlib.sha1(str(state).encode()).hexdigest()[:12]
    return Path(f"/tmp/kgpt-munge-{digest}") / "munge.socket"


def env(state: Path) -> dict[str, str]:
    """os.environ with SLURM_CONF naming this cluster's configuration."""
    return {**os.environ, "SLURM_CONF": str(conf_path(state))}


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has finished


def daemon_pid(state: Path, daemon: str) -> int | None:
    """The pid of this cluster's daemon when it is running, else None."""
    pid = _read_pid(pid_file(state, daemon))
    return pid if _alive(pid) else None


def _node() -> dict[str, str]:
    """This host as `slurmd -C` describes it: NodeName, CPUs, RealMemory, ..."""
    out = subprocess.run([which("slurmd"), "-C"], capture_output=True, text=True).stdout
    fields = dict(re.findall(r"(\w+)=(\S+)", out.splitlines()[0] if out else ""))
    if "CPUs" not in fields or "RealMemory" not in fields:  # fall back on /proc
        mem_kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())[1])
        fields = {"CPUs": str(os.cpu_count() or 1), "RealMemory": str(mem_kb // 1024)}
    fields["NodeName"] = socket.gethostname().split(".")[0]
    return fields


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _free_ports(start: int = 6817) -> tuple[int, int]:
    for port in range(start, start + 200, 2):
        if _port_free(port) and _port_free(port + 1):
            return port, port + 1
    raise ClusterError(f"no two free ports from {start} to {start + 200}")


def write_conf(state: Path) -> Path:
    """slurm.conf for this host as controller and only node, everything kept in state."""
    node = _node()
    host, cpus = node["NodeName"], int(node["CPUs"])
    # A little under what slurmd measures: a node with less than RealMemory is drained.
    memory = max(int(node["RealMemory"]) - 64, 256)
    ctld_port, slurmd_port = _free_ports()
    lines = {
        "ClusterName": "kgpt",
        "SlurmctldHost": host,
        "SlurmctldPort": ctld_port,
        "SlurmdPort": slurmd_port,
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "AuthInfo": f"socket={munge_socket(state)},cred_expire=5",
        "StateSaveLocation": state / "ctld-state",
        "SlurmdSpoolDir": state / "slurmd-spool",
        "SlurmctldPidFile": pid_file(state, "slurmctld"),
        "SlurmdPidFile": pid_file(state, "slurmd"),
        "SlurmctldLogFile": log_file(state, "slurmctld"),
        "SlurmdLogFile": log_file(state, "slurmd"),
        "SlurmctldDebug": "info",
        "SlurmdDebug": "info",
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "MpiDefault": "none",
        "MailProg": "/bin/true",
        "SchedulerType": "sched/backfill",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core_Memory",
        "DefMemPerCPU": memory // cpus,
        "ReturnToService": 2,
        "MinJobAge": 2,
        "JobRequeue": 1,
        "KillWait": 5,
        "InactiveLimit": 0,
        "AccountingStorageType": "accounting_storage/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "JobCompType": "jobcomp/filetxt",
        "JobCompLoc": state / "jobcomp.log",
        "PlugStackConfig": state / "plugstack.conf",
    }
    text = "# Written by scripts/slurm_cluster.py; rewritten by each start.\n"
    text += "".join(f"{k}={v}\n" for k, v in lines.items())
    text += (f"NodeName={host} CPUs={cpus} RealMemory={memory} State=UNKNOWN\n"
             f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP\n")
    (state / "plugstack.conf").write_text("")  # none of the system's SPANK plugins
    for sub in ("ctld-state", "slurmd-spool"):
        (state / sub).mkdir(exist_ok=True)
    conf_path(state).write_text(text)
    return conf_path(state)


# ---------------------------------------------------------------- start, status, stop

def _log_tail(path: Path, n: int = 20) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return f"(no log at {path})"
    return "\n".join("    " + line for line in lines) or f"(empty log {path})"


def _launch(state: Path, daemon: str, argv: list[str]) -> None:
    """Start a daemon that forks into the background and wait for its pid file."""
    pid_file(state, daemon).unlink(missing_ok=True)
    with open(log_file(state, daemon), "a") as log:
        r = subprocess.run(argv, env=env(state), stdin=subprocess.DEVNULL, stdout=log,
                           stderr=subprocess.STDOUT, timeout=30, start_new_session=True)
    deadline = time.monotonic() + 10
    while r.returncode == 0 and time.monotonic() < deadline:
        if daemon_pid(state, daemon):
            return
        time.sleep(0.1)
    raise ClusterError(f"{daemon} did not start (exit status {r.returncode}); "
                       f"the end of {log_file(state, daemon)}:\n"
                       f"{_log_tail(log_file(state, daemon))}")


def _start_munged(state: Path) -> None:
    key = state / "munge.key"
    if not key.exists():
        subprocess.run([which("mungekey"), "--create", f"--keyfile={key}"], check=True,
                       capture_output=True)
    os.chown(key, 0, 0)
    key.chmod(0o600)
    munge_socket(state).parent.mkdir(mode=0o755, exist_ok=True)
    munge_socket(state).parent.chmod(0o755)
    _launch(state, "munged", [which("munged"), f"--socket={munge_socket(state)}",
                              f"--key-file={key}", f"--pid-file={pid_file(state, 'munged')}",
                              f"--log-file={log_file(state, 'munged')}",
                              f"--seed-file={state / 'munged.seed'}"])


def sinfo_states(state: Path) -> list[str]:
    """The state of each node as sinfo reports it ([] when the controller does not answer)."""
    try:
        r = subprocess.run([which("sinfo"), "-h", "-N", "-o", "%T"], env=env(state),
                           capture_output=True, text=True, timeout=15)
    except (subprocess.TimeoutExpired, TypeError):
        return []
    return r.stdout.split() if r.returncode == 0 else []


def is_up(state: Path) -> bool:
    """All three daemons run and the node is idle, mixed or allocated (can take jobs)."""
    if not all(daemon_pid(state, d) for d in DAEMONS):
        return False
    nodes = sinfo_states(state)
    return bool(nodes) and all(n.rstrip("*~#$@+-").lower() in ("idle", "mixed", "allocated",
                                                               "completing") for n in nodes)


def start(state: Path, timeout: float = START_TIMEOUT) -> str:
    """Start the cluster (what of it is not running) and wait until its node is idle."""
    why = cannot_run()
    if why:
        raise ClusterError(why)
    state = state.resolve()
    if conf_path(state).exists() and is_up(state):
        return f"already up: SLURM_CONF={conf_path(state)}"
    state.mkdir(parents=True, exist_ok=True)
    if not daemon_pid(state, "munged"):
        _start_munged(state)
    if not daemon_pid(state, "slurmctld"):
        if not daemon_pid(state, "slurmd"):
            write_conf(state)  # the ports may have changed since the last start
        _launch(state, "slurmctld", [which("slurmctld"), "-f", str(conf_path(state))])
    if not daemon_pid(state, "slurmd"):
        _launch(state, "slurmd", [which("slurmd"), "-f", str(conf_path(state))])
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if is_up(state):
            return f"up: SLURM_CONF={conf_path(state)}"
        for daemon in DAEMONS:
            if not daemon_pid(state, daemon):
                raise ClusterError(f"{daemon} exited after it started; the end of "
                                   f"{log_file(state, daemon)}:\n"
                                   f"{_log_tail(log_file(state, daemon))}")
        time.sleep(0.25)
    raise ClusterError(
        f"the node is not idle after {timeout:.0f} s (sinfo says {sinfo_states(state)}); "
        f"the end of {log_file(state, 'slurmctld')}:\n{_log_tail(log_file(state, 'slurmctld'))}"
        f"\nand of {log_file(state, 'slurmd')}:\n{_log_tail(log_file(state, 'slurmd'))}")


def status(state: Path) -> tuple[bool, str]:
    state = state.resolve()
    running = {d: daemon_pid(state, d) for d in DAEMONS}
    parts = ", ".join(f"{d} {'pid ' + str(p) if p else 'not running'}"
                      for d, p in running.items())
    if not conf_path(state).exists():
        return False, f"down: no cluster in {state}"
    up = is_up(state)
    nodes = sinfo_states(state) if running["slurmctld"] else []
    return up, (f"{'up' if up else 'down'}: {parts}; node {' '.join(nodes) or 'unknown'}; "
                f"SLURM_CONF={conf_path(state)}")


def _processes_of(state: Path) -> list[int]:
    """Processes (job steps, jobs) whose environment names this cluster's slurm.conf."""
    marker = f"SLURM_CONF={conf_path(state)}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def _kill_all(pids: list[int], grace: float) -> list[int]:
    """SIGTERM, then SIGKILL after grace seconds; the pids that were still there to kill."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [p for p in pids if _alive(p)]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
    return pids


def stop(state: Path) -> str:
    state = state.resolve()
    if not conf_path(state).exists():
        return f"nothing to stop: no cluster in {state}"
    if daemon_pid(state, "slurmctld"):  # end the jobs through Slurm while it still can
        subprocess.run([which("scancel"), "--full", "--quiet", "--user=root"], env=env(state),
                       capture_output=True, timeout=15)
    stopped = []
    for daemon in DAEMONS:
        pid = daemon_pid(state, daemon)
        if pid:
            _kill_all([pid], grace=10)
            stopped.append(f"{daemon} ({pid})")
    strays = _kill_all(_processes_of(state), grace=3)
    shutil.rmtree(munge_socket(state).parent, ignore_errors=True)
    left = [p for p in [*(daemon_pid(state, d) for d in DAEMONS), *strays] if _alive(p)]
    if left:
        raise ClusterError(f"still running after SIGKILL: {left}")
    said = f"stopped {', '.join(stopped)}" if stopped else "was not running"
    return said + (f"; killed {len(strays)} leftover job processes" if strays else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.slurm_cluster",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("start", "stop", "status", "env"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help=f"the state directory (default {DEFAULT_DIR})")
    parser.add_argument("--timeout", type=float, default=START_TIMEOUT,
                        help="seconds start waits for the node to be idle")
    args = parser.parse_args(argv)
    state = args.dir.resolve()
    try:
        if args.command == "start":
            print(start(state, args.timeout))
        elif args.command == "stop":
            print(stop(state))
        elif args.command == "status":
            up, said = status(state)
            print(said)
            return 0 if up else 1
        else:
            if not conf_path(state).exists():
                print(f"no cluster in {state}: run `python -m scripts.slurm_cluster start"
                      f"{'' if state == DEFAULT_DIR else ' --dir ' + str(state)}` first",
                      file=sys.stderr)
                return 1
            print(f"export SLURM_CONF={conf_path(state)}")
    except ClusterError as e:
        print(f"slurm_cluster {args.command}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
