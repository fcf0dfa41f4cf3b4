#!/usr/bin/env python3
"""`make gpu-check`: kgpt's GPU acceptance, in one command and a time budget.

A GPU is lent to this project now and then, for minutes, with no network. This is
what to run on it: seven parts, in order, each through the same `make` targets a user
types, each skipped (with the reason) when the minutes left cannot hold it:

1. mission   `make defconfig-gpt2-shakespeare-l4 && make`, shortened: data, the
             compiled default, a checkpoint, the summary; then `make resume-check`
2. bench     `make bench` of the card's preset (h100 on an H100 or H200, l4 elsewhere),
             eager and compiled, then one sweep per speed lever (attention kernels,
             fused loss, compile modes, micro-batch): speed, MFU, peak memory
             against the prediction, compiled graphs
3. optim     `make bench-optim`: every optimizer's step against AdamW's
4. sparse    the 2:4 kernel: `make bench` of a 2:4-pruned model, dense vs sparse
5. track3    `make bench` of track 3's model (its Muon baseline's preset, its bfloat16
             token table), with Muon and with AdamW: the step a seed's GPU-hours follow
6. char      nanoGPT's shakespeare_char (best val loss 1.4697 on an A100) in full, or
             as many steps as fit, with the loss where it stopped
7. matrix    a 4-cell matrix (AdamW and Muon x 2 seeds, short) and its report

Without a GPU the same parts run with tiny shapes on the CPU (the report says so at
the top), so CI keeps them working. Everything goes into
results/gpu-check-<device>-<commit>/: report.md and results.json, rewritten as each
part ends (a check cut short keeps what it finished), the .config of each part, each
part's output in logs/, and the runs in runs/. Nothing outside that folder is
written: the parts use their own .config files and data folder, never ./.config.

    make gpu-check                       # GPU_CHECK_MINUTES=9 by default
    make gpu-check GPU_CHECK_MINUTES=14  # more time: more levers, char in full
    GPU_CHECK_PARTS="mission bench" make gpu-check   # some parts only

On a lent machine without network (docs/performance.md, "On a lent GPU, without
network"): `make gpu-bundle` here, carry gpu-bundle/ there, and run
`make PYTHON=python3 gpu-check`; the check puts gpu-bundle/site on its children's path.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gpt2 import REPO
from gpt2.config import axes
from gpt2.config.registry import DEFAULT_OPTIMIZER, OPTIMIZERS, PRUNING_METHODS
from gpt2.processes import terminal_safe
from gpt2.storage import own_folder, write_text_atomic
from gpt2.training.provenance import code_identity, short

BUNDLE_SITE = REPO / "gpu-bundle" / "site"
PARTS = ("mission", "bench", "optim", "sparse", "track3", "char", "matrix")
DEFAULT_MINUTES = 9.0
# Where the tokens come from when there is no network: the bundle's copy of the
# corpus (make gpu-bundle), this checkout's prepared copy, or CI's shared folder.
CORPUS_CANDIDATES = ("gpu-bundle/tinyshakespeare.txt", "data/shakespeare/input.txt",
                     "../shared/data/tinyshakespeare.txt")

# The CPU's tiny shapes: every part's model, small enough that all seven parts run in
# a few minutes on two cores. Compiled with aot_eager (the graphs inductor would
# get, torch's kernels: no C++ build inside the budget).
TINY = {"MODEL_SIZE": "custom", "N_LAYER": "2", "N_HEAD": "2", "N_EMBD": "64",
        "BLOCK_SIZE": "64", "BATCH_SIZE": "4", "GRADIENT_ACCUMULATION": "1",
        "DEVICE": "cpu", "DTYPE": "float32", "COMPILE": "on",
        "COMPILE_BACKEND": "aot_eager", "EVAL_TOKENS": "1024", "DATA_WORKERS": "0",
        "SAMPLE_TOKENS": "8", "TARGET_CARD": ""}

# Seconds each part is expected to take (first: on a GPU, second: tiny on the CPU),
# from the runs recorded in docs/performance.md (GPU: an H200 at 3de1b33; the mission
# there took 326 s with a compiled resume check, and its eager one, not yet timed on a
# GPU, is guessed at 60 s of the 200 that took; char and matrix have not run on one).
# Scaled by what the first part measured against its estimate; a part starts only if
# its estimate fits.
# track3 has not run on a GPU: two compiled rows of about 40 s (its first step compiled
# in 40.8 s on an H200) and 7 steps of 1.1 s.
ESTIMATES = {"mission": (190, 70), "bench": (75, 40), "optim": (75, 25),
             "sparse": (65, 15), "track3": (110, 30), "char": (90, 20), "matrix": (120, 50)}
# A bench row: one `make bench` process (import, compile, warm-up, timed steps).
ROW_SECONDS = (35, 7)
# The levers are what the MFU goal needs, so their sweeps may use the budget but for
# the two short parts after them; char and the matrix take what is left (char as
# many steps as fit, or is skipped with its reason).
LEVERS_LEAVE_ROOM_FOR = ("optim", "sparse", "track3")


@dataclass
class Part:
    name: str
    status: str = "pending"  # done | failed | skipped
    seconds: float = 0.0
    note: str = ""
    commands: list[str] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)  # for report.md

    def record(self) -> dict:
        return {"name": self.name, "status": self.status, "seconds": round(self.seconds, 1),
                "note": self.note, "commands": self.commands, "figures": self.figures}


class Check:
    def __init__(self, minutes: float, parts: tuple[str, ...], root: Path = REPO / "results"):
        self.gpu = torch.cuda.is_available()
        self.device = torch.cuda.get_device_name() if self.gpu else "cpu"
        # A lent machine gets the working tree without .git: then the sources' hash
        # names the code (the one every run folder records beside the commit).
        code = code_identity()
        self.commit = code["commit"] or ""
        self.code = short(code)
        slug = re.sub(r"[^a-z0-9]+", "-", self.device.lower()).strip("-")
        name = self.commit[:10] or f"src-{code['sources'][:10]}"
        self.folder = root / f"gpu-check-{slug}-{name}"
        own_folder(root)
        if self.folder.exists() and not self.folder.is_symlink():
            # A check of the same commit on the same device ran before: it stays, under
            # its start time, and this one measures afresh (its runs would be "done").
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.folder.stat().st_mtime))
            self.folder.rename(self.folder.with_name(f"{self.folder.name}-{stamp}"))
        own_folder(self.folder)
        for sub in ("logs", "configs", "runs"):
            own_folder(self.folder / sub)
        self.budget = minutes * 60
        self.start = time.monotonic()
        self.scale = 1.0  # measured / estimated, from the first part that ran
        self.wanted = parts
        self.parts = [Part(name) for name in PARTS]
        self.corpus = next((str((REPO / c).resolve()) for c in CORPUS_CANDIDATES
                            if (REPO / c).is_file()), "")

    # ---- time ----------------------------------------------------------------------
    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def estimate(self, name: str) -> float:
        return ESTIMATES[name][0 if self.gpu else 1] * self.scale

    def row_seconds(self) -> float:
        return ROW_SECONDS[0 if self.gpu else 1] * self.scale

    def reserve_for(self, parts: tuple[str, ...]) -> float:
        """The estimates of those of ``parts`` that are wanted: what a part that can
        grow (bench's lever sweeps, char's steps) leaves for them."""
        return sum(self.estimate(p) for p in parts if p in self.wanted)

    # ---- running -------------------------------------------------------------------
    def make(self, part: Part, *args: str, config: Path | None = None, log: str = "",
             timeout: float | None = None, env: dict | None = None) -> tuple[int, str]:
        """``make ARGS`` with this Python, in this checkout, on ``config``; output to
        logs/<part>-<log>.log. Past ``timeout`` seconds (default: the budget left) the
        command gets SIGINT (training checkpoints and stops), then SIGKILL."""
        cmd = ["make", "--no-print-directory", f"PYTHON={sys.executable}", *args]
        shown = shlex.join(["make", *args])
        part.commands.append(shown + (f"   (KCONFIG_CONFIG={config.name})" if config else ""))
        base = {k: v for k, v in os.environ.items()
                if k not in ("MAKEFLAGS", "MAKELEVEL", "TRAIN_ARGS", "BENCH_ARGS", "CHECK_ARGS",
                             "SET", "RUN", "DRY_RUN", "SMOKE", "KCONFIG_CONFIG", "CELL", "CARD")}
        if config:
            base["KCONFIG_CONFIG"] = str(config)
        # This checkout's modules, and the bundle's packages where a lent machine has it
        # (make gpu-bundle): a Python with only torch and an image's packages runs it.
        paths = [str(REPO), *([str(BUNDLE_SITE)] if BUNDLE_SITE.is_dir() else []),
                 *filter(None, [base.get("PYTHONPATH")])]
        base["PYTHONPATH"] = os.pathsep.join(paths)
        limit = max(1.0, self.left() if timeout is None else min(timeout, self.left()))
        path = self.folder / "logs" / f"{part.name}{'-' + log if log else ''}.log"
        with open(path, "ab") as out:
            out.write(f"$ {shown}\n".encode())
            out.flush()
            proc = subprocess.Popen(cmd, cwd=REPO, env={**base, **(env or {})}, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                rc = -1
        text = path.read_text(errors="replace")
        return rc, text[text.rfind(f"$ {shown}\n"):]

    def configure(self, part: Part, name: str, preset: str, settings: dict[str, str],
                  log: str = "") -> Path:
        """configs/<name>.config from defconfigs/<preset> with ``settings`` set
        (and the tiny shapes on the CPU), through make defconfig-* and setconfig."""
        config = self.folder / "configs" / f"{name}.config"
        rc, out = self.make(part, f"defconfig-{preset}", config=config, log=log)
        if rc:
            raise Failed(f"make defconfig-{preset} failed: {last_line(out)}")
        tiny = {} if self.gpu else dict(TINY)
        if settings.get("COMPILE") == "off":  # (the backend is not in force then)
            tiny.pop("COMPILE_BACKEND", None)
        values = {**tiny, "RESULTS_DIR": str(self.folder / "runs"),
                  "DATA_DIR": str(self.folder / "data"), "DATA_INPUT": self.corpus,
                  **settings}
        text = " ".join(f"{k}={shlex.quote(v) if v else chr(34) * 2}" for k, v in values.items())
        rc, out = self.make(part, "setconfig", f"SET={text}", config=config, log=log)
        if rc:
            raise Failed(f"make setconfig failed: {last_line(out)}")
        return config

    # ---- the report ----------------------------------------------------------------
    def header(self) -> list[str]:
        driver = ""
        if self.gpu:
            build = (f"CUDA {torch.version.cuda}" if torch.version.cuda else
                     f"ROCm {getattr(torch.version, 'hip', '')}")
            props = torch.cuda.get_device_properties(0)
            driver = (f"{build}, compute capability {props.major}.{props.minor}, "
                      f"{props.total_memory / 2**30:.1f} GiB, driver {nvidia_driver()}")
        return [
            f"# gpu-check: {self.device}",
            "",
            *([] if self.gpu else [
                "**No GPU: this ran the parts with tiny shapes on the CPU** (2 layers x 64, "
                "context 64, compiled with aot_eager). It shows the parts work; its figures "
                "are not GPU figures.", ""]),
            f"- device: {self.device}" + (f" ({driver})" if driver else ""),
            f"- torch: {torch.__version__}",
            f"- code: {self.code}",
            f"- budget: {self.budget / 60:.1f} minutes (GPU_CHECK_MINUTES); "
            f"started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
            "",
            "| part | status | time | note |",
            "|---|---|---:|---|",
            *(f"| {p.name} | {p.status} | {p.seconds:.0f} s | {p.note} |" for p in self.parts),
            "",
        ]

    def write(self) -> None:
        body = self.header()
        for p in self.parts:
            if p.status in ("pending", "skipped") and not p.lines:
                continue
            body += [f"## {p.name}: {p.status}", "", *(f"    {c}" for c in p.commands), "",
                     *p.lines, ""]
        write_text_atomic(self.folder / "report.md", "\n".join(body))
        write_text_atomic(self.folder / "results.json", json.dumps({
            "device": self.device, "gpu": self.gpu, "torch": torch.__version__,
            "cuda": torch.version.cuda, "commit": self.commit or None, "code": self.code,
            "budget_minutes": self.budget / 60, "tiny_shapes": not self.gpu,
            "parts": [p.record() for p in self.parts]}, indent=2) + "\n")

    def run(self) -> int:
        print(f"gpu-check {self.device} | {self.budget / 60:.1f} minutes | {self.folder}",
              flush=True)
        for part in self.parts:
            if part.name not in self.wanted:
                part.status, part.note = "skipped", "not in GPU_CHECK_PARTS"
                continue
            need = self.estimate(part.name)
            if need > self.left():
                part.status = "skipped"
                part.note = (f"about {need:.0f} s needed, {max(self.left(), 0):.0f} s left "
                             "of the budget")
                print(f"  {part.name:<8} skipped: {part.note}", flush=True)
                self.write()
                continue
            began = time.monotonic()
            try:
                RUNNERS[part.name](self, part)
                part.status = part.status if part.status != "pending" else "done"
            except Failed as e:
                part.status, part.note = "failed", str(e)
            part.seconds = time.monotonic() - began
            if part.name == "mission" and part.status == "done":
                self.scale = max(0.25, min(4.0, part.seconds / ESTIMATES["mission"][
                    0 if self.gpu else 1]))
            print(f"  {part.name:<8} {part.status} in {part.seconds:.0f} s"
                  + (f": {terminal_safe(part.note)}" if part.note else ""), flush=True)
            self.write()
        self.write()
        print(f"report   {self.folder / 'report.md'}")
        failed = [p.name for p in self.parts if p.status == "failed"]
        if failed:
            print(f"error: failed: {', '.join(failed)} (logs in {self.folder / 'logs'})",
                  file=sys.stderr)
        return 1 if failed else 0


class Failed(Exception):
    """A part that could not finish: its note says why."""


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def nvidia_driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def summary_of(folder: Path) -> dict:
    """The newest run's summary.json under ``folder`` (a results folder), or {}."""
    found = sorted(folder.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(found[-1].read_text()) if found else {}


def last_interval_rate(folder: Path) -> float | None:
    """tokens/s of the last logged interval of the newest run under ``folder``."""
    found = sorted(folder.glob("*/metrics.jsonl"), key=lambda p: p.stat().st_mtime)
    rows = [json.loads(ln) for ln in found[-1].read_text().splitlines()
            if ln.strip()] if found else []
    return next((r["tokens_per_sec"] for r in reversed(rows) if r.get("tokens_per_sec")), None)


def figure(summary: dict, key: str, fmt: str = "{:,.4g}") -> str:
    value = summary.get(key)
    return "n/a" if value is None else fmt.format(value)


# ---- the parts ---------------------------------------------------------------------------

def mission(check: Check, part: Part) -> None:
    steps = 60 if check.gpu else 6
    config = check.configure(part, "mission", "gpt2-shakespeare-l4", {
        "MAX_ITERS": str(steps), "WARMUP_ITERS": str(steps // 6), "EVAL_INTERVAL": str(steps // 2),
        "CHECKPOINT_INTERVAL": str(steps // 2), "LOG_INTERVAL": str(steps // 4),
        "RUN_NAME": "mission"})
    rc, out = check.make(part, config=config, log="make")
    if rc:
        raise Failed(f"make failed ({rc}): {last_line(out)}")
    s = summary_of(check.folder / "runs")
    part.figures["summary"] = {k: s.get(k) for k in (
        "final_val_loss", "tokens_per_sec", "mfu", "achieved_tflops", "peak_memory_mb",
        "predicted_peak_memory_mb", "iters", "wall_time_s")}
    # A short compiled run's own rate is mostly its first step (47 s of compiling on an
    # H200, against 9 s for the other 59 steps): the last log interval's rate, with no
    # evaluation in it, is the one to set beside bench's.
    last = last_interval_rate(check.folder / "runs")
    part.figures["last_interval_tokens_per_sec"] = last
    part.lines += [f"`make` of the L4 preset, {steps} steps: val loss "
                   f"{figure(s, 'final_val_loss')}, {figure(s, 'tokens_per_sec', '{:,.0f}')} tokens/s "
                   f"over the run, first step (compiling) included (MFU {figure(s, 'mfu', '{:.1%}')}); "
                   f"{'n/a' if last is None else f'{last:,.0f}'} tokens/s in its last log interval; "
                   f"peak {figure(s, 'peak_memory_mb', '{:,.0f}')}"
                   f" MB (predicted {figure(s, 'predicted_peak_memory_mb', '{:,.0f}')} MB)."]
    # Eager on a GPU: the question there is whether the kernels repeat themselves, and
    # two more compiled processes cost about 200 s of the budget (H200, 3de1b33); the
    # compiled resume is tested on the CPU (tests/runtime/test_compiled.py).
    eager = " --compile=off" if check.gpu else ""
    rc, out = check.make(part, "resume-check", f"TRAIN_ARGS=--max-iters={steps // 2 * 2}{eager}",
                         config=config, log="resume")
    rows = re.findall(r"^  (\S+)\s+(\S+)$", out, re.MULTILINE)
    part.figures["resume"] = dict(rows)
    verdict = next((ln for ln in out.splitlines() if ln.startswith(("exact", "not exact"))), "")
    part.figures["resume_exact"] = verdict.startswith("exact")
    part.lines += ["", "`make resume-check` (stopped at half, resumed, against a straight run"
                   + (", eager" if eager else "") + "):",
                   "", *(f"    {k:<26} {v}" for k, v in rows), "", verdict or last_line(out)]
    if rc:
        raise Failed(f"make resume-check failed ({rc}): {last_line(out)}")
    if not check.gpu and not part.figures["resume_exact"]:
        raise Failed("resume was not exact on the CPU, where it must be")


def bench_rows(check: Check, part: Part, config: Path, sweeps: list[str], steps: int,
               warmup: int, log: str) -> list[dict]:
    """`make bench` with these sweeps; the rows of its sweep JSON."""
    out_json = check.folder / "logs" / f"{part.name}-{log}.json"
    args = " ".join([f"--steps={steps}", f"--warmup={warmup}", f"--json={out_json}",
                     *(f"--sweep={s}" for s in sweeps)])
    rc, out = check.make(part, "bench", f"BENCH_ARGS={args}", config=config, log=log)
    rows = json.loads(out_json.read_text())["rows"] if out_json.is_file() else []
    part.lines += [f"`make bench` sweep {' x '.join(sweeps)} ({steps} timed steps after "
                   f"{warmup}):", ""]
    if rc and not rows:
        part.lines += [f"not measured: {last_line(out)}", ""]
        return []
    part.lines += ["| settings | tokens/s | MFU | step | peak MB (predicted) | compiled: graphs, "
                   "breaks, recompiles while timed |", "|---|---:|---:|---:|---:|---|"]
    kept = []
    for r in rows:
        label = " ".join(f"{k}={v}" for k, v in r["settings"].items() if k != "skipped")
        if r["status"] != "measured":
            part.lines.append(f"| {label} | {r['status']}: {r.get('note', '')} | | | | |")
            kept.append({"settings": r["settings"], "status": r["status"],
                         "note": r.get("note", "")})
            continue
        c = r.get("compiled")
        row = {"settings": r["settings"], "status": "measured", "tokens_per_sec":
               r["tokens_per_sec"], "mfu": r["mfu"], "step_ms": r["step_time_s"]["median"] * 1e3,
               "peak_memory_mb": r["peak_memory_mb"],
               "predicted_peak_memory_mb": r["predicted_peak_memory_mb"], "compiled": c}
        kept.append(row)
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
        part.lines.append(
            f"| {label} | {row['tokens_per_sec']:,.0f} | {mfu} | {row['step_ms']:.1f} ms | "
            f"{row['peak_memory_mb']:,.0f} ({row['predicted_peak_memory_mb']:,.0f}) | "
            + (f"{c['graphs']}, {c['graph_breaks']}, {c['recompiles_timed']}" if c else "eager")
            + " |")
    part.lines.append("")
    return kept


def bench(check: Check, part: Part) -> None:
    card = "h100" if re.search(r"\bH[12]00\b", check.device) else "l4"
    config = check.configure(part, "bench", f"gpt2-shakespeare-{card}",
                             {"RUN_NAME": f"bench-{card}"})
    steps, warmup = (20, 5) if check.gpu else (3, 1)
    # Eager and compiled first: the figure the issue tracks (MFU of the preset).
    rows = bench_rows(check, part, config, ["compile=off,on"], steps, warmup, "compile")
    part.figures["compile"] = rows
    if not any(r["status"] == "measured" for r in rows):
        raise Failed("neither eager nor compiled could be measured")
    levers = [("attention", ["attention_backend=auto,flash,cudnn,efficient,math"
                             if check.gpu else "attention_backend=math"]),
              # (tiny: one row each, the levers' code paths in under five minutes)
              ("loss", ["loss_chunk_tokens=0,8192", "loss_fused=n,y"] if check.gpu else
               ["loss_chunk_tokens=64", "loss_fused=y"]),
              ("batch", ["batch_size=16,32,64" if card == "h100" else "batch_size=8,16"]
               if check.gpu else []),
              ("mode", ["compile_mode=default,reduce-overhead,max-autotune-no-cudagraphs"]
               if check.gpu else [])]
    for name, sweeps in levers:
        if not sweeps:
            part.lines += [f"lever {name}: not on the CPU " + (
                "(compile modes are inductor's, and the tiny check compiles with aot_eager)"
                if name == "mode" else "(the tiny check keeps to five minutes)"), ""]
            continue
        n = 1
        for s in sweeps:
            n *= len(s.split("=", 1)[1].split(","))
        need = n * check.row_seconds()
        room = check.left() - check.reserve_for(LEVERS_LEAVE_ROOM_FOR)
        if need > room:
            why = ("the parts after this one need the rest of the budget"
                   if room < check.left() else f"{max(room, 0):.0f} s of the budget left")
            part.lines += [f"lever {name}: skipped ({n} rows, about {need:.0f} s; {why})", ""]
            part.figures[name] = "skipped"
            continue
        part.figures[name] = bench_rows(check, part, config, sweeps, steps, warmup, name)


def optim(check: Check, part: Part) -> None:
    args = (["--device=cuda", "--dtype=bfloat16", "--model-size=gpt2", "--block-size=1024",
             "--batch-size=8", "--steps=10", "--warmup=3", "--pruning=none"] if check.gpu else
            ["--device=cpu", "--n-layer=2", "--n-head=2", "--n-embd=64", "--block-size=32",
             "--batch-size=2", "--steps=2", "--warmup=1", "--pruning=none"])
    rc, out = check.make(part, "bench-optim", f"BENCH_ARGS={' '.join(args)}", log="optim")
    part.lines += ["`make bench-optim` (every optimizer, no pruning):", "",
                   *(f"    {ln}" for ln in out.splitlines()[1:] if ln.strip()), ""]
    if rc:
        raise Failed(f"make bench-optim failed ({rc}): {last_line(out)}")


def ramped() -> str:
    """The first pruning method (in the registry's order) that ramps its masks during
    training with any optimizer: the sparse part's method."""
    return next(m for m, spec in PRUNING_METHODS.items()
                if spec.family == "pruned during training" and spec.optimizer is None)


def sparse(check: Check, part: Part) -> None:
    config = check.configure(part, "sparse", "gpt2-shakespeare-l4", {
        "RUN_NAME": "sparse", "PRUNING_METHOD": ramped(), "PRUNING_STRUCTURE": "2:4",
        "TARGET_SPARSITY": "0.5", "COMPILE": "off"})
    steps, warmup = (20, 5) if check.gpu else (3, 1)
    rows = bench_rows(check, part, config, ["sparse_kernel=off,on"], steps, warmup, "kernel")
    part.figures["kernel"] = rows
    if not check.gpu:
        part.lines.append("(on the CPU the sparse kernel is refused: it needs CUDA; the row "
                          "saying so is the expected result)")
    elif not all(r["status"] == "measured" for r in rows):
        part.note = "the sparse kernel was not measured: see the rows"


def track3(check: Check, part: Part) -> None:
    """Track 3's model as its Muon preset trains it (524,288 tokens a step in 8
    micro-batches, the bfloat16 table), its step with Muon and with AdamW: the figure
    docs/matrix.md turns into GPU-hours per seed. Random tokens: no FineWeb needed."""
    settings = {"RUN_NAME": "track3"}
    if not check.gpu:  # (the bfloat16 table needs bfloat16 as the run's dtype)
        settings["DTYPE"] = "bfloat16"
    config = check.configure(part, "track3", "gpt2-fineweb10b-track3-muon", settings)
    steps, warmup = (5, 2) if check.gpu else (2, 1)
    rows = bench_rows(check, part, config, ["optimizer=muon,adamw"], steps, warmup,
                      "optimizers")
    part.figures["optimizers"] = rows
    if not any(r["status"] == "measured" for r in rows):
        raise Failed("neither optimizer's step could be measured")


def char(check: Check, part: Part) -> None:
    preset = "gpt2-shakespeare-char" if check.gpu else "gpt2-shakespeare-char-cpu"
    settings = {"RUN_NAME": "char", "EVAL_INTERVAL": "250" if check.gpu else "5",
                "CHECKPOINT_INTERVAL": "250" if check.gpu else "5"}
    if not check.gpu:  # (eager: the mission and the bench compile; five minutes in all)
        settings.update(MAX_ITERS="10", WARMUP_ITERS="2", COMPILE="off")
    config = check.configure(part, "char", preset, settings)
    # (at least its estimate: a run stopped before its first evaluation measures nothing)
    limit = max(check.estimate("char"), check.left() - check.reserve_for(("matrix",)))
    rc, out = check.make(part, config=config, log="train", timeout=limit)
    rows = [json.loads(ln) for p in sorted((check.folder / "runs").glob("char-*/metrics.jsonl"))
            for ln in p.read_text().splitlines() if ln.strip()]
    evals = [r for r in rows if "val_loss" in r]
    if not evals:
        raise Failed(f"no evaluation was reached ({last_line(out)})")
    best = min(evals, key=lambda r: r["val_loss"])
    last = max(r["step"] for r in rows)
    finished = rc == 0
    part.figures = {"steps": last, "finished": finished, "best_val_loss": best["val_loss"],
                    "best_step": best["step"], "last_val_loss": evals[-1]["val_loss"]}
    part.note = "" if finished else f"stopped at step {last} when its time was up"
    part.lines += [f"{preset}: {'all ' if finished else ''}{last} steps; best val loss "
                   f"{best['val_loss']:.4f} at step {best['step']} (nanoGPT: 1.4697 after 5,000 "
                   "steps on an A100)" + ("" if finished else ", stopped by the budget")]
    if rc not in (0, -1, 130):
        raise Failed(f"make failed ({rc}): {last_line(out)}")


def matrix(check: Check, part: Part) -> None:
    # The default optimizer and the first whole-matrix one, dense, whatever the preset
    # enables (the sparse part runs pruning).
    optimizers = [DEFAULT_OPTIMIZER, next(n for n, m in OPTIMIZERS.items() if not m.elementwise)]
    methods = [m for m, spec in PRUNING_METHODS.items() if spec.family == "dense"]
    steps = 100 if check.gpu else 6
    config = check.configure(part, "matrix", "gpt2-shakespeare-matrix-cpu", {
        **({"DEVICE": "cuda", "DTYPE": "bfloat16"} if check.gpu else {"COMPILE": "off"}),
        "RUN_NAME": "matrix", "MAX_ITERS": str(steps), "WARMUP_ITERS": str(steps // 6),
        "EVAL_INTERVAL": str(steps // 2), "LOG_INTERVAL": str(steps // 2),
        "CHECKPOINT_INTERVAL": str(steps // 2), "MATRIX_SEEDS": "1337 1338",
        **{axes.optimizer_symbol(n): "y" if n in optimizers else "n" for n in OPTIMIZERS},
        **{axes.pruning_symbol(m): "y" if m in methods else "n" for m in PRUNING_METHODS}})
    rc, out = check.make(part, "test-matrix", config=config, log="matrix")
    reports = sorted((check.folder / "runs").glob("matrix*/report.md"))
    part.lines += [f"`make test-matrix`: {' and '.join(OPTIMIZERS[n].title for n in optimizers)} "
                   "(no pruning) x 2 seeds, "
                   f"{steps} steps each" + (f"; report: {reports[-1]}" if reports else "")]
    summary = sorted((check.folder / "runs").glob("matrix*/summary.csv"))
    if summary:
        part.lines += ["", *(f"    {ln}" for ln in summary[-1].read_text().splitlines()[:6])]
    if rc or not reports:
        raise Failed(f"make test-matrix failed ({rc}): {last_line(out)}")


RUNNERS = {"mission": mission, "bench": bench, "optim": optim, "sparse": sparse,
           "track3": track3, "char": char, "matrix": matrix}


def main() -> int:
    text = os.environ.get("GPU_CHECK_MINUTES", "") or str(DEFAULT_MINUTES)
    try:
        minutes = float(text)
        if not 1 <= minutes <= 600:
            raise ValueError
    except ValueError:
        print(f"error: GPU_CHECK_MINUTES={text!r}: give minutes between 1 and 600 (e.g. 9)",
              file=sys.stderr)
        return 2
    wanted = tuple(os.environ.get("GPU_CHECK_PARTS", "").split()) or PARTS
    unknown = [p for p in wanted if p not in PARTS]
    if unknown:
        print(f"error: GPU_CHECK_PARTS names {unknown[0]!r}: the parts are "
              f"{', '.join(PARTS)}", file=sys.stderr)
        return 2
    return Check(minutes, wanted).run()


if __name__ == "__main__":
    from gpt2.processes import survive_lost_terminal

    survive_lost_terminal()
    sys.exit(main())
