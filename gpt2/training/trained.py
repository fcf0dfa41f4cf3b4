"""A trained run's model, loaded back from its run folder: what generate, evaluate,
export and a new run started from it (``--init-from results/<run>``) read.

The newest checkpoint (ckpt.pt) is verified against its sha256 and must be the
folder's own: a ckpt.pt pointed at another configuration's checkpoint is refused,
as training refuses to resume from it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from gpt2.config.options import TRAIN, Config, applies, fields, from_record, opt, resolve
from gpt2.data.tokenizer import tokenizer_for
from gpt2.errors import CheckpointError, ConfigError
from gpt2.model.gpt import ARCHITECTURE, GPT
from gpt2.model.build import model_config
from gpt2.storage import read_json_object, read_regular
from gpt2.training import checkpoint
from gpt2.training.schedule import branch_step
from gpt2 import run_folder
from gpt2.run_folder import SUMMARY, read_summary

CKPT = run_folder.CKPT


def is_run_folder(path: Path) -> bool:
    """A kgpt run folder with a checkpoint (not a Hugging Face folder, whose
    config.json is GPT2Config's)."""
    return (path / CKPT).exists() and (path / run_folder.CONFIG_JSON).is_file() and \
        not (path / "model.safetensors").exists()


def recorded_hash(run_dir: Path) -> tuple[str, str] | None:
    """The config hash a run folder records and the file that says so: summary.json,
    else config.json (None: neither can be read, e.g. a folder holding only ckpt.pt)."""
    summary = read_summary(run_dir)
    if summary and isinstance(summary.config_hash, str):
        return summary.config_hash, SUMMARY
    try:
        return from_record(read_json_object(run_dir / run_folder.CONFIG_JSON)).config_hash(), run_folder.CONFIG_JSON
    except (TypeError, ConfigError):  # (TypeError: none there, or not an object)
        return None


def foreign_checkpoint(ckpt_path: Path, state: dict) -> str | None:
    """Why the checkpoint ckpt.pt names is not this run's (another configuration's,
    e.g. the link was pointed elsewhere), as training would refuse it; None if it is."""
    recorded = recorded_hash(ckpt_path.parent)
    if recorded is None or state.get("config_hash") == recorded[0]:
        return None
    target = os.readlink(ckpt_path) if ckpt_path.is_symlink() else ckpt_path.name
    return (f"{ckpt_path} -> {target} is a checkpoint of configuration "
            f"{state.get('config_hash')}, but {ckpt_path.parent} is a run of configuration "
            f"{recorded[0]} ({recorded[1]}): point ckpt.pt back at one of this run's own "
            f"checkpoints/step-N.pt, or use the run that checkpoint belongs to "
            "(RUN=results/<run>)")


def load(run_dir: Path) -> tuple[Config, dict[str, Any]]:
    """(the run's Config, its newest checkpoint) on the CPU; CheckpointError when
    there is no good checkpoint of this run."""
    ckpt = Path(run_dir) / CKPT
    if not run_folder.present(ckpt):
        raise CheckpointError(f"{run_dir} has no checkpoint ({CKPT}): is it a run folder, and "
                              "has it trained a step?")
    return load_file(ckpt)


def load_file(ckpt: Path) -> tuple[Config, dict[str, Any]]:
    """(the Config, the state) of one checkpoint file (or the ckpt.pt link), on the CPU;
    CheckpointError for anything but a good checkpoint of kgpt's."""
    if not ckpt.is_file():
        raise CheckpointError(f"{ckpt} is not there")
    state = checkpoint.load(ckpt)
    foreign = foreign_checkpoint(ckpt, state)
    if foreign:
        raise CheckpointError(foreign)
    try:
        cfg = from_record(state["config"])
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{ckpt} records a configuration kgpt cannot read ({e})") from None
    problem = weights_problem(cfg, state["model"])
    if problem:
        raise CheckpointError(f"{ckpt}: its weights do not fit the model its configuration "
                              f"builds ({problem}): use an earlier checkpoint "
                              "(checkpoints/step-N.pt) or train the run again")
    return cfg, state


def weights_problem(cfg: Config, weights: Any) -> str | None:
    """What makes ``weights`` (a checkpoint's model state) unlike the state of the
    model ``cfg`` builds: a name missing or extra, a value that is not a tensor of
    that parameter's shape. None when it fits. (The model is built on the meta
    device: shapes only, no memory.)"""
    if not isinstance(weights, dict):
        return f"a {type(weights).__name__}, not a state dict"
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in GPT(model_config(cfg)).state_dict().items()}
    missing = sorted(expected.keys() - weights.keys())
    if missing:
        return f"{len(missing)} missing, e.g. {missing[0]}"
    extra = sorted(weights.keys() - expected.keys(), key=str)
    if extra:
        return f"{len(extra)} not the model's, e.g. {str(extra[0])[:80]}"
    for name, shape in expected.items():
        value = weights[name]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            what = (tuple(value.shape) if isinstance(value, torch.Tensor)
                    else type(value).__name__)
            return f"{name} is {what}, not {shape}"
        if not value.is_floating_point():
            return f"{name} holds {value.dtype}, not floating-point numbers"
        if not torch.isfinite(value).all():
            # (training never saves these: a non-finite loss stops before its update)
            return f"{name} holds NaN or infinite values"
    return None


