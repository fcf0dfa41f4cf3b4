"""Pruning does what its name says: the published scores, the schedule, exact
sparsity, and masks that hold through every optimizer step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpt2.config.options import Config
from gpt2.model.gpt import GPT, GPTConfig
from gpt2.config.choices import valid_pairs
from gpt2.optim.algorithms.optimizers import build_optimizer
from gpt2.sparsity.algorithms.pruning import (adamwprune_sparsity, build_pruner, lowest, prune_targets,
                                   sparsity_at, state_score)

# State pruning under kgpt's rules of the other methods (cubic ramp, per tensor, exactly
# round(s * n), the blocks only) instead of AdamWPrune's, its defaults.
KGPT_STATE_RULES = dict(state_schedule="cubic", state_scope="layer", state_threshold="exact",
                        state_prune_head=False)

BLOCK_LINEARS = {f"transformer.h.{i}.{m}.weight" for i in range(2)
                 for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}



def kgpt_step(model, pruner, opt, x, step):
    """One training step as kgpt's loop drives a pruner around the optimizer."""
    model(x, x)[1].backward()
    pruner.before_step()
    opt.step()
    pruner.after_step(step)
    opt.zero_grad(set_to_none=True)

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
    torch.testing.assert_close(pruner.accumulated[name], expected)


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
    """AdamWPrune's code: bitter0 ("hybrid") |w*m| * |w| / (sqrt(v) + 1e-8) and
    bitter7 |w| * (|v| + 1e-8)^(1/4), the constant 1e-8 whatever Adam's eps."""
    w = torch.tensor([2.0, -1.0, 0.5, 3.0])
    m = torch.tensor([0.1, -0.4, 0.0, 0.2])
    v = torch.tensor([0.04, 0.16, 1.0, 0.0])
    torch.testing.assert_close(state_score("hybrid", w, m, v), torch.tensor(
        [0.2 * 2 / (0.2 + 1e-8), 0.4 * 1 / (0.4 + 1e-8), 0.0, 0.6 * 3 / 1e-8]))
    torch.testing.assert_close(state_score("bitter7", w, m, v), torch.tensor(
        [2 * (0.04 + 1e-8) ** 0.25, (0.16 + 1e-8) ** 0.25, 0.5 * (1 + 1e-8) ** 0.25,
         3 * 1e-8 ** 0.25]))
    # The README's form |w| * (v^(1/4) + eps) differs where v is small: 3 * 1e-8 there.
    assert state_score("bitter7", w, m, v)[3] == pytest.approx(3e-2, rel=1e-4)


def _reference_state_mask(variant, w, m, v, k):
    """AdamWPrune's scores written out, and the k lowest of them pruned."""
    w, m, v = w.double(), m.double(), v.double()
    if variant == "hybrid":
        score = (w * m).abs() * w.abs() / (v.sqrt() + 1e-8)
    else:
        score = w.abs() * (v.abs() + 1e-8) ** 0.25
    flat = score.flatten()
    mask = torch.zeros(flat.numel(), dtype=torch.bool)
    mask[flat.argsort(stable=True)[:k]] = True
    return mask.view_as(w)


@pytest.mark.parametrize("variant", ["hybrid", "bitter7"])
def test_state_pruning_ranks_by_adamw_moments(variant):
    model = tiny_model()
    cfg = pruning_cfg(optimizer="adamwprune", method="state", pruning_variant=variant,
                      adam_eps=1e-3,  # the scores' constant is AdamWPrune's, not eps
                      **KGPT_STATE_RULES)  # exact per-tensor ranking: the scores alone
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, total_steps=8)
    train_steps(model, opt, pruner, 1)
    expected = {}
    for name, p in pruner.targets:
        st = opt.state[p]
        expected[name] = _reference_state_mask(variant, p.detach(), st["exp_avg"],
                                               st["exp_avg_sq"], round(0.5 * p.numel()))
    pruner.update_masks(0.5)
    for name, p in pruner.targets:
        assert torch.equal(pruner.pruned[name], expected[name]), name
        assert (opt.state[p]["exp_avg"][expected[name]] == 0).all()
        assert (opt.state[p]["exp_avg_sq"][expected[name]] == 0).all()


