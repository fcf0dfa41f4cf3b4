"""What a setting may be: every choice list and the plain facts about each entry.

The configuration needs to know which optimizers and pruning methods exist, which
settings each reads, which pairs go together; it does not need their code. Those
facts live here, as plain data, so that importing ``Config`` imports no torch (a
`make` that has nothing to do answers at once). The code that implements each entry
lives above, keyed by the same names, and checks at import that it implements
exactly these (``implemented``):

    optimizers       gpt2/optim/<name>.py         one module each (gpt2/config/methods.py)
    pruning methods  gpt2/sparsity/<name>.py      one module each
    devices, dtypes  gpt2/runtime/device.py
    attention        gpt2/model/gpt.py            SDPA_BACKENDS
    trackers         gpt2/training/trackers.py

Model sizes (gpt2/config/sizes.py) and datasets (gpt2/config/datasets.py) are plain
tables of their own, read here as they are.
"""

from __future__ import annotations

from typing import Iterable

from gpt2.config.registry import OPTIMIZERS, PRUNING_METHODS

# ---- model and system --------------------------------------------------------------

CHECKPOINTING: tuple[str, ...] = ("none", "selective", "full")  # CONFIG_ACTIVATION_CHECKPOINTING_*
# The model's architecture choices (gpt2/model/gpt.py); the first of each is GPT-2's.
MODEL_NORMS: tuple[str, ...] = ("layernorm", "rmsnorm")  # CONFIG_MODEL_NORM
MODEL_POSITIONS: tuple[str, ...] = ("learned", "rope-half")  # CONFIG_MODEL_POSITION
MODEL_ACTIVATIONS: tuple[str, ...] = ("gelu", "relu2")  # CONFIG_MODEL_ACTIVATION
MODEL_INITS: tuple[str, ...] = ("gpt2", "track3")  # CONFIG_MODEL_INIT
# CONFIG_MODEL_PRECISION: float32 weights under autocast (kgpt's), or track 3's token
# table stored in bfloat16, which carries the whole forward in bfloat16
MODEL_PRECISIONS: tuple[str, ...] = ("autocast", "bf16-table")
# CONFIG_ATTENTION_BACKEND: the one SDPA kernel family allowed ("auto": torch chooses)
ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "flash", "cudnn", "efficient", "math")
DEVICES: tuple[str, ...] = ("auto", "cuda", "cpu", "mps")
# CONFIG_TARGET_CARD: the GPU a preset is written for, so `make memcheck` can answer
# for it on a machine without it (a laptop, a login node). Name -> (the card, its
# memory in GB as its datasheet gives it: 10^9 bytes).
CARDS: dict[str, tuple[str, float]] = {
    "l4": ("NVIDIA L4", 24), "a10": ("NVIDIA A10", 24),
    "a100-40gb": ("NVIDIA A100 40GB", 40), "a100-80gb": ("NVIDIA A100 80GB", 80),
    "h100": ("NVIDIA H100 80GB", 80), "h200": ("NVIDIA H200", 141),
    "w7900": ("AMD Radeon Pro W7900", 48), "mi300x": ("AMD Instinct MI300X", 192),
}
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
# torch.compile: "auto" compiles on CUDA GPUs, where it pays for its minute of
# start-up many times over, and not on the CPU or MPS, where it rarely does.
COMPILE_MODES: tuple[str, ...] = ("auto", "on", "off")
# CONFIG_SPARSE_KERNEL: 2:4 semi-structured matmuls (gpt2/sparsity/algorithms/sparse_kernel.py)
SPARSE_KERNELS: tuple[str, ...] = ("auto", "on", "off")
# torch.compile's mode= when compiling (CONFIG_COMPILE_MODE): the same computation,
# kernels chosen or launched differently. reduce-overhead and max-autotune replay
# CUDA graphs (fewer kernel launches from Python), max-autotune benchmarks kernel
# variants while compiling (minutes longer).
COMPILE_STYLES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune",
                                   "max-autotune-no-cudagraphs")
# CONFIG_COMPILE_BACKEND: what torch.compile hands the captured graphs to. inductor
# generates kernels (Triton on GPUs, C++ on the CPU: needs a compiler there);
# aot_eager traces forward and backward as inductor does but runs them with torch's
# own kernels, so it needs no compiler and finds the same graph breaks and
# recompiles in seconds (the CPU tests of the compiled step use it); eager only
# captures the forward.
COMPILE_BACKENDS: tuple[str, ...] = ("inductor", "aot_eager", "eager")
# CONFIG_PARALLEL: DDP keeps a whole copy of model and optimizer state per GPU; FSDP
# (PyTorch's fully_shard) splits weights, gradients and optimizer state among the
# processes, for models whose training state does not fit one GPU.
PARALLEL_MODES: tuple[str, ...] = ("ddp", "fsdp")
# CONFIG_NONFINITE: what a step with a non-finite loss does.
NONFINITE_POLICIES: tuple[str, ...] = ("stop", "skip")
# Learning-rate schedules (gpt2/training/schedule.py SCHEDULES) and the shapes of WSD's
# cooldown.
LR_SCHEDULES: tuple[str, ...] = ("cosine", "wsd", "linear", "constant")
WSD_SHAPES: tuple[str, ...] = ("linear", "sqrt", "cosine")
# Registry order is the order of the Kconfig choice entries (CONFIG_TRACKER_<NAME>).
TRACKERS: tuple[str, ...] = ("none", "tensorboard", "wandb", "trackio")
# Trackers that group runs into projects: CONFIG_TRACKER_PROJECT is in force only
# for these (TensorBoard has no projects, so a project name there would do nothing).
PROJECT_TRACKERS: tuple[str, ...] = ("wandb", "trackio")