def model(run_dir: Path) -> tuple[Config, GPT, dict[str, Any]]:
    """The run's model with its newest weights (CPU, eval mode), its Config and the
    checkpoint it came from."""
    cfg, state = load(run_dir)
    net = GPT(model_config(cfg))
    net.load_state_dict(state["model"])
    return cfg, net.eval(), state


# ---- runs started from a run ---------------------------------------------------------

# What an extension may change: its length and the schedule's. Everything else that
# changes results (Opt.hashed) must be the parent's.
LENGTH = ("max_iters", "epochs", "schedule_iters", "extend_from")
# Where this command writes: this checkout's (the flags', or the default), never what the
# parent recorded. A run copied from another machine records that machine's folder,
# and an extension once trained there and moved its `latest` link.
HERE = ("results_dir",)


def parent_of(cfg: Config) -> tuple[Path, str] | None:
    """The run folder ``cfg`` starts from and how ("extends": its whole state;
    "weights": init_from a run), or None."""
    if cfg.extend_from:
        return Path(os.path.expanduser(cfg.extend_from)), "extends"
    if cfg.init_from and is_run_folder(Path(os.path.expanduser(cfg.init_from))):
        return Path(os.path.expanduser(cfg.init_from)), "weights"
    return None


def parent_identity(cfg: Config) -> dict[str, Any] | None:
    """What a run started from another records of it (provenance.json "parent"):
    the folder, its configuration and the checkpoint (step and sha256, read from
    the files' names and the sha256 beside them: nothing is loaded). None for a run
    that starts from scratch or from released weights."""
    found = parent_of(cfg)
    if found is None:
        return None
    folder, how = found
    newest = run_folder.newest(folder / CKPT)
    recorded = recorded_hash(folder)
    return {"how": how, "path": str(folder.resolve()), "name": folder.resolve().name,
            "config_hash": recorded[0] if recorded else None,
            "step": run_folder.step_of(newest) if newest else None,
            "sha256": checkpoint.recorded_sha256(newest) if newest else None}


def recorded_config(folder: Path) -> Config:
    """The Config a run folder records (config.json); CheckpointError when it has none
    kgpt can read."""
    try:
        return from_record(json.loads(read_regular(Path(folder) / run_folder.CONFIG_JSON)
                                      or b"null"))
    except (ConfigError, ValueError, TypeError, RecursionError) as e:
        raise CheckpointError(f"{folder} has no readable config.json ({e}): is it a run "
                              "folder (results/<run>)?") from None


def branch_identity(folder: Path, cfg: Config) -> dict[str, Any] | None:
    """What a run that branches from ``folder`` records of it (provenance.json "parent",
    as parent_identity): the kept checkpoint at its cooldown's first step. None when
    it is not a WSD run, or the checkpoint is not there (it then trains from step 0)."""
    step = branch_step(cfg)
    path = run_folder.branch_checkpoint(folder, step) if step else None
    if path is None or not path.is_file():
        return None
    recorded = recorded_hash(folder)
    return {"how": "branches", "path": str(folder.resolve()), "name": folder.resolve().name,
            "config_hash": recorded[0] if recorded else None, "step": step,
            "sha256": checkpoint.recorded_sha256(path)}