@pytest.mark.slow
def test_movement_equals_masked_training_with_a_straight_through_estimator():
    """The reference: the forward pass uses W * M with M = TopK(S) (per tensor), S
    accumulates -dL/dW' * W for every weight, pruned or not, and only live weights
    are updated. Simulated here with dense weights that are never zeroed; the product
    zeroes pruned weights in place and must stay equal to W * M, regrowth included."""
    cfg = pruning_cfg(method="movement", optimizer="sgd", sgd_momentum=0.0,
                      sgd_nesterov=False, weight_decay=0.0, learning_rate=0.5,
                      target_sparsity=0.6, pruning_warmup=1, pruning_end=0.9,
                      pruning_frequency=1, pruning_ramp="linear")
    steps = 24
    model, ref = tiny_model(), tiny_model()
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, total_steps=steps)
    names = [name for name, _ in pruner.targets]
    ref_params = dict(ref.named_parameters())
    dense = {n: ref_params[n].detach().clone() for n in names}
    score = {n: torch.zeros_like(dense[n]) for n in names}
    keep = {n: torch.ones_like(dense[n], dtype=torch.bool) for n in names}
    gen = torch.Generator().manual_seed(3)
    regrown = 0
    for step in range(1, steps + 1):
        x = torch.randint(0, 200, (4, 8), generator=gen)
        kgpt_step(model, pruner, opt, x, step)
        # reference
        with torch.no_grad():
            for n in names:
                ref_params[n].copy_(dense[n] * keep[n])
        ref(x, x)[1].backward()
        with torch.no_grad():
            for n, p in ref.named_parameters():
                if n in names:
                    score[n] -= p.grad * dense[n]  # straight-through: dL/dS = dL/dW' * W
                    dense[n] -= 0.5 * p.grad * keep[n]  # only live weights learn
                else:
                    p -= 0.5 * p.grad
        ref.zero_grad(set_to_none=True)
        s = sparsity_at(step, 0.6, 1, round(0.9 * steps), "linear")
        if step > 1:
            for n in names:
                k = round(s * score[n].numel())
                order = score[n].flatten().argsort(stable=True)
                new = torch.ones(score[n].numel(), dtype=torch.bool)
                new[order[:k]] = False
                new = new.view_as(keep[n])
                regrown += int((new & ~keep[n]).sum())
                keep[n] = new
        params = dict(model.named_parameters())
        for n in names:
            assert torch.equal(~pruner.pruned[n], keep[n]), (step, n)
            torch.testing.assert_close(params[n].detach(), dense[n] * keep[n], rtol=1e-4,
                                       atol=1e-6, msg=f"step {step} {n}")
    assert regrown > 0  # the run exercised weights coming back


