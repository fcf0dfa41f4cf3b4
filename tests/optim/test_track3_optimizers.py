"""kgpt's AdamW and Muon, configured as modded-nanogpt's track 3 baselines, against
those baselines' own optimizer code on the same weights and gradients.

The references transcribe records/track_3_optimization of KellerJordan/modded-nanogpt
at f411b3d: train_gpt_simple.py (the tuned Muon baseline, result #36: Muon on the
blocks' matrices, torch's AdamW on the rest, the stable-then-linear-decay schedule) and
the log of result #2 (results/a63a68d1-...txt: torch's AdamW on the blocks' matrices
with a 250-step warmup, a second AdamW on the rest). torch.optim.AdamW is the
reference package itself. Two differences, both for a CPU: Newton-Schulz runs in
float32 (the reference: bfloat16 on its GPU), and the steps and warmup are short.
Each test runs twice: with kgpt's float32 token table, and with the reference's
bfloat16 one (CONFIG_MODEL_PRECISION=bf16-table), which its AdamW (fused=True, as
train_gpt_simple.py builds it) steps in float32 and rounds to bfloat16.
The track 3 model keeps Q, K and V as three matrices; kgpt fuses them into one, and
the reference here gets the three thirds of it.
"""

from __future__ import annotations

import pytest
import torch

from gpt2.config.options import Config
from gpt2.model.build import model_config
from gpt2.model.gpt import GPT
from gpt2.optim.algorithms.optimizers import build_optimizer
from gpt2.training.schedule import lr_at, schedule_of
from gpt2.training.step import apply_learning_rate

pytestmark = pytest.mark.slow  # reference transcriptions (see pytest.ini)

STEPS = 10
TRACK3_MODEL = dict(model_size="custom", n_layer=2, n_head=2, n_embd=32, block_size=8,
                    tie_weights=False, model_norm="rmsnorm", model_position="rope-half",
                    model_qk_norm=True, model_attention_scale=0.12, model_activation="relu2",
                    model_embedding_norm=True, model_head_bias=True, model_logit_cap=15.0,
                    model_init="track3")
SCHEDULE = dict(max_iters=STEPS, lr_schedule="wsd", wsd_cooldown=0.7, min_lr=0.0)


# ---- the references ---------------------------------------------------------------------

def track3_eta(step: int, train_steps: int, warmup_steps: int = 0, cooldown_frac=0.7):
    """set_hparams: stable, then linear decay over the last cooldown_frac; #2 adds a
    warmup of min(1, (step + 1) / warmup_steps)."""
    progress = step / train_steps
    eta = 1.0 if progress < 1 - cooldown_frac else (1 - progress) / cooldown_frac
    warmup = min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    return warmup * eta


def zeropower_track3(G):
    X = G.float()  # bfloat16 in the reference (on its GPU)
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    a, b, c = 2, -1.5, 0.5
    for _ in range(12):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def muon_update_track3(grad, momentum, mu=0.95):
    momentum.lerp_(grad, 1 - mu)
    update = grad.lerp_(momentum, mu)
    update = zeropower_track3(update)
    update *= max(1, grad.size(-2) / grad.size(-1)) ** 0.5
    return update


class MuonTrack3:
    """train_gpt_simple.py's Muon.step for one process."""

    def __init__(self, params, lr, weight_decay, mu=0.95):
        self.params, self.lr, self.weight_decay, self.mu = params, lr, weight_decay, mu
        self.initial_lr = lr
        self.momentum = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.momentum):
            update = muon_update_track3(p.grad, m, mu=self.mu)
            p.mul_(1 - self.lr * self.weight_decay)
            p.add_(update, alpha=-self.lr)


# ---- kgpt's model as the reference sees it -----------------------------------------------

def reference_params(model: GPT) -> dict[str, list[torch.Tensor]]:
    """Each kgpt parameter as the track 3 model's tensor(s): the fused Q, K, V weight
    as three leaf tensors, everything else as one copy (in its dtype: the token
    table's bfloat16 under bf16-table, as the reference stores it)."""
    out = {}
    for name, p in model.named_parameters():
        pieces = p.detach().chunk(3, dim=0) if name.endswith("c_attn.weight") else [p.detach()]
        out[name] = [t.clone().requires_grad_() for t in pieces]
    return out


