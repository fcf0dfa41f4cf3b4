"""SET and RigL (dynamic sparse training) against a transcription of RigL's reference
code: google-research/rigl, rigl/sparse_optimizers.py at 112a9bf (SparseSETOptimizer:
is_mask_update_iter, get_drop_fraction, _get_update_op, reset_momentum;
SparseRigLOptimizer: generic_mask_update, apply_gradients). The transcription works on
numpy arrays, as the TensorFlow graph does on tensors; the reference's tie-break noise
N(0, 1e-5) is set to 0 on both sides (the product's noise is tested on its own)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gpt2.config.options import Config
from gpt2.model.gpt import GPT, GPTConfig
from gpt2.sparsity.algorithms import pruning
from gpt2.optim.algorithms.optimizers import build_optimizer
from gpt2.sparsity.algorithms.pruning import build_pruner, dst_drop_fraction


# ---- the transcription ------------------------------------------------------------

def ref_is_update(global_step: int, begin: int, end: int, frequency: int,
                  last_update: int) -> bool:
    """is_mask_update_iter: within [begin, end] (or end < 0) and a frequency past the
    last update (last_mask_update_step starts at -frequency)."""
    in_range = global_step >= begin and (global_step <= end or end < 0)
    return in_range and last_update + frequency <= global_step


def ref_drop_fraction(global_step: int, initial: float, anneal: str, begin: int,
                      end: int) -> float:
    """get_drop_fraction: 'constant', or learning_rate_decay.cosine_decay(initial,
    global_step, decay_steps=end - begin) with alpha 0:
    initial * 0.5 * (1 + cos(pi * min(global_step, decay_steps) / decay_steps))."""
    if anneal == "constant":
        return initial
    decay_steps = end - begin
    step = min(global_step, decay_steps)
    return initial * 0.5 * (1 + math.cos(math.pi * step / decay_steps))


def top_k_indices(scores: np.ndarray) -> np.ndarray:
    """nn_ops.top_k(x, k=size) indices: descending, equal values in index order."""
    return np.argsort(-scores, kind="stable")


def ref_get_update_op(score_drop, score_grow, mask, weights, drop_fraction):
    """_get_update_op (reinit_when_same False, grow_init 'zeros'): returns the new mask,
    the new weights and the new connections (where the momentum is reset)."""
    n_total = score_drop.size
    n_ones = int(mask.sum())
    n_prune = int(np.float32(n_ones) * np.float32(drop_fraction))
    n_keep = n_ones - n_prune
    sorted_indices = top_k_indices(score_drop.reshape(-1))
    new_values = np.where(np.arange(n_total) < n_keep, 1.0, 0.0)
    mask1 = np.zeros(n_total)
    mask1[sorted_indices] = new_values
    score_grow = score_grow.reshape(-1)
    score_grow_lifted = np.where(mask1 == 1, score_grow.min() - 1, score_grow)
    sorted_indices = top_k_indices(score_grow_lifted)
    new_values = np.where(np.arange(n_total) < n_prune, 1.0, 0.0)
    mask2 = np.zeros(n_total)
    mask2[sorted_indices] = new_values
    assert (mask1 * mask2).sum() == 0
    mask2_reshaped = mask2.reshape(mask.shape)
    new_connections = (mask2_reshaped == 1) & (mask == 0)
    new_weights = np.where(new_connections, 0.0, weights)
    return (mask1 + mask2).reshape(mask.shape), new_weights, new_connections


def ref_rigl_mask_update(mask, weights, masked_grad, drop_fraction):
    """SparseRigLOptimizer.generic_mask_update with noise_std 0: drop by |mask * w|,
    grow by |gradient of the masked weights|."""
    score_drop = np.abs(mask * weights)
    score_grow = np.abs(masked_grad)
    return ref_get_update_op(score_drop, score_grow, mask, weights, drop_fraction)


# ---- the product against it --------------------------------------------------------

def tiny(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8))


def rigl_cfg(**kw) -> Config:
    base = dict(optimizer="sgd", sgd_momentum=0.9, sgd_nesterov=False, weight_decay=0.0,
                learning_rate=0.05, pruning_method="rigl", target_sparsity=0.7,
                pruning_warmup=0, pruning_end=0.5, pruning_frequency=4)
    return Config(**{**base, **kw})


@pytest.mark.slow
@pytest.mark.parametrize("anneal", ["cosine", "constant"])
def test_rigl_equals_the_reference_code_update_by_update(monkeypatch, anneal):
    """40 steps of a tiny GPT under SGD with momentum (the reference's optimizer), RigL
    at 70 % from a random mask, updates every 4 steps up to iteration 20: the
    product's model against a copy trained as the reference trains (forward on
    W * mask, the optimizer on W with masked gradients, skipped on update iterations;
    mask updates by the transcription, momentum of new connections reset). Masks and
    masked weights agree exactly after every step, through every update (drops
    regrown at once, new connections, the cosine's fall to 0) and past the end."""
    monkeypatch.setattr(pruning, "DST_NOISE_STD", 0.0)
    cfg = rigl_cfg(dst_drop_anneal=anneal)
    model, ref = tiny(), tiny()
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, total_steps=40)
    assert pruner.end == 20
    names = [n for n, _ in pruner.targets]
    ref_params = dict(ref.named_parameters())
    masks = {n: (~pruner.pruned[n]).numpy().astype(np.float64) for n in names}
    ref_opt = torch.optim.SGD(ref.parameters(), lr=cfg.learning_rate, momentum=0.9)
    x = torch.randint(0, 200, (4, 8), generator=torch.Generator().manual_seed(5))
    last_update, updates, new_total = -4, [], 0
    for step in range(1, 41):
        global_step = step - 1
        # the product
        model(x, x)[1].backward()
        pruner.before_step(step)
        if not pruner.replaces_update(step):
            opt.step()
        pruner.after_step(step)
        opt.zero_grad(set_to_none=True)
        # the reference: forward on the masked weights, gradients of the masked weights
        saved = {n: ref_params[n].detach().clone() for n in names}
        with torch.no_grad():
            for n in names:
                ref_params[n].mul_(torch.from_numpy(masks[n]).float())
        ref(x, x)[1].backward()
        with torch.no_grad():
            for n in names:
                ref_params[n].copy_(saved[n])
        masked_grads = {n: ref_params[n].grad.numpy().astype(np.float64) for n in names}
        if ref_is_update(global_step, 0, 20, 4, last_update):
            last_update = global_step
            fraction = ref_drop_fraction(global_step, 0.3, anneal, 0, 20)
            updates.append((step, fraction))
            for n in names:
                w = ref_params[n].detach().numpy().astype(np.float64)
                mask, new_w, new = ref_rigl_mask_update(masks[n], w, masked_grads[n],
                                                        fraction)
                new_total += int(new.sum())
                masks[n] = mask
                new_t = torch.from_numpy(new)
                with torch.no_grad():
                    ref_params[n].masked_fill_(new_t, 0.0)
                    buf = ref_opt.state[ref_params[n]].get("momentum_buffer")
                    if buf is not None:
                        buf.masked_fill_(new_t, 0.0)
            ref_opt.zero_grad(set_to_none=True)
        else:
            for n in names:  # the variable's gradient is the masked weights' times the mask
                ref_params[n].grad.mul_(torch.from_numpy(masks[n]).float())
            ref_opt.step()
            ref_opt.zero_grad(set_to_none=True)
        for n in names:
            mask = torch.from_numpy(masks[n] == 1)
            assert torch.equal(~pruner.pruned[n], mask), (step, n)
            assert torch.equal(dict(model.named_parameters())[n].detach(),
                               ref_params[n].detach() * mask), (step, n)
        for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
            if n not in names:
                assert torch.equal(p, q), (step, n)
    assert [s for s, _ in updates] == [1, 5, 9, 13, 17, 21]
    if anneal == "cosine":
        assert updates[-1][1] == 0.0 and updates[0][1] == 0.3
    assert new_total > 0
    assert abs(pruner.sparsity() - 0.7) < 0.005


