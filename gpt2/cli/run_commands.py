"""The targets that run the .config: all, data, train, smoke, bench, resume-check,
memcheck, generate, eval-hellaswag. Each builds its entry point's flags from .config
(dotconfig.py) and the make variables, and starts it with run_child. On a matrix
.config, all and train run the matrix (matrix_commands.py); the per-run tools act
on the cell CELL= names."""

from __future__ import annotations

import math
from pathlib import Path
import os
import re

from gpt2 import REPO
from gpt2.cli.children import run_child
from gpt2.cli.dotconfig import (SingleRun, check_hardware, data_argv, data_config, is_matrix,
                                load_existing, one_run, run_folder, run_folder_config,
                                single_run)
from gpt2.cli.environment import config_path, dry_run, slurm, split_flags, train_args
from gpt2.config import kconfig
from gpt2.config.smoke import DEFAULT_STEPS
from gpt2.errors import UsageError
from gpt2.run_folder import RunDir
from gpt2.slurm import single_run as slurm_run
from gpt2.training import reporting


def cmd_matrix(**kw) -> int:
    # (imported when a matrix runs: `make` on a finished single run needs none of it)
    from gpt2.cli.matrix_commands import cmd_matrix as run_matrix

    return run_matrix(**kw)


def results_root() -> Path:
    from gpt2.cli.results_commands import results_root as root

    return root()


def cmd_data() -> int:
    cfg, active = data_config(load_existing(complete=True))
    return run_child("DATA", "gpt2.prepare_data", data_argv(cfg, active))


def cmd_train() -> int:
    loaded = load_existing(complete=True)
    if is_matrix(loaded):
        return cmd_matrix(prepare=False, loaded=loaded)
    one = single_run(loaded)
    if slurm():
        return submit_run(loaded, one)
    run = None if dry_run() else one.run
    if run is not None and not run.completed():
        check_hardware(one.cfg)
    return train_and_publish(one.argv(), run, one)


def cmd_all() -> int:
    loaded = load_existing(complete=True)
    if is_matrix(loaded):
        return cmd_matrix(prepare=True, loaded=loaded)
    one = single_run(loaded)
    on_slurm = slurm()
    run = None if dry_run() or on_slurm else one.run
    # (on Slurm the hardware is the compute nodes'; a finished run needs none)
    if run is not None and not run.completed():
        check_hardware(one.cfg)
    rc = run_child("DATA", "gpt2.prepare_data", data_argv(one.cfg, one.active))
    if rc:
        return rc
    if on_slurm:
        return submit_run(loaded, one)
    return train_and_publish(one.argv(), run, one)


def train_and_publish(argv: list[str], run: RunDir | None, one: SingleRun | None = None) -> int:
    """train.py with ``argv``; then the run's page and the results index, which
    training leaves to what started it (pages.publish_after_run). A run already
    complete is reported here, as train.py would report it (the same function), without
    starting it: a third of what `make` on a finished run cost."""
    report = already_complete(one, run)
    if report:
        print(report, flush=True)
        rc = 0
    else:
        rc = run_child("TRAIN", "gpt2.train", argv, dry_run_flag="--dry-run")
    if run is not None:
        from gpt2.results import pages  # (Jinja2, the matrix's readers: not for `make data`)

        pages.publish_after_run(run.path, run.root if run.linked else None)
        if rc == 0 and run.completed():
            print(next_steps(run.path))
    return rc


def already_complete(one: SingleRun | None, run: RunDir | None) -> str | None:
    """train.py's report of ``one``'s run when it holds it complete, made by this code
    and data (reporting.already_complete, what train.py asks first); None when train.py
    has something to decide: a run-control flag or IF_CHANGED given, or a dry run."""
    if one is None or run is None or one.control or os.environ.get("IF_CHANGED") or dry_run():
        return None
    return reporting.already_complete(one.cfg)


