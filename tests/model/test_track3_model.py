"""The CONFIG_MODEL_* architecture settings against modded-nanogpt's track 3 model.

``Track3GPT`` below transcribes the model classes of modded-nanogpt's
records/track_3_optimization/train_gpt_simple.py (KellerJordan/modded-nanogpt at
f411b3d): RMSNorm with gains, Linear layers with biases, separate Q, K and V
projections, RMS-normalised queries and keys, half-truncated rotary positions (base
1024), attention scale 0.12, ReLU squared, a norm after the embedding, an untied head
with a bias, the logit cap 15 x / sqrt(x^2 + 15^2), and a summed cross-entropy. The
head width is a parameter (the reference fixes 128; the tests use 16-wide heads), and
so is the token table's dtype: bfloat16 as the reference stores it, which runs its
whole forward in bfloat16 (CONFIG_MODEL_PRECISION=bf16-table), or float32, which
makes the comparison with kgpt's default exact in float32 on a CPU.

kgpt's GPT with those settings gets the same weights (Q, K and V concatenated into
its fused projection) and must give the same logits, the same loss (kgpt's mean is
the reference's sum over the tokens) and the same gradients.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpt2.config.options import Config
from gpt2.config.sizes import parameter_count
from gpt2.model.build import model_config
from gpt2.model.gpt import GPT, GPTConfig

# ---- the transcription --------------------------------------------------------------


class Track3RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.gains = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), weight=self.gains.type_as(x))


class Track3Linear(nn.Linear):
    def __init__(self, n_in, n_out):
        super().__init__(n_in, n_out, bias=True)

    def forward(self, x):
        return F.linear(x, self.weight.type_as(x), self.bias.type_as(x))


class Track3Rotary(nn.Module):
    def __init__(self, dim):
        super().__init__()
        freq = (1 / 1024) ** torch.linspace(0, 1, steps=dim // 4, dtype=torch.float32)
        self.register_buffer("freq", torch.cat([freq, freq.new_zeros(dim // 4)]))

    def forward(self, x_bthd):
        pos = torch.arange(x_bthd.size(1), dtype=torch.float32)
        theta = torch.outer(pos, self.freq)[None, :, None, :]
        cos, sin = theta.cos(), theta.sin()
        x1, x2 = x_bthd.to(dtype=torch.float32).chunk(2, dim=-1)
        return torch.cat((x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos), 3).type_as(x_bthd)


class Track3Attention(nn.Module):
    def __init__(self, dim, head_dim):
        super().__init__()
        self.num_heads, self.head_dim = dim // head_dim, head_dim
        inner = self.num_heads * head_dim
        self.q, self.k, self.v = (Track3Linear(dim, inner) for _ in range(3))
        self.proj = Track3Linear(inner, dim)
        self.rotary = Track3Rotary(head_dim)

    def forward(self, x):
        B, T = x.size(0), x.size(1)
        q = self.q(x).view(B, T, self.num_heads, self.head_dim)
        k = self.k(x).view(B, T, self.num_heads, self.head_dim)
        v = self.v(x).view(B, T, self.num_heads, self.head_dim)
        q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        q, k = self.rotary(q), self.rotary(k)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), scale=0.12,
                                           is_causal=True).transpose(1, 2)
        return self.proj(y.contiguous().view(B, T, self.num_heads * self.head_dim))


class Track3MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc, self.proj = Track3Linear(dim, 4 * dim), Track3Linear(4 * dim, dim)

    def forward(self, x):
        return self.proj(self.fc(x).relu().square())


class Track3Block(nn.Module):
    def __init__(self, dim, head_dim):
        super().__init__()
        self.attn, self.mlp = Track3Attention(dim, head_dim), Track3MLP(dim)
        self.norm1, self.norm2 = Track3RMSNorm(dim), Track3RMSNorm(dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Track3GPT(nn.Module):
    def __init__(self, vocab_size, num_layers, model_dim, head_dim, table=torch.float32):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, model_dim).to(table)  # reference: .bfloat16()
        self.blocks = nn.ModuleList([Track3Block(model_dim, head_dim)
                                     for _ in range(num_layers)])
        self.proj = Track3Linear(model_dim, vocab_size)
        self.norm1, self.norm2 = Track3RMSNorm(model_dim), Track3RMSNorm(model_dim)

    def logits(self, inputs):
        x = self.norm1(self.embed(inputs))
        for block in self.blocks:
            x = block(x)
        logits = self.proj(self.norm2(x)).float()
        return 15 * logits * (logits.square() + 15**2).rsqrt()

    def forward(self, inputs, targets):
        logits = self.logits(inputs)
        return F.cross_entropy(logits.view(targets.numel(), -1), targets.view(-1),
                               reduction="sum")


# ---- kgpt's settings for it, and the weights carried across ----------------------------

LAYERS, WIDTH, HEAD, VOCAB, CONTEXT = 2, 64, 16, 96, 24
TRACK3 = dict(norm="rmsnorm", position="rope-half", qk_norm=True, attention_scale=0.12,
              activation="relu2", embedding_norm=True, head_bias=True, logit_cap=15.0,
              init="track3")


def kgpt_track3(**kw) -> GPT:
    return GPT(GPTConfig(n_layer=LAYERS, n_head=WIDTH // HEAD, n_embd=WIDTH, vocab_size=VOCAB,
                         block_size=CONTEXT, bias=True, tie_weights=False,
                         **{**TRACK3, **kw}))


def reference(table=torch.float32) -> Track3GPT:
    """The transcription with every weight random (the reference's own initialisation
    zeroes the projections, which would hide a wrongly placed one)."""
    torch.manual_seed(3)
    ref = Track3GPT(VOCAB, LAYERS, WIDTH, HEAD, table)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("gains"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:  # (the head's large enough that the cap bends many logits)
                p.normal_(std={"embed.weight": 0.5, "proj.weight": 1.0}.get(name, 0.15))
    return ref


def kgpt_names(ref_name: str) -> tuple[str, int | None]:
    """The kgpt parameter a reference parameter is (a slice of): (name, which third
    of the fused attention projection, or None)."""
    top = {"embed.weight": "transformer.wte.weight", "norm1.gains": "transformer.ln_e.weight",
           "norm2.gains": "transformer.ln_f.weight", "proj.weight": "lm_head.weight",
           "proj.bias": "lm_head.bias"}
    if ref_name in top:
        return top[ref_name], None
    _, i, rest = ref_name.split(".", 2)
    prefix = f"transformer.h.{i}."
    local = {"norm1.gains": ("ln_1.weight", None), "norm2.gains": ("ln_2.weight", None),
             "attn.proj.weight": ("attn.c_proj.weight", None),
             "attn.proj.bias": ("attn.c_proj.bias", None),
             "mlp.fc.weight": ("mlp.c_fc.weight", None), "mlp.fc.bias": ("mlp.c_fc.bias", None),
             "mlp.proj.weight": ("mlp.c_proj.weight", None),
             "mlp.proj.bias": ("mlp.c_proj.bias", None)}
    for j, part in enumerate("qkv"):
        for kind in ("weight", "bias"):
            local[f"attn.{part}.{kind}"] = (f"attn.c_attn.{kind}", j)
    name, third = local[rest]
    return prefix + name, third


def piece(tensor: torch.Tensor, third: int | None) -> torch.Tensor:
    return tensor if third is None else tensor.chunk(3, dim=0)[third]


def carried(ref: Track3GPT, **kw) -> GPT:
    model = kgpt_track3(**kw)
    ours = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in ref.named_parameters():
            target, third = kgpt_names(name)
            piece(ours[target], third).copy_(p)
    return model


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (3, CONTEXT), generator=g),
            torch.randint(0, VOCAB, (3, CONTEXT), generator=g))


# ---- the comparisons ------------------------------------------------------------------

def test_every_parameter_of_the_track3_model_has_one_place_in_kgpts():
    ref, model = reference(), kgpt_track3()
    places = {}
    for name, p in ref.named_parameters():
        target, third = kgpt_names(name)
        assert piece(dict(model.named_parameters())[target], third).shape == p.shape, name
        places.setdefault(target, []).append(third)
    assert sorted(places) == sorted(n for n, _ in model.named_parameters())
    assert sum(p.numel() for p in ref.parameters()) == model.num_params()


def test_logits_loss_and_gradients_equal_the_track3_model():
    ref = reference()
    model = carried(ref)
    idx, targets = batch()
    assert torch.allclose(model.all_logits(idx), ref.logits(idx), atol=2e-5, rtol=1e-5)
    # the cap keeps every logit inside (-15, 15), and these weights push them there
    assert 10 < ref.logits(idx).abs().max() < 15

    ref_loss = ref(idx, targets)
    _, loss = model(idx, targets)
    assert torch.allclose(loss, ref_loss / targets.numel(), rtol=1e-5)
    ref_loss.backward()
    loss.backward()
    ours = dict(model.named_parameters())
    for name, p in ref.named_parameters():
        target, third = kgpt_names(name)
        mine = piece(ours[target].grad, third)
        # kgpt's loss is the mean: its gradients are the sum's over the token count
        assert torch.allclose(mine * targets.numel(), p.grad, atol=1e-5, rtol=1e-4), name


def relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours.float() - theirs.float()).norm() / theirs.float().norm()).item()


@pytest.mark.parametrize("autocast", [False, True])
def test_bf16_table_computes_as_the_track3_model_with_its_bfloat16_table(autocast):
    """The reference as it is: its token table bfloat16, so everything after it is
    bfloat16 (each Linear and norm casts its float32 weights to its input's). kgpt's
    bf16-table gives the same logits, under the trainer's autocast or not (autocast
    is off inside the model); the float32 model with the same weights does not (by
    1 %), so the comparison tells the precisions apart. Gradients are not bitwise
    the same: the reference adds the three bfloat16 input gradients of Q, K and V,
    kgpt's fused projection sums them in float32 inside one matmul, so everything
    upstream of the last block's attention differs by bfloat16 rounding (0.1-1 %;
    the float32 model: 1.3-2.5 %). 64 tokens, a power of two, so that kgpt's mean
    and the reference's sum scale gradients without rounding."""
    ref = reference(torch.bfloat16)
    model = carried(ref, precision="bf16-table")
    assert model.transformer.wte.weight.dtype == torch.bfloat16
    idx, targets = (t[:, :16].contiguous() for t in batch(2))
    idx, targets = torch.cat([idx, idx[:1]]), torch.cat([targets, targets[:1]])
    inside = []  # autocast's state where the blocks run
    model.transformer.h[0].register_forward_hook(
        lambda *_: inside.append(torch.is_autocast_enabled("cpu")))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model.all_logits(idx)
        _, loss = model(idx, targets)
    # (CUDA's autocast would run the norms in float32: off, whatever the caller's;
    # the CPU's has no such rule, so the values alone would not show it)
    assert inside == [False, False]
    expected = ref.logits(idx)
    assert relative(logits, expected) < 1e-4
    with torch.no_grad():
        ref.embed.float()
        assert relative(carried(ref).all_logits(idx), expected) > 5e-3
        ref.embed.bfloat16()
    ref_loss = ref(idx, targets)
    assert abs(loss.item() * targets.numel() / ref_loss.item() - 1) < 1e-6
    ref_loss.backward()
    loss.backward()
    ours = dict(model.named_parameters())
    apart = {}
    for name, p in ref.named_parameters():
        target, third = kgpt_names(name)
        mine = piece(ours[target].grad, third)
        assert mine.dtype == p.grad.dtype, name
        apart[name] = relative(mine * targets.numel(), p.grad)
    last = [n for n in apart if n.startswith(("proj.", "norm2.", f"blocks.{LAYERS - 1}.mlp."))]
    assert max(apart[n] for n in last) < 3e-3, apart
    assert sorted(apart.values())[len(apart) // 2] < 5e-3, apart
    assert max(apart.values()) < 2e-2, apart


@pytest.mark.slow
def test_the_chunked_loss_and_the_evaluation_windows_cap_the_logits_too():
    ref = reference()
    idx, targets = batch(1)
    expected = ref(idx, targets) / targets.numel()
    chunked = carried(ref)
    object.__setattr__(chunked.cfg, "loss_chunk_tokens", 16)
    _, loss = chunked(idx, targets)
    assert torch.allclose(loss, expected, rtol=1e-5)
    with torch.no_grad():
        _, rows = carried(ref)(idx, targets, per_window=True)
    assert torch.allclose(rows.mean(), expected, rtol=1e-5)


def test_the_logit_caps_gradient_is_its_formulas():
    x = (torch.randn(40, dtype=torch.float64) * 30).requires_grad_()
    from gpt2.model.gpt import _CapLogits
    assert torch.autograd.gradcheck(lambda t: _CapLogits.apply(t, 15.0), (x,))
    assert torch.allclose(_CapLogits.apply(x, 15.0), 15 * x * (x * x + 225).rsqrt())


def test_rotary_query_key_products_depend_on_the_distance_only():
    """The same query and key, rotated for positions (m, n) and (m + s, n + s), have
    the same product; for other distances a different one. The last quarter of the
    channel pairs is not turned: those channels are left as they were."""
    from gpt2.model.gpt import rotate_half_truncated

    torch.manual_seed(0)
    q, k = torch.randn(2, 32)

    def at(vector, position):  # one head, the vector at `position` of a 40-token context
        x = torch.zeros(1, 40, 1, 32)
        x[0, position, 0] = vector
        return rotate_half_truncated(x)[0, position, 0]

    def product(m, n):
        return at(q, m) @ at(k, n)

    assert torch.allclose(product(7, 3), product(30, 26), atol=1e-5)
    assert not torch.allclose(product(7, 3), product(7, 5), atol=1e-3)
    turned = at(q, 11)
    unturned = [*range(8, 16), *range(24, 32)]
    assert torch.equal(turned[unturned], q[unturned])
    assert not torch.allclose(turned[:8], q[:8])


def test_track3_initialisation():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=256, vocab_size=512, block_size=16,
                          bias=True, tie_weights=False, **TRACK3))
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight") or name == "lm_head.weight" or name.endswith("bias"):
            assert p.abs().max() == 0, name
        elif name == "transformer.wte.weight":
            assert abs(p.std().item() - 1) < 0.01
        elif p.dim() == 2:
            expected = (0.33 / p.size(1)) ** 0.5
            assert abs(p.std().item() / expected - 1) < 0.03, name
        else:  # the norms' gains
            assert torch.equal(p, torch.ones_like(p)), name


