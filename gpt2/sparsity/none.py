"""none: dense training."""

from __future__ import annotations

from gpt2.config.methods import Pruning


def build(model, optimizer, cfg, total_steps):
    from gpt2.sparsity.algorithms.pruning import NoPruning
    return NoPruning(model, optimizer, cfg, total_steps)


METHOD = Pruning(
    name='none', order=10, title='none',
    summary='dense training',
    reference='dense training: nothing is pruned',
    text="""\
    Train the dense model.""",
    matrix_text="""\
    One dense cell per optimizer and seed: the baseline the pruned
    cells are compared with. It has no sparsity axis.""",
    build=build, settings=(),
    reads=(),
    family='dense',
)
