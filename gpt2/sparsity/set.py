"""SET: dynamic sparse training, the smallest |w| dropped and as many regrown at random
(Mocanu et al. 2018)."""

from __future__ import annotations

from gpt2.config.methods import Pruning


def build(model, optimizer, cfg, total_steps):
    from gpt2.sparsity.algorithms.pruning import SET
    return SET(model, optimizer, cfg, total_steps)


METHOD = Pruning(
    name='set', order=50, title='SET (dynamic sparse training)',
    summary=("dynamic sparse training: drop the smallest |w|, regrow at random (Mocanu et al. "
             "2018)"),
    reference="Mocanu et al. 2018 (SET), as google-research/rigl's SparseSETOptimizer runs it",
    text="""\
    Sparse Evolutionary Training (Mocanu et al. 2018), as RigL's
    reference code (google-research/rigl, SparseSETOptimizer) runs it:
    the model is sparse at the target from the first mask (a random
    one when CONFIG_PRUNING_WARMUP is 0, else the smallest |w| after
    the dense warmup), and every CONFIG_PRUNING_FREQUENCY steps until
    CONFIG_PRUNING_END a fraction of each tensor's live weights, the
    smallest |w|, is dropped and as many regrown at random, at 0 with
    fresh optimizer state.""",
    matrix_text="""\
    SET (dynamic sparse training) at each sparsity level, with every
    enabled optimizer it pairs with.""",
    build=build, settings=(),
    reads=("target_sparsity", "pruning_warmup", "pruning_end", "pruning_frequency",
           "prune_embeddings", "prune_norms_biases", "dst_drop_fraction", "dst_drop_anneal"),
    family='dynamic sparse',
)
