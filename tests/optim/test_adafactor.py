"""Adafactor (gpt2/optim/adafactor.py) against its reference, torch.optim.Adafactor of
the pinned torch, built here by hand: the groups kgpt decays (2-D weights only), its
own rate driven by kgpt's schedule, and every setting passed through.

The steps reach every state the method has: the relative step capped by the rate and
then by 1/sqrt(t) (a rate of 0.8 passes it at step 2), an update clipped by its RMS
(the gradients spike at step 5), matrices (factored) and vectors (not)."""

from __future__ import annotations

import pytest

import torch

from gpt2.config.options import Config
from gpt2.model.gpt import GPT, GPTConfig
from gpt2.optim.algorithms.optimizers import build_optimizer
from gpt2.training.schedule import lr_at, schedule_of
from gpt2.training.step import apply_learning_rate

STEPS = 12


def tiny_model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8))


def gradients(model, steps: int) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    out = [[torch.randn(p.shape, generator=gen) for p in model.parameters()]
           for _ in range(steps)]
    out[4] = [10 * g for g in out[4]]  # a spike: its update's RMS passes d
    return out


def reference(d: float):
    """torch.optim.Adafactor over a fresh tiny model, with kgpt's decay groups."""
    model = tiny_model()
    params = list(model.parameters())
    opt = torch.optim.Adafactor(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.05},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=0.8, beta2_decay=-0.7, eps=(None, 2e-3), d=d)
    return model, opt


@pytest.mark.slow
def test_adafactor_equals_torch_adafactor_under_kgpts_schedule():
    cfg = Config(optimizer="adafactor", learning_rate=1e-3, min_lr=1e-4, warmup_iters=2,
                 max_iters=STEPS, adafactor_lr=0.8, adafactor_weight_decay=0.05,
                 adafactor_beta2_decay=-0.7, adafactor_eps2=2e-3, adafactor_d=1.5)
    schedule = schedule_of(cfg)
    ours = tiny_model()
    grads = gradients(ours, STEPS)
    opt = build_optimizer(ours, cfg, "cpu", STEPS)
    (ref_model, ref), (free_model, unclipped) = reference(1.5), reference(1e6)
    rates, differs = [], []
    for k, step in enumerate(grads):
        rate = lr_at(k, total=STEPS, **schedule)
        apply_learning_rate(opt, rate)
        rates.append(0.8 * rate / cfg.learning_rate)  # its own rate, scheduled
        for o in (ref, unclipped):
            for group in o.param_groups:
                group["lr"] = rates[-1]
        for model in (ours, ref_model, free_model):
            for p, g in zip(model.parameters(), step):
                p.grad = g.clone()
        for o in (opt, ref, unclipped):
            o.step()
        for (n, a), b in zip(ours.named_parameters(), ref_model.parameters()):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"{n} step {k + 1}")
        differs.append(any(not torch.equal(a, b) for a, b in
                           zip(ref_model.parameters(), free_model.parameters())))
    # the states reached: the relative step capped by the rate and by 1/sqrt(t), and
    # the update clipped first at the spike
    caps = [rate < (t + 1) ** -0.5 for t, rate in enumerate(rates)]
    assert any(caps) and not all(caps), rates
    assert differs.index(True) == 4, differs


def test_adafactor_has_its_own_rate_and_decay():
    """AdamW's 6e-4 would leave Adafactor still: a run at the defaults takes torch's
    1e-2, whatever CONFIG_LEARNING_RATE is, and decays by its own setting."""
    model = tiny_model()
    opt = build_optimizer(model, Config(optimizer="adafactor"), "cpu", 10)
    apply_learning_rate(opt, Config().learning_rate)  # the schedule at its peak
    assert {g["lr"] for g in opt.param_groups} == {1e-2}
    assert {g["weight_decay"] for g in opt.param_groups} == {0.0}
    opt = build_optimizer(model, Config(optimizer="adafactor", adafactor_weight_decay=0.1),
                          "cpu", 10)
    assert sorted(g["weight_decay"] for g in opt.param_groups) == [0.0, 0.1]
