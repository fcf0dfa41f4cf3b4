"""Helpers the tests share: the tiny model's flags, running the entry points and make,
and reading a run folder. Fixtures are in conftest.py; tests import these from here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The golden list of the methods: every optimizer and pruning method, in menu order,
# with the settings each reads (summary.json's order). The one place a test names them
# all: tests/config/test_registry.py holds the registries to it, the generic tests read it.
METHODS = json.loads((Path(__file__).parent / "methods.json").read_text())


PY = sys.executable


# The data the tiny model trains on: tiny Shakespeare by character (65 tokens), so
# its token table and head are 65 rows, not GPT-2's 50,304, and a step costs a tenth
# (what a training test checks, a falling loss, a resume, a stop, is the same for
# any vocabulary). Tests of the BPE path itself name "shakespeare".
TINY_DATASET = "shakespeare-char"

# What a tiny run given it trains on instead: GPT-2's BPE tokens (TINY's later flag
# wins), for the tests of that path itself (HellaSwag, export, the BPE tokenizer).
BPE = "--dataset=shakespeare"

# The tiny model every training test uses: ~29k parameters, about 5 ms a step on a
# CPU core.
TINY = [f"--dataset={TINY_DATASET}", "--model-size=custom", "--n-layer=2", "--n-head=2", "--n-embd=32", "--block-size=32",
        "--batch-size=4", "--gradient-accumulation=1", "--max-iters=30", "--warmup-iters=3",
        "--learning-rate=3e-3", "--min-lr=3e-4", "--eval-interval=10", "--eval-tokens=256",
        "--log-interval=1", "--checkpoint-interval=10", "--sample-tokens=8", "--device=cpu",
        "--dtype=float32", "--data-workers=0", "--cpu-threads=1"]


def corpus_path() -> Path | None:
    for candidate in (os.environ.get("KGPT_CORPUS"),
                      REPO.parent / "shared" / "data" / "tinyshakespeare.txt",
                      REPO / "data" / "shakespeare" / "input.txt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def synthetic_corpus(path: Path, n_lines: int = 12_000) -> Path:
    """Play-like text from a tiny grammar: learnable, deterministic, offline. Used when
    the real corpus is not on this machine, so `make test` still trains for real."""
    import numpy as np

    rng = np.random.default_rng(0)
    names = ["ROMEO", "JULIET", "KING HENRY", "LADY MACBETH", "HAMLET", "First Citizen"]
    subjects = ["I", "thou", "my lord", "the king", "this night", "our love", "the world"]
    verbs = ["shall see", "doth love", "must fear", "will bear", "hath done", "dost know"]
    objects = ["the crown", "thy face", "my heart", "the sword", "a kingdom", "his grace"]
    lines = []
    for i in range(n_lines):
        if i % 4 == 0:
            lines.append(f"\n{names[rng.integers(len(names))]}:")
        lines.append(f"{subjects[rng.integers(len(subjects))].capitalize()} "
                     f"{verbs[rng.integers(len(verbs))]} {objects[rng.integers(len(objects))]}"
                     f"{',;.!?'[rng.integers(5)]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def load_script(name: str):
    """scripts/<name>.py as a module: the scripts are not a package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"kgpt_script_{name}",
                                                  REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What `make <target>` runs (the Makefile's KGPT), from the checkout (cwd=REPO).
BRIDGE = [PY, "-m", "gpt2.cli"]


def run_bridge(*args: str, env: dict | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m gpt2.cli <args>``: a make target without make."""
    return subprocess.run([*BRIDGE, *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def run_py(script: str, *args: str, env: dict | None = None, check: bool = False,
           timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([PY, str(REPO / script), *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, **(env or {})}, timeout=timeout)
    if check and proc.returncode:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_make(*args: str, env: dict | None = None, timeout: float = 600,
             cwd: Path = REPO) -> subprocess.CompletedProcess:
    """make with this interpreter (no .venv is created) and a clean variable set."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("TRAIN_ARGS", "DRY_RUN", "V", "KCONFIG_CONFIG", "MAKEFLAGS")}
    return subprocess.run(["make", "--no-print-directory", f"PYTHON={PY}", *args],
                          capture_output=True, text=True, cwd=cwd, env={**base, **(env or {})},
                          timeout=timeout)


# The entry points a test may call in its own process (call_main), by the script path
# run_py takes: their main(argv) decides everything a process of them would.
MAINS = {"gpt2/train.py": "gpt2.train", "gpt2/generate.py": "gpt2.generate",
         "gpt2/evaluate.py": "gpt2.evaluate", "gpt2/prepare_data.py": "gpt2.prepare_data",
         "gpt2/prune_oneshot.py": "gpt2.prune_oneshot", "gpt2/export.py": "gpt2.export",
         "scripts/memcheck.py": "scripts.memcheck", "bridge": "gpt2.cli"}


def call_main(script: str, *args: str, env: dict | None = None, check: bool = False,
              unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``run_py(script, *args)`` in this process: the entry point's ``main(argv)``, with
    ``env`` set (and ``unset`` removed) for the call only; the result as run_py's. What
    a test of a decision (a refusal, a summary, a resume) needs, without a Python start
    and a torch import (2.5 s) each time. A test whose subject is the process (signals,
    exit by a signal, a terminal, make, torchrun) uses run_py.

    The output is taken at descriptors 1 and 2, as a process's would be: what the
    entry point prints and what the processes it starts print, in the order written."""
    import importlib
    import tempfile

    module = importlib.import_module(MAINS[script])
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch else None  # (CONFIG_CPU_THREADS sets them)
    saved_env = dict(os.environ)
    for var in unset:
        os.environ.pop(var, None)
    os.environ.update(env or {})
    saved_streams = sys.stdout, sys.stderr
    saved_fds = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            for stream in saved_streams:
                stream.flush()
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")
            sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
            try:
                rc = module.main(list(args))
            except SystemExit as e:  # argparse's refusals and --help
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
            finally:
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
        finally:
            sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            os.environ.clear()
            os.environ.update(saved_env)
            if threads is not None:
                torch.set_num_threads(threads)
        out.seek(0)
        err.seek(0)
        stdout, stderr = (f.read().decode(errors="replace") for f in (out, err))
    proc = subprocess.CompletedProcess([MAINS[script], *args], rc or 0, stdout, stderr)
    if check and proc.returncode:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout}\n"
                             f"{proc.stderr}")
    return proc


def run_target(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """What ``run_make(*args)`` runs, in this process: the make bridge's main
    (``python -m gpt2.cli``) on the target, with each ``VAR=value`` argument in the
    environment as make exports it. For tests of what a target does; the Makefile's
    own handling of variables is tested through make (tests/cli/, test_input_safety)."""
    variables = dict(a.split("=", 1) for a in args if "=" in a)
    names = [a for a in args if "=" not in a] or ["all"]  # (the Makefile's default goal)
    argv = ["defconfig", names[0][len("defconfig-"):]] if names[0].startswith("defconfig-") \
        else names
    return call_main("bridge", *argv, env={**(env or {}), **variables},
                     unset=("TRAIN_ARGS", "DRY_RUN", "V", "KCONFIG_CONFIG", "MAKEFLAGS"))


def train_tiny(data_dir: Path, results: Path, *extra: str, check: bool = True,
               process: bool = False):
    """The tiny model trained into ``results`` (in this process; ``process``: as
    ``python gpt2/train.py``)."""
    run = run_py if process else call_main
    return run("gpt2/train.py", *TINY, f"--data-dir={data_dir}", f"--results-dir={results}",
               "--run-name=tiny", *extra, check=check)


def signal_at_step(cmd: list[str], sig: int, step: int = 5) -> tuple[int, str]:
    """Run a training command, send it ``sig`` once it prints step ``step``; returns
    its exit status and whole output."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(f"step {step:>6}/"):
            proc.send_signal(sig)
            break
    out = "".join(lines) + proc.stdout.read()
    return proc.wait(timeout=120), out


def only_run_dir(results: Path) -> Path:
    dirs = [p for p in results.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def checkpoint_state(step: int, max_iters: int = 12, **more) -> dict:
    """A checkpoint state with every entry a save requires (checkpoint.CONTENTS),
    empty unless given."""
    from gpt2.training import checkpoint

    empty = {key: 0.0 if isinstance(kind, tuple) else kind()
             for key, kind in checkpoint.CONTENTS.items()}
    return {**empty, "step": step, "max_iters": max_iters, **more}