def init_from_run(model: GPT, cfg: Config) -> str:
    """Load a kgpt run's newest weights into ``model`` (CONFIG_INIT_FROM=<run
    folder>): a new run, with a fresh optimizer, from step 0. The model must have
    the run's shape; a shorter context keeps the first rows of the position table."""
    folder = Path(os.path.expanduser(cfg.init_from))
    try:
        parent, state = load(folder)
    except CheckpointError as e:
        raise ConfigError("init_from", str(e)) from None
    ours, its = tokenizer_for(cfg.dataset), tokenizer_for(parent.dataset)
    if ours.name != its.name:
        raise ConfigError("init_from", f"{folder} was trained on {parent.dataset}'s tokens "
                          f"({its.label}), and {cfg.dataset} has other ones ({ours.label}): "
                          "its weights would read every token as another")
    mine, theirs = model.cfg, model_config(parent)
    for name in ("n_layer", "n_head", "n_embd", "vocab_size", "bias", "tie_weights",
                 *ARCHITECTURE):
        if getattr(mine, name) != getattr(theirs, name):
            raise ConfigError("init_from", f"{folder} is a model with {name}="
                              f"{getattr(theirs, name)}, this configuration builds "
                              f"{getattr(mine, name)}: give it the run's model settings")
    if mine.block_size > theirs.block_size:
        raise ConfigError("init_from", f"{folder} has {theirs.block_size} positions, fewer "
                          f"than CONFIG_BLOCK_SIZE={mine.block_size}")
    weights = dict(state["model"])
    if "transformer.wpe.weight" in weights:  # (rotary positions have no table)
        weights["transformer.wpe.weight"] = weights["transformer.wpe.weight"][:mine.block_size]
    model.load_state_dict(weights)
    return f"{folder} (step {state['step']}, weights only: a new optimizer from step 0)"


def extension_problem(parent: Config, cfg: Config) -> str | None:
    """Why ``cfg`` cannot extend the run configured as ``parent``; None if it can."""
    differ = [f.name for f in fields() if opt(f.name).hashed and f.name not in LENGTH
              and (applies(parent, f.name) or applies(cfg, f.name))
              and getattr(parent, f.name) != getattr(cfg, f.name)]
    if differ:
        return (f"the run differs from its parent in {', '.join(differ)}: an extension "
                "changes only its length (max_iters, schedule_iters). To change anything "
                "else, start a new run from its weights (CONFIG_INIT_FROM)")
    return None


def extension_config(given: dict[str, Any]) -> Config:
    """The configuration of an extension given as flags (``given``, with
    extend_from): the parent's in every setting the flags leave out, its length
    from --max-iters, and its schedules spanning the parent's steps unless
    --schedule-iters says otherwise."""
    folder = Path(os.path.expanduser(given["extend_from"]))
    try:
        parent = from_record(json.loads(read_regular(folder / run_folder.CONFIG_JSON) or b"null"))
    except (ValueError, TypeError, RecursionError) as e:
        raise ConfigError("extend_from", f"{folder} has no readable config.json ({e}): is it "
                          "a run folder (results/<run>)?") from None
    if "max_iters" not in given:
        raise ConfigError("max_iters", f"extending {folder} needs its new length: "
                          f"--max-iters N, more than its {parent.max_iters or 'epochs'} "
                          "(with make: TRAIN_ARGS=--max-iters=N)")
    summary = read_summary(folder)
    steps = summary.max_iters if summary else None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        steps = parent.max_iters  # (a summary that does not say, or says it wrongly)
    base = {f.name: getattr(parent, f.name) for f in fields(TRAIN)
            if applies(parent, f.name) and f.name not in LENGTH + HERE}
    return resolve({**base, "schedule_iters": parent.schedule_steps(steps), **given})
