"""AdEMAMix: AdEMAMix: Adam plus a slow gradient average."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

SETTINGS = (
    Setting('ademamix_beta2',
        0.999,
        'AdEMAMix beta2 (second-moment decay)',
        prompt='AdEMAMix beta2',
        text="""\
        Decay of the second moment, in [0, 1). 0.999 as in the
        reference's example.""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
    Setting('ademamix_beta3',
        0.9999,
        "AdEMAMix beta3: the slow gradient average's decay",
        prompt='AdEMAMix beta3 (slow average)',
        text="""\
        Decay of the slow gradient average, in [0, 1): with 0.9999 it
        remembers gradients over ~10,000 steps. The reference's value.""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
    Setting('ademamix_alpha',
        8.0,
        "AdEMAMix alpha: the slow average's weight in the step",
        prompt='AdEMAMix alpha',
        text="""\
        The slow average's weight in the step. 8 as in the reference's
        example for language models.""",
        min=0.0,
        max=1000.0),
    Setting('ademamix_warmup',
        0,
        ("steps over which AdEMAMix's alpha and beta3 climb to their values (0: the run's whole "
         "length, as the authors advise)"),
        prompt='AdEMAMix alpha and beta3 warmup (steps, 0: the whole run)',
        text="""\
        Steps over which alpha climbs from 0 and beta3 from beta1 (by
        half-life) to their values. The authors set it to the run's
        length, which 0 does (the steps the schedule spans).""",
        min=0,
        max=1000000000),
)

GRIDS = (
    Grid('lr',
         '3e-4 6e-4 1.2e-3',
         prompt='AdEMAMix learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) AdEMAMix cells train at,
        separated by spaces. The default is x0.5, x1 and x2 around AdamW's usual
        6e-4. Widen the grid when the report says
        the best point is on its edge. CONFIG_MIN_LR keeps its ratio to
        each."""),
    Grid('wd',
         '0.1',
         prompt='AdEMAMix weight decays',
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) AdEMAMix cells train
        at, separated by spaces; every learning rate is tried with every
        decay. The default is one value, 0.1; add more to tune it."""),
)



def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.adam_variants import AdEMAMix
    from gpt2.optim.algorithms.optimizer_base import param_groups
    warmup = cfg.ademamix_warmup
    if not warmup:  # the whole run, as the authors advise
        if not (total_steps or cfg.max_iters):
            raise ValueError("AdEMAMix's warmup spans the run, whose length is not known yet: "
                             "pass total_steps or set ademamix_warmup")
        warmup = cfg.schedule_steps(total_steps or cfg.max_iters)
    return AdEMAMix(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                    betas=(cfg.beta1, cfg.ademamix_beta2, cfg.ademamix_beta3),
                    alpha=cfg.ademamix_alpha, warmup=warmup, eps=cfg.adam_eps)

METHOD = Optimizer(
    name='ademamix', order=110, title='AdEMAMix',
    summary='AdEMAMix: Adam plus a slow gradient average',
    reference='Pagliardini et al. 2024; apple/ml-ademamix, pytorch/ademamix.py',
    text="""\
    AdEMAMix (Pagliardini et al. 2024): Adam whose step adds alpha
    times a slow average of the gradients (beta3 = 0.9999) to the
    usual fast one, so gradients thousands of steps old still count.
    One more state tensor than AdamW.""",
    matrix_text="""\
    Add AdEMAMix cells.""",
    build=build, settings=SETTINGS,
    reads=("beta1", "ademamix_beta2", "ademamix_beta3", "ademamix_alpha", "ademamix_warmup",
           "adam_eps"),
    tuning_grids=GRIDS, spans_run=lambda cfg: (
        "AdEMAMix's alpha and beta3 warmups span its own length (ADEMAMIX_WARMUP 0): set "
        "ADEMAMIX_WARMUP to steps" if cfg.ademamix_warmup == 0 else None),
    # fast and slow averages and the second moment; one tensor at a time, its
    # denominator and update
    state_floats=lambda cfg: (3, 3, 3),
    step_scratch=lambda device, s, cfg: 8 * s.largest,
)