class _TopKStraightThrough(torch.autograd.Function):
    """The reference's TopKBinarizer (emmental/modules/binarizer.py): the forward pass
    gives the mask of the kept scores, the backward pass hands the gradient to the
    scores unchanged (straight-through). The mask itself is passed in, computed on
    kgpt's schedule."""

    @staticmethod
    def forward(ctx, scores, keep):
        return keep.to(scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _movement_under_adamw(freeze: bool) -> dict:
    """kgpt's movement pruning beside an independent transcription of the reference
    (emmental's MaskedLinear: dense W, forward x @ (W * TopK(S)).T, S learnt from its
    straight-through gradient dL/dW' * W), both trained by torch AdamW with momentum
    and weight decay on the same batches. Returns what differed: the steps whose masks
    disagreed, the largest weight difference, and the weights the reference regrew."""
    steps, warmup, end, frequency, target = 30, 2, 18, 2, 0.6
    cfg = pruning_cfg(method="movement", optimizer="adamw", learning_rate=1e-2,
                      weight_decay=0.1, beta1=0.9, beta2=0.95, adam_eps=1e-8,
                      target_sparsity=target, pruning_warmup=warmup, pruning_end=end / steps,
                      pruning_frequency=frequency, pruning_ramp="cubic",
                      movement_freeze_pruned=freeze)
    model, ref = tiny_model(vocab_size=200), tiny_model(vocab_size=200)
    opt = build_optimizer(model, cfg, "cpu")
    assert type(opt) is torch.optim.AdamW
    pruner = build_pruner(model, opt, cfg, total_steps=steps)
    names = [name for name, _ in pruner.targets]
    # reference: every block Linear keeps a dense W and scores S; a mask per layer
    dense = {n: p.detach().clone().requires_grad_() for n, p in ref.named_parameters()
             if n in names}
    score = {n: torch.zeros_like(w, requires_grad=True) for n, w in dense.items()}
    keep = {n: torch.ones_like(w, dtype=torch.bool) for n, w in dense.items()}
    trained = [dense.get(n, p) for n, p in ref.named_parameters()]
    ref_opt = torch.optim.AdamW([{"params": [t for t in trained if t.dim() >= 2],
                                  "weight_decay": 0.1},
                                 {"params": [t for t in trained if t.dim() < 2],
                                  "weight_decay": 0.0}],
                                lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(5)
    disagreed, worst, regrown = [], 0.0, 0
    for step in range(1, steps + 1):
        x = torch.randint(0, 200, (4, 8), generator=gen)
        kgpt_step(model, pruner, opt, x, step)
        # reference
        masked = {n: dense[n] * _TopKStraightThrough.apply(score[n], keep[n]) for n in names}
        torch.func.functional_call(ref, masked, (x, x))[1].backward()
        ref_opt.step()  # W's gradient is dL/dW' * mask: 0 where pruned
        with torch.no_grad():
            for n in names:  # S learns from dL/dS = dL/dW' * W (Eq. 7, at rate 1)
                score[n] -= score[n].grad
                score[n].grad = None
        ref_opt.zero_grad(set_to_none=True)
        if step > warmup and ((step - warmup) % frequency == 0 or step == end):
            s = sparsity_at(step, target, warmup, end, "cubic")
            for n in names:  # TopK: the round(s * n) lowest scores go, ties by position
                order = score[n].detach().flatten().argsort(stable=True)
                new = torch.ones(order.numel(), dtype=torch.bool)
                new[order[:round(s * order.numel())]] = False
                new = new.view_as(keep[n])
                regrown += int((new & ~keep[n]).sum())
                keep[n] = new
        params = {n: p.detach() for n, p in model.named_parameters()}
        masks_agree = all(torch.equal(~pruner.pruned[n], keep[n]) for n in names)
        if not masks_agree:
            disagreed.append(step)
            continue
        for n, p in ref.named_parameters():
            if n in names:
                assert (params[n][~keep[n]] == 0).all(), (step, n)  # what the model sees
                true = torch.where(keep[n], params[n], pruner.kept[n])  # what it will use
                worst = max(worst, float((true - dense[n].detach()).abs().max()))
                worst = max(worst, float((pruner.accumulated[n] - score[n].detach()).abs().max()))
            else:
                worst = max(worst, float((params[n] - p.detach()).abs().max()))
    return {"disagreed": disagreed, "worst": worst, "regrown": regrown}


@pytest.mark.slow
def test_movement_under_adamw_equals_the_reference_where_pruned_weights_drift():
    """Under AdamW the reference's masked weights keep their Adam state and go on
    moving (momentum, decoupled decay) with no gradient, and come back with the value
    they drifted to. kgpt's default does the same: over 30 steps, 14 mask updates and
    regrowth, the masks agree at every step and weights, kept values and scores to
    float precision. The frozen rule (movement_freeze_pruned, kgpt's old one) does not:
    its masks part from the reference's within a few updates."""
    reference = _movement_under_adamw(freeze=False)
    assert reference["regrown"] > 0  # weights came back
    assert reference["disagreed"] == [] and reference["worst"] < 1e-6, reference
    frozen = _movement_under_adamw(freeze=True)
    # the first masks (step 4) agree: nothing was pruned before them to drift
    assert frozen["disagreed"] and frozen["disagreed"][0] > 4, frozen


@pytest.mark.slow
def test_movement_freeze_pruned_keeps_the_old_rule():
    """movement_freeze_pruned=True: a pruned weight keeps the value it had when pruned,
    its optimizer state is zeroed then and stays 0, and it is 0 after every step;
    without it the kept values move and the state is kept."""
    for freeze in (True, False):
        model = tiny_model(vocab_size=200)
        cfg = pruning_cfg(method="movement", weight_decay=0.1, movement_freeze_pruned=freeze)
        opt = build_optimizer(model, cfg, "cpu")
        pruner = build_pruner(model, opt, cfg, total_steps=12)  # masks at steps 4, 6, ...
        assert pruner.clears_state == freeze
        train_steps(model, opt, pruner, 4)
        name, p = pruner.targets[0]
        mask = pruner.pruned[name].clone()
        kept = pruner.kept[name].clone()
        state = {k: v.clone() for k, v in opt.state[p].items() if v.shape == p.shape}
        assert mask.any() and set(state) == {"exp_avg", "exp_avg_sq"}
        assert (p[mask] == 0).all()
        cleared = [(v[mask] == 0).all() for v in state.values()]
        assert all(cleared) if freeze else not any(cleared)
        train_steps(model, opt, pruner, 1, start=4)  # step 5: no mask update
        assert torch.equal(pruner.pruned[name], mask) and (p[mask] == 0).all()
        if freeze:
            assert torch.equal(pruner.kept[name], kept)
            assert all((opt.state[p][k][mask] == 0).all() for k in state)
        else:  # no gradient, but momentum and decay move them
            assert (pruner.kept[name][mask] != kept[mask]).all()


def _movement_run(steps: int = 6):
    model = tiny_model(vocab_size=200)
    cfg = pruning_cfg(method="movement", weight_decay=0.1)
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, total_steps=12)
    train_steps(model, opt, pruner, steps)
    return model, opt, pruner


@pytest.mark.slow
def test_a_skipped_step_leaves_pruned_movement_weights_as_they_were():
    """The fp16 grad scaler skips optimizer.step() after an overflow: between
    before_step (which puts the kept values back into the parameters) and after_step
    nothing moves, and after_step zeroes the pruned weights again with the same kept
    values."""
    model, opt, pruner = _movement_run()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    kept = {n: k.clone() for n, k in pruner.kept.items()}
    assert any(m.any() for m in pruner.pruned.values())
    model(*[torch.zeros(1, 8, dtype=torch.long)] * 2)[1].backward()
    pruner.before_step()
    assert any((p[pruner.pruned[n]] != 0).any() for n, p in pruner.targets)  # dense now
    pruner.after_step(7)  # no optimizer.step(); step 7 updates no mask
    opt.zero_grad(set_to_none=True)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), weights[n]), n
    for n, k in pruner.kept.items():
        assert torch.equal(k[pruner.pruned[n]], kept[n][pruner.pruned[n]]), n


