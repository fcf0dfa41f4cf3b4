"""State pruning (AdamWPrune): scores from AdamW's moments, by default with AdamWPrune's
schedule and sampled global threshold; needs optimizer adamwprune."""

from __future__ import annotations

from gpt2.config.methods import Pruning, Setting

SETTINGS = (
    Setting('pruning_variant',
        'hybrid',
        'state pruning score',
        prompt='State pruning score',
        text="""\
        How AdamW's first moment m and second moment v rank weights.""",
        choices={
            'hybrid': ('hybrid: |w*m| * |w| / (sqrt(v) + 1e-8)',
                """\
            AdamWPrune's original score (its bitter0): weight size times the
            Adam step direction's strength; keeps large weights that are still
            being pushed consistently."""),
            'bitter7': ('bitter7: |w| * (|v| + 1e-8)^(1/4)',
                """\
            Weight size times the fourth root of the second moment, as
            AdamWPrune's code computes it (its README writes v^(1/4) + eps):
            keeps large weights whose gradients are large."""),
        }),
    Setting('state_schedule',
        'adamwprune',
        ("state pruning's schedule: AdamWPrune's, target * x^3 at the steps its code updates the "
         "masks (also after the ramp), or kgpt's cubic or linear ramp"),
        prompt='State pruning schedule',
        text="""\
        When the masks grow and to what sparsity. x is the fraction of the
        ramp done, from CONFIG_PRUNING_WARMUP to CONFIG_PRUNING_END.""",
        choices={
            'adamwprune': ("AdamWPrune's: target * x^3",
                """\
            As AdamWPrune's code: after optimizer step t it takes i = t - 1
            (its iteration number) and updates the masks when i is past the
            warmup and a multiple of CONFIG_PRUNING_FREQUENCY, to
            target * x^3 with x = (i - warmup) / (end - warmup), at most 1. It
            prunes slowly first (0.7 * 0.125 = 0.0875 halfway to a 0.7 target)
            and goes on updating after the ramp."""),
            'cubic': ("kgpt's cubic: target * (1 - (1 - x)^3)",
                """\
            The ramp of magnitude and movement pruning (Zhu & Gupta 2017),
            updated every CONFIG_PRUNING_FREQUENCY steps from the warmup and at
            the end of the ramp: prunes fast first (0.6125 halfway to a 0.7
            target). Not AdamWPrune's."""),
            'linear': ("kgpt's linear: target * x",
                """\
            The linear ramp of magnitude and movement pruning, updated as the
            cubic one. Not AdamWPrune's."""),
        }),
    Setting('state_scope',
        'global',
        'state pruning ranks weights over all targets at once (AdamWPrune) or per tensor',
        prompt='State pruning ranking scope',
        text="""\
        Where the state pruning threshold is computed.""",
        choices={
            'layer': ('per tensor',
                """\
            Every target tensor reaches the sparsity on its own (kgpt's
            default for the other methods). Not AdamWPrune's."""),
            'global': ('global (AdamWPrune)',
                """\
            One threshold over the scores of all targets, as AdamWPrune's code:
            some tensors end sparser than others."""),
        }),
    Setting('state_threshold',
        'sampled',
        ("state pruning's threshold: the k-th smallest score of a 2 percent sample, every score "
         "at or below it pruned (AdamWPrune), or exactly round(s * n) pruned, ties by position"),
        prompt='State pruning threshold',
        text="""\
        How the score below which weights are pruned is found, for k
        weights to prune.""",
        when=(('pruning_structure', ('unstructured',)),),
        choices={
            'sampled': ('sampled (AdamWPrune)',
                """\
            As AdamWPrune's code: the k-th smallest score is estimated from 2 %
            of the scores drawn at random (with replacement), and every score
            at or below it is pruned, so the count is near k, not exact. The
            draws come from a generator seeded with CONFIG_SEED."""),
            'exact': ('exact',
                """\
            Exactly k = round(s * n) weights are pruned, ties broken by
            position, as kgpt does for the other methods. Not AdamWPrune's."""),
        }),
    Setting('state_prune_head',
        True,
        ("state pruning also prunes the output head (the token embedding when tied), as "
         "AdamWPrune prunes every Linear"),
        prompt='State pruning also prunes the output head',
        text="""\
        AdamWPrune prunes every Linear layer's weight, the output head
        included (with tied weights, that is the token embedding). Say n
        to prune the blocks' Linear weights only, as the other methods do
        by default; that is not AdamWPrune's."""),
)


def build(model, optimizer, cfg, total_steps):
    from gpt2.sparsity.algorithms.pruning import StatePruning
    # AdamWPrune's own schedule is no ramp of the shared kind (StatePruning.after_step)
    return StatePruning(model, optimizer, cfg, total_steps, variant=cfg.pruning_variant,
                        ramp=None if cfg.state_schedule == "adamwprune" else cfg.state_schedule,
                        scope=cfg.state_scope, threshold=cfg.state_threshold,
                        prune_head=cfg.state_prune_head)


METHOD = Pruning(
    name='state', order=40, title='state (AdamWPrune)',
    summary=("AdamWPrune's scores from AdamW moments, by default with its schedule and sampled "
             "global threshold (needs optimizer adamwprune)"),
    reference=('AdamWPrune, lib/optimizers.py (update_adamprune_masks, its scores and '
               'sampled threshold) under its GPT-2 trainer'),
    text="""\
    Scores come from AdamW's own moments (see CONFIG_PRUNING_VARIANT),
    so no extra memory is needed. Only with optimizer AdamWPrune.
    With the defaults of the state pruning settings below (schedule,
    scope, threshold, output head) it follows AdamWPrune's code; with
    any other it is AdamWPrune's scores under kgpt's rules, and its
    results are not AdamWPrune's.""",
    matrix_text="""\
    State pruning at each sparsity level, with the optimizer it needs.""",
    build=build, settings=SETTINGS,
    # its own scope (AdamWPrune's: global), and the output head by default
    ranks_globally=lambda cfg: cfg.state_scope == "global",
    prunes_head=lambda cfg: cfg.state_prune_head,
    reads=("target_sparsity", "pruning_warmup", "pruning_end", "pruning_frequency",
           "prune_embeddings", "prune_norms_biases", "pruning_variant", "state_schedule",
           "state_scope", "state_threshold", "state_prune_head", "pruning_structure"),
    optimizer='adamwprune', variants='pruning_variant',
)
