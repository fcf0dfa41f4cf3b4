"""The GPT-2 model: sizes, causality, initialisation, attention and sampling."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gpt2.data.tokenizer import VOCAB_SIZE
from gpt2.model import gpt
from gpt2.model.gpt import GPT, PADDED_VOCAB_SIZE, GPTConfig
from gpt2.model.build import model_config
from gpt2.config.sizes import MODEL_SIZES

# Parameter counts of the released GPT-2 checkpoints (vocabulary 50257, tied head).
RELEASED = {"gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080,
            "gpt2-xl": 1_557_611_200}


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(n_layer=2, n_head=2, n_embd=32, block_size=16), **kw}))


@pytest.mark.parametrize("name", list(MODEL_SIZES))
def test_presets_have_the_released_parameter_counts(name):
    s = MODEL_SIZES[name]
    with torch.device("meta"):
        model = GPT(GPTConfig(n_layer=s.n_layer, n_head=s.n_head, n_embd=s.n_embd))
    padding = (PADDED_VOCAB_SIZE - VOCAB_SIZE) * s.n_embd
    assert model.num_params() - padding == RELEASED[name]


def test_vocab_is_padded_to_a_multiple_of_64():
    assert PADDED_VOCAB_SIZE % 64 == 0 and PADDED_VOCAB_SIZE >= VOCAB_SIZE


def test_future_tokens_do_not_change_past_logits():
    model = tiny().eval()
    idx = torch.randint(0, VOCAB_SIZE, (2, 12))
    changed = idx.clone()
    changed[:, 8:] = torch.randint(0, VOCAB_SIZE, (2, 4))
    logits_a, _ = model(idx, idx)
    logits_b, _ = model(changed, changed)
    assert torch.allclose(logits_a[:, :8], logits_b[:, :8], atol=1e-6)
    assert not torch.allclose(logits_a[:, 8:], logits_b[:, 8:])


def test_attention_equals_explicit_masked_softmax():
    model = tiny().eval()
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 10, 32)
    q, k, v = attn.c_attn(x).split(32, dim=2)
    q, k, v = (t.view(2, 10, 2, 16).transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(16)
    scores = scores.masked_fill(torch.triu(torch.ones(10, 10, dtype=torch.bool), 1), -math.inf)
    ref = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(2, 10, 32)
    assert torch.allclose(attn(x), attn.c_proj(ref), atol=1e-5)


def test_initial_loss_is_uniform_over_the_vocabulary():
    model = tiny(n_layer=4, n_embd=64, n_head=4)
    idx, targets = torch.randint(0, VOCAB_SIZE, (2, 4, 16))
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(PADDED_VOCAB_SIZE)) < 0.1


def test_weight_tying_and_residual_init():
    tied, untied = tiny(), tiny(tie_weights=False)
    assert tied.lm_head.weight is tied.transformer.wte.weight
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert untied.num_params() - tied.num_params() == PADDED_VOCAB_SIZE * 32
    big = GPT(GPTConfig(n_layer=8, n_head=4, n_embd=256, block_size=16))
    proj_std = big.transformer.h[0].mlp.c_proj.weight.std().item()
    fc_std = big.transformer.h[0].mlp.c_fc.weight.std().item()
    assert abs(proj_std - 0.02 / math.sqrt(16)) < 0.0005 and abs(fc_std - 0.02) < 0.001


def test_no_bias_option_removes_every_bias():
    model = tiny(bias=False)
    assert not [n for n, _ in model.named_parameters() if n.endswith("bias")]


@pytest.mark.slow
@pytest.mark.parametrize("top_k", [0, 200])
def test_generate_never_emits_padding_and_crops_long_prompts(top_k):
    """The padded vocabulary ids are no tokens. Here the model gives them the highest
    logits by far, so only the mask keeps them from every draw."""
    model = tiny().eval()
    plain = model.forward

    def padding_favoured(idx, targets=None):
        logits, loss = plain(idx, targets)
        logits = logits.clone()
        logits[..., VOCAB_SIZE:] = 50.0
        return logits, loss

    model.forward = padding_favoured
    prompt = torch.randint(0, VOCAB_SIZE, (1, 40))  # longer than block_size=16
    out = model.generate(prompt, 20, top_k=top_k, generator=torch.Generator().manual_seed(1))
    assert out.shape == (1, 60) and int(out.max()) < VOCAB_SIZE
    model.forward = plain
    g = torch.Generator().manual_seed(3)
    a = model.generate(prompt[:, :4], 5, top_k=1, generator=g)
    b = model.generate(prompt[:, :4], 5, top_k=1, generator=g)
    assert torch.equal(a, b)  # top_k=1 is greedy


def test_sequence_longer_than_context_is_an_error():
    with pytest.raises(ValueError, match="context length"):
        tiny()(torch.zeros(1, 17, dtype=torch.long))


def _loss_and_grads(cfg_kw: dict, seed: int = 0):
    torch.manual_seed(seed)
    model = tiny(**cfg_kw)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, 50257, (3, 16), generator=g) for _ in range(2))
    torch.manual_seed(7)  # the dropout masks
    _, loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_activation_checkpointing_leaves_loss_and_gradients_unchanged(mode):
    # Dropout on: recomputation must replay the same masks (RNG restored).
    ref_loss, ref_grads = _loss_and_grads(dict(dropout=0.1))
    loss, grads = _loss_and_grads(dict(dropout=0.1, checkpointing=mode))
    assert torch.equal(loss, ref_loss)
    for name, g in ref_grads.items():
        assert torch.equal(grads[name], g), name


@pytest.mark.parametrize("chunk", [7, 16, 48])
def test_chunked_cross_entropy_equals_the_whole_loss(chunk):
    ref_loss, ref_grads = _loss_and_grads({})
    loss, grads = _loss_and_grads(dict(loss_chunk_tokens=chunk))
    assert torch.allclose(loss, ref_loss, rtol=1e-6, atol=0)
    for name, g in ref_grads.items():
        # Sums in another order: equal up to float32 rounding at the gradient's scale.
        assert (grads[name] - g).abs().max() <= 1e-5 * g.abs().max(), name
    if chunk >= 48:  # one chunk covers the batch: the plain path, bit for bit
        assert torch.equal(loss, ref_loss)


def test_chunked_cross_entropy_in_evaluation_equals_the_whole_loss():
    torch.manual_seed(0)
    plain, chunked = tiny(), tiny(loss_chunk_tokens=5)
    chunked.load_state_dict(plain.state_dict())
    x, y = torch.randint(0, 50257, (2, 16)), torch.randint(0, 50257, (2, 16))
    with torch.no_grad():
        assert torch.allclose(chunked(x, y)[1], plain(x, y)[1], rtol=1e-6)


@pytest.mark.parametrize("chunk,most", [(0, 32), (5, 5), (4096, 32)])
def test_per_window_evaluation_scores_a_bounded_piece_of_logits_at_a_time(chunk, most,
                                                                          monkeypatch):
    """Evaluation keeps no logits for backward, so it never computes a whole batch's
    at once (on the CPU that fragmented glibc's kept heap: the CPU preset's peak
    rose from 2.8 to 5.5 GB over its evaluations). Each window's loss is still its
    mean token loss."""
    monkeypatch.setattr(gpt, "EVAL_HEAD_TOKENS", 32)
    model = tiny(loss_chunk_tokens=chunk)
    rows = []
    model.lm_head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    x, y = torch.randint(0, 50257, (3, 16)), torch.randint(0, 50257, (3, 16))
    with torch.no_grad():
        windows = model(x, y, per_window=True)[1]
        assert rows and max(rows) == most and sum(rows) == 3 * 16
        rows.clear()
        expected = torch.stack([model(x[i:i + 1], y[i:i + 1])[1] for i in range(3)])
    assert windows.shape == (3,)
    assert torch.allclose(windows, expected, rtol=1e-6)


def _head_loss_and_grads(cfg_kw: dict, autocast: bool = False, scale: float = 3.0):
    """Loss and gradients of a scaled loss (as accumulation and loss scaling scale it),
    optionally under bfloat16 autocast."""
    torch.manual_seed(0)
    model = tiny(**cfg_kw)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, 50257, (3, 16), generator=g) for _ in range(2))
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        loss = model(x, y)[1]
    (loss * scale).backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("chunk,tie", [(7, True), (48, True), (16, False)])
def test_fused_cross_entropy_gives_the_plain_loss_and_gradients(chunk, tie):
    """CONFIG_LOSS_FUSED computes the head's gradients in forward; the reference is
    the plain head: the whole logits, torch's cross_entropy and autograd."""
    ref_loss, ref_grads = _head_loss_and_grads(dict(tie_weights=tie))
    loss, grads = _head_loss_and_grads(dict(tie_weights=tie, loss_chunk_tokens=chunk,
                                            loss_fused=True))
    assert torch.allclose(loss, ref_loss, rtol=1e-6, atol=0)
    for name, g in ref_grads.items():
        assert (grads[name] - g).abs().max() <= 1e-5 * g.abs().max(), name


