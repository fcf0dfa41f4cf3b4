"""Signum: Signum: steps by the sign of the momentum (Lion with one beta)."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

SETTINGS = (
    Setting('signum_momentum',
        0.9,
        'Signum momentum: the decay of the momentum whose sign is the step',
        prompt='Signum momentum',
        text="""\
        Decay of the momentum whose sign is the step, in [0, 1). 0.9 as in
        signSGD's paper.""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
)

GRIDS = (
    Grid('lr',
         '6e-5 1.2e-4 2.4e-4',
         prompt='Signum learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) Signum cells train at,
        separated by spaces. The default is x0.5, x1 and x2 around 1.2e-4, a fifth of
        AdamW's usual 6e-4: sign steps move every weight by the whole
        rate, so Lion's paper advises for its kind a rate 3-10x below AdamW's. Widen the grid when the report says
        the best point is on its edge. CONFIG_MIN_LR keeps its ratio to
        each."""),
    Grid('wd',
         '0.5',
         prompt='Signum weight decays',
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) Signum cells train
        at, separated by spaces; every learning rate is tried with every
        decay. The default, 0.5, keeps lr x wd at AdamW's 6e-4 x 0.1
        at the grid's centre, as Lion's paper advises."""),
)



def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.sign_descent import Lion
    from gpt2.optim.algorithms.optimizer_base import param_groups
    beta = cfg.signum_momentum
    return Lion(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate, betas=(beta, beta))

METHOD = Optimizer(
    name='signum', order=90, title='Signum',
    summary='Signum: steps by the sign of the momentum (Lion with one beta)',
    reference="Bernstein et al. 2018 (signSGD with momentum): Lion's update with one beta",
    text="""\
    Signum (Bernstein et al. 2018): every weight steps by +-lr, the
    sign of its momentum. Lion with one beta (CONFIG_SIGNUM_MOMENTUM).""",
    matrix_text="""\
    Add Signum cells.""",
    build=build, settings=SETTINGS, reads=('signum_momentum',),
    tuning_grids=GRIDS,
    state_floats=lambda cfg: (1, 1, 1),
    step_scratch=lambda device, s, cfg: 4 * s.params,
)
