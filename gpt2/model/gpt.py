"""GPT-2 (Radford et al. 2019) as in the paper and its well-known reimplementations.

Learned position embeddings, pre-LayerNorm blocks, GELU (tanh approximation),
optional weight tying between the token embedding and the output head, residual
projections initialised with std 0.02/sqrt(2*n_layer), and attention through
torch's scaled_dot_product_attention (flash/memory-efficient kernels on GPUs).
The vocabulary is padded from 50257 to 50304 (a multiple of 64) for faster
matmuls; padded ids never occur in data and are masked out when sampling.

Every architecture setting below defaults to GPT-2's. The others describe the model
of modded-nanogpt's optimization track (records/track_3_optimization/
train_gpt_simple.py; docs/model.md has the table): RMSNorm with gains, rotary
positions on half of each head's channels, RMS-normalised queries and keys, a fixed
attention scale, ReLU squared, a norm after the token embedding, an untied head with a
bias, a smooth cap on the logits, and its initialisation. ``precision`` says how the
numbers are carried: kgpt's float32 weights with the matmuls under the run's autocast,
or (``bf16-table``) that script's token table stored in bfloat16, which makes its
whole forward bfloat16: every layer casts its float32 weights to its input's dtype,
and autocast is off, so the casts are the script's own on any device.

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

from gpt2.config.choices import (ATTENTION_BACKENDS, CHECKPOINTING, MODEL_ACTIVATIONS, MODEL_INITS,
                                 MODEL_NORMS, MODEL_POSITIONS, MODEL_PRECISIONS,
                                 PADDED_VOCAB_SIZE, VOCAB_SIZE, implemented)
from gpt2.model.fused_loss import linear_cross_entropy

# Evaluation computes the head's logits for at most this many tokens at a time
# (float32: 103 MB); larger pieces were no faster on the CPU (_window_losses).
EVAL_HEAD_TOKENS = 512
# CONFIG_ATTENTION_BACKEND -> the one SDPA kernel family allowed (auto: torch chooses)
SDPA_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
implemented(ATTENTION_BACKENDS[1:], SDPA_BACKENDS, "attention backends (but auto)")
# The rotary base of modded-nanogpt's half-truncated RoPE: its frequencies run from 1
# down to 1/1024 radians per position over a quarter of the head's channels.
ROPE_HALF_BASE = 1024.0


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
    # Architecture (the first choice of each is GPT-2's; see the module docstring)
    norm: str = "layernorm"  # one of MODEL_NORMS
    position: str = "learned"  # one of MODEL_POSITIONS
    qk_norm: bool = False  # RMS-normalise each head's queries and keys
    attention_scale: float = 0.0  # 0: 1/sqrt(head width)
    activation: str = "gelu"  # one of MODEL_ACTIVATIONS
    embedding_norm: bool = False  # a norm on the token embedding, before the blocks
    head_bias: bool = False  # the output head has a bias
    logit_cap: float = 0.0  # > 0: logits x -> cap * x / sqrt(x^2 + cap^2)
    init: str = "gpt2"  # one of MODEL_INITS
    precision: str = "autocast"  # one of MODEL_PRECISIONS (not architecture: the same
    # weights compute the same function, rounded differently)

    def is_gpt2(self) -> bool:
        """Whether this is GPT-2's architecture (what released weights and the Hugging
        Face export hold)."""
        return all(getattr(self, f) == getattr(GPT2_ARCHITECTURE, f) for f in ARCHITECTURE)


# The fields that choose what the model computes beyond its dimensions (GPTConfig
# above; the initialisation is not one: weights trained from either compute alike).
ARCHITECTURE = ("norm", "position", "qk_norm", "attention_scale", "activation",
                "embedding_norm", "head_bias", "logit_cap")
GPT2_ARCHITECTURE = GPTConfig()


class _CastLinear(nn.Linear):
    """A Linear that casts its weight and bias to its input's dtype, as track 3's
    Linear does (``weight.type_as(x)``): with a bfloat16 input, a bfloat16 matmul and
    output, whatever autocast would do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.type_as(x)
        return F.linear(x, self.weight.type_as(x), bias)


class _CastRMSNorm(nn.RMSNorm):
    """RMSNorm with its gains cast to the input's dtype (track 3's RMSNorm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight.type_as(x), self.eps)


class _CastLayerNorm(nn.LayerNorm):
    """LayerNorm with its weight and bias cast to the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.type_as(x)
        return F.layer_norm(x, self.normalized_shape, self.weight.type_as(x), bias, self.eps)


def _casting(cfg: GPTConfig) -> bool:
    """Whether the layers cast their weights to their inputs' dtype (bf16-table): the
    default keeps torch's own layers, whose casts autocast makes."""
    return cfg.precision == "bf16-table"


def _linear(cfg: GPTConfig, n_in: int, n_out: int, bias: bool) -> nn.Linear:
    return (_CastLinear if _casting(cfg) else nn.Linear)(n_in, n_out, bias=bias)