@pytest.mark.slow
def test_movement_resumes_bit_for_bit_with_drifting_pruned_weights():
    """Kept values, scores, masks and the optimizer state of pruned weights are all a
    resumed run needs: 6 steps, a round trip through torch.save, 6 more equal 12
    straight steps exactly."""
    import io

    straight = _movement_run(12)
    model, opt, pruner = _movement_run(6)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "pruning": pruner.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    model = tiny_model(seed=1, vocab_size=200)
    model.load_state_dict(saved["model"])
    cfg = pruning_cfg(method="movement", weight_decay=0.1)
    opt = build_optimizer(model, cfg, "cpu")
    opt.load_state_dict(saved["optimizer"])
    pruner = build_pruner(model, opt, cfg, total_steps=12)
    pruner.load_state_dict(saved["pruning"])
    train_steps(model, opt, pruner, 6, start=6)
    for (n, p), q in zip(model.named_parameters(), straight[0].parameters()):
        assert torch.equal(p, q), n
    for n, k in pruner.kept.items():
        assert torch.equal(k, straight[2].kept[n]) and torch.equal(
            pruner.pruned[n], straight[2].pruned[n]), n


def test_a_pruned_movement_weight_comes_back_with_its_value():
    model = tiny_model()
    cfg = pruning_cfg(method="movement")
    pruner = build_pruner(model, torch.optim.SGD(model.parameters(), lr=0.0), cfg, 8)
    name, p = pruner.targets[0]
    original = p.detach().clone()
    p.grad = -p.detach().sign()  # -w*g = |w|: every score is |w|
    pruner.before_step()
    pruner.update_masks(0.5)
    gone = pruner.pruned[name].nonzero()[0].tolist()
    assert p[tuple(gone)] == 0
    p.grad = torch.zeros_like(p)
    p.grad[tuple(gone)] = -1000.0 * original[tuple(gone)].sign()  # its score soars
    pruner.before_step()  # (the gradient of a pruned weight is taken before it is zeroed)
    pruner.update_masks(0.5)
    assert not pruner.pruned[name][tuple(gone)]
    assert p[tuple(gone)] == original[tuple(gone)]
    assert int(pruner.pruned[name].sum()) == round(0.5 * p.numel())


# (SET and RigL keep the target from their first mask on and move it: their own test,
# tests/sparsity/test_dynamic_sparsity.py; every optimizer trains with them in test_pairs.py.)
@pytest.mark.slow
@pytest.mark.parametrize("optimizer,method", [p for p in valid_pairs()
                                              if p[1] not in ("none", "set", "rigl")])
def test_pruned_weights_stay_zero_after_every_step(optimizer, method):
    """Muon spreads updates over whole matrices and SGD/Adam carry momentum: after
    every step each pruned weight is exactly 0, its optimizer state is 0 (from the
    first mask on; not with movement, whose reference keeps it), the count of pruned weights only grows, and the target is exact
    from the end on. Except with movement (whose reference regrows), a weight once
    pruned is in every later mask: the very same weights, not only as many (a pruned
    weight that an update made nonzero again must not win its place back)."""
    model = tiny_model()
    # (state pruning's own schedule and sampled threshold: test_state_pruning_follows_*)
    cfg = pruning_cfg(optimizer=optimizer, method=method,
                      **(KGPT_STATE_RULES if method == "state" else {}))
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, total_steps=12)  # ramp ends at step 6
    seen: list[float] = []
    before = {name: m.clone() for name, m in pruner.pruned.items()}

    def check(step):
        for name, p in pruner.targets:
            mask = pruner.pruned[name]
            assert (p[mask] == 0).all(), (step, name)
            # (SOAP's moments are in a rotated basis, where a weight's position names
            # no element: they are left whole, so some there are not 0)
            rotated = not getattr(opt, "state_in_weight_coordinates", True)
            for value in opt.state[p].values():
                if pruner.clears_state and torch.is_tensor(value) and value.shape == p.shape:
                    assert (value[mask] == 0).all() != (rotated and mask.any()), (step, name)
            if not pruner.regrows:
                assert not (before[name] & ~mask).any(), (step, name)
            before[name] = mask.clone()
        seen.append(sum(int(m.sum()) for m in pruner.pruned.values()))

    train_steps(model, opt, pruner, 12, on_step=check)
    # warmup 2 and frequency 2: the first masks come at step 4; the ramp ends at 6
    assert seen == sorted(seen) and seen[2] == 0 and seen[3] > 0
    assert len(set(seen[5:])) == 1
    total = sum(p.numel() for _, p in pruner.targets)
    assert abs(pruner.sparsity() - 0.8) < 0.005 and abs(seen[-1] / total - 0.8) < 0.005


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_a_pruned_weight_an_update_moved_stays_pruned(scope):
    """Masks are ranked after the optimizer step, before the step's zeroing, so a
    pruned weight may hold a value then (Muon's update covers whole matrices). For
    the methods that do not regrow it must not compete: the next mask holds every
    weight the previous one held, compared weight by weight. (Magnitude is the one
    whose score reads the weight; state pruning's moments of a pruned weight stay 0.)"""
    model = tiny_model()
    cfg = pruning_cfg(method="magnitude", pruning_scope=scope)
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, total_steps=8)
    train_steps(model, opt, pruner, 1)  # the optimizer state exists
    pruner.update_masks(0.5)
    first = {name: m.clone() for name, m in pruner.pruned.items()}
    with torch.no_grad():
        for name, p in pruner.targets:
            p[first[name]] = 10.0  # far above every live weight
    pruner.update_masks(0.6)
    for name, p in pruner.targets:
        assert not (first[name] & ~pruner.pruned[name]).any(), name
    assert sum(int(m.sum()) for m in pruner.pruned.values()) == round(
        0.6 * sum(p.numel() for _, p in pruner.targets))


