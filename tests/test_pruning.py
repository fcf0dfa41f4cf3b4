"""Pruning does what its name says: the published scores, the schedule, exact
sparsity, and masks that hold through every optimizer step."""

from __future__ import annotations

import pytest
import torch

from gpt2.config.options import Config
from gpt2.model.gpt import GPT, GPTConfig
from gpt2.training.optimizers import OPTIMIZERS, build_optimizer
from gpt2.training.pruning import (PRUNING_METHODS, build_pruner, lowest, prune_targets,
                                   sparsity_at, state_score, valid_pairs)

BLOCK_LINEARS = {f"transformer.h.{i}.{m}.weight" for i in range(2)
                 for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}


def tiny_model(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, **kw))


def pruning_cfg(optimizer="adamw", method="magnitude", **kw) -> Config:
    base = dict(optimizer=optimizer, pruning_method=method, target_sparsity=0.8,
                pruning_warmup=2, pruning_end=0.5, pruning_frequency=2, learning_rate=1e-2)
    return Config(**{**base, **kw})


def train_steps(model, optimizer, pruner, steps, start=0, on_step=None):
    x = torch.randint(0, 200, (4, 8), generator=torch.Generator().manual_seed(7))
    for step in range(start, start + steps):
        _, loss = model(x, x)
        loss.backward()
        pruner.before_step()
        optimizer.step()
        pruner.after_step(step + 1)
        optimizer.zero_grad(set_to_none=True)
        if on_step:
            on_step(step + 1)


def test_schedule_hand_values():
    for ramp, mid in (("cubic", 0.8 * (1 - 0.5 ** 3)), ("linear", 0.4)):
        values = [sparsity_at(s, 0.8, start=10, end=20, ramp=ramp) for s in (0, 10, 15, 20, 99)]
        assert values == pytest.approx([0.0, 0.0, mid, 0.8, 0.8]), ramp
    # cubic prunes faster early than linear, and both are monotone
    cubic = [sparsity_at(s, 0.9, 0, 100, "cubic") for s in range(101)]
    assert cubic == sorted(cubic) and cubic[25] > 0.9 * 0.25


def test_lowest_takes_exactly_k_even_with_ties():
    scores = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, -1.0])
    assert lowest(scores, 3).tolist() == [True, True, False, False, False, True]
    assert int(lowest(torch.zeros(1000), 333).sum()) == 333
    assert not lowest(scores, 0).any() and lowest(scores, 6).all()


def test_targets_default_to_block_linears_and_widen_only_on_request():
    model = tiny_model()
    assert {n for n, _ in prune_targets(model)} == BLOCK_LINEARS
    with_emb = {n for n, _ in prune_targets(model, embeddings=True)}
    assert with_emb == BLOCK_LINEARS | {"transformer.wte.weight", "transformer.wpe.weight"}
    untied = tiny_model(tie_weights=False)
    assert "lm_head.weight" in {n for n, _ in prune_targets(untied, embeddings=True)}
    assert "lm_head.weight" not in {n for n, _ in prune_targets(untied)}
    vectors = {n for n, p in prune_targets(model, norms_biases=True)} - BLOCK_LINEARS
    assert vectors and all(dict(model.named_parameters())[n].dim() == 1 for n in vectors)


def test_magnitude_prunes_the_smallest_weights_exactly_per_tensor():
    model = tiny_model()
    cfg = pruning_cfg(method="magnitude")
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, total_steps=8)
    before = {n: p.detach().abs().clone() for n, p in pruner.targets}
    pruner.update_masks(0.5)
    for name, p in pruner.targets:
        mask = pruner.pruned[name]
        assert int(mask.sum()) == round(0.5 * p.numel())
        assert before[name][mask].max() <= before[name][~mask].min()
        assert (p[mask] == 0).all()


def test_global_scope_reaches_the_total_exactly_but_not_per_tensor():
    model = tiny_model()
    with torch.no_grad():  # make one tensor much smaller: global ranking prunes it first
        dict(model.named_parameters())["transformer.h.0.mlp.c_fc.weight"].mul_(0.01)
    cfg = pruning_cfg(method="magnitude", pruning_scope="global")
    pruner = build_pruner(model, build_optimizer(model, cfg, "cpu"), cfg, total_steps=8)
    pruner.update_masks(0.3)
    total = sum(p.numel() for _, p in pruner.targets)
    assert sum(int(m.sum()) for m in pruner.pruned.values()) == round(0.3 * total)
    assert pruner.pruned["transformer.h.0.mlp.c_fc.weight"].all()


def test_movement_score_accumulates_minus_w_times_grad():
    model = tiny_model()
    cfg = pruning_cfg(method="movement")
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # weights fixed: hand-checkable
    pruner = build_pruner(model, opt, cfg, total_steps=8)
    name, p = pruner.targets[0]
    expected = torch.zeros_like(p)
    for seed in range(3):
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(seed))
        expected -= p.detach() * p.grad
        pruner.before_step()
    torch.testing.assert_close(pruner.movement[name], expected)


