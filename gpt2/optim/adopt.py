"""ADOPT: ADOPT: Adam normalising each gradient by the second moment before it."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

SETTINGS = (
    Setting('adopt_beta2',
        0.9999,
        'ADOPT beta2 (second-moment decay; any value converges)',
        prompt='ADOPT beta2',
        text="""\
        Decay of the second moment, in [0, 1). ADOPT converges with any
        value; 0.9999 is the reference's default.""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
    Setting('adopt_eps',
        1e-06,
        'ADOPT epsilon: the floor of sqrt(v) a gradient is divided by',
        prompt='ADOPT epsilon',
        text="""\
        The floor of sqrt(v) each gradient is divided by: max(sqrt(v),
        eps). 1e-6 is the reference's default.""",
        min=0.0,
        max=1.0,
        min_exclusive=True),
    Setting('adopt_clip',
        True,
        'ADOPT clips each normalised gradient to +-t^0.25 at step t (the reference default)',
        prompt='ADOPT clips normalised gradients to +-t^0.25',
        text="""\
        At step t, clamp each normalised gradient to [-t^0.25, t^0.25]
        before averaging it, as the reference does by default (its
        clip_lambda). Say n for the paper's unclipped algorithm."""),
)

GRIDS = (
    Grid('lr',
         '3e-4 6e-4 1.2e-3',
         prompt='ADOPT learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) ADOPT cells train at,
        separated by spaces. The default is x0.5, x1 and x2 around AdamW's usual
        6e-4. Widen the grid when the report says
        the best point is on its edge. CONFIG_MIN_LR keeps its ratio to
        each."""),
    Grid('wd',
         '0.1',
         prompt='ADOPT weight decays',
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) ADOPT cells train
        at, separated by spaces; every learning rate is tried with every
        decay. The default is one value, 0.1; add more to tune it."""),
)



def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.adam_variants import Adopt
    from gpt2.optim.algorithms.optimizer_base import param_groups
    return Adopt(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                 betas=(cfg.beta1, cfg.adopt_beta2), eps=cfg.adopt_eps, clip=cfg.adopt_clip)

METHOD = Optimizer(
    name='adopt', order=100, title='ADOPT',
    summary='ADOPT: Adam normalising each gradient by the second moment before it',
    reference='Taniguchi et al. 2024; iShohei220/adopt, src/adopt/adopt.py (decouple=True)',
    text="""\
    ADOPT (Taniguchi et al. 2024): Adam that normalises each gradient
    by the second moment of the steps before it, then averages, which
    converges with any beta2. Its first step only measures the
    gradient.""",
    matrix_text="""\
    Add ADOPT cells.""",
    build=build, settings=SETTINGS, reads=('beta1', 'adopt_beta2', 'adopt_eps', 'adopt_clip'),
    first_step_moves=False,  # its first step only measures the gradient
    tuning_grids=GRIDS,
    # one tensor at a time: sqrt(v) and the normalised gradient
    step_scratch=lambda device, s, cfg: 8 * s.largest,
)