def test_state_pruning_pairs_only_with_adamwprune():
    # (which methods there are: tests/methods.json, held by tests/config/test_registry.py)
    assert ("adamwprune", "state") in valid_pairs()
    assert ("adamwprune", "magnitude") not in valid_pairs()
    assert ("adamw", "state") not in valid_pairs()


def test_a_pair_that_cannot_work_is_refused_naming_what_would():
    """The refusal a user reads for a bad optimizer/pruning pair, written out: it must
    say which partner the method or the optimizer needs."""
    from gpt2.config.choices import pair_problem

    assert pair_problem("adamwprune", "magnitude") == (
        "optimizer 'adamwprune' works only with pruning method 'none' or 'state'")
    assert pair_problem("adamw", "state") == (
        "pruning method 'state' works only with optimizer 'adamwprune'")
    assert pair_problem("adamwprune", "state") is None
    assert pair_problem("adamw", "magnitude") is None


def test_lowest_at_its_edges_is_a_boolean_mask_of_exactly_k():
    scores = torch.tensor([3.0, 1.0, 2.0, 1.0])
    for k, expected in ((0, [False] * 4), (-1, [False] * 4), (4, [True] * 4), (9, [True] * 4),
                        (1, [False, True, False, False]), (2, [False, True, False, True])):
        mask = lowest(scores, k)
        assert mask.dtype == torch.bool and mask.tolist() == expected, k
    # the threshold's ties beyond k are left alone: exactly k, never more
    assert lowest(torch.zeros(5), 3).tolist() == [True, True, True, False, False]


def test_a_non_finite_update_does_not_poison_movement_scores():
    """An fp16 step that overflowed (which the grad scaler skips) leaves the running
    movement scores as they were for the elements it touched."""
    model = tiny_model()
    opt = build_optimizer(model, pruning_cfg(method="movement"), "cpu")
    pruner = build_pruner(model, opt, pruning_cfg(method="movement"), 100)
    name, p = pruner.targets[0]
    p.grad = torch.ones_like(p)
    pruner.before_step()
    before = pruner.accumulated[name].clone()
    assert before.abs().sum() > 0 and before.dtype == torch.float32
    p.grad = torch.ones_like(p)
    p.grad.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    pruner.before_step()
    after = pruner.accumulated[name]
    assert torch.equal(after.view(-1)[:3], before.view(-1)[:3])
    assert torch.equal(after.view(-1)[3:], 2 * before.view(-1)[3:])


@pytest.mark.slow
def test_pruning_state_round_trips_and_targets_follow_the_settings():
    cfg = pruning_cfg(method="movement")
    model = tiny_model()
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, 20)
    train_steps(model, opt, pruner, 8)
    assert 0 < pruner.sparsity()
    again = build_pruner(tiny_model(seed=1), opt, cfg, 20)
    again.load_state_dict(pruner.state_dict())
    for name, _ in pruner.targets:
        assert torch.equal(again.pruned[name], pruner.pruned[name])
        assert torch.equal(again.accumulated[name], pruner.accumulated[name])
        assert torch.equal(again.kept[name], pruner.kept[name])
    names = {n for n, _ in build_pruner(model, opt, pruning_cfg(prune_embeddings=True), 20).targets}
    assert "transformer.wte.weight" in names
    assert "transformer.wte.weight" not in {n for n, _ in pruner.targets}
    norms = {n for n, _ in build_pruner(model, opt, pruning_cfg(prune_norms_biases=True), 20).targets}
    assert any(".ln_" in n for n in norms) and not any(".ln_" in n for n, _ in pruner.targets)