def test_the_settings_build_the_track3_model_and_count_its_parameters():
    cfg = Config(model_size="custom", n_layer=LAYERS, n_head=WIDTH // HEAD, n_embd=WIDTH,
                 block_size=CONTEXT, tie_weights=False, model_norm="rmsnorm",
                 model_position="rope-half", model_qk_norm=True, model_attention_scale=0.12,
                 model_activation="relu2", model_embedding_norm=True, model_head_bias=True,
                 model_logit_cap=15.0, model_init="track3")
    built = model_config(cfg)
    for key, value in TRACK3.items():
        assert getattr(built, key) == value, key
    assert not built.is_gpt2() and model_config(Config()).is_gpt2()
    model = GPT(built)
    assert parameter_count(LAYERS, WIDTH, built.vocab_size, CONTEXT, True, False,
                           rmsnorm=True, learned_positions=False, embedding_norm=True,
                           head_bias=True) == model.num_params()


def test_gpt2s_settings_hash_as_before_the_architecture_settings_existed():
    """Each architecture setting is left out of the hash at its default, so every run
    folder made before them keeps its name."""
    assert Config().config_hash() == Config(model_norm="layernorm").config_hash()
    assert Config().config_hash() != Config(model_norm="rmsnorm").config_hash()


def test_settings_that_cannot_go_together_are_refused_naming_the_setting():
    from gpt2.config.options import resolve
    from gpt2.errors import ConfigError

    base = dict(model_size="custom", n_layer=2, n_embd=64)
    with pytest.raises(ConfigError, match="MODEL_POSITION.*head width n_embd/n_head = 6"):
        resolve({**base, "n_head": 2, "n_embd": 12, "model_position": "rope-half"})
    resolve({**base, "n_head": 4, "model_position": "rope-half"})  # 16 wide: fine
    with pytest.raises(ConfigError, match="LOSS_FUSED.*uncapped"):
        resolve({**base, "n_head": 4, "model_logit_cap": 15.0, "loss_fused": True,
                 "loss_chunk_tokens": 64})


