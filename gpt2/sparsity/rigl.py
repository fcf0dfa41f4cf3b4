"""RigL: dynamic sparse training, the smallest |w| dropped and the largest |gradient|
regrown (Evci et al. 2020)."""

from __future__ import annotations

from gpt2.config.methods import Pruning


def build(model, optimizer, cfg, total_steps):
    from gpt2.sparsity.algorithms.pruning import RigL
    return RigL(model, optimizer, cfg, total_steps)


METHOD = Pruning(
    name='rigl', order=60, title='RigL (dynamic sparse training)',
    summary=("dynamic sparse training: drop the smallest |w|, regrow the largest |gradient| (Evci"
             " et al. 2020)"),
    reference='Evci et al. 2020 (RigL), google-research/rigl, SparseRigLOptimizer',
    text="""\
    Rigging the Lottery (Evci et al. 2020), as its reference code
    (google-research/rigl, SparseRigLOptimizer): as SET, but the
    regrown weights are those of largest |gradient| (of the masked
    weights, so pruned ones have one too), and a mask update takes
    the place of that step's weight update, as in the reference. The
    drop fraction falls as a cosine (CONFIG_DST_DROP_ANNEAL).""",
    matrix_text="""\
    RigL (dynamic sparse training) at each sparsity level, with every
    enabled optimizer it pairs with.""",
    build=build, settings=(),
    # the float32 |gradient| of every target, held from before the step to its mask
    # update
    extra_bytes=lambda cfg: 4,
    memory_words="5 B (mask, float32 gradient size at a mask update)",
    reads=("target_sparsity", "pruning_warmup", "pruning_end", "pruning_frequency",
           "prune_embeddings", "prune_norms_biases", "dst_drop_fraction", "dst_drop_anneal"),
    family='dynamic sparse',
)