def test_fused_cross_entropy_under_autocast_is_as_close_as_the_plain_head():
    """In bfloat16 the fused head may differ from the plain one only by rounding:
    each is compared with the float32 gradients, and the fused one must be no
    further from them than the plain one is (with a margin for rounding)."""
    _, exact = _head_loss_and_grads({})
    plain_loss, plain = _head_loss_and_grads({}, autocast=True)
    fused_loss, fused = _head_loss_and_grads(dict(loss_chunk_tokens=16, loss_fused=True),
                                             autocast=True)
    assert torch.allclose(fused_loss, plain_loss, rtol=1e-4)
    for name, g in exact.items():
        plain_err = (plain[name] - g).norm() / g.norm()
        fused_err = (fused[name] - g).norm() / g.norm()
        assert plain_err < 0.05 and fused_err <= 1.5 * plain_err + 1e-4, (name, fused_err,
                                                                          plain_err)


def test_fused_linear_cross_entropy_with_a_bias_and_without_gradients():
    from gpt2.model.fused_loss import linear_cross_entropy
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*shape, generator=g, requires_grad=True)
               for shape in ((10, 8), (50, 8), (50,)))
    t = torch.randint(0, 50, (10,), generator=g)
    ref = F.cross_entropy(F.linear(x, w, b), t)
    ref_grads = torch.autograd.grad(ref * 0.5, (x, w, b))
    loss = linear_cross_entropy(x, w, b, t, chunk=3)
    grads = torch.autograd.grad(loss * 0.5, (x, w, b))
    assert torch.allclose(loss, ref, rtol=1e-6)
    for got, want in zip(grads, ref_grads):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)
    with torch.no_grad():  # evaluation: the loss alone
        assert torch.allclose(linear_cross_entropy(x, w, b, t, chunk=3), ref, rtol=1e-6)


