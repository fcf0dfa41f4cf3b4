"""random: the sanity baseline, weights pruned at random on magnitude's schedule."""

from __future__ import annotations

from gpt2.config.methods import Pruning

# The seed of an update's draws: the run's seed and the step, so a resumed run draws
# what the uninterrupted one did (the masks travel in checkpoints; the scores need not).
STEP_SEED = 1_000_003


def build(model, optimizer, cfg, total_steps):
    import torch

    from gpt2.sparsity.algorithms.pruning import Pruner

    class RandomPruning(Pruner):
        """Every mask update draws a uniform score per weight; the lowest go. Pruned
        weights rank below every live one (Pruner.update_masks), so masks only grow, as
        magnitude's do; the ramp, scope and N:M structure are the shared ones."""

        def after_step(self, step: int) -> None:
            self.step = step
            super().after_step(step)

        def scores(self):
            gen = torch.Generator().manual_seed(cfg.seed * STEP_SEED + self.step)
            return {name: torch.rand(p.shape, generator=gen).to(p.device)
                    for name, p in self.targets}

    return RandomPruning(model, optimizer, cfg, total_steps)


METHOD = Pruning(
    name="random", order=65, title="random (baseline)",
    summary="weights drawn at random at each mask update, on magnitude's ramp: the baseline "
            "a method must beat",
    reference="the random baseline of gradual pruning (Zhu & Gupta 2017's schedule; Liu et "
              "al. 2022, 'The Unreasonable Effectiveness of Random Pruning')",
    text="""\
    Random pruning, the sanity baseline: at each mask update every live
    weight gets a uniform random score and the lowest go, on the same
    ramp, scope and mask structure as magnitude pruning; pruned weights
    stay pruned, their optimizer state cleared. A method that does not
    beat it at a sparsity has learnt nothing about which weights matter.
    The draws are seeded by CONFIG_SEED and the step, so a resumed run
    prunes exactly what an uninterrupted one does.""",
    matrix_text="""\
    Random pruning at each sparsity level, with every enabled optimizer
    it pairs with: the baseline the other methods are judged against.""",
    build=build,
    reads=("target_sparsity", "pruning_warmup", "pruning_end", "pruning_frequency",
           "pruning_ramp", "pruning_scope", "prune_embeddings", "prune_norms_biases",
           "pruning_structure"),
)