def test_state_pruning_ranks_by_magnitude_until_the_optimizer_has_moments():
    cfg = pruning_cfg(optimizer="adamwprune", method="state")
    model = tiny_model()
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, 20)
    scores = pruner.scores()
    assert [n for n, _ in pruner.targets] == list(scores)
    for name, p in pruner.targets:
        assert torch.equal(scores[name], p.detach().abs())
    with pytest.raises(ValueError) as err:
        state_score("bitter9", torch.ones(1), torch.ones(1), torch.ones(1))
    assert str(err.value) == "unknown state pruning variant 'bitter9'"


# ---- state pruning against AdamWPrune's own code -------------------------------------

def test_adamwprune_schedule_hand_values():
    """AdamWPrune's ramp, target * x^3, read at its iteration number (the steps taken
    before this one): 0.0875 of a 0.7 target halfway, where kgpt's cubic has 0.6125."""
    def at(step):
        return adamwprune_sparsity(step, 0.7, start=10, end=20, frequency=5)

    assert [at(s) for s in (1, 10, 11, 12, 15, 17, 20, 22)] == [None] * 8
    assert at(16) == pytest.approx(0.7 * 0.5 ** 3) == pytest.approx(0.0875)
    assert at(21) == pytest.approx(0.7) and at(31) == pytest.approx(0.7)  # after the ramp too
    assert sparsity_at(15, 0.7, 10, 20, "cubic") == pytest.approx(0.6125)
    assert adamwprune_sparsity(13, 0.7, 10, 20, 2) == pytest.approx(0.7 * 0.2 ** 3)


class AdamWPruneReference:
    """AdamWPrune's state pruning, written out from its lib/optimizers.py
    (update_adamprune_masks on its global-threshold path, _kth_threshold_sampling,
    apply_adamprune_masking) as its gpt2/trainers/vanilla.py drives them: masks for
    every nn.Linear (the tied output head too) in module order, gradients masked
    before the step, masks updated after it with the iteration number (0 at the first
    step). It draws its sample from ``generator`` where the reference uses torch's
    global generator."""

    def __init__(self, model, optimizer, variant, target, warmup, ramp_end, frequency,
                 generator):
        self.optimizer, self.variant, self.generator = optimizer, variant, generator
        self.target, self.warmup, self.ramp_end = target, warmup, ramp_end
        self.frequency = frequency
        self.masks = {name: (module, torch.ones_like(module.weight.data, dtype=torch.bool))
                      for name, module in model.named_modules()
                      if isinstance(module, nn.Linear)}

    def mask_gradients(self):
        for module, mask in self.masks.values():
            if module.weight.grad is not None:
                module.weight.grad.data.mul_(mask.to(module.weight.grad.dtype))

    def importance(self, module):
        state = self.optimizer.state.get(module.weight, {})
        w = module.weight.data
        if self.variant == "bitter7":
            if "exp_avg_sq" in state:
                return torch.abs(w) * (torch.abs(state["exp_avg_sq"]) + 1e-8) ** 0.25
            return torch.abs(w)
        if "exp_avg" in state and "exp_avg_sq" in state:
            momentum_score = torch.abs(w * state["exp_avg"])
            stability_score = torch.abs(w) / (torch.sqrt(state["exp_avg_sq"]) + 1e-8)
            return momentum_score * stability_score
        return torch.abs(w)

    def kth_threshold_sampling(self, scores, k, sample_frac=0.02):
        n = scores.numel()
        sample_size = max(1, int(n * sample_frac))
        idx = torch.randint(0, n, (sample_size,), device=scores.device,
                            generator=self.generator)
        sample = scores.flatten()[idx]
        k_sample = max(1, int(k * (sample_size / n)))
        return torch.kthvalue(sample, k_sample).values

    def update(self, step_count):
        if step_count > self.warmup and step_count % self.frequency == 0:
            progress = min(1.0, (step_count - self.warmup) / (self.ramp_end - self.warmup))
            progress = progress ** 3
            current_sparsity = self.target * progress
            all_scores = torch.cat([self.importance(m).flatten() for m, _ in self.masks.values()])
            k = int(current_sparsity * all_scores.numel())
            if k > 0:
                threshold = self.kth_threshold_sampling(all_scores, k)
                for name, (module, _) in self.masks.items():
                    new_mask = self.importance(module) > threshold
                    self.masks[name] = (module, new_mask.to(torch.bool))
                    module.weight.data.mul_(new_mask.to(module.weight.dtype))
        elif step_count > self.warmup:
            for module, mask in self.masks.values():
                module.weight.data.mul_(mask.to(module.weight.dtype))
        for module, mask in self.masks.values():
            state = self.optimizer.state.get(module.weight, {})
            if "exp_avg" in state:
                state["exp_avg"].mul_(mask.to(state["exp_avg"].dtype))
            if "exp_avg_sq" in state:
                state["exp_avg_sq"].mul_(mask.to(state["exp_avg_sq"].dtype))


def _pruned_by_module(pruner) -> dict[str, torch.Tensor]:
    """kgpt's masks keyed as the reference's modules (the tied head is listed as the
    token embedding)."""
    return {("lm_head" if name == "transformer.wte.weight" else name.removesuffix(".weight")):
            mask for name, mask in pruner.pruned.items()}