def test_the_fused_loss_needs_a_chunk_size():
    from gpt2.config.options import resolve
    from gpt2.errors import ConfigError
    with pytest.raises(ConfigError, match="CONFIG_LOSS_CHUNK_TOKENS"):
        resolve({"loss_fused": True})
    assert model_config(resolve({"loss_fused": True, "loss_chunk_tokens": 8192})).loss_fused


def test_unknown_checkpointing_mode_is_an_error():
    with pytest.raises(ValueError, match="checkpointing"):
        tiny(checkpointing="some")


@pytest.mark.parametrize("backend", ["flash", "math"])
def test_each_attention_backend_computes_the_same_model(backend):
    """CONFIG_ATTENTION_BACKEND picks kernels, not the model: the CPU's two (flash
    and plain math) give the loss and gradients of torch's own choice."""
    ref_loss, ref_grads = _loss_and_grads({})
    loss, grads = _loss_and_grads(dict(attention_backend=backend))
    assert torch.allclose(loss, ref_loss, rtol=1e-6, atol=0)
    for name, g in ref_grads.items():
        assert (grads[name] - g).abs().max() <= 1e-5 * g.abs().max(), name


def test_the_attention_backend_setting_reaches_the_kernel_choice():
    """Pinning a CUDA-only kernel family on the CPU leaves SDPA nothing to run: the
    setting really restricts the choice (training refuses it up front, see below)."""
    x = torch.randint(0, 50257, (1, 8))
    with pytest.raises(RuntimeError, match="No viable backend"):
        tiny(attention_backend="efficient")(x)
    from gpt2.errors import ConfigError
    from gpt2.runtime.device import setup_runtime

    with pytest.raises(ConfigError, match="CONFIG_ATTENTION_BACKEND.*need a CUDA GPU"):
        setup_runtime("cpu", "float32", True, 0, attention="cudnn")
    # The CPU's flash kernel has no dropout: a training forward finds no kernel (found
    # by make gpu-check's attention sweep on the L4 preset, dropout 0.1), so the run is
    # refused before it starts; evaluation (no dropout) would have passed.
    model = tiny(attention_backend="flash", dropout=0.1)
    with pytest.raises(RuntimeError, match="No available kernel"):
        model.train()(x)
    model.eval()(x)
    with pytest.raises(ConfigError, match="flash attention kernel takes no dropout"):
        setup_runtime("cpu", "float32", True, 0, attention="flash", dropout=0.1)
    setup_runtime("cpu", "float32", True, 0, attention="flash", dropout=0.0)


@pytest.mark.parametrize("bias,tie", [(True, True), (False, True), (True, False)])
def test_the_parameter_count_without_torch_is_the_models(bias, tie):
    """Budgets in tokens per parameter are planned from parameter_count; it must be
    what the model built has."""
    from gpt2.config.sizes import parameter_count

    for n_layer, n_embd, block in ((2, 32, 16), (3, 48, 64)):
        cfg = GPTConfig(n_layer=n_layer, n_head=2, n_embd=n_embd, vocab_size=96,
                        block_size=block, bias=bias, tie_weights=tie)
        assert parameter_count(n_layer, n_embd, 96, block, bias, tie) == GPT(cfg).num_params()
    # GPT-2 124M, as released (vocabulary 50257): 124,439,808 parameters
    assert parameter_count(12, 768, 50257, 1024) == 124_439_808
