"""GPT-2 (Radford et al. 2019) as in the paper and its well-known reimplementations.

Learned position embeddings, pre-LayerNorm blocks, GELU (tanh approximation),
optional weight tying between the token embedding and the output head, residual
projections initialised with std 0.02/sqrt(2*n_layer), and attention through
torch's scaled_dot_product_attention (flash/memory-efficient kernels on GPUs).
The vocabulary is padded from 50257 to 50304 (a multiple of 64) for faster
matmuls; padded ids never occur in data and are masked out when sampling.

Two memory savers, both off by default (docs/memory.md has what they save):

* activation checkpointing: ``full`` keeps only each block's input and recomputes
  the block during backward; ``selective`` recomputes only the MLP, whose 4x-wide
  hidden layer holds half of a block's saved activations. Recomputation repeats
  the same arithmetic, so losses and gradients are unchanged.
* chunked cross-entropy (``loss_chunk_tokens``): the output head and the loss run
  over that many tokens at a time, each chunk recomputed in backward, so the
  (tokens x 50304) float32 logits are never held for the whole batch at once.
  With ``loss_fused`` as well, each chunk's gradients are computed in forward
  instead (gpt2/model/fused_loss.py): the same saving without the recomputation.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpt2.config.choices import (ATTENTION_BACKENDS, CHECKPOINTING, PADDED_VOCAB_SIZE, VOCAB_SIZE,
                                 implemented)
from gpt2.model.fused_loss import linear_cross_entropy

# Evaluation computes the head's logits for at most this many tokens at a time
# (float32: 103 MB); larger pieces were no faster on the CPU (_window_losses).
EVAL_HEAD_TOKENS = 512
# CONFIG_ATTENTION_BACKEND -> the one SDPA kernel family allowed (auto: torch chooses)
SDPA_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
implemented(ATTENTION_BACKENDS[1:], SDPA_BACKENDS, "attention backends (but auto)")


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = PADDED_VOCAB_SIZE
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True
    checkpointing: str = "none"  # one of CHECKPOINTING
    loss_chunk_tokens: int = 0  # 0: the loss over all tokens at once
    loss_fused: bool = False  # the chunks' gradients computed in forward (needs a chunk size)
    attention_backend: str = "auto"  # "auto" or a key of SDPA_BACKENDS


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.backend = SDPA_BACKENDS.get(cfg.attention_backend)
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.is_residual_projection = True
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(self.backend) if self.backend is not None else contextlib.nullcontext():
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.is_residual_projection = True
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


def _recompute(fn, *args):
    """Run fn saving nothing for backward but its inputs; backward runs it again.
    Non-reentrant checkpointing restores the RNG, so dropout masks repeat exactly."""
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.checkpointing not in CHECKPOINTING:
            raise ValueError(f"checkpointing must be one of {CHECKPOINTING}")
        self.checkpointing = cfg.checkpointing
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(self.ln_1(x))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_2(x))

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attn(x)
        return x + self._mlp(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and torch.is_grad_enabled()) or self.checkpointing == "none":
            return self._forward(x)
        if self.checkpointing == "full":
            return _recompute(self._forward, x)
        x = x + self._attn(x)
        return x + _recompute(self._mlp, x)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
            ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "is_residual_projection", False):
                # GPT-2: scale residual-branch outputs by 1/sqrt(number of residual adds).
                std /= math.sqrt(2 * self.cfg.n_layer)
            if module is self.lm_head and self.cfg.tie_weights:
                return  # shares the embedding's initialisation
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = False) -> int:
        """Unique parameters (a tied matrix counts once); non_embedding drops the
        position table, and the token table too when it is not reused as the head."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
            if not self.cfg.tie_weights:
                n -= self.transformer.wte.weight.numel()
        return n

    def _hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """The final LayerNorm's output for every position."""
        T = idx.shape[1]
        if T > self.cfg.block_size:
            raise ValueError(f"sequence of {T} tokens exceeds the context length "
                             f"{self.cfg.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)

    def all_logits(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits at every position (B, T, vocab), for scoring text (evaluation)."""
        return self.lm_head(self._hidden(idx))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                per_window: bool = False):
        """(logits, mean loss); ``per_window``: (None, each row's mean loss), which
        evaluation asks for (through forward, so torch.compile and FSDP see the call)."""
        B, T = idx.shape
        x = self._hidden(idx)
        if targets is None:
            # Inference: only the last position's logits are needed.
            return self.lm_head(x[:, [-1], :]), None
        chunk = self.cfg.loss_chunk_tokens
        if per_window:
            step = min(chunk or EVAL_HEAD_TOKENS, EVAL_HEAD_TOKENS)
            return None, self._window_losses(x.view(B * T, -1), targets.reshape(-1),
                                             step).view(B, T).mean(dim=1)
        if self.cfg.loss_fused:
            return None, linear_cross_entropy(x.view(B * T, -1), self.lm_head.weight,
                                              self.lm_head.bias, targets.reshape(-1), chunk)
        if chunk and B * T > chunk:
            return None, self._chunked_loss(x.view(B * T, -1), targets.reshape(-1), chunk)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def _chunk_loss_sum(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(x).float()
        return F.cross_entropy(logits, targets, reduction="sum")

    def _window_losses(self, x: torch.Tensor, targets: torch.Tensor,
                       step: int) -> torch.Tensor:
        """Every token's cross-entropy (no reduction), without gradients, from the
        logits of ``step`` tokens at a time (EVAL_HEAD_TOKENS, or the loss chunk when
        smaller). Never a whole batch at once: with nothing to keep for backward there
        is no reason to: a batch's whole logits would be the largest buffer the
        evaluation allocates, and (when glibc still kept freed buffers on the CPU)
        per-token losses allocated between two of them made the CPU preset peak at
        5.5 GB against its 2.8 GB training step."""
        return torch.cat([F.cross_entropy(self.lm_head(x[i:i + step]).float(),
                                          targets[i:i + step], reduction="none")
                          for i in range(0, x.size(0), step)])

    def _chunked_loss(self, x: torch.Tensor, targets: torch.Tensor,
                      chunk: int) -> torch.Tensor:
        """Mean cross-entropy computed ``chunk`` tokens at a time. Each chunk is
        checkpointed, so autograd keeps only its input rows: backward rebuilds one
        chunk's logits at a time. (Without the checkpoint each chunk's float32
        log-probabilities would stay saved and nothing would be gained.)"""
        part = _recompute if torch.is_grad_enabled() else (lambda fn, *args: fn(*args))
        total = sum(part(self._chunk_loss_sum, x[i:i + chunk], targets[i:i + chunk])
                    for i in range(0, x.size(0), chunk))
        return total / x.size(0)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int = 0, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample continuations of idx (B, T); the context is cropped to block_size."""
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.cfg.block_size:]
            logits, _ = self(ctx)
            logits = logits[:, -1, :].float() / temperature
            tokens = min(VOCAB_SIZE, self.cfg.vocab_size)  # (a character-level table: all)
            logits[:, tokens:] = -float("inf")  # padding ids are not tokens
            if top_k:
                kth = torch.topk(logits, min(top_k, tokens)).values[:, [-1]]
                logits[logits < kth] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(idx.device)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
