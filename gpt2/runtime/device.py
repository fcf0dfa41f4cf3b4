"""Device and precision: which device a run uses, how it autocasts, what memory it used.

The names CONFIG_DEVICE and CONFIG_DTYPE offer are in gpt2/config/choices.py. Checks run before any
work so a config that asks for hardware the machine lacks stops at once, with the
symbol to change.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from dataclasses import dataclass

import torch

from gpt2.errors import ConfigError

# Of the attention kernels (CONFIG_ATTENTION_BACKEND, gpt2/model/gpt.py), flash and
# math run everywhere; efficient (memory-efficient) and cudnn need a CUDA GPU.
CUDA_ONLY_ATTENTION: tuple[str, ...] = ("cudnn", "efficient")

CPU_DEFCONFIG = "make defconfig-gpt2-shakespeare-cpu"


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def resolve_device(requested: str) -> str:
    """auto -> cuda, then mps, then cpu. A device that is not there is an error."""
    if requested == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if _mps_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "CUDA was requested but torch sees no CUDA/ROCm GPU "
                          f"(torch {torch.__version__}, cuda build: {torch.version.cuda}). "
                          "Select CONFIG_DEVICE_AUTO or CONFIG_DEVICE_CPU in `make menuconfig`, "
                          f"or start from the CPU preset: {CPU_DEFCONFIG}")
    if requested == "mps" and not _mps_available():
        raise ConfigError("device", "MPS was requested but this machine has no Apple GPU; "
                          f"select CONFIG_DEVICE_AUTO, or run {CPU_DEFCONFIG}")
    return requested


def check_dtype(device: str, dtype: str) -> None:
    if dtype == "float16" and device != "cuda":
        raise ConfigError("dtype", f"float16 autocast needs a CUDA GPU (device is {device}); "
                          "use CONFIG_DTYPE_FLOAT32 or CONFIG_DTYPE_BFLOAT16")
    if dtype == "bfloat16" and device == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("dtype", "this GPU does not support bfloat16; use "
                          "CONFIG_DTYPE_FLOAT16 (with loss scaling) or CONFIG_DTYPE_FLOAT32")
    if dtype != "float32" and device == "mps":
        raise ConfigError("dtype", "use CONFIG_DTYPE_FLOAT32 on MPS")


@dataclass(frozen=True)
class Runtime:
    """The resolved device and precision of one run."""

    device: str
    dtype: str

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def torch_dtype(self) -> torch.dtype:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16,
                "float16": torch.float16}[self.dtype]

    def autocast(self):
        if self.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.torch_dtype)

    @property
    def needs_grad_scaler(self) -> bool:
        return self.dtype == "float16"

    def name(self) -> str:
        if self.device_type == "cuda":
            return torch.cuda.get_device_name()
        return f"{self.device_type} ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"

    def compiles(self, mode: str) -> bool:
        """Whether CONFIG_COMPILE ``mode`` compiles the model on this device."""
        return compiles(mode, self.device_type)

    def synchronize(self) -> None:
        """Wait for queued GPU work, so wall-clock timings mean something."""
        if self.device_type == "cuda":
            torch.cuda.synchronize()
        elif self.device_type == "mps":
            torch.mps.synchronize()

    def reset_peak_memory(self) -> None:
        if self.device_type == "cuda":
            torch.cuda.reset_peak_memory_stats()

    def peak_memory_mb(self) -> float:
        """Peak accelerator memory allocated by torch; on CPU the process's peak RSS."""
        if self.device_type == "cuda":
            return torch.cuda.max_memory_allocated() / 2**20
        if self.device_type == "mps":
            return torch.mps.driver_allocated_memory() / 2**20
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


# Buffers of this size or more are mapped for themselves and unmapped when freed. At
# 32 MiB the logits of a 128-token micro-batch (25 MiB) stayed in the heap and fragmented
# it: the tiny test matrix's cells peaked 7 % above their prediction (541 MiB, 505
# predicted); at 8 MiB, 429. A layer's activations (a few MiB) still come from the heap.
LARGE_BUFFER = 8 * 2**20