def test_the_drop_fraction_follows_the_reference_including_its_global_step():
    """Hand values: cosine_decay of the global step (not of the steps since the
    warmup), so a warmup of 10 with end 30 starts at cos(pi/2)-level 0.15, not 0.3."""
    for t in range(0, 45):
        for begin, end in ((0, 20), (10, 30)):
            assert dst_drop_fraction(t, 0.3, "cosine", begin, end) == pytest.approx(
                ref_drop_fraction(t, 0.3, "cosine", begin, end), abs=1e-12)
    assert dst_drop_fraction(10, 0.3, "cosine", 10, 30) == pytest.approx(0.15)
    assert dst_drop_fraction(7, 0.3, "constant", 0, 20) == 0.3


@pytest.mark.slow
@pytest.mark.parametrize("method", ["set", "rigl"])
def test_dynamic_sparsity_holds_its_sparsity_and_resets_what_it_grows(method):
    """AdamW, SET and RigL after a dense warmup of 3 steps: dense until then, the
    target exactly per tensor from the warmup's end to the last step (each update
    drops and grows as many), every pruned weight 0 with a zero gradient, each grown
    weight starts at 0 with zero moments, and the masks do move."""
    model = tiny()
    cfg = Config(optimizer="adamw", pruning_method=method, target_sparsity=0.6,
                 pruning_warmup=3, pruning_end=0.75, pruning_frequency=2, learning_rate=1e-2)
    opt = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, opt, cfg, total_steps=16)
    x = torch.randint(0, 200, (4, 8), generator=torch.Generator().manual_seed(7))
    history = []
    for step in range(1, 17):
        before = {n: m.clone() for n, m in pruner.pruned.items()}
        model(x, x)[1].backward()
        pruner.before_step(step)
        for n, p in pruner.targets:
            assert p.grad is None or (p.grad[pruner.pruned[n]] == 0).all()
        skipped = pruner.replaces_update(step)
        if not skipped:
            opt.step()
        pruner.after_step(step)
        opt.zero_grad(set_to_none=True)
        counts = [int(pruner.pruned[n].sum()) for n, _ in pruner.targets]
        history.append(counts)
        for n, p in pruner.targets:
            assert (p[pruner.pruned[n]] == 0).all(), (step, n)
            if step > 3 and before[n].any():
                grown = before[n] & ~pruner.pruned[n]
                for v in opt.state[p].values():
                    if torch.is_tensor(v) and v.shape == p.shape:
                        assert (v[grown] == 0).all(), (step, n)
                assert (p[grown] == 0).all()
        if step in (4, 6) and method == "rigl":
            assert skipped
    sizes = [p.numel() for _, p in pruner.targets]
    assert history[:2] == [[0] * len(sizes)] * 2
    assert all(c == [round(0.6 * s) for s in sizes] for c in history[2:]), history
    moved = sum(int((a ^ b).sum()) for a, b in zip(
        [build_pruner(tiny(), opt, cfg, 16).pruned[n] for n, _ in pruner.targets],
        pruner.pruned.values()))
    assert moved > 0


def test_rigl_from_step_0_starts_from_a_random_mask_of_exact_size():
    cfg = rigl_cfg()
    model = tiny()
    pruner = build_pruner(model, build_optimizer(model, cfg, "cpu"), cfg, total_steps=40)
    for n, p in pruner.targets:
        assert int(pruner.pruned[n].sum()) == round(0.7 * p.numel())
        assert (p[pruner.pruned[n]] == 0).all()
    other = tiny()
    cfg2 = rigl_cfg(seed=7)
    again = build_pruner(other, build_optimizer(other, cfg2, "cpu"), cfg2, total_steps=40)
    assert any(not torch.equal(pruner.pruned[n], again.pruned[n]) for n, _ in pruner.targets)
