"""The model a run's settings build: the one place that turns a kgpt Config (or a
run folder's config.json) into the model's own GPTConfig. gpt2/model/gpt.py knows
only GPTConfig, so the model imports no setting and no run folder."""

from __future__ import annotations

import os
from pathlib import Path

from gpt2 import run_folder, storage
from gpt2.config.choices import PADDED_VOCAB_SIZE, VOCAB_SIZE
from gpt2.config.datasets import vocab_rows
from gpt2.config.options import from_record
from gpt2.errors import ConfigError
from gpt2.model.gpt import GPTConfig


def model_config(cfg) -> GPTConfig:
    """The model a run's Config builds."""
    n_layer, n_head, n_embd = cfg.dims()
    return GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                     vocab_size=init_vocab(cfg.init_from, cfg.dataset),
                     block_size=cfg.block_size, dropout=cfg.dropout, bias=cfg.bias,
                     tie_weights=cfg.tie_weights,
                     checkpointing=cfg.activation_checkpointing,
                     loss_chunk_tokens=cfg.loss_chunk_tokens,
                     loss_fused=cfg.loss_fused,
                     attention_backend=cfg.attention_backend,
                     norm=cfg.model_norm, position=cfg.model_position,
                     qk_norm=cfg.model_qk_norm, attention_scale=cfg.model_attention_scale,
                     activation=cfg.model_activation,
                     embedding_norm=cfg.model_embedding_norm,
                     head_bias=cfg.model_head_bias, logit_cap=cfg.model_logit_cap,
                     init=cfg.model_init, precision=cfg.model_precision)


def init_vocab(init_from: str, dataset: str) -> int:
    """Rows of the token table of a model initialised from ``init_from`` (from
    scratch: the dataset's, gpt2/config/datasets.py vocab_rows): kgpt pads GPT-2's
    vocabulary to 50304 for speed; released weights and Hugging Face folders keep their 50257
    (gpt2/model/pretrained.py); a kgpt run folder has whatever its model had (read
    from its config.json; a folder that cannot be read fails later, when loaded,
    with the reason)."""
    if not init_from:
        return vocab_rows(dataset)
    folder = Path(os.path.expanduser(init_from))
    if (folder / run_folder.CKPT).exists() and not (folder / "model.safetensors").exists():
        try:
            return model_config(from_record(storage.read_json_object(folder / run_folder.CONFIG_JSON))
                                ).vocab_size
        except (OSError, ValueError, TypeError, ConfigError, RecursionError):
            return PADDED_VOCAB_SIZE
    return VOCAB_SIZE
