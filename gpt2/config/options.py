"""The typed configuration: one field per Kconfig symbol, one place for each fact.

Every setting a run can have is a field of :class:`Config`. Names follow one rule so
nothing has to be listed twice:

    field ``learning_rate``  <->  Kconfig symbol ``LEARNING_RATE`` (CONFIG_LEARNING_RATE)
                             <->  command-line flag ``--learning-rate``

The Python type picks the Kconfig type: ``bool`` -> bool, ``int`` -> int,
``float`` -> string parsed here (Kconfig has no floats), ``str`` with choices ->
a named ``choice`` whose entries are ``<SYMBOL>_<VALUE>`` (``-`` written as ``_``),
other ``str`` -> string. Choices come from the registries (model sizes, datasets,
optimizers, pruning methods, devices, dtypes); ``tests/test_registry.py`` checks
that Kconfig, argparse and the registries agree, and that the defaults match.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from gpt2.data.sources import DATASETS
from gpt2.model.sizes import CUSTOM, MODEL_SIZE_CHOICES, MODEL_SIZES
from gpt2.training.device import DEVICES, DTYPES
from gpt2.training.optimizers import OPTIMIZERS
from gpt2.training.pruning import PRUNING_METHODS

# Entry points that consume options (see Opt.used_by).
TRAIN, DATA = "train", "data"

RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


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
    used_by: frozenset[str] = frozenset({TRAIN})
    # False for settings that cannot change what a run computes (where files go,
    # how often to print): changing them keeps the run folder, so a run resumes.
    hashed: bool = True
    aliases: tuple[str, ...] = ()  # extra flag spellings


def _opt(default: Any, help: str, group: str, **kw: Any) -> Any:
    if "used_by" in kw:
        kw["used_by"] = frozenset(kw["used_by"])
    return field(default=default, metadata={"opt": Opt(help=help, group=group, **kw)})


class ConfigError(ValueError):
    """A bad setting. The message names the Kconfig symbol and the flag."""

    def __init__(self, name: str, message: str, where: str | None = None):
        self.name = name
        self.where = where
        self.message = message
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{symbol(name)} ({flag(name)}): {message}")


def symbol(name: str) -> str:
    """Kconfig symbol (with the .config prefix) of a field."""
    return "CONFIG_" + name.upper()


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def choice_symbol(name: str, value: str) -> str:
    """Kconfig symbol of one entry of a choice, e.g. MODEL_SIZE_GPT2_MEDIUM."""
    return f"{name.upper()}_{value.upper().replace('-', '_')}"


@dataclass(frozen=True)
class Config:
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
    # ---- Data ------------------------------------------------------------------
    dataset: str = _opt("shakespeare", "dataset to train on", "data",
                        choices=tuple(DATASETS), used_by={TRAIN, DATA})
    data_dir: str = _opt("data", "folder holding <dataset>/train.bin and val.bin", "data",
                         used_by={TRAIN, DATA}, hashed=False)
    data_input: str = _opt("", "local raw corpus to tokenize instead of downloading", "data",
                           used_by={DATA}, hashed=False, aliases=("--input",))
    val_fraction: float = _opt(0.1, "fraction of the corpus held out for validation", "data",
                               min=0.0, max=0.5, min_exclusive=True, used_by={DATA})
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
    min_lr: float = _opt(6e-5, "learning rate at the end of cosine decay", "training",
                         min=0.0, max=10.0)
    warmup_iters: int = _opt(100, "linear warmup steps", "training", min=0, max=10**9)
    decay_lr: bool = _opt(True, "cosine-decay the learning rate to min_lr", "training")
    weight_decay: float = _opt(0.1, "decoupled weight decay on 2-D weights", "training",
                               min=0.0, max=10.0)
    grad_clip: float = _opt(1.0, "clip gradient global norm to this (0: off)", "training",
                            min=0.0, max=1e6)
    eval_interval: int = _opt(250, "steps between validation evaluations", "training",
                              min=1, max=10**9)
    eval_batches: int = _opt(20, "validation micro-batches per evaluation", "training",
                             min=1, max=10**6)
    log_interval: int = _opt(10, "steps between progress lines", "training", min=1,
                             max=10**9, hashed=False)
    checkpoint_interval: int = _opt(500, "steps between checkpoints", "training", min=1,
                                    max=10**9, hashed=False)
    seed: int = _opt(1337, "random seed (init, data order, dropout)", "training", min=0,
                     max=2**31 - 1)
    # ---- Optimizer -------------------------------------------------------------
    optimizer: str = _opt("adamw", "optimizer", "optimizer", choices=tuple(OPTIMIZERS))
    beta1: float = _opt(0.9, "Adam beta1 (first-moment decay)", "optimizer", min=0.0, max=1.0,
                        max_exclusive=True)
    beta2: float = _opt(0.95, "Adam beta2 (second-moment decay)", "optimizer", min=0.0,
                        max=1.0, max_exclusive=True)
    adam_eps: float = _opt(1e-8, "Adam epsilon", "optimizer", min=0.0, max=1.0,
                           min_exclusive=True)
    # ---- Pruning ---------------------------------------------------------------
    pruning_method: str = _opt("none", "pruning method", "pruning",
                               choices=tuple(PRUNING_METHODS))
    # ---- System ----------------------------------------------------------------
    device: str = _opt("auto", "device: auto picks cuda, then mps, then cpu", "system",
                       choices=DEVICES)
    dtype: str = _opt("bfloat16", "autocast precision (weights stay float32)", "system",
                      choices=DTYPES)
    compile: bool = _opt(False, "torch.compile the model", "system")
    tf32: bool = _opt(True, "allow TF32 matmuls on NVIDIA Ampere and newer", "system")
    data_workers: int = _opt(1, "background threads preparing batches (0: none)", "system",
                             min=0, max=64, hashed=False)
    cpu_threads: int = _opt(0, "CPU threads for torch (0: all cores)", "system", min=0,
                            max=1024, hashed=False)
    # ---- Output ----------------------------------------------------------------
    run_name: str = _opt("gpt2", "run folder name; letters, digits, . _ -", "output",
                         hashed=False)
    results_dir: str = _opt("results", "folder that holds the run folders", "output",
                            hashed=False)
    sample_tokens: int = _opt(64, "tokens sampled at each evaluation (0: none)", "output",
                              min=0, max=4096, hashed=False)
    sample_prompt: str = _opt("", "prompt for samples (empty: start of text)", "output",
                              hashed=False)
    sample_temperature: float = _opt(0.8, "sampling temperature", "output", min=0.0,
                                     max=100.0, min_exclusive=True,
                                     hashed=False)
    sample_top_k: int = _opt(200, "sample from the k most likely tokens (0: all)", "output",
                             min=0, max=1 << 20, hashed=False)

    # ---- derived values ---------------------------------------------------------
    def dims(self) -> tuple[int, int, int]:
        """(n_layer, n_head, n_embd) after applying the size preset."""
        if self.model_size == CUSTOM:
            return self.n_layer, self.n_head, self.n_embd
        p = MODEL_SIZES[self.model_size]
        return p.n_layer, p.n_head, p.n_embd

    def tokens_per_step(self) -> int:
        return self.batch_size * self.gradient_accumulation * self.block_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def config_hash(self) -> str:
        """Short hash of every setting that can change what a run computes."""
        items = {f.name: getattr(self, f.name) for f in fields() if opt(f.name).hashed}
        n_layer, n_head, n_embd = self.dims()
        items.update(n_layer=n_layer, n_head=n_head, n_embd=n_embd)
        blob = json.dumps(items, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]


def fields(used_by: str | None = None) -> list[dataclasses.Field]:
    out = list(dataclasses.fields(Config))
    if used_by is not None:
        out = [f for f in out if used_by in opt(f.name).used_by]
    return out


def opt(name: str) -> Opt:
    return Config.__dataclass_fields__[name].metadata["opt"]


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
    if o.min is not None and (value < o.min or (o.min_exclusive and value == o.min)):
        bound = ">" if o.min_exclusive else ">="
        raise ConfigError(name, f"{value} is out of range: must be {bound} {o.min:g}")
    if o.max is not None and (value > o.max or (o.max_exclusive and value == o.max)):
        bound = "<" if o.max_exclusive else "<="
        raise ConfigError(name, f"{value} is out of range: must be {bound} {o.max:g}")


def validate(cfg: Config) -> Config:
    """Check every field and the rules that tie fields together."""
    for f in fields():
        check_value(f.name, getattr(cfg, f.name))
    if not RUN_NAME_RE.match(cfg.run_name):
        raise ConfigError("run_name", f"{cfg.run_name!r} is not a valid run name: use 1-64 "
                          "letters, digits, '.', '_' or '-', starting with a letter or digit "
                          "(it becomes a folder under the results dir)")
    if not cfg.results_dir.strip():
        raise ConfigError("results_dir", "must not be empty")
    if not cfg.data_dir.strip():
        raise ConfigError("data_dir", "must not be empty")
    n_layer, n_head, n_embd = cfg.dims()
    if n_embd % n_head:
        raise ConfigError("n_head", f"n_embd={n_embd} is not divisible by n_head={n_head}")
    if cfg.max_iters == 0 and cfg.epochs == 0:
        raise ConfigError("max_iters", "both max_iters and epochs are 0: set at least one")
    if cfg.min_lr > cfg.learning_rate:
        raise ConfigError("min_lr", f"{cfg.min_lr:g} is above learning_rate "
                          f"{cfg.learning_rate:g}")
    if cfg.max_iters and cfg.warmup_iters > cfg.max_iters:
        raise ConfigError("warmup_iters", f"{cfg.warmup_iters} warmup steps exceed "
                          f"max_iters={cfg.max_iters}")
    return cfg


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
    return parse


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
    return validate(cfg)


def to_argv(cfg: Config, used_by: str, names: Iterable[str] | None = None) -> list[str]:
    """The argument list that reproduces ``cfg`` for an entry point. Values are
    separate list items: nothing here is ever seen by a shell."""
    wanted = None if names is None else set(names)
    argv: list[str] = []
    for f in fields(used_by):
        if wanted is not None and f.name not in wanted:
            continue
        value = getattr(cfg, f.name)
        if isinstance(value, bool):
            argv.append(flag(f.name) if value else "--no-" + flag(f.name)[2:])
        else:
            # --flag=value keeps a value that starts with '-' from reading as a flag.
            argv.append(f"{flag(f.name)}={value!r}" if isinstance(value, float)
                        else f"{flag(f.name)}={value}")
    return argv


def to_dotconfig(cfg: Config) -> str:
    """Render a Config in .config syntax: what a run records when it was started
    from flags rather than from a .config."""
    lines = ["# kgpt configuration rendered from command-line flags"]
    for f in fields():
        name, value = f.name, getattr(cfg, f.name)
        if name in ("n_layer", "n_head", "n_embd") and cfg.model_size != CUSTOM:
            continue  # only in force for custom sizes
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