@pytest.mark.parametrize("settings,refusal", [
    (dict(dtype="float32"), "CONFIG_DTYPE is float32"),
    (dict(loss_fused=True, loss_chunk_tokens=64), "fused loss"),
    (dict(parallel="fsdp"), "FSDP"),
    (dict(pruning_method="magnitude"), "pruning"),
    (dict(optimizer="lion"), "lion"),
    (dict(optimizer="adamw", cautious=True), "adamw"),
])
def test_bf16_table_refuses_what_it_was_not_built_with(settings, refusal):
    """bf16-table needs bfloat16 as the run's dtype and an optimizer that steps a
    bfloat16 table in float32; the rest has not been built or tested with it."""
    from gpt2.config.options import resolve
    from gpt2.errors import ConfigError

    base = dict(model_size="custom", n_layer=2, n_head=4, n_embd=64,
                model_precision="bf16-table")
    for fine in (dict(), dict(optimizer="muon"), dict(optimizer="adamw", param_groups="track3")):
        assert resolve({**base, **fine}).model_precision == "bf16-table"
    with pytest.raises(ConfigError, match=f"MODEL_PRECISION.*{refusal}"):
        resolve({**base, **settings})


def test_gpt2s_released_weights_refuse_another_architecture():
    from gpt2.config.options import resolve
    from gpt2.errors import ConfigError
    from gpt2.model import pretrained

    cfg = resolve(dict(init_from="gpt2", model_activation="relu2"))
    with torch.device("meta"):
        model = GPT(model_config(cfg))
    with pytest.raises(ConfigError, match="INIT_FROM.*for GPT-2.s architecture"):
        pretrained.init_from(model, cfg)