def gradients(model: GPT, steps: int) -> list[dict[str, torch.Tensor]]:
    """Random gradients with a drift, each in its parameter's dtype (autograd gives a
    bfloat16 table a bfloat16 gradient)."""
    gen = torch.Generator().manual_seed(11)
    drift = {n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}
    return [{n: (0.5 * drift[n] + torch.randn(p.shape, generator=gen)).to(p.dtype)
             for n, p in model.named_parameters()} for _ in range(steps)]


def run_kgpt(cfg: Config, grads) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(model_config(cfg))
    opt = build_optimizer(model, cfg, "cpu", STEPS)
    table = model.transformer.wte.weight.data_ptr()
    for step, g in enumerate(grads):
        apply_learning_rate(opt, lr_at(step, **schedule_of(cfg), total=STEPS))
        for n, p in model.named_parameters():
            p.grad = g[n].clone()
        opt.step()
    assert model.transformer.wte.weight.dtype == (torch.bfloat16 if cfg.model_precision
                                                  == "bf16-table" else torch.float32)
    # (stepped in place: a compiled model's CUDA graphs hold the table's address)
    assert model.transformer.wte.weight.data_ptr() == table
    return {n: p.detach() for n, p in model.named_parameters()}


def blocks_and_vectors(ref: dict[str, list[torch.Tensor]], model: GPT):
    """The reference tensors of the blocks' matrices (what Muon, or #2's first AdamW,
    takes) and of the biases and gains."""
    named = dict(model.named_parameters())
    blocks = [t for n, ts in ref.items()
              if n.startswith("transformer.h.") and named[n].dim() == 2 for t in ts]
    vectors = [t for n, ts in ref.items() if named[n].dim() < 2 for t in ts]
    return blocks, vectors


def run_reference(cfg: Config, grads, build) -> dict[str, torch.Tensor]:
    """The reference optimizers ``build`` makes over the track 3 view of the same
    starting weights, stepped with set_hparams' rates; the weights back in kgpt's
    names."""
    torch.manual_seed(0)
    model = GPT(model_config(cfg))
    ref = reference_params(model)
    optimizers, eta = build(ref, model)
    for g_step in range(STEPS):
        factor = eta(g_step)
        for opt in optimizers:
            groups = opt.param_groups if hasattr(opt, "param_groups") else [opt]
            for group in groups:
                if isinstance(group, dict):
                    group["lr"] = group["initial_lr"] * factor
                else:
                    group.lr = group.initial_lr * factor
        for name, pieces in ref.items():
            grad = grads[g_step][name]
            for piece, gpiece in zip(pieces, grad.chunk(len(pieces), dim=0)):
                piece.grad = gpiece.clone()
        for opt in optimizers:
            opt.step()
    return {n: torch.cat([t.detach() for t in pieces]) for n, pieces in ref.items()}


def assert_same(ours, theirs):
    assert ours.keys() == theirs.keys()
    for name in ours:
        if ours[name].dtype == torch.bfloat16:
            assert_rounded_alike(ours[name], theirs[name], name)
        else:
            torch.testing.assert_close(ours[name], theirs[name], rtol=2e-5, atol=2e-6,
                                       msg=name)


def assert_rounded_alike(ours, theirs, name):
    """Two bfloat16 tensors stepped in float32 by different code (kgpt's Muon widens
    the table for its foreach AdamW; the reference's fused kernel widens each
    element): the float32 results differ in their last bits, so a few roundings go
    the other way, and with them that element's bfloat16 moments: 9 of the table's
    1.6M elements after ten steps. The likely bugs move a share of them: stepping in
    bfloat16 (56 %), or the decay rounded away before the step (44 %)."""
    assert theirs.dtype == torch.bfloat16, name
    moved = (ours != theirs).float().mean().item()
    assert moved < 1e-4, (name, moved)
    assert (ours.float() - theirs.float()).norm() < 1e-4 * theirs.float().norm(), name


# ---- the baselines --------------------------------------------------------------------------

PRECISIONS = pytest.mark.parametrize("precision", ["autocast", "bf16-table"])