# The GPT-2 tokenizer's vocabulary (gpt2/data/tokenizer.py checks its files hold it),
# and the token table kgpt trains: padded to a multiple of 128 for speed.
VOCAB_SIZE = 50257
PADDED_VOCAB_SIZE = 50304


def accumulation_problem(accumulation: int, processes: int, whence: str = "") -> str | None:
    """Why ``accumulation`` micro-batches per step cannot be shared by ``processes``
    (``whence``: where that count comes from, for the message)."""
    if accumulation % processes == 0:
        return None
    return (f"{accumulation} micro-batches per step do not divide among {processes} "
            f"processes{whence}: use a multiple of it (each process runs an equal share, so tokens "
            "per step stay batch_size x gradient_accumulation x block_size)")


# ---- optimizers ----------------------------------------------------------------------

# Every optimizer is a module of gpt2/optim/ (gpt2/config/methods.py loads them).
# Those whose update can be made cautious (Liang et al. 2024): those that read the
# setting.
CAUTIOUS = tuple(name for name, m in OPTIMIZERS.items() if "cautious" in m.reads)


def optimizer_hparams(cfg) -> dict:
    """The optimizer settings a run used, for summary.json."""
    names = ("learning_rate", "min_lr", "weight_decay") + OPTIMIZERS[cfg.optimizer].hparams
    return {name: getattr(cfg, name) for name in names}


# ---- pruning methods -----------------------------------------------------------------

PRUNING_RAMPS = ("cubic", "linear")
PRUNING_SCOPES = ("layer", "global")
# Mask structure: any weights, or N kept of every M consecutive weights along each row
# (a Linear's input dimension), the pattern sparse tensor cores run (2:4 on NVIDIA
# Ampere and newer).
PRUNING_STRUCTURES = ("unstructured", "2:4", "1:4", "4:8")
# One-shot pruning of a trained model (gpt2/training/oneshot.py, make prune-oneshot).
ONESHOT_METHODS = ("magnitude", "wanda", "sparsegpt")


def n_of_m(structure: str) -> tuple[int, int] | None:
    """(N, M) of an N:M structure ("2:4" -> (2, 4)); None for unstructured."""
    if structure == "unstructured":
        return None
    n, m = structure.split(":")
    return int(n), int(m)


def structure_sparsity(structure: str) -> float | None:
    """The sparsity an N:M structure fixes, 1 - N/M (2:4 -> 0.5); None for unstructured."""
    nm = n_of_m(structure)
    return None if nm is None else 1 - nm[0] / nm[1]

# Dynamic sparse training (SET, RigL): the sparsity is the target's from the first
# mask on, and the mask moves: every pruning_frequency steps until pruning_end, a
# fraction of each tensor's live weights (annealed from dst_drop_fraction) is dropped
# and as many regrown.
DST_ANNEALS = ("cosine", "constant")
# Every pruning method is a module of gpt2/sparsity/ (gpt2/config/registry.py).


def pair_problem(optimizer: str, method: str) -> str | None:
    """Why an optimizer and a pruning method cannot be combined, or None."""
    needs = PRUNING_METHODS[method].optimizer
    if needs is not None and needs != optimizer:
        return f"pruning method {method!r} works only with optimizer {needs!r}"
    if OPTIMIZERS[optimizer].pruning is not None and method not in pairs_of(optimizer):
        return (f"optimizer {optimizer!r} works only with pruning method "
                f"{' or '.join(repr(a) for a in pairs_of(optimizer))}")
    return None


def pairs_of(optimizer: str) -> list[str]:
    """The pruning methods an optimizer that lists its own (Optimizer.pruning) pairs
    with: those, the dense baseline, and the methods that demand it (Pruning.optimizer:
    the pairing is declared once, by the method that needs the optimizer)."""
    listed = OPTIMIZERS[optimizer].pruning or ()
    return [m for m, spec in PRUNING_METHODS.items()
            if m in listed or spec.family == "dense" or spec.optimizer == optimizer]


def valid_pairs() -> list[tuple[str, str]]:
    return [(o, m) for o in OPTIMIZERS for m in PRUNING_METHODS if pair_problem(o, m) is None]


def end_step(cfg, total_steps: int) -> int:
    """The step at which pruning reaches its target sparsity."""
    return max(1, round(cfg.pruning_end * total_steps))


def schedule_problem(cfg, total_steps: int) -> str | None:
    """Why the pruning schedule cannot fit in ``total_steps``, or None."""
    end = end_step(cfg, total_steps)
    if cfg.pruning_warmup < end:
        return None
    return (f"pruning would start after step {cfg.pruning_warmup} but must reach its target "
            f"by step {end} (pruning_end={cfg.pruning_end:g} of {total_steps} steps); lower "
            "pruning_warmup or raise pruning_end")


# ---- the implementations' check ------------------------------------------------------

def implemented(names: Iterable[str], code: Iterable[str], what: str) -> None:
    """Refuse, at import, code that implements other entries than a choice list holds:
    a name added in one place and not the other would otherwise show in the menus and
    fail only when a run chose it."""
    names, code = tuple(names), tuple(code)
    if names != code:
        missing = [n for n in names if n not in code]
        extra = [n for n in code if n not in names]
        raise RuntimeError(f"{what}: gpt2/config/choices.py lists {names}, the code "
                           f"implements {code} (missing: {missing}, not listed: {extra}; "
                           "same order); add or remove the entry in both")
