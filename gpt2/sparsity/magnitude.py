"""magnitude: smallest |w| (Zhu & Gupta 2017)."""

from __future__ import annotations

from gpt2.config.methods import Pruning


def build(model, optimizer, cfg, total_steps):
    from gpt2.sparsity.algorithms.pruning import MagnitudePruning
    return MagnitudePruning(model, optimizer, cfg, total_steps)


METHOD = Pruning(
    name='magnitude', order=20, title='magnitude',
    summary='smallest |w| (Zhu & Gupta 2017)',
    reference=("Zhu & Gupta 2017, 'To prune, or not to prune' (gradual magnitude "
               'pruning, its cubic ramp)'),
    text="""\
    Gradual magnitude pruning (Zhu & Gupta 2017): the weights with the
    smallest |w| are removed.""",
    matrix_text="""\
    Magnitude pruning at each sparsity level, with every enabled
    optimizer it pairs with.""",
    build=build, settings=(),
    reads=("target_sparsity", "pruning_warmup", "pruning_end", "pruning_frequency",
           "pruning_ramp", "pruning_scope", "prune_embeddings", "prune_norms_biases",
           "pruning_structure"),
)