STATE_RUN = dict(target_sparsity=0.7, pruning_warmup=2, pruning_end=0.5, pruning_frequency=2)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["hybrid", "bitter7"])
def test_state_pruning_follows_adamwprune_code(variant):
    """By default state pruning is AdamWPrune's: the same masks as the reference's code
    at every step of 20 (the ramp ends at iteration 10; masks are updated at
    iterations 4, 6, ..., 18, after the ramp too), the same weights, the output head
    pruned, one threshold over all tensors from a 2 % sample."""
    steps = 20
    cfg = pruning_cfg(optimizer="adamwprune", method="state", pruning_variant=variant,
                      **STATE_RUN)
    ours, theirs = tiny_model(vocab_size=256), tiny_model(vocab_size=256)
    opt_ours, opt_theirs = build_optimizer(ours, cfg, "cpu"), build_optimizer(theirs, cfg, "cpu")
    pruner = build_pruner(ours, opt_ours, cfg, total_steps=steps)
    reference = AdamWPruneReference(
        theirs, opt_theirs, variant, target=0.7, warmup=2, ramp_end=round(0.5 * steps),
        frequency=2, generator=torch.Generator().manual_seed(cfg.seed))
    x = torch.randint(0, 200, (4, 8), generator=torch.Generator().manual_seed(7))
    seen = []
    for iter_num in range(steps):
        for model in (ours, theirs):
            model(x, x)[1].backward()
        pruner.before_step()
        reference.mask_gradients()
        opt_ours.step()
        opt_theirs.step()
        pruner.after_step(iter_num + 1)
        reference.update(iter_num)
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad(set_to_none=True)
        mine = _pruned_by_module(pruner)
        assert set(mine) == set(reference.masks), iter_num
        for name, (_, keep) in reference.masks.items():
            assert torch.equal(mine[name], ~keep), (iter_num, name)
        for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
            assert torch.equal(a, b), (iter_num, name)
        seen.append(sum(int(m.sum()) for m in mine.values()))
    total = sum(m.numel() for m in pruner.pruned.values())
    # nothing before iteration 4; then growing, at or near the target after the ramp
    assert seen[:4] == [0] * 4 and 0 < seen[4] < seen[6] < seen[8] < seen[10]
    assert abs(seen[-1] / total - 0.7) < 0.1 and abs(pruner.sparsity() - seen[-1] / total) < 1e-3
    assert pruner.pruned["transformer.wte.weight"].any()  # the tied head is pruned


@pytest.mark.slow
def test_state_pruning_is_at_adamwprune_s_sparsity_halfway_up_the_ramp():
    """Iteration 6 is halfway from the warmup (2) to the ramp's end (10): AdamWPrune's
    target * x^3 prunes 0.7 / 8 = 0.0875 there (exactly, with the exact threshold;
    near it with the sampled one), kgpt's cubic 0.6125."""
    def sparsity_after(steps, **rules):
        cfg = pruning_cfg(optimizer="adamwprune", method="state", **STATE_RUN, **rules)
        model = tiny_model(vocab_size=256)
        opt = build_optimizer(model, cfg, "cpu")
        pruner = build_pruner(model, opt, cfg, total_steps=20)
        train_steps(model, opt, pruner, steps)
        return pruner.sparsity(), sum(m.numel() for m in pruner.pruned.values())

    exact, n = sparsity_after(7, state_threshold="exact")
    assert abs(exact - 0.0875) <= 1 / n
    assert sparsity_after(6, state_threshold="exact")[0] == pytest.approx(
        round(0.7 * 0.25 ** 3 * n) / n)  # iteration 4's update: x = 2 / 8
    assert abs(sparsity_after(7)[0] - 0.0875) < 0.03
    cubic, _ = sparsity_after(7, state_schedule="cubic", state_threshold="exact")
    assert abs(cubic - 0.7 * (1 - 0.5 ** 3)) <= 1 / n  # kgpt's ramp, at step 6 (x = 0.5)


# Every method with 2:4 (and Muon, whose update covers whole matrices), the other
# structures once each. (The optimizers' state clearing under pruning is
# test_pruned_weights_stay_zero_after_every_step's, for every pair.)
NM_CASES = [("adamw", "magnitude", "2:4"), ("adamw", "movement", "2:4"),
            ("adamwprune", "state", "2:4"), ("muon", "movement", "2:4"),
            ("adamw", "magnitude", "1:4"), ("adamw", "movement", "4:8"),
            ("adamwprune", "state", "1:4")]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,method,structure", NM_CASES,
                         ids=[f"{o}-{m}-{s}" for o, m, s in NM_CASES])