def return_large_buffers() -> bool:
    """Have glibc give every buffer of LARGE_BUFFER or more back to the OS when it
    is freed, so the process's resident size is the memory its tensors hold.

    Left to itself glibc does this for buffers above a threshold that moves (up to
    32 MiB, after the first such buffer is freed); fixed, it no longer depends on
    the order things happened in, and reaches the logits of small micro-batches. The opposite setting, keeping every freed buffer
    in the heap, was used until issue 47: it spared the page faults of mapping the
    step's logits buffers again, but the heap it kept fragmented, and the peak went past any
    prediction, differently from run to run (a 3.3M-parameter run predicted at
    1,060 MB peaked at 2,437 MB, and at 3,747 MB when run longer). With huge pages
    (gpt2/__init__.py) the faults cost little: the CPU preset trains as fast as it did.
    Tiny models pay more, their steps being little else: 60 steps of the tests' 2 x 32
    model (1.6M parameters, GPT-2's vocabulary) ran at 312-321 tokens/s against 436-460
    with every freed buffer kept.
    docs/memory.md has the measurements. No-op off glibc."""
    mallopt = _glibc("mallopt")
    m_mmap_threshold = -3
    return mallopt is not None and bool(mallopt(m_mmap_threshold, LARGE_BUFFER))


def return_freed_memory() -> bool:
    """Give the heap's freed memory (buffers below LARGE_BUFFER) back to the OS, once.

    Called after an evaluation on the CPU: its buffers differ in size from a training
    step's, and what they leave free in the heap would otherwise stay resident beside
    the step's. No-op off glibc."""
    malloc_trim = _glibc("malloc_trim")
    return malloc_trim is not None and bool(malloc_trim(0))


def _glibc(name: str):
    """glibc's function ``name``, or None off glibc."""
    try:
        import ctypes

        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # new name, old name
DEFAULT_ALLOC_CONF = "expandable_segments:True"


def configure_allocator(environ=os.environ) -> bool:
    """Let the CUDA caching allocator grow segments in place (expandable_segments)
    instead of carving fixed blocks: steps whose tensor sizes vary (evaluation,
    sampling, the last short batch) then stop fragmenting memory into pieces no
    later request fits, the usual cause of "out of memory" with gigabytes
    "reserved but unallocated". Read when the allocator starts, so this runs
    before the first CUDA allocation; a setting the user made is left alone."""
    if any(environ.get(name) for name in ALLOC_CONF_VARS):
        return False
    environ["PYTORCH_ALLOC_CONF"] = DEFAULT_ALLOC_CONF
    return True


def compiles(mode: str, device_type: str) -> bool:
    """Whether CONFIG_COMPILE ``mode`` compiles the model on ``device_type``."""
    return mode == "on" or (mode == "auto" and device_type == "cuda")


def check_attention(device: str, backend: str, dropout: float = 0.0) -> None:
    if backend in CUDA_ONLY_ATTENTION and device != "cuda":
        raise ConfigError("attention_backend", f"the {backend} attention kernels need a CUDA "
                          f"GPU (device is {device}); use CONFIG_ATTENTION_BACKEND_AUTO, _FLASH "
                          "or _MATH")
    # (torch's CPU flash kernel has no dropout: "No available kernel" at the first step)
    if backend == "flash" and device == "cpu" and dropout > 0:
        raise ConfigError("attention_backend", f"the CPU's flash attention kernel takes no "
                          f"dropout (CONFIG_DROPOUT is {dropout:g}): use "
                          "CONFIG_ATTENTION_BACKEND_AUTO or _MATH, or dropout 0")


def compiled(model: torch.nn.Module, style: str, backend: str = "inductor") -> torch.nn.Module:
    """``model`` under torch.compile in CONFIG_COMPILE_MODE ``style``, with
    CONFIG_COMPILE_BACKEND ``backend`` (a mode is inductor's: validate() refuses
    one with another backend)."""
    return torch.compile(model, mode=None if style == "default" else style, backend=backend)


def compile_counts() -> dict[str, int]:
    """What torch.compile has done in this process so far: the graphs it compiled
    and the graph breaks it met (torch._dynamo's counters). A compiled training run
    settles at one graph for the step and one for evaluation (no grad); a count that
    grows with the steps is a recompile every step, which ends in eager steps once
    Dynamo's recompile limit is reached."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def setup_runtime(device: str, dtype: str, tf32: bool, cpu_threads: int,
                  local_rank: int | None = None, attention: str = "auto",
                  dropout: float = 0.0) -> Runtime:
    """Resolve and check device/dtype (and the attention kernels asked for), then set
    process-wide torch switches. ``local_rank``: this process's GPU on its node,
    under torchrun."""
    configure_allocator()
    resolved = resolve_device(device)
    check_dtype(resolved, dtype)
    check_attention(resolved, attention, dropout)
    if cpu_threads:
        torch.set_num_threads(cpu_threads)
    if resolved == "cpu":
        return_large_buffers()
    if resolved == "cuda":
        # TF32 matmuls: ~2x faster fp32 GEMMs on Ampere+ at ~1e-3 relative precision.
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if local_rank is not None:
            torch.cuda.set_device(local_rank)
            return Runtime(f"cuda:{local_rank}", dtype)
    return Runtime(resolved, dtype)
