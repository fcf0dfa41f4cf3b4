"""Every optimizer does what its name says: torch references where one exists, the
one decay rule for all, and SPAM's and Muon's mechanics on hand-checked cases."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from gpt2.config.options import Config
from gpt2.model.gpt import GPT, GPTConfig
from gpt2.training.optimizers import (OPTIMIZERS, AdamWSpam, build_optimizer, orthogonalize,
                                      param_groups, spam_lr_factor)

STEPS = 5


def tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8))


def cfg_for(optimizer: str, **kw) -> Config:
    return Config(**{"optimizer": optimizer, "learning_rate": 1e-2, "weight_decay": 0.1, **kw})


def fake_grads(model: torch.nn.Module, step: int) -> None:
    """Reproducible dense gradients (the same for every copy of the model)."""
    gen = torch.Generator().manual_seed(1000 + step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


def run_steps(model, optimizer, steps=STEPS):
    for step in range(steps):
        fake_grads(model, step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def assert_same_params(a: torch.nn.Module, b: torch.nn.Module, exact: bool = True):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        if exact:
            assert torch.equal(p, q), name
        else:
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize("name", tuple(OPTIMIZERS))
def test_weight_decay_is_decoupled_and_only_on_2d_weights(name):
    """Against the same optimizer without decay, each step differs by exactly
    -lr*wd*p on tensors with 2+ dims and not at all elsewhere. L2 decay (added to the
    gradient) would instead leak into momentum and adaptive scaling and fail this."""
    cfg = cfg_for(name)
    with_wd, without = tiny_model(), tiny_model()
    opt_wd = build_optimizer(with_wd, cfg, "cpu")
    opt_0 = build_optimizer(without, Config(**{**cfg.to_dict(), "weight_decay": 0.0}), "cpu")
    lr_of = {id(p): g["lr"] for g in opt_wd.param_groups for p in g["params"]}
    diff = {n: torch.zeros_like(p) for n, p in with_wd.named_parameters()}
    for step in range(3):
        before = {n: p.detach().clone() for n, p in with_wd.named_parameters()}
        for m in (with_wd, without):
            fake_grads(m, step)
        opt_wd.step()
        opt_0.step()
        for (n, p), q in zip(with_wd.named_parameters(), without.parameters()):
            if p.dim() >= 2:
                diff[n] = diff[n] - lr_of[id(p)] * cfg.weight_decay * before[n]
            torch.testing.assert_close(p - q, diff[n], rtol=1e-4, atol=1e-7,
                                       msg=f"{name}: {n} step {step}")


def test_decay_groups_cover_every_parameter_once():
    model = tiny_model()
    groups = param_groups(model, 0.1)
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())
    assert all(p.dim() >= 2 for p in groups[0]["params"])
    assert all(p.dim() < 2 for p in groups[1]["params"]) and groups[1]["weight_decay"] == 0


@pytest.mark.parametrize("name,factory", [
    ("adamw", lambda g, c: torch.optim.AdamW(g, lr=c.learning_rate, betas=(c.beta1, c.beta2),
                                             eps=c.adam_eps)),
    ("adamwprune", lambda g, c: torch.optim.AdamW(g, lr=c.learning_rate,
                                                  betas=(c.beta1, c.beta2), eps=c.adam_eps)),
    ("adamwadv", lambda g, c: torch.optim.AdamW(g, lr=c.learning_rate, betas=(c.beta1, c.beta2),
                                                eps=c.adam_eps, amsgrad=True)),
    # Decay is decoupled for every optimizer, so Adam's steps are AdamW's.
    ("adam", lambda g, c: torch.optim.AdamW(g, lr=c.learning_rate, betas=(c.beta1, c.beta2),
                                            eps=c.adam_eps)),
])
def test_adam_family_equals_torch_reference(name, factory):
    cfg = cfg_for(name, beta2=0.99, adam_eps=1e-6)
    ours_model, ref_model = tiny_model(), tiny_model()
    run_steps(ours_model, build_optimizer(ours_model, cfg, "cpu"))
    run_steps(ref_model, factory(param_groups(ref_model, cfg.weight_decay), cfg))
    assert_same_params(ours_model, ref_model)


def test_sgd_equals_torch_sgd_plus_decoupled_decay():
    cfg = cfg_for("sgd", sgd_momentum=0.8, sgd_nesterov=True)
    ours_model, ref_model = tiny_model(), tiny_model()
    run_steps(ours_model, build_optimizer(ours_model, cfg, "cpu"))
    groups = param_groups(ref_model, cfg.weight_decay)
    ref = torch.optim.SGD([{**g, "weight_decay": 0.0} for g in groups], lr=cfg.learning_rate,
                          momentum=0.8, nesterov=True)
    for step in range(STEPS):
        fake_grads(ref_model, step)
        with torch.no_grad():
            for p in groups[0]["params"]:
                p.mul_(1 - cfg.learning_rate * cfg.weight_decay)
        ref.step()
    assert_same_params(ours_model, ref_model)


def test_spam_without_clipping_or_reset_equals_torch_adamw():
    cfg = cfg_for("adamwspam", spam_threshold=0.0, spam_reset_interval=0, spam_warmup=0)
    ours_model, ref_model = tiny_model(), tiny_model()
    run_steps(ours_model, build_optimizer(ours_model, cfg, "cpu"))
    run_steps(ref_model, torch.optim.AdamW(param_groups(ref_model, cfg.weight_decay),
                                           lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2),
                                           eps=cfg.adam_eps))
    assert_same_params(ours_model, ref_model, exact=False)


def _spam(threshold=0.0, reset=0, warmup=0, lr=0.1, eps=1e-12):
    p = torch.nn.Parameter(torch.zeros(3))
    return p, AdamWSpam([p], lr=lr, betas=(0.9, 0.9), eps=eps, threshold=threshold,
                        reset_interval=reset, warmup=warmup)


def _step(p, opt, grad):
    p.grad = torch.tensor(grad, dtype=torch.float32)
    opt.step()


def test_spam_clips_spikes_against_the_previous_second_moment():
    p, opt = _spam(threshold=50.0)
    _step(p, opt, [1.0, 1.0, 0.0])  # v = 0.1 * g^2 = [0.1, 0.1, 0]; no clipping on step 1
    st = opt.state[p]
    torch.testing.assert_close(st["exp_avg"], torch.tensor([0.1, 0.1, 0.0]))
    # limit theta*v = 5: 100 and -100 are spikes, clipped to +-sqrt(5); 1 is not; the
    # third element has no history (v = 0) and is left alone.
    _step(p, opt, [1.0, 100.0, -100.0])
    clipped = math.sqrt(5.0)
    torch.testing.assert_close(st["exp_avg"], torch.tensor(
        [0.09 + 0.1, 0.09 + 0.1 * clipped, -10.0]))
    torch.testing.assert_close(st["exp_avg_sq"], torch.tensor(
        [0.09 + 0.1, 0.09 + 0.5, 0.1 * 1e4]))


def test_spam_resets_both_moments_every_interval():
    p, opt = _spam(reset=2)
    for _ in range(2):
        _step(p, opt, [1.0, 1.0, 1.0])
    st = opt.state[p]
    torch.testing.assert_close(st["exp_avg"], torch.full((3,), 0.19))  # 0.9*0.1 + 0.1
    _step(p, opt, [2.0, 2.0, 2.0])  # step 3 follows a reset: moments start over
    torch.testing.assert_close(st["exp_avg"], torch.full((3,), 0.2))
    torch.testing.assert_close(st["exp_avg_sq"], torch.full((3,), 0.4))
    assert st["step"] == 1


def test_spam_rewarmup_factor_follows_half_cosine_after_each_reset():
    factors = [spam_lr_factor(t, reset_interval=4, warmup=3) for t in range(1, 11)]
    ramp = [0.5 * (1 - math.cos(math.pi * k / 3)) for k in (1, 2)]  # 0.25, 0.75
    assert factors == pytest.approx([1, 1, 1, 1, *ramp, 1, 1, *ramp])
    assert spam_lr_factor(7, reset_interval=4, warmup=0) == 1.0


def test_spam_rewarmup_scales_the_step_after_a_reset():
    """With a constant gradient Adam's step is lr*sign(g); after the reset at step 3
    it is halved (factor 0.5 for k=1 of a 2-step warmup), then whole again."""
    p, opt = _spam(reset=2, warmup=2, lr=0.1)
    moves = []
    for _ in range(4):
        before = p.detach().clone()
        _step(p, opt, [1.0, -1.0, 1.0])
        moves.append((p.detach() - before).tolist())
    expected = [[-0.1, 0.1, -0.1], [-0.1, 0.1, -0.1], [-0.05, 0.05, -0.05], [-0.1, 0.1, -0.1]]
    assert moves == [pytest.approx(m, abs=1e-6) for m in expected]


@pytest.mark.parametrize("shape", [(32, 32), (96, 32), (32, 128)])
def test_muon_orthogonalization_approximates_u_vt(shape):
    """Newton-Schulz output is close to U V^T of the SVD: singular values pushed near
    1 (the quintic's known band, about 0.7-1.2) and the same singular vectors."""
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    o = orthogonalize(g, steps=5)
    s = torch.linalg.svdvals(o)
    assert 0.6 < s.min() and s.max() < 1.25, s
    u, _, vt = torch.linalg.svd(g, full_matrices=False)
    exact = u @ vt
    cos = (o * exact).sum() / (o.norm() * exact.norm())
    assert cos > 0.95, cos


def test_muon_splits_block_matrices_from_the_rest():
    cfg = cfg_for("muon", muon_lr=0.05)
    model = tiny_model()
    opt = build_optimizer(model, cfg, "cpu")
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in opt.param_groups if g["muon"] for p in g["params"]]
    assert muon and all(".h." in n and n.endswith("weight") for n in muon)
    assert "transformer.wte.weight" not in muon and "transformer.wpe.weight" not in muon
    assert [g["lr_scale"] for g in opt.param_groups if g["muon"]] == [0.05 / 1e-2]


def test_muon_adamw_part_equals_torch_adamw_and_matrix_step_is_orthogonal():
    cfg = cfg_for("muon", muon_momentum=0.0, muon_nesterov=False, weight_decay=0.0)
    ours_model, ref_model = tiny_model(), tiny_model()
    opt = build_optimizer(ours_model, cfg, "cpu")
    before = copy.deepcopy(ours_model)
    muon_ids = {id(p) for g in opt.param_groups if g["muon"] for p in g["params"]}
    run_steps(ours_model, opt, 1)
    ref = torch.optim.AdamW([p for p in ref_model.parameters()], lr=cfg.learning_rate,
                            betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, weight_decay=0.0)
    run_steps(ref_model, ref, 1)
    fake_grads(before, 0)
    for (n, p), q, b in zip(ours_model.named_parameters(), ref_model.parameters(),
                            before.parameters()):
        if id(p) in muon_ids:  # momentum 0: the step is -lr * scale * NS(g)
            scale = max(1.0, p.size(0) / p.size(1)) ** 0.5
            expected = b - cfg.muon_lr * scale * orthogonalize(b.grad, 5)
            torch.testing.assert_close(p, expected, msg=n)
        else:
            assert torch.equal(p, q), n