def test_nm_masks_keep_exactly_n_of_every_m_along_each_row(optimizer, method, structure):
    """N:M masks for every method, each at its defaults (state pruning with AdamWPrune's
    schedule and global scope): after every step no group of M consecutive weights of
    a row (a Linear's input dimension) has lost more than M - N, from the end of the
    ramp on every group has lost exactly M - N, and each pruned weight is 0 with its
    gradient and (where the method clears it) its optimizer state 0. Groups are
    checked along rows: masks grouped down columns, or a ramp that fills some groups
    past M - N before the end, fail."""
    n, m = (int(v) for v in structure.split(":"))
    model = tiny_model()
    cfg = pruning_cfg(optimizer=optimizer, method=method, pruning_structure=structure,
                      target_sparsity=1 - n / m)
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, total_steps=12)  # ramp ends at step 6
    rotated = not getattr(opt, "state_in_weight_coordinates", True)
    per_group: list[tuple[int, int]] = []

    def check(step):
        lost = []
        for name, p in pruner.targets:
            mask = pruner.pruned[name]
            assert p.shape[-1] % m == 0 and p.dim() == 2, name
            lost.append(mask.view(-1, m).sum(dim=1))
            assert (p[mask] == 0).all(), (step, name)
            for value in opt.state[p].values():
                if (pruner.clears_state and not rotated and torch.is_tensor(value)
                        and value.shape == p.shape):
                    assert (value[mask] == 0).all(), (step, name)
        lost = torch.cat(lost)
        per_group.append((int(lost.min()), int(lost.max())))

    x = torch.randint(0, 200, (4, 8), generator=torch.Generator().manual_seed(7))
    for step in range(1, 13):
        model(x, x)[1].backward()
        pruner.before_step()
        for name, p in pruner.targets:  # the gradients of pruned weights are gone
            assert p.grad is None or (p.grad[pruner.pruned[name]] == 0).all(), name
        opt.step()
        pruner.after_step(step)
        opt.zero_grad(set_to_none=True)
        check(step)
    assert all(most <= m - n for _, most in per_group), per_group
    assert per_group[-1] == (m - n, m - n), per_group
    assert any(0 < most for _, most in per_group[:5]), per_group  # it ramped
    if method != "state":  # (AdamWPrune's schedule reaches its target later)
        assert per_group[5:] == [(m - n, m - n)] * 7, per_group
    assert pruner.sparsity() >= 1 - n / m


def test_nm_candidates_take_the_lowest_of_each_group_and_ties_by_position():
    """Hand values: 2:4 over two rows of two groups; a ramp to a quarter prunes the
    lowest candidates overall, never a group's third-lowest."""
    from gpt2.sparsity.algorithms.pruning import nm_candidates

    scores = torch.tensor([[4.0, 1.0, 3.0, 2.0, 0.5, 0.5, 0.5, 9.0],
                           [8.0, 7.0, 6.0, 5.0, 1.0, 2.0, 3.0, 4.0]])
    ranked = nm_candidates({"w": scores.flatten()}, 2, 4)["w"].view(2, 8)
    inf = float("inf")
    assert ranked.tolist() == [[inf, 1.0, inf, 2.0, 0.5, 0.5, inf, inf],
                               [inf, inf, 6.0, 5.0, 1.0, 2.0, inf, inf]]
    quarter = lowest(ranked.flatten(), 4).view(2, 8)
    # the four lowest candidates: 0.5 0.5 1.0 (row 1) 1.0 (row 0), not row 1's 3.0
    assert quarter.nonzero().tolist() == [[0, 1], [0, 4], [0, 5], [1, 4]]


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_magnitude_nm_prunes_the_smallest_of_each_row_group(scope):
    """2:4 magnitude masks by hand: in each run of 4 weights along a row, the 2 of
    smallest |w|, whatever the scope (groups down a column, or scores taken in another
    order, prune other weights); halfway up the ramp (a quarter of the weights) the
    smallest candidates overall go first."""
    model = tiny_model()
    cfg = pruning_cfg(pruning_structure="2:4", target_sparsity=0.5, pruning_scope=scope)
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, total_steps=12)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, p in pruner.targets:  # distinct magnitudes, signs mixed
            p.copy_((torch.randperm(p.numel(), generator=gen).float() + 1).view_as(p)
                    * (torch.randint(0, 2, p.shape, generator=gen) * 2 - 1))
    weights = {name: p.detach().clone() for name, p in pruner.targets}
    pruner.update_masks(0.25)
    quarter = {name: m.clone() for name, m in pruner.pruned.items()}
    pruner.update_masks(0.5)
    for name, w in weights.items():
        groups = w.abs().view(w.shape[0], -1, 4)
        expected = torch.zeros_like(groups, dtype=torch.bool)
        expected.scatter_(2, groups.argsort(dim=2)[..., :2], True)
        assert torch.equal(pruner.pruned[name], expected.view_as(w)), name
        assert not (quarter[name] & ~pruner.pruned[name]).any(), name
    if scope == "layer":  # per tensor: its own quarter, the smallest candidates
        for name, w in weights.items():
            cand = w.abs()[pruner.pruned[name]]
            assert torch.equal(w.abs()[quarter[name]].sort().values,
                               cand.sort().values[:w.numel() // 4]), name
