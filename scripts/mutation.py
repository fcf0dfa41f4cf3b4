#!/usr/bin/env python3
"""`make test-mutation`: mutation testing (mutmut) of the modules where a silent bug
does the most harm, each against the fast tests that are meant to catch its bugs.

mutmut changes one thing at a time in a module (a comparison, a constant, an
argument) and runs the tests that reach the changed function; a mutant the tests
pass with "survived", and is either a missing test or a change that cannot alter
behaviour (an equivalent mutant, listed with why in docs/testing.md). Each module
runs in a copy of the checkout under .mutation/<module>/ (mutmut writes its mutated
tree there), so the checkout itself is never changed.

    python -m scripts.mutation                 # every module, then the score table
    python -m scripts.mutation --only pruning  # one module (a name from MODULES)
    python -m scripts.mutation --list          # the modules and their tests
    make test-mutation MUTATION_ARGS="--only pruning"   # the same, through make

Prints one line per module (killed / mutants = score) and writes
results/mutation/<module>.md with the diff of every surviving mutant. Run it after
changing one of these modules or its tests; it is not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / ".mutation"
OUT = REPO / "results" / "mutation"
# mutmut stops a mutant's tests after (their measured time + TIMEOUT_CONSTANT) x
# TIMEOUT_MULTIPLIER seconds of wall time (twice that of CPU time) and counts it
# killed. Its defaults (1 s, 15x) make an endless loop cost minutes; 5 s and 3x give
# a test of 0.3 s 16 s: room for pytest's start in each fork on two shared cores.
TIMEOUT_MULTIPLIER = 3.0
TIMEOUT_CONSTANT = 5.0
# Tests that cannot pass under mutmut, whatever the mutant: they check what `make
# help` imports, and mutmut's trampolines import mutmut.
DESELECT = ("tests/cli/test_cli.py::test_help_needs_only_the_standard_library",)
# What a module's copy needs besides the module: the package, the scripts the tests
# import, and what the config tests read.
ALSO_COPY = ("gpt2", "scripts", "Kconfig", "kconfig", "defconfigs", "Makefile",
             "requirements.txt", "README.md")


@dataclass(frozen=True)
class Module:
    path: str  # the file mutated
    tests: tuple[str, ...]  # the fast tests meant to catch its bugs
    why: str  # what a silent bug there costs


MODULES = {
    "config-loader": Module("gpt2/config/kconfig.py",
                            ("tests/config/test_config_strict.py", "tests/config/test_slurm_config.py",
                             "tests/matrix/test_matrix_plan.py"),
                            "a .config value silently not in force"),
    "config-options": Module("gpt2/config/options.py",
                             ("tests/config/test_config_options.py", "tests/config/test_config_strict.py",
                              "tests/config/test_registry.py"),
                             "a bad value accepted, or a run hashed under another config"),
    "bridge": Module("gpt2/cli/environment.py",
                     ("tests/cli/test_make_variables.py", "tests/test_input_safety.py",
                      "tests/cli/test_cli.py"),
                     "make variables that run commands or reach the wrong setting"),
    "pruning": Module("gpt2/sparsity/algorithms/pruning.py",
                      ("tests/sparsity/test_pruning.py", "tests/sparsity/test_dynamic_sparsity.py",
                       "tests/config/test_config_options.py"),
                      "masks that do not hold, or sparsity that is not reached"),
    "schedule": Module("gpt2/training/schedule.py", ("tests/training/test_schedule.py",),
                       "a learning rate other than the one reported"),
    "checkpoint": Module("gpt2/training/checkpoint.py",
                         ("tests/training/test_checkpoint.py", "tests/test_run_results.py"),
                         "a damaged checkpoint trusted, or a resume that is not exact"),
    "run-folder": Module("gpt2/run_folder.py",
                         ("tests/test_run_results.py", "tests/training/test_checkpoint.py"),
                         "an unfinished run taken as complete, or a summary misread"),
    "matrix-plan": Module("gpt2/matrix/plan.py", ("tests/matrix/test_matrix_plan.py",),
                          "cells run under settings other than the plan's"),
    "matrix-runner": Module("gpt2/matrix/runner.py",
                            ("tests/matrix/test_matrix_runner.py", "tests/matrix/test_matrix_plan.py"),
                            "a finished cell run again, or an unfinished one skipped"),
    "optimizers": Module("gpt2/optim/algorithms/optimizers.py", ("tests/optim/test_optimizers.py",),
                         "an update other than the reference's"),
    "matrix-paired": Module("gpt2/matrix/paired.py", ("tests/matrix/test_paired.py",),
                            "a difference claimed that the seeds do not support"),
    "matrix-speedup": Module("gpt2/matrix/speedup.py", ("tests/matrix/test_speedup.py",),
                             "a speedup over the baseline the runs do not show"),
    "sign-descent": Module("gpt2/optim/algorithms/sign_descent.py",
                           ("tests/optim/test_optimizer_references.py",),
                           "a Lion or Signum step other than the reference's"),
    "adam-variants": Module("gpt2/optim/algorithms/adam_variants.py",
                            ("tests/optim/test_optimizer_references.py",),
                            "an ADOPT, AdEMAMix, MARS or cautious step other than the reference's"),
    "soap-optimizer": Module("gpt2/optim/algorithms/soap.py", ("tests/optim/test_optimizer_references.py",),
                   "a SOAP step other than the reference's"),
    "kron-optimizer": Module("gpt2/optim/algorithms/kron.py", ("tests/optim/test_optimizer_references.py",),
                   "a PSGD-Kron step other than the reference's"),
    "polar-express": Module("gpt2/optim/algorithms/polar_express.py",
                            ("tests/optim/test_optimizer_references.py",),
                            "Newton-Schulz coefficients other than the reference's"),
    "oneshot": Module("gpt2/training/oneshot.py", ("tests/training/test_oneshot.py",),
                      "one-shot masks or SparseGPT updates other than the references'"),
    "sparse-kernel": Module("gpt2/sparsity/algorithms/sparse_kernel.py", ("tests/sparsity/test_sparse_kernel.py",),
                            "a sparse kernel used where it cannot run, or other gradients"),
    "sparsity-report": Module("gpt2/matrix/sparsity_report.py",
                              ("tests/matrix/test_sparsity_report.py",),
                              "a sparsity table or a moved rate the results do not show"),
    "tokenizer": Module("gpt2/data/tokenizer.py",
                        ("tests/data/test_character_level.py", "tests/data/test_data.py",
                         "tests/test_input_safety.py"),
                        "text turned into other tokens than the reference's, or back"),
    "charts": Module("gpt2/results/charts.py", ("tests/results/test_charts.py",),
                     "a chart that draws other numbers than the run's, or a changed library"),
    "records": Module("gpt2/records.py", ("tests/test_records.py",),
                      "a planted or damaged record read as a figure, a page or a report line"),
    "argparser": Module("gpt2/config/argparser.py", ("tests/test_records.py",),
                        "a number past its range taken, or refused with another message"),
    "matrix-axes": Module("gpt2/config/axes.py",
                          ("tests/matrix/test_matrix_axes.py", "tests/matrix/test_matrix_plan.py"),
                          "cells named, grouped or compared by the wrong axis values"),
    "track3-score": Module("gpt2/matrix/track3.py", ("tests/matrix/test_track3_score.py",),
                           "an optimizer said to beat track 3's target or baseline when "
                           "its rules say it does not"),
    "shards": Module("gpt2/data/shards.py",
                     ("tests/data/test_modded_shards.py", "tests/data/test_data.py"),
                     "a truncated or foreign shard read as tokens"),
}


def prepare(name: str, module: Module) -> Path:
    """A fresh copy of the tracked files, configured for mutmut on one module."""
    work = WORK / name
    shutil.rmtree(work, ignore_errors=True)
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = REPO / f
        if src.is_file():
            (work / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / f)
    # The tests import gpt2 from the mutated tree mutmut puts on the path first, so
    # the checkout's root must not stand before it (pytest.ini's pythonpath = .).
    ini = (work / "pytest.ini").read_text().replace("pythonpath = .\n", "")
    (work / "pytest.ini").write_text(ini)
    toml = (work / "pyproject.toml").read_text()
    (work / "pyproject.toml").write_text(toml + "\n[tool.mutmut]\n" + "\n".join([
        f"source_paths = {json.dumps([module.path])}",
        f"pytest_add_cli_args_test_selection = {json.dumps(list(module.tests))}",
        f"also_copy = {json.dumps(list(ALSO_COPY))}",
        f"pytest_add_cli_args = {json.dumps([f'--deselect={t}' for t in DESELECT])}",
        f"timeout_multiplier = {TIMEOUT_MULTIPLIER}",
        f"timeout_constant = {TIMEOUT_CONSTANT}", ""]))
    # The tests find the shared corpus beside the checkout, and run from mutmut's
    # mutants/ folder inside the copy: beside that folder, then.
    shared = REPO.parent / "shared"
    if shared.is_dir():
        (work / "shared").symlink_to(shared)
    return work


def mutmut(work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("mutmut")
    # mutmut runs each mutant in a process forked from one that already ran torch;
    # a fork inherits no OpenMP threads, so torch's thread pool would wait on them
    # forever and the mutant would count as killed by the time limit. One thread
    # keeps torch off that pool.
    return subprocess.run([str(exe), *args], cwd=work, capture_output=True, text=True,
                          check=check, env={**os.environ, "PYTHONWARNINGS": "ignore",
                                            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})


def _tail(proc: subprocess.CompletedProcess, lines: int = 8) -> str:
    """The last lines mutmut printed: where it says why it stopped."""
    return "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-lines:])


def run_module(name: str, module: Module) -> dict:
    work = prepare(name, module)
    t0 = time.monotonic()
    proc = mutmut(work, "run", check=False)
    stats_file = work / "mutants" / "mutmut-cicd-stats.json"
    mutmut(work, "export-cicd-stats", check=False)
    if not stats_file.is_file():
        raise SystemExit(f"error: mutmut did not finish on {module.path}:\n" + _tail(proc))
    stats = json.loads(stats_file.read_text())
    checked = sum(v for k, v in stats.items() if k != "total")
    if stats["total"] and not checked:  # mutmut stopped before the first mutant
        raise SystemExit(f"error: mutmut checked no mutant of {module.path} (its tests must "
                         "pass on the unmutated code first):\n" + _tail(proc))
    lines = mutmut(work, "results", "--all", "true").stdout.splitlines()
    survivors = [ln.split(":")[0].strip() for ln in lines if ln.strip().endswith(": survived")]
    report = [f"# Surviving mutants of {module.path}", "",
              f"Tests: {', '.join(module.tests)}", ""]
    for mutant in survivors:
        report += ["```diff", mutmut(work, "show", mutant).stdout.strip(), "```", ""]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.md").write_text("\n".join(report))
    # A mutant no selected test reaches counts against the score: it is a gap too.
    total = stats["total"] - stats["skipped"]
    caught = stats["killed"] + stats["timeout"] + stats["segfault"]
    return {"module": name, "path": module.path, "killed": caught, "total": total,
            "timeout": stats["timeout"], "survived": stats["survived"],
            "no_tests": stats["no_tests"],
            "score": caught / total if total else None,
            "minutes": (time.monotonic() - t0) / 60}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=list(MODULES), default=[],
                        help="a module to test (repeatable; default: all)")
    parser.add_argument("--list", action="store_true", help="list the modules and stop")
    if argv is None:  # make passes MUTATION_ARGS through the environment, unexpanded
        from gpt2.cli.environment import split_flags
        from gpt2.errors import UsageError

        try:
            argv = sys.argv[1:] + split_flags("MUTATION_ARGS")
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    if args.list:
        for name, m in MODULES.items():
            print(f"{name:15} {m.path:32} {' '.join(m.tests)}")
        return 0
    if shutil.which("mutmut", path=str(Path(sys.executable).parent)) is None:
        print("error: mutmut is not installed in this environment; `make test-mutation` "
              "installs it", file=sys.stderr)
        return 2
    rows = []
    for name in args.only or list(MODULES):
        print(f"mutating {MODULES[name].path} ...", flush=True)
        row = run_module(name, MODULES[name])
        rows.append(row)
        print(f"  {row['killed']}/{row['total']} killed = {row['score']:.0%} "
              f"({row['timeout']} of them by the time limit; {row['survived']} survived, "
              f"{row['no_tests']} reached by no selected test) "
              f"in {row['minutes']:.1f} min; survivors: results/mutation/{name}.md", flush=True)
    print("\n| module | file | killed (by time limit) | survived | unreached | mutants | score |"
          "\n|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['module']} | `{r['path']}` | {r['killed']} ({r['timeout']}) | "
              f"{r['survived']} | {r['no_tests']} | {r['total']} | {r['score']:.0%} |")
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (OUT / f"scores-{stamp}.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
