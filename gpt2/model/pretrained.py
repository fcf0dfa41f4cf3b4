"""OpenAI's GPT-2 weights in Hugging Face format, loaded into our GPT.

``CONFIG_INIT_FROM`` names a released size (gpt2, gpt2-medium, gpt2-large, gpt2-xl),
found in the Hugging Face cache, or a folder holding ``config.json`` and
``model.safetensors`` (or ``pytorch_model.bin``). Nothing is downloaded here:
training never touches the network, and the error says how to fetch the files.

Two differences from our layout:

* Hugging Face's GPT-2 uses ``Conv1D`` layers, whose weights are stored as
  (in, out); our ``nn.Linear`` holds (out, in), so those four matrices per block
  are transposed.
* The released vocabulary has 50257 entries. A model initialised from it keeps
  exactly those (no padding to 50304): padded rows would need logits of their own,
  and any value they got would change the softmax of a trained model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from gpt2.config.datasets import characters
from gpt2.config.sizes import MODEL_SIZES
from gpt2.errors import ConfigError, PretrainedError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Hub repositories of each released size: the current name, then the legacy alias.
REPOS = {name: (f"openai-community/{name}", name) for name in MODEL_SIZES}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
N_POSITIONS = 1024  # of every released GPT-2


def is_release(init_from: str) -> bool:
    return init_from in MODEL_SIZES


def find(init_from: str) -> Path:
    """The folder with the weights: a path, or a release in the Hugging Face cache."""
    if not is_release(init_from):
        folder = Path(os.path.expanduser(init_from))
        if not folder.is_dir():
            raise PretrainedError(f"{folder} is not a folder; CONFIG_INIT_FROM takes one of "
                                  f"{', '.join(MODEL_SIZES)} or a folder with config.json "
                                  "and model.safetensors")
        return folder
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    for repo in REPOS[init_from]:
        try:
            return Path(snapshot_download(repo, local_files_only=True))
        except LocalEntryNotFoundError:
            continue
    repo = REPOS[init_from][0]
    raise PretrainedError(f"{init_from} weights are not in the Hugging Face cache; fetch them "
                          f"once with `hf download {repo} config.json model.safetensors` "
                          "(training never downloads), or set CONFIG_INIT_FROM to a folder")


def read_config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise PretrainedError(f"{folder} has no config.json") from None


def dims(folder: Path) -> tuple[int, int, int, int]:
    """(n_layer, n_head, n_embd, n_positions) of the checkpoint."""
    c = read_config(folder)
    return c["n_layer"], c["n_head"], c["n_embd"], c.get("n_positions", N_POSITIONS)


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(path)
            return torch.load(path, map_location="cpu", weights_only=True)
    raise PretrainedError(f"{folder} has none of {', '.join(WEIGHT_FILES)}")


def to_ours(hf: dict[str, torch.Tensor], block_size: int) -> dict[str, torch.Tensor]:
    """Hugging Face GPT-2 tensor names and layouts -> ours. The position table is cut
    to ``block_size`` rows when the run uses a shorter context."""
    out = {}
    for key, value in hf.items():
        name = key.removeprefix("transformer.")
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # the causal mask buffers of old checkpoints, not weights
        if name.endswith(CONV1D):
            value = value.t()
        name = name if name.startswith("lm_head.") else "transformer." + name
        out[name] = value.contiguous()
    out["transformer.wpe.weight"] = out["transformer.wpe.weight"][:block_size]
    out.setdefault("lm_head.weight", out["transformer.wte.weight"])  # tied
    return out


def to_hf(ours: dict[str, torch.Tensor], vocab: int, bias: bool,
          tie_weights: bool) -> dict[str, torch.Tensor]:
    """Our tensors -> Hugging Face GPT-2's names and layouts (the inverse of
    :func:`to_ours`), with the token rows cut to ``vocab``. Hugging Face's GPT-2
    always has biases: a model without them gets zero biases, which compute the
    same. A tied head is left out (the loader ties it to wte)."""
    out: dict[str, torch.Tensor] = {}
    for name, value in ours.items():
        if name == "lm_head.weight":
            if not tie_weights:
                out[name] = value[:vocab]
            continue
        hf = name.removeprefix("transformer.")
        if hf.endswith(CONV1D):
            value = value.t()
        if hf == "wte.weight":
            value = value[:vocab]
        out["transformer." + hf] = value.detach().to("cpu").contiguous().clone()
    if not bias:
        for name, value in list(out.items()):
            stem = name.removesuffix(".weight")
            if name.endswith(".weight") and "wte" not in name and "wpe" not in name:
                width = value.shape[-1] if name.endswith(CONV1D) else value.shape[0]
                out.setdefault(stem + ".bias", torch.zeros(width, dtype=value.dtype))
    return out


def load_into(model: torch.nn.Module, folder: Path) -> None:
    """Copy the weights in ``folder`` into ``model`` (built with the checkpoint's
    dimensions: see :func:`mismatch`)."""
    ours = to_ours(read_state_dict(folder), model.cfg.block_size)
    missing, unexpected = model.load_state_dict(ours, strict=False)
    if missing or unexpected:
        raise PretrainedError(f"{folder} does not match the model: missing "
                              f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")


def mismatch(folder: Path, n_layer: int, n_head: int, n_embd: int, block_size: int,
             bias: bool, tie_weights: bool) -> str | None:
    """Why weights in ``folder`` cannot initialise the configured model, if they can't."""
    layers, heads, width, positions = dims(folder)
    if (layers, heads, width) != (n_layer, n_head, n_embd):
        return (f"{folder} holds {layers} layers x {heads} heads x {width} wide, the "
                f"configuration {n_layer} x {n_head} x {n_embd}: pick the matching "
                "CONFIG_MODEL_SIZE (or custom dimensions)")
    if block_size > positions:
        return (f"the weights have {positions} positions, fewer than CONFIG_BLOCK_SIZE="
                f"{block_size}")
    if not (bias and tie_weights):
        return "GPT-2 weights have biases and a tied output head: set CONFIG_BIAS=y and " \
               "CONFIG_TIE_WEIGHTS=y"
    return None


def init_from(model: torch.nn.Module, cfg) -> str:
    """Load CONFIG_INIT_FROM's weights into ``model``, whose shape ``cfg`` (a
    Config) describes; returns where they came from. A missing or mismatched model
    is a ConfigError naming the setting."""
    if characters(cfg.dataset):
        raise ConfigError("init_from", f"GPT-2 weights read GPT-2 BPE tokens, and dataset "
                          f"{cfg.dataset} is character-level: train it from scratch "
                          "(CONFIG_INIT_FROM=\"\") or choose a BPE dataset")
    if not model.cfg.is_gpt2():
        raise ConfigError("init_from", "GPT-2's weights are for GPT-2's architecture, and "
                          "this configuration sets CONFIG_MODEL_NORM, _POSITION, _QK_NORM, "
                          "_ATTENTION_SCALE, _ACTIVATION, _EMBEDDING_NORM, _HEAD_BIAS "
                          "or _LOGIT_CAP to another: keep their defaults to start "
                          "from GPT-2, or train from scratch (CONFIG_INIT_FROM=\"\")")
    try:
        folder = find(cfg.init_from)
        n_layer, n_head, n_embd = cfg.dims()
        problem = mismatch(folder, n_layer, n_head, n_embd, cfg.block_size, cfg.bias,
                           cfg.tie_weights)
        if problem:
            raise ConfigError("init_from", problem)
        load_into(model, folder)
    except PretrainedError as e:
        raise ConfigError("init_from", str(e)) from None
    return str(folder)