def test_movement_prunes_what_moves_toward_zero_not_what_is_small():
    """A large weight whose gradient pushes it toward zero goes; a small one growing
    away from zero stays, the opposite of what magnitude pruning would do."""
    model = tiny_model()
    cfg = pruning_cfg(method="movement")
    pruner = build_pruner(model, torch.optim.SGD(model.parameters(), lr=0.0), cfg, 8)
    name, p = pruner.targets[0]
    with torch.no_grad():
        p.fill_(0.5)
        p[0, 0], p[0, 1] = 2.0, 0.01
    grad = torch.full(p.shape, -0.1)  # -w*g = +0.05: everything else is growing
    grad[0, 0], grad[0, 1] = 1.0, -1.0  # big weight shrinking, small weight growing
    p.grad = grad
    pruner.before_step()
    pruner.update_masks(1 / p.numel())
    assert pruner.pruned[name][0, 0] and not pruner.pruned[name][0, 1]


def test_state_score_variants_hand_values():
    w = torch.tensor([2.0, -1.0, 0.5])
    m = torch.tensor([0.1, -0.4, 0.0])
    v = torch.tensor([0.04, 0.16, 1.0])
    torch.testing.assert_close(state_score("hybrid", w, m, v, 0.0),
                               torch.tensor([4 * 0.1 / 0.2, 1 * 0.4 / 0.4, 0.0]))
    torch.testing.assert_close(state_score("bitter7", w, m, v, 0.0),
                               torch.tensor([2 * 0.04 ** 0.25, 1 * 0.16 ** 0.25, 0.5]))
    eps = 1e-3
    torch.testing.assert_close(state_score("bitter7", w, m, v, eps),
                               w.abs() * (v ** 0.25 + eps))


@pytest.mark.parametrize("variant", ["hybrid", "bitter7"])
def test_state_pruning_ranks_by_adamw_moments(variant):
    model = tiny_model()
    cfg = pruning_cfg(optimizer="adamwprune", method="state", pruning_variant=variant)
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, total_steps=8)
    train_steps(model, opt, pruner, 1)
    expected = {}
    for name, p in pruner.targets:
        st = opt.state[p]
        score = state_score(variant, p.detach(), st["exp_avg"], st["exp_avg_sq"], cfg.adam_eps)
        expected[name] = lowest(score.flatten(), round(0.5 * p.numel())).view_as(p)
    pruner.update_masks(0.5)
    for name, p in pruner.targets:
        assert torch.equal(pruner.pruned[name], expected[name]), name
        assert (opt.state[p]["exp_avg"][expected[name]] == 0).all()
        assert (opt.state[p]["exp_avg_sq"][expected[name]] == 0).all()


@pytest.mark.parametrize("optimizer,method", [p for p in valid_pairs() if p[1] != "none"])
def test_pruned_weights_stay_zero_after_every_step(optimizer, method):
    """Muon spreads updates over whole matrices and SGD/Adam carry momentum: after
    every step each pruned weight is exactly 0, its optimizer state is 0 (from the
    first mask on), sparsity only grows, and the target is exact from the end on."""
    model = tiny_model()
    cfg = pruning_cfg(optimizer=optimizer, method=method)
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, total_steps=12)  # ramp ends at step 6
    seen: list[float] = []

    def check(step):
        for name, p in pruner.targets:
            mask = pruner.pruned[name]
            assert (p[mask] == 0).all(), (step, name)
            for value in opt.state[p].values():
                if torch.is_tensor(value) and value.shape == p.shape:
                    assert (value[mask] == 0).all(), (step, name)
        seen.append(sum(int(m.sum()) for m in pruner.pruned.values()))

    train_steps(model, opt, pruner, 12, on_step=check)
    # warmup 2 and frequency 2: the first masks come at step 4; the ramp ends at 6
    assert seen == sorted(seen) and seen[2] == 0 and seen[3] > 0
    assert len(set(seen[5:])) == 1
    total = sum(p.numel() for _, p in pruner.targets)
    assert abs(pruner.sparsity() - 0.8) < 0.005 and abs(seen[-1] / total - 0.8) < 0.005


def test_registry_lists_the_documented_methods():
    assert set(PRUNING_METHODS) == {"none", "magnitude", "movement", "state"}
    assert set(OPTIMIZERS) == {"sgd", "adam", "adamw", "adamwadv", "adamwspam", "adamwprune",
                               "muon"}
    assert ("adamwprune", "state") in valid_pairs()
    assert ("adamwprune", "magnitude") not in valid_pairs()
    assert ("adamw", "state") not in valid_pairs()