def next_steps(path: Path) -> str:
    """What a user usually does with a finished run, as commands to copy."""
    from gpt2.results import pages

    page = path / pages.RUN_PAGE
    return "\n".join([
        "next     make generate PROMPT=\"...\"    (text from this run)",
        f"         open {page}" if page.is_file() else "         make results   (its page)",
        "         make compare RUN=\"results/<run> results/<run>\"   (runs side by side)",
        "         make test-matrix   (optimizers x pruning: start from `make "
        "defconfig-gpt2-shakespeare-matrix-cpu`)"])


def submit_run(loaded, one: SingleRun) -> int:
    """SLURM=1: the run as one Slurm job with the Slurm menu's settings; returns once
    it is submitted (DRY_RUN=1: prints its script, submits nothing)."""
    cfg, flags = one.cfg, one.argv()
    settings = kconfig.to_slurm(loaded)
    results = REPO / cfg.results_dir  # (an absolute results_dir stays itself)
    run_folder = f"{cfg.run_name}-{cfg.config_hash()}"
    text = slurm_run.render_script(results, run_folder, flags, settings, cfg.nproc_per_node)
    if dry_run():
        print(text, end="")
        return 0
    with slurm_run.submitting(results):
        waiting = slurm_run.queued(results, run_folder)
        if waiting:
            t = waiting[0]
            print(f"run {run_folder} is already {t.state.lower()} as Slurm job {t.job}: "
                  f"nothing submitted. `squeue -j {t.job}` shows it; `scancel {t.job}` stops "
                  "it at a checkpoint, and `make SLURM=1` then resumes it")
            return 0
        job, path = slurm_run.submit(results, run_folder, text)
    print(f"  SLURM   submitted {run_folder} as job {job} ({path})\n"
          f"  output  {results / slurm_run.SLURM_DIR / f'{run_folder}-{job}.out'}\n"
          f"  run     {results / run_folder}/\n"
          f"`squeue -j {job}` shows it; `scancel {job}` stops it at a checkpoint, and `make "
          "SLURM=1` then resumes it. Before its time limit it saves and requeues itself.")
    return 0


def cmd_smoke() -> int:
    """`make smoke`: the configuration (a single run or a matrix) for SMOKE steps."""
    os.environ.setdefault("SMOKE", str(DEFAULT_STEPS))
    return cmd_all()


def cmd_bench() -> int:
    """Speed of the configured model (scripts/bench.py; BENCH_ARGS for its flags)."""
    cfg, argv = one_run()
    if not dry_run():
        check_hardware(cfg)
    return run_child("BENCH", "scripts.bench", argv)


def cmd_resume_check() -> int:
    """Stop-and-resume against a straight run of the .config (scripts/resume_check.py;
    CHECK_ARGS for its flags)."""
    cfg, flags = one_run()
    argv = [*split_flags("CHECK_ARGS"), "--", *flags]
    if not dry_run():
        check_hardware(cfg)
    return run_child("RESUME", "scripts.resume_check", argv)


def cmd_memcheck() -> int:
    """Predicted peak memory of the configured run (scripts/memcheck.py); for a test
    matrix, of every cell (or the one CELL= names), before any is launched. CARD=
    (a card's name or a memory size) predicts for that GPU instead of this machine's."""
    card = [f"--card={os.environ['CARD']}"] if os.environ.get("CARD") else []
    loaded = load_existing(complete=True)
    if is_matrix(loaded):
        cell = os.environ.get("CELL")
        argv = ["--matrix", str(config_path()), *([f"--cell={cell}"] if cell else []),
                *card, *train_args()]
    else:
        argv = [*card, *single_run(loaded).flags]
    return run_child("MEM", "scripts.memcheck", argv)


