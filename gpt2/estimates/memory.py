"""Predict a training run's peak memory before anything is allocated.

The prediction is a sum of terms, each a count of real tensors (the tests in
tests/estimates/test_memory.py check every term against the tensors a CPU run allocates,
measured with scripts/memtrack.py):

* weights, gradients: 4 bytes per parameter each (float32), 2 for the token table's
  under CONFIG_MODEL_PRECISION=bf16-table; gradients are counted in full, which is
  exact with gradient accumulation and at most 4 bytes per parameter high without it;
* optimizer state: the optimizer registry's values per parameter, float32 but for a
  bfloat16 table's (bfloat16, as zeros_like makes them);
* pruning: one byte per target weight for the masks, plus 4 for RigL (the |gradient| it
  grows by) and 8 for movement (its scores
  and the values of pruned weights, kept aside in case they come back);
* activations kept for backward, per token and layer (C = n_embd, H = heads,
  a = 2 bytes under bf16/fp16 autocast, 4 in float32):

      none       4C + C·a' + 3aC + aC + 4C + C·a' + 4aC + 4aC + 4H + 16
      selective  4C + C·a' + 3aC + aC + 4C + 4H + 8   (the MLP is recomputed)
      full       4C                                   (only the block's input)

  (a' = bytes of a Linear's input: the half-precision copy of the LayerNorm
  output under autocast, the float32 output itself otherwise), plus the final
  LayerNorm, the head's input and the token ids. Each 4C + 8 is a LayerNorm; an
  RMSNorm keeps 8C + 4. Query-key norms and rotary positions add their own
  (_attention_extras, layer_position_bytes);
* autocast weight copies: under bf16/fp16 each Linear's weight is cast once per
  forward and the copy is kept for backward (not inside checkpointed blocks);
* logits and loss: 12 bytes per token and vocabulary entry at the peak of the
  head's backward (the saved float32 log-probabilities, their gradient, and the
  gradient of the logits); with chunked cross-entropy 16 bytes per chunk token; a
  logit cap keeps 4 more (6 under autocast);
* workspace: what the backward recomputation of a checkpointed block, the
  optimizer step or a pruning-mask update needs beyond that, plus a fixed
  allowance for cuBLAS/cuDNN workspaces on CUDA.

On CUDA the prediction is compared with ``torch.cuda.mem_get_info``'s free
memory (it is what ``torch.cuda.max_memory_allocated`` measures); on the CPU with
available RAM, adding the process's current resident size (interpreter, torch).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import torch

from gpt2.config.options import Config, applies
from gpt2.errors import ConfigError
from gpt2.model.gpt import CHECKPOINTING, GPT
from gpt2.model.build import model_config
from gpt2.sparsity.algorithms import sparse_kernel
from gpt2.runtime.device import compiles
from gpt2.config.registry import OPTIMIZERS, PRUNING_METHODS
from gpt2.optim.algorithms.optimizer_base import is_hidden_matrix
from gpt2.optim.algorithms.optimizers import is_fused_qkv
from gpt2.sparsity.algorithms.pruning import prune_targets, with_head

MiB = 2**20
CHECKPOINT_ORDER = CHECKPOINTING  # none < selective < full
# A run is planned to use at most this share of the budget: the rest absorbs
# allocator fragmentation and what the estimate does not model.
HEADROOM = 0.90
CUDA_WORKSPACE = 64 * MiB  # cuBLAS/cuDNN workspaces and kernel scratch
# What the 2:4 sparse kernel's forward (CONFIG_SPARSE_KERNEL) adds at the backward's
# peak, as a multiple of the saved activations: measured, not derived. gpu-check at
# 3de1b33 on an H200 (torch 2.11, bfloat16, eager, the L4 preset pruned 2:4 at
# micro-batch 16): 38,872 MiB against 17,282 with the kernel off, whose prediction
# (17,280) held; the 21,590 MiB between them are 3.9x its 5,568 MiB of activations.
# Which tensors they are is not known yet (docs/performance.md); until it is, the
# estimate carries the measured amount, rounded up, so that "fits" stays true.
SPARSE_KERNEL_FACTOR = 4.0
LOGIT_BYTES = 12  # per token and vocabulary entry at the head's backward peak
CHUNK_LOGIT_BYTES = 16  # per chunk token: the recomputed logits are alive as well
# The logit cap (CONFIG_MODEL_LOGIT_CAP) keeps its float32 input for backward: 4 B more
# per token and vocabulary entry, whole or chunked, and under autocast 2 B more, the
# head's low-precision gradient made beside it (measured on the CPU).
CAP_LOGIT_BYTES = 4
CAP_HALF_LOGIT_BYTES = 2
# On the CPU the process's peak resident size exceeds its tensors and its size before
# training by two amounts. A fixed one: the first step sets up torch's CPU kernels, their
# thread pools and the autograd engine, 88-111 MiB in runs whose step allocates almost
# nothing (30k-0.8M parameters, a 65-token vocabulary). And one that grows with the step:
# buffers of 8 MiB and more go back to the OS when freed
# (gpt2/runtime/device.py:return_large_buffers), but smaller ones come from glibc's heap,
# whose freed space stays resident and is not always reused. The allowance for it is
# 0.25x the step's temporary memory: with it, the CPU preset's whole run peaked at 87 %
# of its prediction and the tiny test matrix's cells at 84-93 % (docs/memory.md has the
# table; tests/matrix/test_matrix_run.py holds the matrix to it). Before issue 47 glibc kept
# every freed buffer, and peaks reached 2.6x their (larger) prediction, differently from
# run to run.
CPU_KERNELS = 96 * MiB
CPU_ALLOCATOR_FACTOR = 0.25


@dataclass(frozen=True)
class Shapes:
    """Parameter counts the estimate needs, read from the model itself (built on
    the meta device: no memory, no time, even for GPT-2 XL)."""

    params: int  # unique parameters (a tied head counts once)
    hidden: int  # parameters of the 2-D matrices inside the blocks
    vectors: int  # parameters of tensors with fewer than 2 dimensions (biases, norms)
    matrix_shapes: tuple[tuple[int, ...], ...]  # of each tensor of 2+ dimensions
    hidden_rows: int  # rows of the block matrices (NorMuon keeps a number per row)
    largest: int  # elements of the largest parameter
    # elements of the block matrices of the most common shape: what Muon
    # orthogonalizes as one stack (the fused QKV weights are a group of their own)
    largest_stack: int
    targets: int  # pruning targets
    largest_target: int
    head: int  # elements of the output head's weight
    table: int  # elements of the token table
    attn_weights: int  # per layer: Linear weights of attention
    mlp_weights: int  # per layer: Linear weights of the MLP


def shapes(cfg: Config) -> Shapes:
    # Only the dimensions matter: one cached entry per size, whatever the savers.
    dims = dataclasses.replace(model_config(cfg), checkpointing="none", loss_chunk_tokens=0,
                               dropout=0.0, attention_backend="auto")
    method = PRUNING_METHODS[cfg.pruning_method]
    return _shapes(dims, cfg.prune_embeddings, cfg.prune_norms_biases,
                   method.family != "dense", method.prunes_head(cfg))


def _stacks(named) -> dict:
    """Elements per stack of same-shaped block matrices, as Muon groups them."""
    stacks: dict = {}
    for n, p in named:
        if is_hidden_matrix(n, p):
            key = (is_fused_qkv(n), tuple(p.shape))
            stacks[key] = stacks.get(key, 0) + p.numel()
    return stacks


@functools.lru_cache(maxsize=64)
def _shapes(model_cfg, prune_embeddings: bool, prune_norms_biases: bool,
            pruning: bool, prune_head: bool = False) -> Shapes:
    with torch.device("meta"):
        model = GPT(model_cfg)
    named = list(model.named_parameters())
    named_targets = prune_targets(model, prune_embeddings, prune_norms_biases)
    if prune_head:
        named_targets = with_head(model, named_targets)
    targets = [p.numel() for _, p in named_targets]
    block = model.transformer.h[0]
    return Shapes(
        params=sum(p.numel() for _, p in named),
        hidden=sum(p.numel() for n, p in named if is_hidden_matrix(n, p)),
        vectors=sum(p.numel() for _, p in named if p.dim() < 2),
        matrix_shapes=tuple(tuple(p.shape) for _, p in named if p.dim() >= 2),
        hidden_rows=sum(p.shape[0] for n, p in named if is_hidden_matrix(n, p)),
        largest=max(p.numel() for _, p in named),
        largest_stack=max(_stacks(named).values(), default=0),
        targets=sum(targets) if pruning else 0,
        largest_target=max(targets) if pruning else 0,
        head=model.lm_head.weight.numel(),
        table=model.transformer.wte.weight.numel(),
        attn_weights=block.attn.c_attn.weight.numel() + block.attn.c_proj.weight.numel(),
        mlp_weights=block.mlp.c_fc.weight.numel() + block.mlp.c_proj.weight.numel())


# Bytes of the numpy object that holds the validation windows' offsets, measured with
# tracemalloc.
VAL_SET_OVERHEAD = 112


@dataclass(frozen=True)
class Term:
    key: str
    label: str
    bytes: int
    note: str = ""


@dataclass(frozen=True)
class Estimate:
    batch_size: int
    device_type: str
    dtype: str
    terms: tuple[Term, ...]
    # Saved activations under each checkpointing mode, for the "what would help" line.
    activations_by_mode: dict[str, int]
    phase: str  # the moment of the peak

    @property
    def peak(self) -> int:
        return sum(t.bytes for t in self.terms)

    def term(self, key: str) -> int:
        return next(t.bytes for t in self.terms if t.key == key)


def norm_bytes(cfg: Config) -> int:
    """Bytes per token a norm keeps for backward: LayerNorm its float32 input and two
    statistics; RMSNorm (composite on the CPU) its input, the normalised values and
    one statistic (measured)."""
    c = cfg.dims()[2]
    return 8 * c + 4 if cfg.model_norm == "rmsnorm" else 4 * c + 8


def _attention_extras(cfg: Config, a: int, half: bool) -> int:
    """Bytes per token the track 3 attention settings add to a block (measured on the
    CPU, tests/estimates/test_memory.py): query-key norms keep a statistic per head for
    each, under autocast their float32 inputs, and without rotary positions their
    outputs (in the attention's precision); rotary positions keep the turned queries
    and keys. (The turns' cosines and sines are per position: see layer_position_bytes.)"""
    _, n_head, c = cfg.dims()
    rope = cfg.model_position == "rope-half"
    extra = 2 * a * c if rope else 0
    if cfg.model_qk_norm:
        extra += 8 * n_head + (8 * c if half else 0) + (0 if rope else 2 * a * c)
    return extra


def layer_position_bytes(cfg: Config) -> int:
    """Bytes per layer, whatever the batch, that rotary positions keep: the cosines and
    sines of half a head's width at every position, for the queries and for the keys."""
    if cfg.model_position != "rope-half":
        return 0
    _, n_head, c = cfg.dims()
    return 8 * (c // n_head) * cfg.block_size


def layer_activation_bytes(cfg: Config, mode: str, half: bool) -> int:
    """Bytes per token one block keeps for backward (see the module docstring)."""
    _, n_head, c = cfg.dims()
    a = 2 if half else 4
    linear_in = a  # half: the autocast copy of the norm's output; else the output
    mask = 1 if cfg.dropout > 0 else 0  # dropout keeps a byte-per-element mask
    norm = norm_bytes(cfg)
    attn = (norm + linear_in * c + 3 * a * c + a * c + 4 * n_head + mask * c
            + _attention_extras(cfg, a, half))
    # (ReLU squared keeps what GELU does: its input's ReLU and the square, measured)
    mlp = norm + linear_in * c + 4 * a * c + 4 * a * c + mask * c
    if cfg.attention_backend == "math":
        # Plain matmul-and-softmax attention keeps each head's T x T weights for
        # backward (measured on the CPU: 4 B per pair in float32, about 6 B under
        # autocast, 10 B more with dropout's mask and dropped weights), where the
        # fused kernels keep only a log-sum-exp per row.
        attn += n_head * cfg.block_size * ((4 if not half else 6) + (10 if mask else 0))
    if mode == "none":
        return attn + mlp
    if mode == "selective":
        return attn + 4 * c  # the MLP's checkpoint keeps only its input
    return 4 * c


def _process_terms(cfg: Config, device_type: str, b: int, runtime_bytes: int,
                   transient: int) -> list[Term]:
    """The terms of a whole-process (resident size) prediction beyond the step's
    tensors; ``transient``: the bytes the step allocates and frees again."""
    terms = [Term("runtime", "process (Python, torch)", runtime_bytes,
                  "resident size before training")]
    if device_type == "cpu":
        # The validation set keeps its windows' offsets only (ValBatches reads each
        # batch when it is evaluated): 8 B per window. With eval_tokens 0 (the whole
        # split) the count is the split's, unknown here: 8 B per window of it (a
        # billion-token split: 8 MB) is left out.
        windows = -(-cfg.eval_tokens // cfg.block_size)
        terms.append(Term("validation", "validation set", 8 * windows + VAL_SET_OVERHEAD,
                          f"{windows:,} window offsets x 8 B" if windows else
                          "the whole split's window offsets, 8 B each (not counted)"))
        terms.append(Term("kernels", "CPU kernels and threads", CPU_KERNELS,
                          "set up by the first step (docs/memory.md)"))
        terms.append(Term("allocator", "allocator heap",
                          int(CPU_ALLOCATOR_FACTOR * transient),
                          f"freed heap space: {CPU_ALLOCATOR_FACTOR}x the step's "
                          "temporaries (docs/memory.md)"))
    return terms


# Longer than most functions on purpose: each term of the peak is derived here beside
# the terms it is compared with to find the peak moment; split up, the derivation
# would be spread over helpers passing a dozen sizes back and forth.
def estimate(cfg: Config, device_type: str, batch_size: int | None = None,
             runtime_bytes: int = 0, shape: Shapes | None = None) -> Estimate:
    """Predicted peak of one training step of ``cfg`` (micro-batch ``batch_size``,
    default the config's) on ``device_type``; ``runtime_bytes`` is added as its own
    term (the CPU process's resident size before training)."""
    b = batch_size or cfg.batch_size
    s = shape or shapes(cfg)
    n_layer, n_head, c = cfg.dims()
    tokens = b * cfg.block_size
    half = cfg.dtype != "float32"
    mode = cfg.activation_checkpointing
    vocab = model_config(cfg).vocab_size

    # FSDP keeps 1/shards of weights, gradients and optimizer state per process, and
    # gathers whole blocks to use them: the one in use and the next, prefetched.
    shards = cfg.nproc_per_node if cfg.parallel == "fsdp" else 1
    # Each process runs its share of the step's micro-batches (runtime.distributed).
    accumulation = cfg.gradient_accumulation // max(cfg.nproc_per_node, 1)
    # DDP keeps its gradient buckets from the moment it wraps the model: a second
    # float32 copy of the gradients (torch's default, gradient_as_bucket_view off),
    # measured with gloo in tests/estimates/test_memory.py.
    # bf16-table: the token table, its gradient (and bucket) and its state take 2 B a
    # value, not 4
    narrow = 2 * s.table if cfg.model_precision == "bf16-table" else 0
    param_bytes = 4 * s.params - narrow
    buckets = param_bytes if cfg.parallel == "ddp" and cfg.nproc_per_node > 1 else 0
    gathered = 2 * 4 * (s.attn_weights + s.mlp_weights) if shards > 1 else 0
    weights = -(-param_bytes // shards) + gathered
    grads = -(-param_bytes // shards)
    h, m, v = OPTIMIZERS[cfg.optimizer].state_floats(cfg)
    other_matrices = s.params - s.hidden - s.vectors
    optimizer = -(-(4 * (h * s.hidden + m * other_matrices + v * s.vectors) - m * narrow
                    + OPTIMIZERS[cfg.optimizer].state_extra(cfg, s)) // shards)
    # a mask byte per target weight, and what the method keeps beside it
    per_target = 1 + PRUNING_METHODS[cfg.pruning_method].extra_bytes(cfg)
    pruning = s.targets * per_target

    # ids (inputs and targets, int64), the final norm's input and statistics, the
    # head's input, the embedding dropout's mask, and the embedding's norm.
    outside = (16 + norm_bytes(cfg) + (2 if half else 4) * c + (c if cfg.dropout > 0 else 0)
               + (norm_bytes(cfg) if cfg.model_embedding_norm else 0))
    # (and rotary positions' cosines and sines, per layer whatever the batch, where the
    # attention is not checkpointed)
    by_mode = {m: tokens * (n_layer * layer_activation_bytes(cfg, m, half) + outside)
                  + (n_layer * layer_position_bytes(cfg) if m != "full" else 0)
               for m in ("none", "selective", "full")}
    activations = by_mode[mode]

    per_layer_copies = {"none": s.attn_weights + s.mlp_weights, "selective": s.attn_weights,
                        "full": 0}[mode]
    # (a head tied to a bfloat16 table is bfloat16 already: no copy of it)
    head_copy = 0 if narrow and cfg.tie_weights else s.head
    copies = 2 * (n_layer * per_layer_copies + head_copy) if half else 0

    chunk = cfg.loss_chunk_tokens
    chunked = bool(chunk and tokens > chunk)
    if cfg.loss_fused:
        # The loss's forward computes the head's gradients (gpt2/model/fused_loss.py):
        # one float32 chunk buffer (under autocast briefly beside the low-precision
        # linear output, then beside its low-precision copy, which the head-gradient
        # matmul's low-precision result joins), the head's float32 gradient and the
        # hidden states' gradient.
        piece = min(chunk, tokens) * vocab
        buffer = max(6 * piece, 2 * piece + 2 * s.head) if half else 4 * piece
        logits = buffer + 4 * s.head + 4 * tokens * c
    else:
        cap = (CAP_LOGIT_BYTES + (CAP_HALF_LOGIT_BYTES if half else 0)
               if cfg.model_logit_cap else 0)
        logit_bytes = (CHUNK_LOGIT_BYTES if chunked else LOGIT_BYTES) + cap
        logits = logit_bytes * (min(chunk, tokens) if chunked else tokens) * vocab
        if chunked and narrow and not cfg.tie_weights:
            # bf16-table, untied: each chunk's head gradient comes through its own cast to
            # float32 and is added to the sum out of place (autocast shares one cast):
            # from the second chunk on the sum exists beside a chunk's logits (then 4 B
            # an entry fewer of them), and an addition holds three head-sized float32
            # tensors, less the chunk's bfloat16 head copy counted among the copies
            # (measured on the CPU). Under accumulation the sum is among the gradients
            # already counted.
            with_sum = logits - 4 * chunk * vocab + 4 * s.head
            logits = with_sum if accumulation > 1 else max(with_sum, 10 * s.head)

    # Transients beyond the saved activations: one checkpointed block (or MLP)
    # rebuilt in backward, or the optimizer step / a pruning update afterwards,
    # when the activations and logits are gone.
    recompute = 0
    if mode != "none":
        full_layer = layer_activation_bytes(cfg, "none", half) * tokens
        kept = layer_activation_bytes(cfg, mode, half) * tokens
        recompute = full_layer - kept + (2 * (s.attn_weights + s.mlp_weights - per_layer_copies)
                                         if half else 0)
    # The peak is one of three moments. (A) Backward through the output head (or
    # through a recomputed block; with the fused loss, the loss's forward): every
    # activation is still saved. Without accumulation no gradient exists yet then
    # (with a chunked loss the first chunk's backward is the largest, before the
    # head's gradient); with accumulation all of them do. (B) The optimizer step or
    # a pruning update: every gradient, no activation. (C) The end of backward with
    # a tied head: autograd adds the head's gradient and the token table's dense
    # one into a third (vocabulary x C) tensor, beside an existing gradient under
    # accumulation. Only small, vocabulary-heavy models peak there.
    if accumulation > 1 or recompute > logits:
        grads_a = grads  # (a recomputed block sits mid-backward: count all, to be safe)
    else:
        grads_a = 0
    # (assuming a GPU that runs it: the estimate is made before one is asked)
    sparse = (applies(cfg, "sparse_kernel") and cfg.sparse_kernel != "off"
              and sparse_kernel.problem(cfg, device_type, capability=(8, 0)) is None)
    sparse_extra = int(SPARSE_KERNEL_FACTOR * activations) if sparse else 0
    moment_a = grads_a + activations + sparse_extra + copies + max(logits, recompute)
    optimizer_scratch = OPTIMIZERS[cfg.optimizer].step_scratch(device_type, s, cfg)
    globally = PRUNING_METHODS[cfg.pruning_method].ranks_globally(cfg)
    score_elems = s.targets if globally else s.largest_target
    update_scratch = optimizer_scratch + 9 * score_elems  # scores, ranked copy, new mask
    moment_b = grads + update_scratch
    tied_sum = (((3 if accumulation > 1 else 2) * (2 if narrow else 4) * s.head)
                if cfg.tie_weights and shards == 1 else 0)
    moment_c = grads + tied_sum
    in_a = moment_a >= max(moment_b, moment_c)
    in_c = not in_a and moment_c > moment_b
    fixed = CUDA_WORKSPACE if device_type == "cuda" else 0
    if in_a:
        phase = ("backward through a recomputed block" if recompute > logits else
                 "loss's forward (fused head and cross-entropy)" if cfg.loss_fused else
                 "backward through the output head")
        grads_now, workspace = grads_a, max(0, recompute - logits) + fixed
        act_now, copies_now, logits_now = activations, copies, logits
        sparse_now = sparse_extra
    elif in_c:
        phase = "end of backward (the tied head's gradient summed)"
        grads_now, workspace = grads, tied_sum + fixed
        act_now = copies_now = logits_now = sparse_now = 0
    else:
        phase = "optimizer step" + (" and pruning update" if s.targets else "")
        grads_now, workspace = grads, update_scratch + fixed
        act_now = copies_now = logits_now = sparse_now = 0

    terms = [
        Term("weights", "weights", weights, f"{s.params:,} parameters x 4 B (float32)" + (
            f", the token table's {s.table:,} x 2 B (bfloat16)" if narrow else "") + (
            f" / {shards} shards, + 2 gathered blocks" if shards > 1 else "")),
        Term("gradients", "gradients", grads_now,
             "4 B per parameter" if grads_now else "none exist yet at this moment"),
        *([Term("buckets", "DDP gradient buckets", buckets,
                f"as the gradients, on each of {cfg.nproc_per_node} processes")]
          if buckets else []),
        Term("optimizer", f"optimizer state ({cfg.optimizer})", optimizer,
             f"{h} float(s) per block-matrix weight, {m} per other matrix weight, "
             f"{v} per bias or norm weight" if m != v else
             f"{h} float(s) per block-matrix weight, {m} per other weight"),
        Term("pruning", f"pruning masks/scores ({cfg.pruning_method})", pruning,
             f"{s.targets:,} targets x {per_target} B" if s.targets else ""),
        Term("activations", f"activations (checkpointing {mode})", act_now,
             f"{tokens:,} tokens x {n_layer} layers" if act_now else "freed by then"),
        Term("copies", "autocast weight copies", copies_now,
             (f"{cfg.dtype} copies of the Linear weights" if copies_now else
              "none in float32" if not half else "freed by then")
             + ("; the 2:4 kernel's compressed copies (9/16 of a copy) live one Linear at "
                "a time in the forward, freed before this moment" if sparse else "")),
        *([Term("sparse", "2:4 sparse kernel (measured)", sparse_now,
                f"{SPARSE_KERNEL_FACTOR:g}x the activations, as measured on an H200 "
                "(docs/memory.md)" if sparse_now else "freed by then")] if sparse else []),
        Term("logits", "logits and loss", logits_now,
             ("freed by then" if not logits_now else
              f"chunks of {chunk:,} tokens x {vocab:,}, the head's and the hidden states' "
              "gradients (fused)" if cfg.loss_fused else
              f"chunks of {chunk:,} tokens x {vocab:,} x {logit_bytes} B" if chunked
              else f"{tokens:,} tokens x {vocab:,} x {logit_bytes} B (float32)")),
        Term("workspace", "workspace", workspace,
             ", ".join(filter(None, (
                 "block recompute" if in_a and recompute > logits else
                 "the tied gradients' sum" if in_c else
                 "optimizer/pruning scratch" if not in_a else "",
                 "cuBLAS and kernels" if fixed else "")))),
    ]
    if runtime_bytes:  # a whole-process (resident size) prediction
        terms += _process_terms(cfg, device_type, b, runtime_bytes,
                                transient=activations + copies + max(logits, recompute))
    return Estimate(b, device_type, cfg.dtype, tuple(terms), by_mode, phase)


# ---- the device's side ----------------------------------------------------------------

def process_rss() -> int:
    """This process's resident size now (Linux; 0 where unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def available_ram() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


@dataclass(frozen=True)
class Budget:
    bytes: int | None  # None: unknown (then nothing is refused)
    source: str
    runtime_bytes: int  # counted into every estimate on this device


def budget(cfg: Config, device_type: str) -> Budget:
    """What a run may use: CONFIG_MEMORY_BUDGET_MB, else the device's free memory."""
    runtime = process_rss() if device_type == "cpu" else 0
    if cfg.memory_budget_mb:
        return Budget(cfg.memory_budget_mb * MiB, "CONFIG_MEMORY_BUDGET_MB", runtime)
    if device_type == "cuda":
        free, total = torch.cuda.mem_get_info()
        return Budget(free, f"free on {torch.cuda.get_device_name()} ({total / 2**30:.1f} GiB "
                      "total)", 0)
    if device_type == "cpu":
        ram = available_ram()
        # The process's own resident memory is part of the prediction: add it back.
        return Budget(None if ram is None else ram + runtime, "available RAM", runtime)
    return Budget(None, f"unknown for {device_type}", 0)


def verdict(peak: int, limit: int | None) -> str:
    if limit is None:
        return "unknown: no memory figure for this device"
    share = peak / limit
    if share <= HEADROOM:
        return f"fits ({share:.0%} of the budget)"
    if share <= 1:
        return (f"tight ({share:.0%} of the budget): may fail from fragmentation or what "
                "the estimate leaves out")
    return f"does not fit ({share:.0%} of the budget)"


def fits(est: Estimate, limit: int | None) -> bool:
    return limit is None or est.peak <= HEADROOM * limit


def largest_fitting_batch(cfg: Config, device_type: str, limit: int | None,
                          runtime_bytes: int = 0, world: int = 1) -> tuple[int, int] | None:
    """(micro-batch, accumulation) with the most sequences per micro-batch that fits
    and the same sequences per step as the config; None if not even 1 fits. With
    ``world`` processes the accumulation must divide among them."""
    per_step = cfg.batch_size * cfg.gradient_accumulation
    s = shapes(cfg)
    for b in sorted((d for d in range(1, per_step + 1)
                     if per_step % d == 0 and (per_step // d) % world == 0), reverse=True):
        if fits(estimate(cfg, device_type, b, runtime_bytes, s), limit):
            return b, per_step // b
    return None


class MemoryPlanError(ConfigError):
    """A configuration predicted not to fit; the message holds the breakdown."""


def gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / MiB:,.0f} MiB"


COMPILED_BOUND = " (eager-mode figure: an upper bound when compiled)"


def bound_note(cfg: Config, device_type: str) -> str:
    """What a prediction is under torch.compile: the estimate models eager PyTorch,
    and Inductor's fused kernels keep fewer intermediates, so it is an upper bound
    there (docs/performance.md: GPT-2 124M on an H100, 12,486 MB measured against
    17,199 MB predicted)."""
    return COMPILED_BOUND if compiles(cfg.compile, device_type) else ""


def breakdown(est: Estimate, b: Budget | None = None) -> str:
    width = max(len(t.label) for t in est.terms)
    lines = [f"  {t.label:<{width}}  {gib(t.bytes):>11}  {t.note}".rstrip() for t in est.terms]
    lines.append(f"  {'predicted peak':<{width}}  {gib(est.peak):>11}")
    if b is not None:
        lines.append(f"  {'budget':<{width}}  "
                     f"{gib(b.bytes) if b.bytes is not None else 'unknown':>11}  {b.source}")
        lines.append(f"  verdict: {verdict(est.peak, b.bytes)}")
    return "\n".join(lines)


SAVER_CHUNK = 4096  # tokens per cross-entropy chunk the suggestions propose


def savers(cfg: Config) -> list[tuple[str, Config]]:
    """The memory savers not yet on, each as (Kconfig setting, config with it on)."""
    out = []
    if not cfg.loss_chunk_tokens and cfg.batch_size * cfg.block_size > SAVER_CHUNK:
        out.append((f"CONFIG_LOSS_CHUNK_TOKENS={SAVER_CHUNK}",
                    dataclasses.replace(cfg, loss_chunk_tokens=SAVER_CHUNK)))
    for mode in ("selective", "full"):
        if CHECKPOINT_ORDER.index(mode) > CHECKPOINT_ORDER.index(cfg.activation_checkpointing):
            out.append((f"CONFIG_ACTIVATION_CHECKPOINTING_{mode.upper()}=y",
                        dataclasses.replace(cfg, activation_checkpointing=mode)))
    chunk = out[0] if out and out[0][1].loss_chunk_tokens != cfg.loss_chunk_tokens else None
    if chunk and len(out) > 1:  # the chunked loss with full checkpointing
        both = dataclasses.replace(out[-1][1], loss_chunk_tokens=SAVER_CHUNK)
        out.append((f"{chunk[0]} + {out[-1][0]}", both))
    return out


def suggestion(cfg: Config, device_type: str, b: Budget, world: int = 1) -> str:
    """Concrete settings that would fit, most faithful to the config first."""
    options = []
    fit = largest_fitting_batch(cfg, device_type, b.bytes, b.runtime_bytes, world)
    if fit is not None:
        micro, accum = fit
        options.append(f"CONFIG_BATCH_SIZE={micro} CONFIG_GRADIENT_ACCUMULATION={accum} (the "
                       f"same {cfg.tokens_per_step():,} tokens per step), or CONFIG_AUTO_BATCH=y "
                       "to choose this automatically")
    for setting, other in savers(cfg):
        est = estimate(other, device_type, runtime_bytes=b.runtime_bytes)
        if fits(est, b.bytes):
            options.append(f"{setting} (predicted {gib(est.peak)})")
    if not options:
        options.append("a smaller model or CONFIG_BLOCK_SIZE, or a device with more memory: "
                       "no micro-batch size or memory saver is predicted to fit")
    return "\n".join(f"  - {o}" for o in options)


def check(cfg: Config, device_type: str, resume_batch: int | None = None,
          world: int = 1) -> tuple[Config, Estimate, Budget]:
    """Before training: apply auto batch, then refuse a config predicted not to fit
    (unless CONFIG_MEMORY_CHECK is off). Returns the config to train with.
    ``resume_batch``: the micro-batch an interrupted run of this config used; auto
    batch keeps it if it still fits, so the resumed run continues exactly."""
    b = budget(cfg, device_type)
    per_step = cfg.batch_size * cfg.gradient_accumulation
    if (cfg.auto_batch and resume_batch and per_step % resume_batch == 0
            and (per_step // resume_batch) % world == 0
            and fits(estimate(cfg, device_type, resume_batch, b.runtime_bytes), b.bytes)):
        cfg = dataclasses.replace(cfg, batch_size=resume_batch,
                                  gradient_accumulation=per_step // resume_batch)
    elif cfg.auto_batch:
        fit = largest_fitting_batch(cfg, device_type, b.bytes, b.runtime_bytes, world)
        if fit is not None:
            micro, accum = fit
            if (micro, accum) != (cfg.batch_size, cfg.gradient_accumulation):
                print(f"auto batch: micro-batch {micro} x {accum} accumulation "
                      f"(was {cfg.batch_size} x {cfg.gradient_accumulation}; "
                      f"{cfg.tokens_per_step():,} tokens per step either way)", flush=True)
            cfg = dataclasses.replace(cfg, batch_size=micro, gradient_accumulation=accum)
    est = estimate(cfg, device_type, runtime_bytes=b.runtime_bytes)
    if cfg.memory_check and b.bytes is not None and est.peak > b.bytes:
        raise MemoryPlanError(
            "batch_size", f"predicted peak memory {gib(est.peak)} exceeds the budget "
            f"{gib(b.bytes)} ({b.source}):\n{breakdown(est, b)}\nThis would run out of "
            f"memory. Settings predicted to fit:\n{suggestion(cfg, device_type, b, world)}\n"
            "(`make memcheck` prints this table; CONFIG_MEMORY_CHECK=n skips the check)")
    return cfg, est, b


def oom_advice(cfg: Config, device_type: str, predicted: Estimate,
               budget: Budget, step: int, ckpt_step: int | None,
               peak_mb: float | None, world: int = 1) -> str:
    """The message for a run that ran out of device memory: the estimator's
    breakdown, then the settings that lower the peak, each with its prediction."""
    def predicted_for(other: Config) -> str:
        est = estimate(other, device_type, runtime_bytes=budget.runtime_bytes)
        return f"predicted {gib(est.peak)}, was {gib(predicted.peak)}"

    tries = []
    per_step = cfg.batch_size * cfg.gradient_accumulation
    smaller = [b for b in range(cfg.batch_size // 2, 0, -1)
               if per_step % b == 0 and (per_step // b) % world == 0]
    if smaller:
        b = smaller[0]
        other = dataclasses.replace(cfg, batch_size=b, gradient_accumulation=per_step // b)
        tries.append(f"CONFIG_BATCH_SIZE={b} CONFIG_GRADIENT_ACCUMULATION={per_step // b}: "
                     f"the same {cfg.tokens_per_step():,} tokens per step "
                     f"({predicted_for(other)})")
    for setting, other in savers(cfg):
        tries.append(f"{setting} ({predicted_for(other)})")
    tries.append("CONFIG_MEMORY_BUDGET_MB set to what this device really has free for "
                 "training: the memory check and CONFIG_AUTO_BATCH then plan with it")
    measured = f"; measured peak before it {peak_mb:,.0f} MB" if peak_mb else ""
    kept = (f"The checkpoint of step {ckpt_step} is intact. A changed batch or memory "
            "setting starts its own run folder (the settings that change the computation "
            "are part of the run's hash)." if ckpt_step is not None else
            "No checkpoint had been written yet.")
    return (f"out of memory in step {step} on {device_type}{measured}. The estimate for this "
            f"configuration:\n{breakdown(predicted, budget)}\nTry:\n"
            + "\n".join(f"  - {t}" for t in tries)
            + f"\n{kept}\n(`make memcheck` prints the full table.)")