@PRECISIONS
def test_muon_baseline_equals_track3s_optimizer_code(precision):
    """Result #36: Muon lr .025 wd .05 on the blocks' matrices (Newton-Schulz (2, -1.5,
    0.5) x 12), AdamW betas (.8, .95) eps 1e-10 wd .001 on embedding (.7), head (.004)
    and vectors (.015); stable for 30 %, then linear to 0."""
    cfg = Config(**TRACK3_MODEL, **SCHEDULE, optimizer="muon", warmup_iters=0,
                 learning_rate=0.015, adam_eps=1e-10, muon_lr=0.025, muon_weight_decay=0.05,
                 muon_coefficients="track3", muon_ns_steps=12, param_groups="track3",
                 aux_embedding_lr=0.7, aux_head_lr=0.004, aux_vector_lr=0.015,
                 aux_beta1=0.8, aux_beta2=0.95, aux_weight_decay=0.001,
                 model_precision=precision)
    grads = gradients(GPT(model_config(cfg)), STEPS)

    def build(ref, model):
        blocks, vectors = blocks_and_vectors(ref, model)
        aux = torch.optim.AdamW([dict(params=ref["transformer.wte.weight"], lr=0.7),
                                 dict(params=ref["lm_head.weight"], lr=0.004),
                                 dict(params=vectors, lr=0.015)],
                                betas=(0.8, 0.95), eps=1e-10, weight_decay=0.001,
                                fused=precision == "bf16-table")
        for group in aux.param_groups:
            group["initial_lr"] = group["lr"]
        return [aux, MuonTrack3(blocks, lr=0.025, weight_decay=0.05)], \
            lambda step: track3_eta(step, STEPS)

    assert_same(run_kgpt(cfg, grads), run_reference(cfg, grads, build))


@PRECISIONS
def test_adamw_baseline_equals_track3s_optimizer_code(precision):
    """Result #2: AdamW lr .0015 betas (.9, .95) eps 1e-10 wd .1 on the blocks'
    matrices; AdamW betas (.8, .95) eps 1e-10 wd 0 on embedding (.3), head (1/320)
    and vectors (.01); a warmup (here 3 steps) on every group, then as above."""
    cfg = Config(**TRACK3_MODEL, **SCHEDULE, optimizer="adamw", warmup_iters=3,
                 learning_rate=0.0015, weight_decay=0.1, beta1=0.9, beta2=0.95,
                 adam_eps=1e-10, param_groups="track3", aux_embedding_lr=0.3,
                 aux_head_lr=1 / 320, aux_vector_lr=0.01, aux_beta1=0.8, aux_beta2=0.95,
                 aux_weight_decay=0.0, model_precision=precision)
    grads = gradients(GPT(model_config(cfg)), STEPS)

    def build(ref, model):
        blocks, vectors = blocks_and_vectors(ref, model)
        fused = precision == "bf16-table"  # (the record's own AdamW is fused)
        aux = torch.optim.AdamW([dict(params=ref["transformer.wte.weight"], lr=0.3),
                                 dict(params=ref["lm_head.weight"], lr=1 / 320),
                                 dict(params=vectors, lr=0.01)],
                                betas=(0.8, 0.95), eps=1e-10, weight_decay=0, fused=fused)
        main = torch.optim.AdamW(blocks, lr=0.0015, betas=(0.9, 0.95), eps=1e-10,
                                 weight_decay=0.10, fused=fused)
        for opt in (aux, main):
            for group in opt.param_groups:
                group["initial_lr"] = group["lr"]
        return [aux, main], lambda step: track3_eta(step, STEPS, warmup_steps=3)

    assert_same(run_kgpt(cfg, grads), run_reference(cfg, grads, build))


@pytest.mark.parametrize("steps,warmup", [(3250, 0), (5625, 250), (4950, 0)])
def test_the_wsd_schedule_is_track3s_set_hparams(steps, warmup):
    """kgpt's WSD (cooldown 0.7, linear, floor 0) is track 3's schedule: exactly where
    0.7 x steps is a whole number, within 1.3e-4 of it where kgpt rounds the cooldown's
    start to a step (5625 x 0.7 = 3937.5)."""
    kw = dict(lr=1.0, min_lr=0.0, warmup=warmup, total=steps, schedule="wsd", cooldown=0.7,
              shape="linear")
    worst = max(abs(lr_at(s, **kw) - track3_eta(s, steps, warmup)) for s in range(steps))
    assert worst < (1e-12 if (steps * 7) % 10 == 0 else 1.3e-4)