def cmd_extend() -> int:
    """A finished run (RUN=) trained on to TRAIN_ARGS' --max-iters, as a new run with
    the run's settings and whole state (train.py --extend-from)."""
    folder = os.environ.get("RUN", "")
    if not folder:
        raise UsageError("`make extend` needs the run to continue and its new length: "
                         "make extend RUN=results/<run> TRAIN_ARGS=--max-iters=N")
    given = train_args()
    # The new run goes into this checkout's results folder (CONFIG_RESULTS_DIR, results/
    # without a .config), never where the parent's config.json says it was trained.
    here = [] if any(a.split("=")[0] == "--results-dir" for a in given) else \
        [f"--results-dir={results_root()}"]
    return run_child("TRAIN", "gpt2.train", ["--extend-from", folder, *here, *given],
                     dry_run_flag="--dry-run")


# generate's make variables: flag, and what the value must look like (None: any text).
GENERATE_VARS = {"PROMPT": ("--prompt", None), "MAX_NEW_TOKENS": ("--max-new-tokens", int),
                 "TEMPERATURE": ("--temperature", float), "TOP_K": ("--top-k", int),
                 "NUM_SAMPLES": ("--num-samples", int), "SEED": ("--seed", int)}


def _generate_value(var: str, text: str, kind: type | None) -> str:
    """``text`` when it is the kind of value VAR= takes; a UsageError naming VAR if
    not (the ranges are checked by generate.py, against the Kconfig symbols')."""
    if kind is int and not re.fullmatch(r"[0-9]+", text.strip()):
        raise UsageError(f"{var}={text!r} is not a whole number (e.g. {var}=40)")
    if kind is float:
        try:
            ok = math.isfinite(float(text))
        except ValueError:
            ok = False
        if not ok:
            raise UsageError(f"{var}={text!r} is not a number (e.g. {var}=0.8)")
    return text.strip() if kind else text


def cmd_generate() -> int:
    env = os.environ
    flags = [f"{opt}={_generate_value(var, env[var], kind)}"
             for var, (opt, kind) in GENERATE_VARS.items() if var in env]
    folder = run_folder()
    return run_child("GEN", "gpt2.generate", ["--run-dir", folder, *flags])


def cmd_eval_hellaswag() -> int:
    """HellaSwag of RUN (default: the newest run) or of INIT_FROM's weights."""
    env = os.environ
    cfg, folder = run_folder_config(required=not env.get("INIT_FROM"))
    argv = ([f"--init-from={env['INIT_FROM']}"] if env.get("INIT_FROM")
            else ["--run-dir", folder])
    if cfg:
        argv.append(f"--data-dir={cfg.data_dir}")
        if cfg.hellaswag_path:
            argv.append(f"--hellaswag-path={cfg.hellaswag_path}")
        if cfg.hellaswag_examples:
            argv.append(f"--examples={cfg.hellaswag_examples}")
    if env.get("EXAMPLES"):
        argv.append(f"--examples={env['EXAMPLES']}")
    return run_child("EVAL", "gpt2.evaluate", argv)


def cmd_prune_oneshot() -> int:
    """Prune RUN (default: the newest run) once: METHOD= (magnitude, wanda, sparsegpt),
    SPARSITY= or STRUCTURE= (2:4 ...), FINETUNE= steps of fine-tuning after, ONESHOT_ARGS=
    for gpt2/prune_oneshot.py's other flags (--calibration-samples N, --seed,
    --finetune-lr, --save-weights)."""
    env = os.environ
    folder = run_folder()
    if not env.get("METHOD"):
        raise UsageError("METHOD= is needed: magnitude, wanda or sparsegpt (e.g. make "
                         "prune-oneshot METHOD=wanda SPARSITY=0.5)")
    argv = ["--run-dir", folder, f"--method={env['METHOD']}"]
    if env.get("SPARSITY"):
        argv.append(f"--sparsity={env['SPARSITY']}")
    if env.get("STRUCTURE"):
        argv.append(f"--structure={env['STRUCTURE']}")
    if env.get("FINETUNE"):
        argv.append(f"--finetune-steps={env['FINETUNE']}")
    return run_child("PRUNE", "gpt2.prune_oneshot", [*argv, *split_flags("ONESHOT_ARGS")])