def _norm(cfg: GPTConfig) -> nn.Module:
    """A LayerNorm (with a bias when the model has biases) or an RMSNorm with gains
    (no bias; eps from the dtype, as F.rms_norm's default)."""
    if cfg.norm == "rmsnorm":
        return (_CastRMSNorm if _casting(cfg) else nn.RMSNorm)(cfg.n_embd)
    return (_CastLayerNorm if _casting(cfg) else nn.LayerNorm)(cfg.n_embd, bias=cfg.bias)


class _CapLogits(torch.autograd.Function):
    """x -> cap * x / sqrt(x^2 + cap^2) (modded-nanogpt's smooth logit cap), keeping
    only x for backward: the derivative is cap^3 / (x^2 + cap^2)^(3/2). Autograd of the
    formula would keep three (tokens x vocabulary) float32 tensors instead of one."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cap: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.cap = cap
        return cap * x * (x.square() + cap * cap).rsqrt()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        cap = ctx.cap
        # in place on one temporary: a (tokens x vocabulary) tensor each step counts
        return x.square().add_(cap * cap).rsqrt_().pow_(3).mul_(grad).mul_(cap ** 3), None


def rotate_half_truncated(x: torch.Tensor) -> torch.Tensor:
    """Rotary positions (B, T, H, D) on the first half of each head's channel pairs,
    as modded-nanogpt: channel i is paired with channel i + D/2, the first D/4 pairs
    turn by position x ROPE_HALF_BASE^(-k/(D/4-1)) radians (k = 0 .. D/4-1) and the
    other D/4 pairs not at all. Computed in float32."""
    width = x.size(-1)
    turning = torch.linspace(0, 1, steps=width // 4, dtype=torch.float32, device=x.device)
    freq = torch.cat([ROPE_HALF_BASE ** -turning, turning.new_zeros(width // 4)])
    angle = torch.arange(x.size(1), dtype=torch.float32, device=x.device)[:, None] * freq
    cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]
    first, second = x.float().chunk(2, dim=-1)
    return torch.cat((first * cos + second * sin, second * cos - first * sin),
                     dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qk_norm = cfg.qk_norm
        self.rotary = cfg.position == "rope-half"
        self.scale = cfg.attention_scale or None  # None: SDPA's 1/sqrt(head width)
        self.backend = SDPA_BACKENDS.get(cfg.attention_backend)
        self.c_attn = _linear(cfg, cfg.n_embd, 3 * cfg.n_embd, cfg.bias)
        self.c_proj = _linear(cfg, cfg.n_embd, cfg.n_embd, cfg.bias)
        self.c_proj.is_residual_projection = True
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # (B, T, C) -> (B, T, n_head, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head)
                   for t in self.c_attn(x).split(C, dim=2))
        if self.qk_norm:
            q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        if self.rotary:
            q, k = rotate_half_truncated(q), rotate_half_truncated(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, n_head, T, head_dim)
        with sdpa_kernel(self.backend) if self.backend is not None else contextlib.nullcontext():
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                               dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = _linear(cfg, cfg.n_embd, 4 * cfg.n_embd, cfg.bias)
        self.c_proj = _linear(cfg, 4 * cfg.n_embd, cfg.n_embd, cfg.bias)
        self.c_proj.is_residual_projection = True
        self.dropout = nn.Dropout(cfg.dropout)
        self.relu2 = cfg.activation == "relu2"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        h = F.relu(h).square() if self.relu2 else F.gelu(h, approximate="tanh")
        return self.dropout(self.c_proj(h))


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
        self.ln_1 = _norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = _norm(cfg)
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
        for name, choices in (("norm", MODEL_NORMS), ("position", MODEL_POSITIONS),
                              ("activation", MODEL_ACTIVATIONS), ("init", MODEL_INITS),
                              ("precision", MODEL_PRECISIONS)):
            if getattr(cfg, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}")
        if cfg.position == "rope-half" and (cfg.n_embd // cfg.n_head) % 4:
            raise ValueError("rope-half needs a head width (n_embd / n_head) divisible by 4")
        self.cfg = cfg
        layers = dict(wte=nn.Embedding(cfg.vocab_size, cfg.n_embd))
        if cfg.position == "learned":
            layers["wpe"] = nn.Embedding(cfg.block_size, cfg.n_embd)
        if cfg.embedding_norm:
            layers["ln_e"] = _norm(cfg)
        self.transformer = nn.ModuleDict(dict(
            **layers,
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
            ln_f=_norm(cfg),
        ))
        self.lm_head = _linear(cfg, cfg.n_embd, cfg.vocab_size, cfg.head_bias)
        if cfg.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_track3 if cfg.init == "track3" else self._init_weights)
        if cfg.precision == "bf16-table":
            # Drawn in float32 and rounded, so that a seed starts both precisions from
            # the same weights (up to that rounding). Track 3 draws it in bfloat16.
            self.transformer.wte.to(torch.bfloat16)

    def _init_track3(self, module: nn.Module) -> None:
        """modded-nanogpt's track 3 initialisation: output projections (the blocks'
        c_proj and an untied head) start at zero, every other Linear weight normal with
        std sqrt(0.33 / fan_in), the token table standard normal, biases zero, norm
        gains one. (A learned position table, which that model has not, keeps GPT-2's
        std 0.02.)"""
        if isinstance(module, nn.Linear):
            if module.bias is not None:
                nn.init.zeros_(module.bias)
            if module is self.lm_head and self.cfg.tie_weights:
                return  # the token table's
            if getattr(module, "is_residual_projection", False) or module is self.lm_head:
                nn.init.zeros_(module.weight)
            else:
                nn.init.normal_(module.weight, std=(0.33 / module.in_features) ** 0.5)
        elif isinstance(module, nn.Embedding):
            std = 1.0 if module is self.transformer.wte else 0.02
            nn.init.normal_(module.weight, std=std)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "is_residual_projection", False):
                # GPT-2: scale residual-branch outputs by 1/sqrt(number of residual adds).
                std /= math.sqrt(2 * self.cfg.n_layer)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
            if module is self.lm_head and self.cfg.tie_weights:
                return  # shares the embedding's initialisation
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = False) -> int:
        """Unique parameters (a tied matrix counts once); non_embedding drops the
        position table, and the token table too when it is not reused as the head."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            if "wpe" in self.transformer:
                n -= self.transformer.wpe.weight.numel()
            if not self.cfg.tie_weights:
                n -= self.transformer.wte.weight.numel()
        return n

    def _hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """The final norm's output for every position."""
        T = idx.shape[1]
        if T > self.cfg.block_size:
            raise ValueError(f"sequence of {T} tokens exceeds the context length "
                             f"{self.cfg.block_size}")
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:  # (in the token table's dtype: the stream's)
            x = x + self.transformer.wpe(torch.arange(T, device=idx.device)).to(x.dtype)
        if "ln_e" in self.transformer:
            x = self.transformer.ln_e(x)
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of hidden states x: the output head, and the logit cap when there
        is one (then in float32, as the cap is computed)."""
        logits = self.lm_head(x)
        if self.cfg.logit_cap:
            return _CapLogits.apply(logits.float(), self.cfg.logit_cap)
        return logits

    def _precision(self, device: torch.device):
        """bf16-table: autocast off, so each layer computes in its input's dtype (the
        token table's bfloat16) as track 3's does, on any device; else nothing."""
        if self.cfg.precision == "bf16-table":
            return torch.autocast(device.type, enabled=False)
        return contextlib.nullcontext()

    def all_logits(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits at every position (B, T, vocab), for scoring text (evaluation)."""
        with self._precision(idx.device):
            return self.head(self._hidden(idx))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                per_window: bool = False):
        """(logits, mean loss); ``per_window``: (None, each row's mean loss), which
        evaluation asks for (through forward, so torch.compile and FSDP see the call)."""
        with self._precision(idx.device):
            return self._forward(idx, targets, per_window)

    def _forward(self, idx: torch.Tensor, targets: torch.Tensor | None, per_window: bool):
        B, T = idx.shape
        x = self._hidden(idx)
        if targets is None:
            # Inference: only the last position's logits are needed.
            return self.head(x[:, [-1], :]), None
        chunk = self.cfg.loss_chunk_tokens
        if per_window:
            step = min(chunk or EVAL_HEAD_TOKENS, EVAL_HEAD_TOKENS)
            return None, self._window_losses(x.view(B * T, -1), targets.reshape(-1),
                                             step).view(B, T).mean(dim=1)
        if self.cfg.loss_fused:
            if self.cfg.logit_cap:
                raise ValueError("the fused loss computes uncapped logits: it cannot be "
                                 "combined with a logit cap")
            return None, linear_cross_entropy(x.view(B * T, -1), self.lm_head.weight,
                                              self.lm_head.bias, targets.reshape(-1), chunk)
        if chunk and B * T > chunk:
            return None, self._chunked_loss(x.view(B * T, -1), targets.reshape(-1), chunk)
        logits = self.head(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def _chunk_loss_sum(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(x).float(), targets, reduction="sum")

    def _window_losses(self, x: torch.Tensor, targets: torch.Tensor,
                       step: int) -> torch.Tensor:
        """Every token's cross-entropy (no reduction), without gradients, from the
        logits of ``step`` tokens at a time (EVAL_HEAD_TOKENS, or the loss chunk when
        smaller). Never a whole batch at once: with nothing to keep for backward there
        is no reason to: a batch's whole logits would be the largest buffer the
        evaluation allocates, and (when glibc still kept freed buffers on the CPU)
        per-token losses allocated between two of them made the CPU preset peak at
        5.5 GB against its 2.8 GB training step."""
        return torch.cat([F.cross_entropy(self.head(x[i:i + step]).float(),
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
