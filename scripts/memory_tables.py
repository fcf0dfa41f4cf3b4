#!/usr/bin/env python3
"""Regenerate docs/memory.md from the memory estimator (gpt2/estimates/memory.py).

The tables are the estimator's own predictions, so they cannot drift from what
`make memcheck` and training use; the validation table measures real CPU steps with
scripts/memtrack.py. tests/estimates/test_memory.py fails when the predicted tables
in docs/memory.md are not what this script writes.

    python -m scripts.memory_tables            # rewrite docs/memory.md
    python -m scripts.memory_tables --check    # exit 1 if it is out of date
    python -m scripts.memory_tables --gpu      # predicted vs measured on this GPU
    python -m scripts.memory_tables --rss      # peak resident size of CPU runs
    python -m scripts.memory_tables --record-peaks RUN_OR_MATRIX_FOLDER...
        # add whole runs' peaks against their predictions to docs/memory_peaks.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path

import torch

from gpt2 import REPO
from gpt2.config.argparser import StrictArgumentParser
from gpt2.config.options import Config, resolve
from gpt2.config.sizes import MODEL_SIZES
from gpt2.estimates import memory
from gpt2.config.choices import PRUNING_METHODS
from gpt2.config.registry import DEFAULT_OPTIMIZER, OPTIMIZERS

DOC = REPO / "docs" / "memory.md"
# Whole CPU runs' measured peaks against their predictions (--record-peaks): measured
# over minutes to hours, so recorded rather than regenerated.
PEAKS = REPO / "docs" / "memory_peaks.json"
BATCHES = (1, 4, 8, 16, 32)
DTYPES = ("bfloat16", "float32")
GPU_CAPACITY = (("L4", 22.0), ("A100 40GB", 39.4), ("A100/H100 80GB", 79.1),
                ("H200", 139.8))  # GiB torch can use, about


def cfg_for(**kw):
    return resolve({"model_size": "gpt2", "block_size": 1024, "device": "cpu", **kw})


def gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def size_table(device_type: str, dtype: str, **kw) -> list[str]:
    lines = ["| model | params | " + " | ".join(f"micro-batch {b}" for b in BATCHES) + " |",
             "|---|---|" + "---|" * len(BATCHES)]
    for name, size in MODEL_SIZES.items():
        cfg = cfg_for(model_size=name, dtype=dtype, **kw)
        cells = [gib(memory.estimate(cfg, device_type, b).peak) for b in BATCHES]
        lines.append(f"| {name} | {size.label} | " + " | ".join(cells) + " |")
    return lines


SAVERS = (("none", {}), ("chunked loss 4096", dict(loss_chunk_tokens=4096)),
          ("fused loss 4096", dict(loss_chunk_tokens=4096, loss_fused=True)),
          ("selective", dict(activation_checkpointing="selective")),
          ("full", dict(activation_checkpointing="full")),
          ("chunked + full", dict(loss_chunk_tokens=4096, activation_checkpointing="full")))


def saver_table() -> list[str]:
    lines = ["| model, micro-batch | " + " | ".join(n for n, _ in SAVERS) + " |",
             "|---|" + "---|" * len(SAVERS)]
    for name, b in (("gpt2", 16), ("gpt2", 32), ("gpt2-medium", 16), ("gpt2-xl", 8)):
        cells = [gib(memory.estimate(cfg_for(model_size=name, dtype="bfloat16", **kw),
                                     "cuda", b).peak) for _, kw in SAVERS]
        lines.append(f"| {name}, {b} | " + " | ".join(cells) + " |")
    return lines


def largest_batch_table() -> list[str]:
    lines = ["| model | " + " | ".join(f"{g} ({c:g} GiB)" for g, c in GPU_CAPACITY) + " |",
             "|---|" + "---|" * len(GPU_CAPACITY)]
    for name in MODEL_SIZES:
        cells = []
        for _, cap in GPU_CAPACITY:
            cfg = cfg_for(model_size=name, dtype="bfloat16", batch_size=256)
            fit = memory.largest_fitting_batch(cfg, "cuda", int(cap * 2**30))
            cells.append(str(fit[0]) if fit else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def state_table() -> list[str]:
    cfg0 = cfg_for(dtype="bfloat16")
    lines = ["| optimizer | state per parameter | GPT-2 124M | GPT-2 1.5B |", "|---|---|---|---|"]
    for name, code in OPTIMIZERS.items():
        h, m, v = code.state_floats(cfg0)
        per = (f"{4 * h} B" if h == m == v else
               f"{4 * h} B (block matrices), {4 * m} B (others)" if m == v else
               f"{4 * h} B (matrices), {4 * v} B (biases, norms)" if h == m else
               f"{4 * h} B (block matrices), {4 * m} B (other matrices), {4 * v} B (vectors)")
        per += f" + {code.state_words}" if code.state_words else ""
        small = memory.estimate(cfg_for(optimizer=name), "cuda").term("optimizer")
        xl = memory.estimate(cfg_for(optimizer=name, model_size="gpt2-xl"), "cuda")
        lines.append(f"| {name} | {per} | {gib(small)} GiB | {gib(xl.term('optimizer'))} GiB |")
    lines += ["", "| pruning method | per target weight | GPT-2 124M | GPT-2 1.5B |",
              "|---|---|---|---|"]
    for method, spec in PRUNING_METHODS.items():
        if spec.family == "dense":
            continue
        opt = spec.optimizer or DEFAULT_OPTIMIZER
        est = [memory.estimate(cfg_for(model_size=m, optimizer=opt, pruning_method=method),
                               "cuda").term("pruning") for m in ("gpt2", "gpt2-xl")]
        lines.append(f"| {method} | {spec.memory_words} | {est[0] / 2**20:.0f} MiB | {est[1] / 2**20:.0f} "
                     "MiB |")
    return lines


# The methods whose memory the validation checks beyond the default's: the pruning
# method that holds the most per weight, and the first optimizer that needs whole
# matrices (its step's scratch, not the backward, sets the peak).
HEAVIEST_PRUNING = max((m for m, s in PRUNING_METHODS.items() if s.family != "dense"),
                       key=lambda m: PRUNING_METHODS[m].extra_bytes(Config()))
WHOLE_MATRIX = next(n for n, m in OPTIMIZERS.items() if not m.elementwise)

# bf16 cases stay small: CPUs without bf16 matrix units run them slowly.
VALIDATION = {
    "4x128, ctx 128, b 16, fp32": dict(n_layer=4, n_head=4, n_embd=128, block_size=128,
                                        batch_size=16),
    "2x128, ctx 64, b 4, bf16": dict(n_layer=2, n_head=4, n_embd=128, block_size=64,
                                     batch_size=4, dtype="bfloat16"),
    "2x128, ctx 64, b 4, bf16, selective ckpt": dict(n_layer=2, n_head=4, n_embd=128,
                                                     block_size=64, batch_size=4,
                                                     dtype="bfloat16",
                                                     activation_checkpointing="selective"),
    "6x256, ctx 256, b 4, full ckpt": dict(n_layer=6, n_head=8, n_embd=256, block_size=256,
                                           batch_size=4, activation_checkpointing="full"),
    "6x256, ctx 256, b 4, selective, chunk 256": dict(
        n_layer=6, n_head=8, n_embd=256, block_size=256, batch_size=4,
        activation_checkpointing="selective", loss_chunk_tokens=256),
    "6x256, ctx 256, b 4 x 2 accumulation": dict(n_layer=6, n_head=8, n_embd=256,
                                                 block_size=256, batch_size=4,
                                                 gradient_accumulation=2),
    f"4x128, ctx 128, b 8, {HEAVIEST_PRUNING} pruning": dict(
        n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=8,
        pruning_method=HEAVIEST_PRUNING, pruning_warmup=1, pruning_frequency=1),
    f"3x256, ctx 128, b 2, {WHOLE_MATRIX} (optimizer-step peak)": dict(
        n_layer=3, n_head=8, n_embd=256, block_size=128, batch_size=2, optimizer=WHOLE_MATRIX),
}


def measure_step(cfg, device: str) -> int:
    """Peak tensor bytes of a real optimizer step (after the first, so optimizer
    state exists), counting what is held throughout."""
    from gpt2.model.gpt import GPT
    from gpt2.model.build import model_config
    from gpt2.runtime.device import setup_runtime
    from scripts.memtrack import TensorMemory
    from gpt2.optim.algorithms.optimizers import build_optimizer
    from gpt2.sparsity.algorithms.pruning import build_pruner
    from gpt2.training.step import Learner, optimizer_step

    runtime = setup_runtime(device, cfg.dtype, True, 0)  # as training: large buffers unmapped
    torch.manual_seed(0)
    model = GPT(model_config(cfg)).to(device)
    optimizer = build_optimizer(model, cfg, runtime.device_type)
    pruner = build_pruner(model, optimizer, cfg, 100)
    scaler = torch.amp.GradScaler(runtime.device_type, enabled=runtime.needs_grad_scaler)
    x, y = (torch.randint(0, 50257, (cfg.batch_size, cfg.block_size)).to(device)
            for _ in range(2))
    stream = itertools.repeat((x, y))
    optimizer_step(Learner(model, optimizer, scaler, pruner, runtime), stream, 1, cfg)
    if runtime.device_type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        optimizer_step(Learner(model, optimizer, scaler, pruner, runtime), stream, 2, cfg)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    held = sum(t.numel() * t.element_size() for t in itertools.chain(
        model.parameters(), getattr(pruner, "pruned", {}).values(),
        getattr(pruner, "accumulated", {}).values(), getattr(pruner, "kept", {}).values()))
    held += sum(v.numel() * v.element_size() for s in optimizer.state.values()
                for v in s.values() if torch.is_tensor(v) and v.numel() > 1)
    with TensorMemory() as mem:
        optimizer_step(Learner(model, optimizer, scaler, pruner, runtime), stream, 2, cfg)
    return held + mem.peak


def validation_table(device: str, cases: dict) -> list[str]:
    lines = ["| configuration | predicted | measured | error |", "|---|---|---|---|"]
    for label, kw in cases.items():
        cfg = resolve({"model_size": "custom", "device": device, "dtype": "float32", **kw})
        predicted = memory.estimate(cfg, device).peak
        measured = measure_step(cfg, device)
        lines.append(f"| {label} | {predicted / 2**20:,.1f} MiB | {measured / 2**20:,.1f} MiB "
                     f"| {predicted / measured - 1:+.1%} |")
    return lines


GPU_CASES = {
    f"{size}, b {b}, {dtype}{', ' + mode if mode != 'none' else ''}": dict(
        model_size=size, block_size=1024, batch_size=b, dtype=dtype,
        activation_checkpointing=mode)
    for size, b, dtype, mode in (("gpt2", 8, "bfloat16", "none"), ("gpt2", 16, "bfloat16",
                                                                    "none"),
                                 ("gpt2", 8, "float32", "none"), ("gpt2", 16, "bfloat16",
                                                                  "full"),
                                 ("gpt2-medium", 8, "bfloat16", "selective"),
                                 ("gpt2-large", 4, "bfloat16", "none"))}


def rss_report() -> str:
    """Peak resident size of three-step CPU runs in fresh processes, against the
    tensor prediction: what CPU_ALLOCATOR_FACTOR is set from."""
    out = []
    for label, kw in [*list(VALIDATION.items())[:3], *RSS_ONLY.items()]:
        code = ("import itertools, json, resource, sys, torch\n"
                "from scripts.memory_tables import measure_rss\n"
                f"print(json.dumps(measure_rss({kw!r})))")
        r = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                      text=True, check=True, cwd=REPO).stdout)
        excess = r["rss"] - r["tensors"] - r["runtime"]
        beyond = excess - r["kernels"]
        out.append(f"{label}: peak RSS {r['rss'] / 2**20:,.0f} MiB = tensors "
                   f"{r['tensors'] / 2**20:,.0f} + process {r['runtime'] / 2**20:,.0f} + "
                   f"{excess / 2**20:,.0f} MiB more (beyond the kernels' "
                   f"{r['kernels'] / 2**20:,.0f}: {beyond / max(r['transient'], 1):.2f}x the "
                   f"step's {r['transient'] / 2**20:,.0f} MiB of temporaries); predicted "
                   f"{r['predicted'] / 2**20:,.0f} MiB ({r['predicted'] / r['rss'] - 1:+.1%})")
    return "\n".join(out)


def measure_rss(kw: dict) -> dict:
    import resource

    from gpt2.model.gpt import GPT
    from gpt2.model.build import model_config
    from gpt2.runtime.device import Runtime, setup_runtime
    from gpt2.optim.algorithms.optimizers import build_optimizer
    from gpt2.sparsity.algorithms.pruning import build_pruner
    from gpt2.training.step import Learner, optimizer_step

    cfg = resolve({"model_size": "custom", "device": "cpu", "dtype": "float32", **kw})
    setup_runtime("cpu", cfg.dtype, True, 0)
    before = memory.process_rss()  # (the process's own term: resident size before training)
    torch.manual_seed(0)
    model = GPT(model_config(cfg))
    optimizer = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, optimizer, cfg, 100)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    vocab = min(model_config(cfg).vocab_size, 50257)
    x, y = (torch.randint(0, vocab, (cfg.batch_size, cfg.block_size)) for _ in range(2))
    stream = itertools.repeat((x, y))
    runtime = Runtime("cpu", cfg.dtype)
    for i in range(3):
        optimizer_step(Learner(model, optimizer, scaler, pruner, runtime), stream, i + 1, cfg)
    est = memory.estimate(cfg, "cpu", runtime_bytes=before)
    tensors = est.peak - est.term("runtime") - est.term("allocator") - est.term("kernels")
    transient = est.term("activations") + est.term("copies") + est.term("logits")
    return {"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "tensors": tensors, "runtime": before, "transient": transient,
            "kernels": est.term("kernels"),
            "predicted": est.peak}


# Measured by --rss besides the first three VALIDATION rows: a step that allocates
# almost nothing, where the fixed part (memory.CPU_KERNELS) is the whole excess.
RSS_ONLY = {
    "4x128, ctx 64, b 12, fp32, 65 characters (shakespeare-char-cpu)": dict(
        n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, bias=False,
        dataset="shakespeare-char"),
    "1x32, ctx 32, b 1, fp32, 65 characters": dict(
        n_layer=1, n_head=1, n_embd=32, block_size=32, batch_size=1,
        dataset="shakespeare-char"),
}

VALIDATION_HEADER = "## Validation"


def render(validate: bool = True) -> str:
    """docs/memory.md; without ``validate`` it stops before the measured section."""
    head = render_predictions()
    if not validate:
        return head
    return head + "\n".join([
        VALIDATION_HEADER,
        "",
        "Predicted against the peak of a real optimizer step (the second, so optimizer "
        "state exists), measured on the CPU by counting tensor storage "
        "(`scripts/memtrack.py`):",
        "",
        *validation_table("cpu", VALIDATION),
        "",
        *peaks_section(),
        "On a GPU, `python scripts/memory_tables.py --gpu` prints the same comparison "
        "against `torch.cuda.max_memory_allocated` for GPT-2 sizes, batches, dtypes and "
        "checkpointing modes. No GPU figures are recorded here yet.",
        "",
    ])


def run_peaks(folder: Path) -> list[dict]:
    """The measured and predicted peak of a run folder, or of every cell of a matrix
    folder, with the preset (the folder's name without its hash) and the code's commit."""
    summaries = sorted(folder.glob("cells/*/summary.json")) or [folder / "summary.json"]
    preset = folder.name.removeprefix("matrix-").rsplit("-", 1)[0]
    rows = []
    for path in summaries:
        s = json.loads(path.read_text())
        if s.get("status") != "completed" or s.get("device", "").split(" ")[0] != "cpu":
            raise SystemExit(f"{path}: not a completed CPU run ({s.get('status')}, "
                             f"{s.get('device')})")
        rows.append({"preset": preset, "cell": path.parent.name if path.parent != folder
                     else "", "commit": s["provenance"]["code"]["commit"][:7],
                     "peak_mb": round(s["peak_memory_mb"]),
                     "predicted_mb": round(s["predicted_peak_memory_mb"])})
    return rows


def record_peaks(folders: list[Path]) -> list[dict]:
    """docs/memory_peaks.json with these folders' runs, replacing what it held for the
    same preset, cell and commit."""
    new = [r for f in folders for r in run_peaks(f)]
    keys = {(r["preset"], r["cell"], r["commit"]) for r in new}
    old = json.loads(PEAKS.read_text()) if PEAKS.is_file() else []
    rows = [r for r in old if (r["preset"], r["cell"], r["commit"]) not in keys] + new
    rows.sort(key=lambda r: (r["preset"], r["commit"], r["cell"]))
    PEAKS.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def peaks_section() -> list[str]:
    """Per preset and commit: how many runs, their peaks and predictions, and the
    highest peak as a share of its prediction."""
    rows = json.loads(PEAKS.read_text()) if PEAKS.is_file() else []
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["preset"], r["commit"]), []).append(r)
    lines = ["### Whole runs on the CPU", "",
             "Every run (or matrix cell) of a preset, trained to the end with `make` or "
             "`make test-matrix`: the process's peak resident size against the prediction "
             "it started with. Recorded with `python -m scripts.memory_tables "
             "--record-peaks <run or matrix folder>` (docs/memory_peaks.json).", "",
             "| preset | code | runs | peak | predicted | highest peak / prediction |",
             "|---|---|---|---|---|---|"]
    for (preset, commit), rs in groups.items():
        worst = max(rs, key=lambda r: r["peak_mb"] / r["predicted_mb"])
        span = lambda key: (f"{min(r[key] for r in rs):,}-{max(r[key] for r in rs):,} MB"
                            if len(rs) > 1 else f"{rs[0][key]:,} MB")
        lines.append(f"| {preset} | {commit} | {len(rs)} | {span('peak_mb')} | "
                     f"{span('predicted_mb')} | {worst['peak_mb'] / worst['predicted_mb']:.0%}"
                     f"{' (' + worst['cell'] + ')' if worst['cell'] else ''} |")
    return lines + ["", "Runs at 4730495 and 5ac31e1 predate 4e5e5de: glibc then kept every "
                    "freed buffer, and the heap it kept fragmented past the prediction, by a "
                    "different amount in each run. Since 4e5e5de buffers of 32 MiB and more "
                    "go back to the OS when freed, and of 8 MiB and more since the commit "
                    "after it (gpt2/runtime/device.py: LARGE_BUFFER).", ""]


def render_predictions() -> str:
    example = cfg_for(dtype="bfloat16", batch_size=16)
    est = memory.estimate(example, "cuda")
    return "\n".join([
        "# Memory: what a run needs, predicted before it starts",
        "",
        "<!-- Generated by `python scripts/memory_tables.py`; edit that script, not this "
        "file. -->",
        "",
        "`make memcheck` prints the predicted peak of the configured run, term by term, "
        "next to the device's free memory (CUDA: `torch.cuda.mem_get_info`; CPU: available "
        "RAM) or `CONFIG_MEMORY_BUDGET_MB`, with a verdict: *fits* (at most "
        f"{memory.HEADROOM:.0%} of the budget), *tight*, or *does not fit*. Training makes "
        "the same check before it allocates anything and refuses a run predicted not to "
        "fit, printing the breakdown and settings that would fit "
        "(`CONFIG_MEMORY_CHECK=n` turns the refusal off). With `CONFIG_AUTO_BATCH=y` it "
        "trains with the largest micro-batch that fits instead, and raises gradient "
        "accumulation so that the sequences per optimizer step stay "
        "`CONFIG_BATCH_SIZE x CONFIG_GRADIENT_ACCUMULATION`; the run keeps its name and "
        "hash, and a resumed run keeps the micro-batch it started with if it still fits.",
        "",
        "## What is counted",
        "",
        "The estimator (`gpt2/estimates/memory.py`) adds up real tensors; "
        "`tests/estimates/test_memory.py` checks each term against what a CPU step allocates. For "
        "GPT-2 124M, bf16, micro-batch 16 x 1024 tokens on CUDA:",
        "",
        "```",
        memory.breakdown(est),
        "```",
        "",
        f"The peak is at the {est.phase}: every activation is still saved and the float32 "
        "log-probabilities, their gradient and the logits' gradient (12 bytes per token "
        "and vocabulary entry) exist together. Without gradient accumulation no parameter "
        "gradient exists yet at that moment; with accumulation all of them do. Small "
        "micro-batches of wide models peak in the optimizer step instead (weights, "
        "gradients, state and the step's temporaries).",
        "",
        "With several processes (`make NGPU=N`) the figures are one process's, as `make "
        "memcheck NGPU=N` prints them. Each process runs its share of a step's "
        "micro-batches (the accumulation / N): with one each, no gradient exists yet at "
        "the backward through the head. DDP keeps its gradient buckets, a second float32 "
        "copy of the gradients (4 B per parameter), from the moment it wraps the model. "
        "FSDP (`CONFIG_PARALLEL_FSDP`) keeps 1/N of the weights, gradients and optimizer "
        "state, and gathers two blocks at a time. The DDP terms are measured in a real "
        "DDP step (gloo, one process of its own group) by the same test file.",
        "",
        "Saved activations per token and layer (C = width, H = heads, a = 2 bytes under "
        "bf16/fp16 autocast and 4 in float32): `none` 4C + C·a + 3aC + aC + 4C + C·a + 4aC "
        "+ 4aC + 4H + 16 (36C + 4H + 16 bytes in bf16, 64C + ... in float32); "
        "`selective` keeps the attention half and the MLP's input; `full` keeps only the "
        "block's float32 input (4C). Under autocast each Linear weight's half-precision "
        "copy is kept for backward too (2 bytes per weight, not inside checkpointed "
        "blocks).",
        "",
        "With track 3's precision (`CONFIG_MODEL_PRECISION_BF16_TABLE`, docs/model.md) the "
        "token table is bfloat16: it, its gradient, DDP's bucket for it and its optimizer "
        "state take 2 bytes a value. The forward keeps what bf16 autocast's does, and a head "
        "tied to the table needs no copy. Muon's step widens the table, its gradient and "
        "its moments to float32 while it runs (16 bytes a table value); torch's AdamW runs "
        "fused and allocates nothing. With a chunked loss the head's float32 gradient is "
        "summed out of place from the second chunk on: three head-sized float32 tensors at "
        "once. Each of these is measured on the CPU by the same test file.",
        "",
        "Not counted: the CUDA context and kernels' code (outside torch's allocator; "
        "`mem_get_info`'s free memory already excludes them), torch.compile's compiled "
        "graphs and their workspaces, evaluation and sampling (smaller than a training "
        "step), and the allocator's fragmentation (the 10 % headroom; "
        "`expandable_segments:True`, set by default through `PYTORCH_ALLOC_CONF` unless "
        "you set it, keeps fragmentation low). On the CPU the process's resident size is "
        "predicted: tensors, plus the process itself (measured when the check runs), plus "
        f"{memory.CPU_KERNELS // memory.MiB} MiB that the first step sets up (torch's CPU "
        "kernels, their thread pools and the autograd engine), plus "
        f"{memory.CPU_ALLOCATOR_FACTOR}x the step's temporary memory for freed space in "
        "glibc's heap. Buffers of 8 MiB and more go back to the OS as they are freed "
        "(gpt2/runtime/device.py:return_large_buffers), so the peak no longer depends on "
        "how the heap happened to fragment; the table below measures it in every cell "
        "of the CPU presets. GPU predictions count only tensors and are not subject to "
        "this).",
        "",
        "## GPU memory (VRAM) per model size and micro-batch",
        "",
        "Predicted peak in GiB, context 1024, AdamW, no pruning, no checkpointing, CUDA.",
        "",
        "**bf16 autocast**",
        "",
        *size_table("cuda", "bfloat16"),
        "",
        "**float32 (TF32 matmuls)**",
        "",
        *size_table("cuda", "float32"),
        "",
        "Largest power-of-two micro-batch predicted to fit (bf16, context 1024, AdamW, no "
        "savers; capacity is about what torch can use of the card):",
        "",
        *largest_batch_table(),
        "",
        "## Memory savers",
        "",
        "Predicted peak in GiB, bf16, context 1024, CUDA. `CONFIG_LOSS_CHUNK_TOKENS` "
        "computes the head and loss in chunks (each recomputed in backward); with "
        "`CONFIG_LOSS_FUSED` each chunk's gradients are computed in forward instead (no "
        "recomputation; the head's float32 gradient is held from the loss on). "
        "`CONFIG_ACTIVATION_CHECKPOINTING_*` recomputes the MLPs (selective) or whole "
        "blocks (full). None changes what is computed: checkpointing gives identical "
        "gradients, the chunked and fused losses the same up to float32 summation order.",
        "",
        *saver_table(),
        "",
        "## Optimizer state and pruning",
        "",
        *state_table(),
        "",
        "## The 2:4 sparse kernel",
        "",
        "Where `CONFIG_SPARSE_KERNEL` can run (2:4 pruning, a 16-bit dtype, CUDA), the "
        f"estimate adds {memory.SPARSE_KERNEL_FACTOR:g}x the activations at the backward's "
        "peak: a measured amount, not a derived one. On an H200 (gpu-check at 3de1b33, "
        "torch 2.11, the L4 preset pruned 2:4, micro-batch 16, eager) the kernel's run "
        "peaked at 38,872 MB against 17,282 with the kernel off, whose prediction "
        "(17,280) held; the 21,590 MB between them are 3.9x that run's activations "
        "([performance.md](performance.md#measured-on-an-h200-gpu-check-at-3de1b33)). "
        "Which tensors they are is not known yet: a term derived from them replaces "
        "this one when a GPU shows it. The compressed weights themselves (9/16 of a copy) "
        "live one Linear at a time.",
        "",
        "## CPU memory (RAM)",
        "",
        "Predicted peak resident size in GiB, context 1024, AdamW: tensors, the allocator "
        f"allowance, and {PROCESS_RSS / 2**20:.0f} MiB for the Python process with torch "
        "loaded (`make memcheck` measures the real one).",
        "",
        "**float32**",
        "",
        *size_table_ram("float32"),
        "",
        "**bf16 autocast** (CPUs with fast bf16 matmuls: AMX, recent Arm)",
        "",
        *size_table_ram("bfloat16"),
        "",
        "",
    ])


def is_current(validate: bool = True) -> bool:
    """Whether docs/memory.md is what render() writes (without ``validate``: up to
    the measured section, which takes a minute of CPU steps to regenerate)."""
    if not DOC.is_file():
        return False
    text = DOC.read_text()
    if validate:
        return text == render()
    return text.split(VALIDATION_HEADER)[0] == render(validate=False)


PROCESS_RSS = 220 * 2**20  # a Python process with torch loaded, about


def size_table_ram(dtype: str) -> list[str]:
    lines = ["| model | params | " + " | ".join(f"b {b}" for b in BATCHES) + " |",
             "|---|---|" + "---|" * len(BATCHES)]
    for name, size in MODEL_SIZES.items():
        cfg = cfg_for(model_size=name, dtype=dtype)
        cells = [gib(memory.estimate(cfg, "cpu", b, runtime_bytes=PROCESS_RSS).peak)
                 for b in BATCHES]
        lines.append(f"| {name} | {size.label} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = StrictArgumentParser(description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if the doc is stale")
    parser.add_argument("--gpu", action="store_true", help="validate on this CUDA GPU")
    parser.add_argument("--rss", action="store_true", help="peak RSS of CPU runs")
    parser.add_argument("--record-peaks", nargs="+", type=Path, metavar="FOLDER",
                        help="record these run or matrix folders' peaks, then rewrite the doc")
    args = parser.parse_args(argv)
    if args.record_peaks:
        record_peaks(args.record_peaks)
    if args.gpu:
        if not torch.cuda.is_available():
            parser.error("--gpu needs a CUDA GPU")
        print("\n".join(validation_table("cuda", GPU_CASES)))
        return 0
    if args.rss:
        print(rss_report())
        return 0
    if args.check:
        if not is_current():
            print(f"{DOC.relative_to(REPO)} is out of date: run python scripts/memory_tables.py")
            return 1
        return 0
    DOC.write_text(render())
    print(f"wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
