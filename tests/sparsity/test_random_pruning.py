"""Random pruning (gpt2/sparsity/random.py) against its definition, transcribed here:
at each update of magnitude's schedule every live weight draws a uniform score from a
generator seeded by the run's seed and the step, and the round(s * n) lowest of the
tensor are pruned, the pruned ones staying pruned.

Run over a whole ramp (warmup, every update, the end, the held target after it), per
tensor and at 2:4, and resumed halfway."""

from __future__ import annotations

import torch

from gpt2.config.options import Config
from gpt2.model.gpt import GPT, GPTConfig
from gpt2.optim.algorithms.optimizers import build_optimizer
from gpt2.sparsity.algorithms.pruning import build_pruner

STEPS = 24
RUN = dict(pruning_method="random", target_sparsity=0.7, pruning_warmup=3, pruning_end=0.75,
           pruning_frequency=4, max_iters=STEPS, seed=5)


def setup(**kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8))
    cfg = Config(**{**RUN, **kw})
    optimizer = build_optimizer(model, cfg, "cpu")
    return model, build_pruner(model, optimizer, cfg, STEPS), cfg


def reference_masks(shapes: dict, seed: int, target: float, start: int, end: int, every: int):
    """The masks after each step, as the definition says: updates where the ramp
    is (every ``every`` steps from ``start``, and at ``end``), the cubic ramp's sparsity,
    one generator per update seeded seed * 1000003 + step, drawing each tensor's
    scores in order; the k lowest live scores pruned, ties by position."""
    pruned = {n: torch.zeros(s, dtype=torch.bool) for n, s in shapes.items()}
    out = []
    for step in range(1, STEPS + 1):
        if start < step <= end and ((step - start) % every == 0 or step == end):
            x = (step - start) / (end - start)
            sparsity = target * (1 - (1 - x) ** 3)
            gen = torch.Generator().manual_seed(seed * 1000003 + step)
            for name, shape in shapes.items():
                scores = torch.rand(shape, generator=gen).flatten()
                scores[pruned[name].flatten()] = -1.0  # below any draw: stays pruned
                k = round(sparsity * scores.numel())
                order = torch.argsort(scores, stable=True)
                mask = torch.zeros(scores.numel(), dtype=torch.bool)
                mask[order[:k]] = True
                pruned[name] = mask.view(shape)
        out.append({n: m.clone() for n, m in pruned.items()})
    return out


def test_random_pruning_follows_its_definition_over_the_whole_ramp():
    model, pruner, cfg = setup()
    shapes = {name: tuple(p.shape) for name, p in pruner.targets}
    end = round(cfg.pruning_end * STEPS)
    expected = reference_masks(shapes, cfg.seed, cfg.target_sparsity, cfg.pruning_warmup, end,
                               cfg.pruning_frequency)
    sizes = []
    for step in range(1, STEPS + 1):
        pruner.after_step(step)
        for name, p in pruner.targets:
            assert torch.equal(pruner.pruned[name], expected[step - 1][name]), (name, step)
            assert bool((p[pruner.pruned[name]] == 0).all())  # pruned weights are 0
        sizes.append(sum(int(m.sum()) for m in pruner.pruned.values()))
    total = sum(p.numel() for _, p in pruner.targets)
    assert sizes[cfg.pruning_warmup - 1] == 0 and sizes == sorted(sizes)  # grows, from 0
    assert abs(sizes[-1] / total - cfg.target_sparsity) < 1e-3  # the target, held
    assert len(set(sizes)) > 4  # several updates on the ramp


def test_random_pruning_is_not_magnitude_pruning():
    """It prunes large weights as often as small ones: half-way to 70 %, the share of
    its pruned weights among the largest half of each tensor is near a half (magnitude
    pruning's is 0)."""
    model, pruner, cfg = setup()
    for step in range(1, STEPS + 1):
        pruner.after_step(step)
    _, before, _ = setup()  # the same weights, unpruned
    large = 0
    for (name, p), (_, q) in zip(pruner.targets, before.targets):
        big = q.detach().abs() >= q.detach().abs().median()
        large += int((pruner.pruned[name] & big).sum())
    share = large / sum(int(m.sum()) for m in pruner.pruned.values())
    assert 0.4 < share < 0.6, share


def test_random_pruning_seeds_by_run_and_step_so_a_resume_continues_exactly():
    _, whole, _ = setup()
    for step in range(1, STEPS + 1):
        whole.after_step(step)
    _, first, _ = setup()
    for step in range(1, 12):
        first.after_step(step)
    _, resumed, _ = setup()
    resumed.load_state_dict(first.state_dict())
    for step in range(12, STEPS + 1):
        resumed.after_step(step)
    assert all(torch.equal(whole.pruned[n], resumed.pruned[n]) for n in whole.pruned)
    _, other, _ = setup(seed=6)
    for step in range(1, STEPS + 1):
        other.after_step(step)
    assert not all(torch.equal(whole.pruned[n], other.pruned[n]) for n in whole.pruned)


def test_random_pruning_grows_an_n_of_m_mask():
    _, pruner, _ = setup(pruning_structure="2:4", target_sparsity=0.5)
    for step in range(1, STEPS + 1):
        pruner.after_step(step)
        for name, mask in pruner.pruned.items():
            per_group = mask.view(-1, 4).sum(dim=1)
            assert int(per_group.max()) <= 2, (name, step)
    assert all(bool((m.view(-1, 4).sum(dim=1) == 2).all()) for m in pruner.pruned.values())
