"""The typed configuration: one field per Kconfig symbol, one place for each fact.

Every setting a run can have is a field of :class:`Config`. Names follow one rule so
nothing has to be listed twice:

    field ``learning_rate``  <->  Kconfig symbol ``LEARNING_RATE`` (CONFIG_LEARNING_RATE)
                             <->  command-line flag ``--learning-rate``

The Python type picks the Kconfig type: ``bool`` -> bool, ``int`` -> int,
``float`` -> string parsed here (Kconfig has no floats), ``str`` with choices ->
a named ``choice`` whose entries are ``<SYMBOL>_<VALUE>`` (``-`` written as ``_``),
other ``str`` -> string. Choices come from the registries (model sizes, datasets,
optimizers, pruning methods, devices, dtypes); ``tests/config/test_registry.py`` checks
that Kconfig, argparse and the registries agree, and that the defaults match.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import re
import types
from dataclasses import dataclass, field
from typing import Any, Iterable

from gpt2.config.choices import (ATTENTION_BACKENDS, CHECKPOINTING, COMPILE_BACKENDS,
                                 MODEL_ACTIVATIONS, MODEL_INITS, MODEL_NORMS, MODEL_POSITIONS,
                                 MODEL_PRECISIONS,
                                 CARDS, COMPILE_MODES, COMPILE_STYLES, DEVICES, DTYPES, LR_SCHEDULES,
                                 NONFINITE_POLICIES, OPTIMIZERS, WSD_SHAPES,
                                 PARALLEL_MODES, PROJECT_TRACKERS, PRUNING_METHODS, PRUNING_RAMPS,
                                 PRUNING_SCOPES, PRUNING_STRUCTURES, SPARSE_KERNELS,
                                 DST_ANNEALS, n_of_m, structure_sparsity,
                                 TRACKERS, accumulation_problem, pair_problem,
                                 schedule_problem)
from gpt2.config.datasets import DATASETS, characters
from gpt2.config.sizes import CUSTOM, MODEL_SIZE_CHOICES, MODEL_SIZES
from gpt2.config.methods import Setting
from gpt2.config.registry import DEFAULT_OPTIMIZER, OPTIMIZER_SETTINGS, PRUNING_SETTINGS
from gpt2.config.argparser import StrictArgumentParser, bounded_parser, unknown_flags
from gpt2.names import choice_symbol, flag, switch_flag, symbol
from gpt2.errors import ConfigError

# Entry points that consume options (see Opt.used_by).
TRAIN, DATA = "train", "data"

# \Z, not $: $ also matches before a trailing newline ("run\n" is not a name).
RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+:-]{0,39}\Z")
MAX_TAGS = 20
# Control characters but tab: no .config line can hold them (kconfig.py refuses them too).
CONTROL_CHAR_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# A string setting reaches train.py as one command-line argument, which Linux caps at
# 128 KiB (MAX_ARG_STRLEN), with all of them together under ARG_MAX (2 MiB): a longer
# value would stop `make` with "Argument list too long". 32 KiB holds a prompt of a
# whole 8192-token context and keeps every string setting together well under both.
MAX_STRING_BYTES = 32 * 1024
# The dataset CONFIG_DATA_TRAIN_SHARDS counts the Hub's training shards of.
_FINEWEB = DATASETS["fineweb10b"]


@dataclass(frozen=True)
class Opt:
    """What the rest of the system needs to know about one field."""

    help: str
    group: str
    choices: tuple[str, ...] = ()
    min: float | None = None  # inclusive unless min_exclusive
    max: float | None = None  # inclusive unless max_exclusive
    min_exclusive: bool = False
    max_exclusive: bool = False
    # Why the range is what it is, where a bound is not obvious: out-of-range messages
    # end with it (here and in the .config loader).
    why: str = ""
    used_by: frozenset[str] = frozenset({TRAIN})
    # False for settings that cannot change what a run computes (where files go,
    # how often to print): changing them keeps the run folder, so a run resumes.
    hashed: bool = True
    aliases: tuple[str, ...] = ()  # extra flag spellings
    # Left out of the config hash while at its default: a setting added after runs
    # were made, whose default computes what those runs did, keeps their hashes and
    # so their folders.
    omit_default: bool = False
    # When the field is in force: ((choice field, values it applies to), ...), all
    # of which must hold. Kconfig encodes the same rule with `depends on`
    # (tests/config/test_registry.py checks they agree); a flag given explicitly where it
    # does not apply is refused rather than silently ignored.
    when: tuple[tuple[str, tuple[str, ...]], ...] = ()


def _users(field_name: str, registry: dict, hparam: str) -> tuple:
    """``when`` for a hyperparameter: in force for the registry entries that read it."""
    return ((field_name, tuple(k for k, spec in registry.items() if hparam in spec.hparams)),)


def _pruning_hparam(name: str):
    return _users("pruning_method", PRUNING_METHODS, name)


def _opt(default: Any, help: str, group: str, **kw: Any) -> Any:
    if "used_by" in kw:
        kw["used_by"] = frozenset(kw["used_by"])
    return field(default=default, metadata={"opt": Opt(help=help, group=group, **kw)})


class _Fields:
    """Config's own fields, in order; the methods' settings join them after
    ``optimizer`` (see Config below)."""

    # ---- Model -----------------------------------------------------------------
    model_size: str = _opt("gpt2", "GPT-2 size preset, or custom dimensions", "model",
                           choices=MODEL_SIZE_CHOICES)
    n_layer: int = _opt(12, "transformer blocks (custom size only)", "model", min=1, max=256)
    n_head: int = _opt(12, "attention heads; must divide n_embd (custom size only)", "model",
                       min=1, max=256)
    n_embd: int = _opt(768, "embedding width (custom size only)", "model", min=8, max=16384)
    block_size: int = _opt(1024, "context length in tokens", "model", min=8, max=8192)
    dropout: float = _opt(0.0, "dropout probability", "model", min=0.0, max=1.0,
                          max_exclusive=True)
    bias: bool = _opt(True, "biases in Linear and LayerNorm layers", "model")
    tie_weights: bool = _opt(True, "share token embedding and output head", "model")
    # The architecture beyond the dimensions: each defaults to GPT-2's; the other choices
    # describe modded-nanogpt's track 3 model (gpt2/model/gpt.py, docs/model.md).
    model_norm: str = _opt("layernorm", "normalisation layers: LayerNorm (GPT-2) or RMSNorm "
                           "with gains", "model", choices=MODEL_NORMS, omit_default=True)
    model_position: str = _opt("learned", "positions: a learned table (GPT-2) or rotary on "
                               "half of each head's channels, base 1024 (modded-nanogpt)",
                               "model", choices=MODEL_POSITIONS, omit_default=True)
    model_qk_norm: bool = _opt(False, "RMS-normalise each head's queries and keys before "
                               "attention", "model", omit_default=True)
    model_attention_scale: float = _opt(0.0, "attention logit scale (0: 1/sqrt(head width), "
                                        "GPT-2's)", "model", min=0.0, max=100.0,
                                        omit_default=True)
    model_activation: str = _opt("gelu", "MLP activation: GELU (tanh approximation, GPT-2) "
                                 "or ReLU squared", "model", choices=MODEL_ACTIVATIONS,
                                 omit_default=True)
    model_embedding_norm: bool = _opt(False, "a norm on the token embedding before the "
                                      "first block", "model", omit_default=True)
    model_head_bias: bool = _opt(False, "a bias in the output head", "model",
                                 omit_default=True)
    model_logit_cap: float = _opt(0.0, "smooth cap on the logits: x -> c*x/sqrt(x^2+c^2) "
                                  "(0: none)", "model", min=0.0, max=1e4, omit_default=True)
    model_init: str = _opt("gpt2", "initialisation: GPT-2's (normal 0.02, residual "
                           "projections scaled) or track 3's (zero output projections, "
                           "sqrt(0.33/fan_in) elsewhere, unit-normal token table)", "model",
                           choices=MODEL_INITS, omit_default=True)
    model_precision: str = _opt("autocast", "how the model carries its numbers: float32 "
                                "weights with the matmuls under CONFIG_DTYPE's autocast "
                                "(kgpt's), or the token table stored in bfloat16, which "
                                "runs the whole forward in bfloat16 (track 3's)", "model",
                                choices=MODEL_PRECISIONS, omit_default=True)
    init_from: str = _opt("", "start from pretrained GPT-2 weights: gpt2, gpt2-medium, "
                          "gpt2-large, gpt2-xl (from the Hugging Face cache), a folder in "
                          "Hugging Face format, or a kgpt run folder (its newest weights, a "
                          "new optimizer) (empty: random initialisation)", "model")
    # ---- Data ------------------------------------------------------------------
    dataset: str = _opt("shakespeare", "dataset to train on", "data",
                        choices=tuple(DATASETS), used_by={TRAIN, DATA})
    data_dir: str = _opt("data", "folder holding <dataset>/ shards and meta.json", "data",
                         used_by={TRAIN, DATA}, hashed=False)
    data_input: str = _opt("", "local corpus to tokenize instead of downloading: a .txt, "
                           ".jsonl or .parquet file, or a folder of them", "data",
                           used_by={DATA}, hashed=False, aliases=("--input",))
    # Not hashed: which tokens a run reads is the data folder's meta.json (its token
    # hash), checked on resume, whatever downloaded them.
    data_train_shards: int = _opt(_FINEWEB.hub_train_shards, "fineweb10b: training shards "
                                  "of 100M tokens `make data` downloads from the Hugging "
                                  "Face Hub when data_input is empty (the most: all 10B "
                                  "tokens)", "data", min=1, max=_FINEWEB.hub_train_shards,
                                  used_by={DATA}, hashed=False,
                                  why=f"{_FINEWEB.hub_repo} holds "
                                      f"{_FINEWEB.hub_train_shards} training shards",
                                  when=(("dataset", ("fineweb10b",)),))
    val_fraction: float = _opt(0.1, "fraction held out for validation when the source has "
                               "no validation split of its own", "data",
                               min=0.0, max=0.5, min_exclusive=True, used_by={TRAIN, DATA})
    data_text_field: str = _opt("text", "field (jsonl) or column (parquet) holding the text "
                                "of local input files", "data", used_by={DATA}, hashed=False)
    shard_tokens: int = _opt(100_000_000, "tokens per shard file of prepared data", "data",
                             min=1024, max=2**31 - 1, used_by={DATA}, hashed=False)
    prepare_workers: int = _opt(0, "tokenizer processes for data preparation (0: one per "
                                "core)", "data", min=0, max=1024, used_by={DATA}, hashed=False)
    data_streaming: bool = _opt(False, "stream a Hugging Face dataset instead of downloading "
                                "it to the Hugging Face cache first", "data", used_by={DATA},
                                hashed=False)
    # ---- Training --------------------------------------------------------------
    batch_size: int = _opt(12, "micro-batch size in sequences", "training", min=1, max=65536)
    gradient_accumulation: int = _opt(1, "micro-batches per optimizer step", "training",
                                      min=1, max=65536)
    max_iters: int = _opt(5000, "optimizer steps (0: derive from epochs)", "training",
                          min=0, max=10**9)
    epochs: float = _opt(0.0, "passes over the training tokens (0: use max_iters)", "training",
                         min=0.0, max=1e6)
    learning_rate: float = _opt(6e-4, "peak learning rate", "training", min=0.0, max=10.0,
                                min_exclusive=True)
    min_lr: float = _opt(6e-5, "learning rate at the end of the decay (cosine, WSD's "
                         "cooldown, linear)", "training", min=0.0, max=10.0)
    warmup_iters: int = _opt(100, "linear warmup steps", "training", min=0, max=10**9)
    lr_schedule: str = _opt("cosine", "learning-rate schedule after warmup: cosine decay to "
                            "min_lr, WSD (constant, then a cooldown to min_lr), linear decay "
                            "to min_lr, or constant", "training", choices=LR_SCHEDULES,
                            omit_default=True)
    decay_lr: bool = _opt(True, "cosine schedule: decay to min_lr (n: hold the peak, as the "
                          "constant schedule does)", "training",
                          when=(("lr_schedule", ("cosine",)),))
    wsd_cooldown: float = _opt(0.2, "WSD: fraction of the schedule's steps spent cooling "
                               "down to min_lr", "training", min=0.0, max=1.0,
                               min_exclusive=True, when=(("lr_schedule", ("wsd",)),))
    wsd_shape: str = _opt("linear", "WSD: shape of the cooldown (linear; sqrt, 1 - sqrt of "
                          "its progress; cosine)", "training", choices=WSD_SHAPES,
                          when=(("lr_schedule", ("wsd",)),))
    schedule_iters: int = _opt(0, "steps the learning-rate decay and the pruning ramp are "
                               "laid out over; past them the learning rate stays at min_lr "
                               "and the sparsity at its target (0: the run's length)",
                               "training", min=0, max=10**9, omit_default=True)
    extend_from: str = _opt("", "continue this finished run folder to more steps (a new run "
                            "folder): its weights, optimizer state, pruning masks, data "
                            "position and random generators; every other setting that "
                            "changes results must be the run's", "training",
                            omit_default=True)
    weight_decay: float = _opt(0.1, "decoupled weight decay on 2-D weights", "training",
                               min=0.0, max=10.0)
    grad_clip: float = _opt(1.0, "clip gradient global norm to this (0: off)", "training",
                            min=0.0, max=1e6)
    eval_interval: int = _opt(250, "steps between validation evaluations", "training",
                              min=1, max=10**9)
    eval_late_interval: int = _opt(0, "steps between validation evaluations in the last "
                                   "eval_late_fraction of the run (0: eval_interval "
                                   "throughout); track 3 evaluates every 25 there to find the "
                                   "earliest step that reaches its target", "training", min=0,
                                   max=10**9, omit_default=True)
    eval_late_fraction: float = _opt(0.1, "the closing fraction of the run evaluated every "
                                     "eval_late_interval steps", "training", min=0.0, max=1.0,
                                     min_exclusive=True, omit_default=True)
    eval_tokens: int = _opt(1 << 20, "validation tokens scored per evaluation, the same "
                            "windows for every batch size (0: the whole validation split)",
                            "training", min=0, max=10**12)
    epoch_warning: float = _opt(4.0, "warn when a run plans more passes over the training "
                                "split than this: past it a comparison mostly measures "
                                "overfitting (0: never)", "training", min=0.0, max=1e6,
                                hashed=False)
    log_interval: int = _opt(10, "steps between progress lines", "training", min=1,
                             max=10**9, hashed=False)
    checkpoint_interval: int = _opt(500, "steps between checkpoints", "training", min=1,
                                    max=10**9, hashed=False)
    # Not hashed: a run stopped by a NaN resumes under the other policy.
    nonfinite: str = _opt("stop", "on a NaN or infinite loss: stop before the update, or "
                          "skip the step and go on", "training", choices=NONFINITE_POLICIES,
                          hashed=False)
    nonfinite_max_skips: int = _opt(10, "skip: stop anyway after this many skipped steps in "
                                    "a row", "training", min=1, max=10**6, hashed=False,
                                    when=(("nonfinite", ("skip",)),))
    hellaswag_interval: int = _opt(0, "steps between HellaSwag evaluations during training "
                                   "(0: none)", "training", min=0, max=10**9,
                                   used_by={TRAIN, DATA}, hashed=False)
    hellaswag_examples: int = _opt(0, "HellaSwag examples per evaluation (0: all 10,042)",
                                   "training", min=0, max=10**6, hashed=False)
    hellaswag_path: str = _opt("", "HellaSwag validation jsonl (empty: "
                               "<data_dir>/hellaswag/hellaswag_val.jsonl, which make data "
                               "fetches when the interval is set)", "training",
                               used_by={TRAIN, DATA}, hashed=False)
    seed: int = _opt(1337, "random seed (init, data order, dropout)", "training", min=0,
                     max=2**31 - 1)
    # ---- Optimizer -------------------------------------------------------------
    optimizer: str = _opt(DEFAULT_OPTIMIZER, "optimizer", "optimizer", choices=tuple(OPTIMIZERS))
    # ---- Pruning ---------------------------------------------------------------
    pruning_method: str = _opt("none", "pruning method", "pruning",
                               choices=tuple(PRUNING_METHODS))
    target_sparsity: float = _opt(0.5, "fraction of target weights pruned at the end",
                                  "pruning", min=0.0, max=1.0, min_exclusive=True,
                                  max_exclusive=True, when=_pruning_hparam("target_sparsity"))
    pruning_warmup: int = _opt(100, "dense steps before pruning starts", "pruning", min=0,
                               max=10**9, when=_pruning_hparam("pruning_warmup"))
    pruning_end: float = _opt(0.75, "fraction of training at which the target is reached",
                              "pruning", min=0.0, max=1.0, min_exclusive=True,
                              when=_pruning_hparam("pruning_end"))
    pruning_frequency: int = _opt(50, "steps between mask updates", "pruning", min=1,
                                  max=10**9, when=_pruning_hparam("pruning_frequency"))
    pruning_ramp: str = _opt("cubic", "sparsity ramp from 0 to the target", "pruning",
                             choices=PRUNING_RAMPS, when=_pruning_hparam("pruning_ramp"))
    pruning_scope: str = _opt("layer", "rank weights per tensor or over all targets",
                              "pruning", choices=PRUNING_SCOPES,
                              when=_pruning_hparam("pruning_scope"))
    pruning_structure: str = _opt("unstructured", "mask structure: any weights, or N kept "
                                  "of every M consecutive weights along each row (the input "
                                  "dimension), which sparse tensor cores run (2:4)", "pruning",
                                  choices=PRUNING_STRUCTURES, omit_default=True,
                                  when=_pruning_hparam("pruning_structure"))
    dst_drop_fraction: float = _opt(0.3, "SET/RigL: fraction of each tensor's live weights "
                                    "dropped and regrown at a mask update, before annealing",
                                    "pruning", min=0.0, max=1.0, min_exclusive=True,
                                    max_exclusive=True, when=_pruning_hparam("dst_drop_fraction"))
    dst_drop_anneal: str = _opt("cosine", "SET/RigL: how the drop fraction falls over the "
                                "updates (cosine to 0 at pruning_end, as RigL's code; or "
                                "constant)", "pruning", choices=DST_ANNEALS,
                                when=_pruning_hparam("dst_drop_anneal"))
    prune_embeddings: bool = _opt(False, "also prune embeddings and the output head",
                                  "pruning", when=_pruning_hparam("prune_embeddings"))
    prune_norms_biases: bool = _opt(False, "also prune LayerNorm gains and biases",
                                    "pruning", when=_pruning_hparam("prune_norms_biases"))
    # ---- System ----------------------------------------------------------------
    device: str = _opt("auto", "device: auto picks cuda, then mps, then cpu", "system",
                       choices=DEVICES)
    dtype: str = _opt("bfloat16", "autocast precision (weights stay float32)", "system",
                      choices=DTYPES)
    compile: str = _opt("auto", "torch.compile the model: auto compiles on CUDA GPUs only",
                        "system", choices=COMPILE_MODES)
    compile_mode: str = _opt("default", "torch.compile mode: default, reduce-overhead (CUDA "
                             "graphs), max-autotune (tuned kernels, CUDA graphs) or "
                             "max-autotune-no-cudagraphs", "system", choices=COMPILE_STYLES,
                             omit_default=True, when=(("compile", ("auto", "on")),))
    compile_backend: str = _opt("inductor", "torch.compile backend: inductor (generated "
                                "kernels; on the CPU it needs a C++ compiler), aot_eager "
                                "(the same forward and backward graphs on torch's kernels: "
                                "finds graph breaks and recompiles without a compiler) or "
                                "eager (the forward captured only)", "system",
                                choices=COMPILE_BACKENDS, omit_default=True,
                                when=(("compile", ("auto", "on")),))
    # auto by default: before the first step the run checks the kernel on each weight
    # shape and keeps it only where it is right and faster (sparse_kernel.decide).
    sparse_kernel: str = _opt("auto", "2:4 masks: run the pruned Linears' forward on their "
                              "compressed weights once the masks are final (CUDA, Ampere or "
                              "newer): auto where it can and is checked right and faster, on "
                              "(refused where it cannot or fails its check) or off",
                              "system", choices=SPARSE_KERNELS, omit_default=True,
                              when=(("pruning_structure", ("2:4",)),))
    attention_backend: str = _opt("auto", "attention kernels: auto (torch picks), flash, "
                                  "cudnn, efficient or math", "system",
                                  choices=ATTENTION_BACKENDS, omit_default=True)
    tf32: bool = _opt(True, "allow TF32 matmuls on NVIDIA Ampere and newer", "system")
    data_workers: int = _opt(1, "background threads preparing batches (0: none)", "system",
                             min=0, max=64, hashed=False)
    cpu_threads: int = _opt(0, "CPU threads for torch (0: all cores)", "system", min=0,
                            max=1024, hashed=False)
    nproc_per_node: int = _opt(1, "processes that train together with DDP, one per GPU "
                               "(launched through torchrun)", "system", min=1, max=1024,
                               hashed=False)
    parallel: str = _opt("ddp", "how several processes share the work: ddp (a copy of "
                         "everything per GPU) or fsdp (weights, gradients and optimizer "
                         "state sharded)", "system", choices=PARALLEL_MODES, hashed=False)
    # ---- Memory ----------------------------------------------------------------
    activation_checkpointing: str = _opt("none", "recompute activations in backward instead "
                                         "of keeping them: none, the MLPs (selective), or "
                                         "whole blocks (full)", "memory",
                                         choices=CHECKPOINTING, hashed=False)
    loss_chunk_tokens: int = _opt(0, "compute the output head and loss this many tokens at "
                                  "a time (0: all at once)", "memory", min=0, max=1 << 24)
    loss_fused: bool = _opt(False, "compute each loss chunk's gradients in forward instead "
                            "of recomputing its logits in backward (needs loss_chunk_tokens)",
                            "memory", omit_default=True)
    auto_batch: bool = _opt(False, "use the largest micro-batch predicted to fit; "
                            "batch_size x gradient_accumulation stays the sequences per step",
                            "memory")
    memory_check: bool = _opt(True, "refuse to start a run predicted not to fit in memory",
                              "memory", hashed=False)
    memory_budget_mb: int = _opt(0, "memory a run may use, in MiB (0: the device's free "
                                 "memory)", "memory", min=0, max=1 << 30, hashed=False)
    target_card: str = _opt("", "the GPU this configuration is written for ("
                            + ", ".join(CARDS) + "): `make memcheck` predicts against its "
                            "memory where no GPU is present (empty: none)", "memory",
                            hashed=False)
    # ---- Output ----------------------------------------------------------------
    run_name: str = _opt("gpt2", "run folder name; letters, digits, . _ -", "output",
                         hashed=False)
    results_dir: str = _opt("results", "folder that holds the run folders", "output",
                            hashed=False)
    run_tags: str = _opt("", "words that describe the run, space-separated: on the results "
                         "pages (filterable) and W&B tags", "output", hashed=False)
    run_notes: str = _opt("", "a note on the run, in your words: on its page and the index, "
                          "and W&B's notes", "output", hashed=False)
    sample_tokens: int = _opt(64, "tokens sampled at each evaluation (0: none)", "output",
                              min=0, max=4096, hashed=False)
    sample_prompt: str = _opt("", "prompt for samples (empty: start of text)", "output",
                              hashed=False)
    # (at least 1e-3: logits divided by a subnormal temperature are infinite, and
    # softmax then gives NaN probabilities)
    sample_temperature: float = _opt(0.8, "sampling temperature", "output", min=1e-3,
                                     max=100.0, hashed=False)
    sample_top_k: int = _opt(200, "sample from the k most likely tokens (0: all)", "output",
                             min=0, max=1 << 20, hashed=False)
    tracker: str = _opt("none", "experiment tracker that also receives the metrics rows",
                        "output", choices=TRACKERS, hashed=False)
    tracker_project: str = _opt("kgpt", "project name in the tracker (wandb, trackio)",
                                "output", hashed=False, when=(("tracker", PROJECT_TRACKERS),))


class _Derived:
    """What Config computes from its fields."""

    def dims(self) -> tuple[int, int, int]:
        """(n_layer, n_head, n_embd) after applying the size preset."""
        if self.model_size == CUSTOM:
            return self.n_layer, self.n_head, self.n_embd
        p = MODEL_SIZES[self.model_size]
        return p.n_layer, p.n_head, p.n_embd

    def schedule_steps(self, total: int) -> int:
        """The steps the schedules span in a run of ``total`` steps (schedule_iters)."""
        return self.schedule_iters or total

    def tokens_per_step(self) -> int:
        return self.batch_size * self.gradient_accumulation * self.block_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def config_hash(self) -> str:
        """Short hash of every setting that can change what a run computes."""
        # Only settings in force: a new optimizer's knobs leave other runs' hashes alone.
        items = {f.name: getattr(self, f.name) for f in fields()
                 if opt(f.name).hashed and applies(self, f.name)
                 and not (opt(f.name).omit_default and getattr(self, f.name) == f.default)}
        n_layer, n_head, n_embd = self.dims()
        items.update(n_layer=n_layer, n_head=n_head, n_embd=n_embd)
        blob = json.dumps(items, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]


def _method_field(setting: Setting, readers: tuple[str, ...], choice: str, group: str
                  ) -> tuple[str, str, Any]:
    """A method's setting (gpt2/config/methods.py) as a Config field: in force while
    one of the methods that read it is ``choice``'s value, and its own conditions
    hold."""
    kw = {k: getattr(setting, k) for k in ("min", "max", "min_exclusive", "max_exclusive",
                                           "why", "omit_default")}
    return setting.name, type(setting.default).__name__, _opt(
        setting.default, setting.help, group, choices=tuple(setting.choices),
        when=((choice, readers),) + setting.when, **kw)


def _config_fields() -> list[tuple[str, str, Any]]:
    out = []
    for name, kind in _Fields.__annotations__.items():
        out.append((name, kind, getattr(_Fields, name)))
        if name == "optimizer":
            out += [_method_field(s, readers, "optimizer", "optimizer")
                    for s, readers in OPTIMIZER_SETTINGS.values()]
        if name == "pruning_method":
            out += [_method_field(s, readers, "pruning_method", "pruning")
                    for s, readers in PRUNING_SETTINGS.values()]
    return out


# The typed configuration: _Fields' fields and every method's settings, one frozen
# dataclass. (Built with make_dataclass because the methods' settings are known only
# once their modules are read.)
Config = dataclasses.make_dataclass("Config", _config_fields(), bases=(_Derived,),
                                    frozen=True)
Config.__module__ = __name__
Config.__doc__ = "Every setting a run can have, typed (the module's docstring: the naming rule)."


def fields(used_by: str | None = None) -> list[dataclasses.Field]:
    out = list(dataclasses.fields(Config))
    if used_by is not None:
        out = [f for f in out if used_by in opt(f.name).used_by]
    return out


def opt(name: str) -> Opt:
    return Config.__dataclass_fields__[name].metadata["opt"]


def applies(cfg: Config, name: str) -> bool:
    """Whether a field is in force under ``cfg`` (see Opt.when)."""
    return all(getattr(cfg, field_name) in values for field_name, values in opt(name).when)


def _not_applying(cfg: Config, name: str) -> str:
    field_name, values = next((f, v) for f, v in opt(name).when if getattr(cfg, f) not in v)
    return (f"has no effect with {field_name} {getattr(cfg, field_name)!r}; it applies to "
            f"{field_name} {', '.join(values)}. Remove it, or choose one of those")


def field_type(name: str) -> type:
    t = Config.__dataclass_fields__[name].type
    return {"int": int, "float": float, "str": str, "bool": bool}[t] if isinstance(t, str) else t


# ---- parsing and checking single values ---------------------------------------------

def parse_float(name: str, text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ConfigError(name, f"{text!r} is not a number (write e.g. 6e-4 or 0.1)") from None
    if not math.isfinite(value):
        raise ConfigError(name, f"{text!r} is not a finite number")
    return value


def check_value(name: str, value: Any) -> None:
    """Range and choice checks for one field; raises ConfigError."""
    o = opt(name)
    if o.choices and value not in o.choices:
        raise ConfigError(name, f"{value!r} is not one of {', '.join(o.choices)}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(name, f"{value} is not a finite number")
    if o.min is not None and (value < o.min or (o.min_exclusive and value == o.min)):
        bound = ">" if o.min_exclusive else ">="
        raise ConfigError(name, f"{value} is out of range: must be {bound} {o.min:g}"
                          + (f" ({o.why})" if o.why else ""))
    if o.max is not None and (value > o.max or (o.max_exclusive and value == o.max)):
        bound = "<" if o.max_exclusive else "<="
        raise ConfigError(name, f"{value} is out of range: must be {bound} {o.max:g}"
                          + (f" ({o.why})" if o.why else ""))


def check_run_name(name: str) -> None:
    """A run (or matrix) name becomes one folder under the results dir: never a path."""
    if not RUN_NAME_RE.match(name):
        raise ConfigError("run_name", f"{name!r} is not a valid run name: use 1-128 "
                          "letters, digits, '.', '_' or '-', starting with a letter or digit "
                          "(it becomes a folder under the results dir)")


def run_tags(value: Any) -> list[str]:
    """The tags CONFIG_RUN_TAGS holds (words split at whitespace), as the checks, the
    pages and the trackers read them; a value that is not text (another version's
    config.json) holds none."""
    return value.split() if isinstance(value, str) else []


def check_tags(text: str) -> None:
    """Tags are words a filter box and a tracker take as they are: an allowlist."""
    tags = run_tags(text)
    bad = [t for t in tags if not TAG_RE.match(t)]
    if bad:
        raise ConfigError("run_tags", f"{bad[0]!r} is not a tag: use words of 1-40 letters, "
                          "digits, '.', '_', '+', ':' or '-', starting with a letter or digit, "
                          "separated by spaces")
    if len(tags) > MAX_TAGS:
        raise ConfigError("run_tags", f"{len(tags)} tags: at most {MAX_TAGS}")
    if len(set(tags)) < len(tags):
        twice = next(t for t in tags if tags.count(t) > 1)
        raise ConfigError("run_tags", f"{twice!r} is given twice")


def validate(cfg: Config) -> Config:
    """Check every field and the rules that tie fields together."""
    for f in fields():  # first: the messages below quote the value
        value = getattr(cfg, f.name)
        size = len(value.encode(errors="surrogateescape")) if isinstance(value, str) else 0
        if size > MAX_STRING_BYTES:
            raise ConfigError(f.name, f"the value is {size:,} bytes long, more than the "
                              f"{MAX_STRING_BYTES:,} a setting may hold (it is passed to "
                              "train.py as one command-line argument): shorten it")
    for f in fields():
        check_value(f.name, getattr(cfg, f.name))
    check_run_name(cfg.run_name)
    check_tags(cfg.run_tags)
    for f in fields():
        value = getattr(cfg, f.name)
        bad = isinstance(value, str) and CONTROL_CHAR_RE.search(value)
        if bad:
            raise ConfigError(f.name, f"{value!r} holds the control character {bad.group()!r}: "
                              "a .config line cannot hold it; give the value on one line")
    if cfg.target_card and cfg.target_card not in CARDS:
        raise ConfigError("target_card", f"{cfg.target_card!r} is not a card kgpt knows: use "
                          f"one of {', '.join(CARDS)}, or leave it empty")
    if not cfg.results_dir.strip():
        raise ConfigError("results_dir", "must not be empty")
    if not cfg.data_dir.strip():
        raise ConfigError("data_dir", "must not be empty")
    if not cfg.data_text_field.strip():
        raise ConfigError("data_text_field", "must not be empty")
    n_layer, n_head, n_embd = cfg.dims()
    if cfg.init_from in MODEL_SIZES and cfg.init_from != cfg.model_size:
        raise ConfigError("init_from", f"{cfg.init_from} weights need model size "
                          f"{cfg.init_from}, not {cfg.model_size}: select "
                          f"CONFIG_{choice_symbol('model_size', cfg.init_from)}=y")
    problem = character_level_problem(cfg)
    if problem:
        raise ConfigError(*problem)
    if n_embd % n_head:
        raise ConfigError("n_head", f"n_embd={n_embd} is not divisible by n_head={n_head}")
    if cfg.model_position == "rope-half" and (n_embd // n_head) % 4:
        raise ConfigError("model_position", f"rope-half turns a quarter of each head's "
                          f"channels: the head width n_embd/n_head = {n_embd // n_head} "
                          "must be divisible by 4")
    if cfg.loss_fused and cfg.model_logit_cap:
        raise ConfigError("loss_fused", "the fused loss computes uncapped logits: turn "
                          "CONFIG_LOSS_FUSED off (CONFIG_LOSS_CHUNK_TOKENS alone bounds the "
                          "logits' memory) or set CONFIG_MODEL_LOGIT_CAP to 0")
    problem = precision_problem(cfg)
    if problem:
        raise ConfigError(*problem)
    if cfg.max_iters == 0 and cfg.epochs == 0:
        raise ConfigError("max_iters", "both max_iters and epochs are 0: set at least one")
    if cfg.parallel == "fsdp":
        if not OPTIMIZERS[cfg.optimizer].elementwise:
            raise ConfigError("parallel", f"FSDP shards each weight, and {cfg.optimizer} "
                              f"{OPTIMIZERS[cfg.optimizer].whole}: use CONFIG_PARALLEL_DDP or "
                              "another optimizer")
        if applies(cfg, "cautious") and cfg.cautious:
            raise ConfigError("parallel", "FSDP shards each weight, and a cautious update "
                              "rescales by its whole tensor's mask: use CONFIG_PARALLEL_DDP or "
                              "turn CONFIG_CAUTIOUS off")
        if cfg.pruning_method != "none":
            raise ConfigError("parallel", "pruning ranks whole tensors, which FSDP shards: "
                              "use CONFIG_PARALLEL_DDP with pruning")
        if cfg.dtype == "float16":
            raise ConfigError("parallel", "FSDP here runs bfloat16 or float32 (float16 needs a "
                              "sharded loss scaler): use CONFIG_DTYPE_BFLOAT16")
    problem = accumulation_problem(cfg.gradient_accumulation, cfg.nproc_per_node,
                                   " (CONFIG_NPROC_PER_NODE)")
    if problem:
        raise ConfigError("gradient_accumulation", problem)
    if (applies(cfg, "compile_backend") and cfg.compile_backend != "inductor"
            and cfg.compile_mode != "default"):
        raise ConfigError("compile_mode", f"{cfg.compile_mode} is a mode of the inductor "
                          f"backend, and CONFIG_COMPILE_BACKEND is {cfg.compile_backend}: use "
                          "CONFIG_COMPILE_MODE_DEFAULT or CONFIG_COMPILE_BACKEND_INDUCTOR")
    if cfg.loss_fused and not cfg.loss_chunk_tokens:
        raise ConfigError("loss_fused", "the fused loss works chunk by chunk: set "
                          "CONFIG_LOSS_CHUNK_TOKENS (e.g. 8192) or turn CONFIG_LOSS_FUSED off")
    if cfg.min_lr > cfg.learning_rate:
        raise ConfigError("min_lr", f"{cfg.min_lr:g} is above learning_rate "
                          f"{cfg.learning_rate:g}")
    problem = pair_problem(cfg.optimizer, cfg.pruning_method)
    if problem:
        valid = [m for m in PRUNING_METHODS if pair_problem(cfg.optimizer, m) is None]
        raise ConfigError("pruning_method", f"{problem}; with optimizer {cfg.optimizer!r} "
                          f"choose one of: {', '.join(valid)}")
    problem = OPTIMIZERS[cfg.optimizer].check(cfg)
    if problem:
        raise ConfigError(*problem)
    problem = applies(cfg, "pruning_structure") and structure_problem(cfg)
    if problem:
        raise ConfigError(*problem)
    # With epochs the step count is known only once the data is open: the trainer
    # checks again then.
    problem = applies(cfg, "pruning_warmup") and cfg.max_iters and schedule_problem(
        cfg, cfg.schedule_steps(cfg.max_iters))
    if problem:
        raise ConfigError("pruning_warmup", problem)
    if cfg.schedule_iters and cfg.warmup_iters > cfg.schedule_iters:
        raise ConfigError("schedule_iters", f"{cfg.schedule_iters} steps cannot hold the "
                          f"{cfg.warmup_iters} warmup steps (warmup_iters)")
    if cfg.extend_from and cfg.init_from:
        raise ConfigError("extend_from", "continues a run with its whole state, init_from "
                          "starts a new run from weights: set one of them")
    if cfg.max_iters and cfg.warmup_iters > cfg.max_iters:
        raise ConfigError("warmup_iters", f"{cfg.warmup_iters} warmup steps exceed "
                          f"max_iters={cfg.max_iters}")
    return cfg


def character_level_problem(cfg: Config) -> tuple[str, str] | None:
    """(field, why) a setting needs GPT-2's tokens, which a character-level dataset
    (shakespeare-char) does not have, or None."""
    alphabet = characters(cfg.dataset)
    if not alphabet:
        return None
    why = (f"dataset {cfg.dataset} is character-level ({len(alphabet)} characters, not "
           "GPT-2's tokens)")
    if cfg.init_from in MODEL_SIZES:
        return ("init_from", f"{cfg.init_from}'s weights read GPT-2 BPE tokens, and {why}: "
                "train from scratch (CONFIG_INIT_FROM=\"\") or choose a BPE dataset")
    if cfg.hellaswag_interval:
        return ("hellaswag_interval", f"HellaSwag is scored in GPT-2 BPE tokens, and {why}: "
                "set CONFIG_HELLASWAG_INTERVAL=0")
    unknown = sorted(set(cfg.sample_prompt) - set(alphabet))
    if unknown:
        return ("sample_prompt", f"holds {', '.join(map(repr, unknown))}, which {why} has "
                f"no token for: its characters are {alphabet!r}")
    return None


def precision_problem(cfg: Config) -> tuple[str, str] | None:
    """(field, why) CONFIG_MODEL_PRECISION=bf16-table cannot hold with the other
    settings, or None. Its forward is bfloat16 whatever autocast says, so the run's
    dtype must say so too; the rest is what has not been built or tested with a
    bfloat16 parameter: the fused loss (written for autocast's matmuls), FSDP's
    flat shards, pruning masks, and optimizers other than those that update the table
    as track 3's fused AdamW does (float32 arithmetic, rounded to bfloat16 once)."""
    if cfg.model_precision != "bf16-table":
        return None
    fix = "or use CONFIG_MODEL_PRECISION_AUTOCAST"
    if cfg.dtype != "bfloat16":
        return ("model_precision", f"bf16-table runs the model in bfloat16, and CONFIG_DTYPE "
                f"is {cfg.dtype}: set CONFIG_DTYPE_BFLOAT16, {fix}")
    if cfg.loss_fused:
        return ("model_precision", f"the fused loss is written for autocast's matmuls: turn "
                f"CONFIG_LOSS_FUSED off (CONFIG_LOSS_CHUNK_TOKENS alone bounds the logits), {fix}")
    if cfg.parallel == "fsdp":
        return ("model_precision", f"FSDP with a bfloat16 token table is not supported: use "
                f"CONFIG_PARALLEL_DDP, {fix}")
    if cfg.pruning_method != "none":
        return ("model_precision", f"pruning is built and tested on float32 weights: set "
                f"CONFIG_PRUNING_METHOD_NONE, {fix}")
    if not OPTIMIZERS[cfg.optimizer].bf16_table(cfg):
        return ("model_precision", f"{cfg.optimizer} (as configured) does not update a "
                "bfloat16 token table as track 3's fused AdamW does: use AdamW (not cautious) "
                f"or Muon, {fix}")
    return None


def structure_problem(cfg: Config) -> tuple[str, str] | None:
    """(field, why) an N:M mask structure cannot hold with the other settings, or None.
    An N:M mask prunes exactly M - N of every M weights, so the target sparsity is
    1 - N/M, and every target's rows must split into groups of M (the model's widths
    are multiples of n_embd, and the token table's rows are n_embd long)."""
    nm = n_of_m(cfg.pruning_structure)
    if nm is None:
        return None
    n, m = nm
    fixed = structure_sparsity(cfg.pruning_structure)
    if abs(cfg.target_sparsity - fixed) > 1e-9:
        return ("target_sparsity", f"{cfg.target_sparsity:g} with {cfg.pruning_structure} masks, "
                f"which keep {n} of every {m} weights: a sparsity of {fixed:g}; set "
                f"CONFIG_TARGET_SPARSITY={fixed:g} or CONFIG_PRUNING_STRUCTURE_UNSTRUCTURED=y")
    n_embd = cfg.dims()[2]
    if n_embd % m:
        return ("pruning_structure", f"{cfg.pruning_structure} masks group every {m} weights "
                f"of a row, and n_embd={n_embd} is not a multiple of {m}")
    return None


# ---- command line ---------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser, used_by: str) -> None:
    """Add one flag per field used by an entry point. Unset flags stay absent from
    the namespace (argparse.SUPPRESS) so we know what the user gave explicitly."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields(used_by):
        o = opt(f.name)
        group = groups.get(o.group) or groups.setdefault(
            o.group, parser.add_argument_group(o.group))
        typ = field_type(f.name)
        kw: dict[str, Any] = dict(default=argparse.SUPPRESS, dest=f.name,
                                  help=f"{o.help} [{symbol(f.name)}{'_*' if o.choices else ''}; "
                                  f"default {f.default!r}]")
        if typ is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif o.choices:
            kw["choices"] = o.choices
        elif typ is float:
            kw["type"] = _float_arg(f.name)
            kw["metavar"] = "FLOAT"
        elif typ is int:
            kw["type"] = _int_arg(f.name)
        else:
            kw["type"] = typ
        group.add_argument(flag(f.name), *o.aliases, **kw)


def _float_arg(name: str):
    def parse(text: str) -> float:
        try:
            return parse_float(name, text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(e.message) from None
    parse.__name__ = "float"
    return bounded_parser(parse, opt(name).min, opt(name).max)


def field_arg(name: str):
    """The parser of field ``name``'s values as a flag of another entry point (generate's
    --temperature is sample_temperature's), its range checked as it is parsed: one
    range for the setting and the flag."""
    base = _float_arg(name) if field_type(name) is float else _int_arg(name)

    def parse(text: str):
        value = base(text)
        try:
            check_value(name, value)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(e.message) from None
        return value
    parse.__name__ = base.__name__
    return bounded_parser(parse, opt(name).min, opt(name).max)


def _int_arg(name: str):
    """A whole number for field ``name``; its range is checked with the whole Config
    (validate), whose message names the Kconfig symbol too."""
    def parse(text: str) -> int:
        return int(text, 10)
    parse.__name__ = "int"
    return bounded_parser(parse, opt(name).min, opt(name).max)


def parse_train_flags(argv: list[str]) -> tuple[dict[str, Any], str]:
    """TRAIN_ARGS read as train.py reads its configuration flags: the values they set
    (field -> typed value, only those given), and what is left that is not one of
    them, each unknown flag with its closest known spelling ('' when nothing is).
    Raises argparse.ArgumentError for a malformed value (``--max-iters x``).

    The matrix plan reads with it what TRAIN_ARGS sets in every cell; a single run's
    TRAIN_ARGS go through train.py's own parser (gpt2/cli/dotconfig.py single_run)."""
    parser = StrictArgumentParser(prog="TRAIN_ARGS", add_help=False, exit_on_error=False)
    add_arguments(parser, TRAIN)
    ns, unknown = parser.parse_known_args(argv)
    return vars(ns), unknown_flags(parser, unknown)


def config_from_namespace(ns: argparse.Namespace, used_by: str) -> Config:
    return resolve({f.name: getattr(ns, f.name) for f in fields(used_by) if hasattr(ns, f.name)})


def resolve(given: dict[str, Any]) -> Config:
    """Build and validate a Config from explicitly given values: a size preset fills
    in the dimensions, and an explicit dimension that contradicts it is an error."""
    cfg = Config(**given)
    if cfg.model_size != CUSTOM:
        preset = dict(zip(("n_layer", "n_head", "n_embd"), cfg.dims()))
        for name, value in preset.items():
            if name in given and given[name] != value:
                raise ConfigError(name, f"{given[name]} conflicts with model size "
                                  f"{cfg.model_size!r} ({name}={value}); use --model-size "
                                  f"custom (CONFIG_MODEL_SIZE_CUSTOM=y) to set dimensions")
        cfg = dataclasses.replace(cfg, **preset)
    for name in given:
        if not applies(cfg, name):
            raise ConfigError(name, _not_applying(cfg, name))
    return validate(cfg)


def from_record(values: dict[str, Any]) -> Config:
    """The Config a run recorded (Config.to_dict in a checkpoint). It lists every
    field, in force or not, so the explicit-flag rules of ``resolve`` do not apply;
    fields added since are left at their defaults. A record that is not a JSON
    object (a damaged or hand-edited config.json) is a TypeError saying so, and a
    value of another type than its field's (n_layer "abc") a ConfigError."""
    if not isinstance(values, dict):
        raise TypeError(f"a run's configuration is a JSON object, not {type(values).__name__} "
                        f"{str(values)[:40]!r}")
    typed = {}
    for f in fields():
        if f.name not in values:
            continue
        value, kind = values[f.name], type(f.default)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # (JSON written by hand: 3 for 3.0)
        if type(value) is not kind:
            raise ConfigError(f.name, f"the run records {str(value)[:60]!r}, not a "
                              f"{kind.__name__}: its config.json or checkpoint was changed")
        typed[f.name] = value
    return validate(Config(**typed))


def record_view(values: dict[str, Any]) -> Any:
    """A run's recorded settings (its config.json) read by attribute, Config's default
    for one it lacks (a run from before the setting existed): what a method's
    functions of a config (its ``tuned``, ``rates``) take."""
    defaults = {f.name: f.default for f in fields()}
    return types.SimpleNamespace(**{**defaults, **values})


def to_argv(cfg: Config, used_by: str, names: Iterable[str] | None = None) -> list[str]:
    """The argument list that reproduces ``cfg`` for an entry point. Values are
    separate list items: nothing here is ever seen by a shell."""
    wanted = None if names is None else set(names)
    argv: list[str] = []
    for f in fields(used_by):
        if (wanted is not None and f.name not in wanted) or not applies(cfg, f.name):
            continue
        value = getattr(cfg, f.name)
        if isinstance(value, bool):
            argv.append(switch_flag(f.name, value))
        else:
            # --flag=value keeps a value that starts with '-' from reading as a flag.
            argv.append(f"{flag(f.name)}={value!r}" if isinstance(value, float)
                        else f"{flag(f.name)}={value}")
    return argv


def to_dotconfig(cfg: Config, used_by: str | None = None) -> str:
    """Render a Config in .config syntax: what a run folder records (its ``config``).
    ``used_by``: only the settings of that entry point (train.py knows no data
    preparation setting, so it does not write one it was never told)."""
    lines = ["# kgpt configuration rendered from its settings"]
    if used_by == TRAIN:
        lines.append("# (every training setting in force; how the data was prepared is the "
                     "data folder's meta.json)")
    for f in fields(used_by):
        name, value = f.name, getattr(cfg, f.name)
        if (name in ("n_layer", "n_head", "n_embd") and cfg.model_size != CUSTOM
                or not applies(cfg, name)):
            continue  # not in force (e.g. dimensions of a preset size)
        if opt(name).choices:
            lines.append(f"{symbol(choice_symbol(name, value).lower())}=y")
        elif isinstance(value, bool):
            lines.append(f"{symbol(name)}=y" if value else f"# {symbol(name)} is not set")
        elif isinstance(value, int):
            lines.append(f"{symbol(name)}={value}")
        else:
            text = repr(value) if isinstance(value, float) else value
            lines.append(f'{symbol(name)}="' + text.replace("\\", "\\\\").replace('"', '\\"')
                         + '"')
    return "\n".join(lines) + "\n"
