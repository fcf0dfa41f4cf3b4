"""movement: accumulated -w*grad (Sanh et al. 2020)."""

from __future__ import annotations

from gpt2.config.methods import Pruning, Setting

SETTINGS = (
    Setting('movement_freeze_pruned',
        False,
        ("movement: freeze pruned weights and clear their optimizer state (off: they drift under "
         "momentum and decay, as in the reference)"),
        prompt='Movement: freeze pruned weights (not the reference)',
        text="""\
        n (default) follows the reference code of Sanh et al., whose
        weight matrix stays dense while the forward pass multiplies it by
        the mask: a pruned weight gets no gradient but keeps its optimizer
        state, so momentum and weight decay go on moving it, and it comes
        back with the value it drifted to. In the model it is still
        exactly 0 between steps.

        y freezes a pruned weight at the value it had when pruned and
        clears its optimizer state, so it comes back with that value and
        fresh state (kgpt's rule before it followed the reference). The
        two agree only under SGD without momentum or weight decay. Under
        AdamW the masks part as pruning goes on. Share of the reference's
        pruned weights that the frozen rule also prunes, same model, data
        and seed: with gpt2-shakespeare-matrix-cpu's model and schedule
        (4x128, 150 steps, learning rate 2e-3, 70 %) 1.000 at the first
        mask (step 40), 0.93 at step 70 and 0.89 from the end of the ramp
        on; with a 2x16 model at learning rate 1e-2 (60 %) 0.94 at step
        12 and 0.69 at step 60, where chance is 0.60."""),
)


def build(model, optimizer, cfg, total_steps):
    from gpt2.sparsity.algorithms.pruning import MovementPruning
    return MovementPruning(model, optimizer, cfg, total_steps, freeze=cfg.movement_freeze_pruned)


METHOD = Pruning(
    name='movement', order=30, title='movement',
    summary='accumulated -w*grad (Sanh et al. 2020)',
    reference=("Sanh et al. 2020, 'Movement Pruning': the movement-pruning example of "
               "Hugging Face transformers, emmental's MaskedLinear (dense W, x @ (W * "
               "TopK(S)).T)"),
    text="""\
    Movement pruning (Sanh et al. 2020): scores accumulate -w * dL/dw at
    every step, pruned weights included, and the lowest are removed,
    i.e. weights moving toward zero, whatever their size. As in the
    reference, a pruned weight keeps its optimizer state and comes
    back when its score rises again. Keeps a float32 score and the
    kept-aside value per weight.""",
    matrix_text="""\
    Movement pruning at each sparsity level, with every enabled
    optimizer it pairs with.""",
    build=build, settings=SETTINGS,
    # a float32 score and the kept-aside value of every target weight
    extra_bytes=lambda cfg: 8, memory_words="9 B (mask, float32 score, kept value)",
    reads=("target_sparsity", "pruning_warmup", "pruning_end", "pruning_frequency",
           "pruning_ramp", "pruning_scope", "prune_embeddings", "prune_norms_biases",
           "pruning_structure", "movement_freeze_pruned"),
)
