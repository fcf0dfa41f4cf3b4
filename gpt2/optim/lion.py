"""Lion: Lion: steps by the sign of an interpolated momentum."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

SETTINGS = (
    Setting('lion_beta1',
        0.9,
        "Lion beta1: the momentum's weight in the signed step",
        prompt='Lion beta1',
        text="""\
        The momentum's weight in the interpolation whose sign is the
        step, in [0, 1]. 0.9 is the paper's default (0.95 for its
        language models).""",
        min=0.0,
        max=1.0),
    Setting('lion_beta2',
        0.99,
        "Lion beta2: the momentum's decay",
        prompt='Lion beta2',
        text="""\
        Decay of the momentum, in [0, 1). 0.99 is the paper's default
        (0.98 for its language models).""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
)

GRIDS = (
    Grid('lr',
         '6e-5 1.2e-4 2.4e-4',
         prompt='Lion learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) Lion cells train at,
        separated by spaces. The default is x0.5, x1 and x2 around 1.2e-4, a fifth of
        AdamW's usual 6e-4: sign steps move every weight by the whole
        rate, so Lion's paper advises a rate 3-10x below AdamW's. Widen the grid when the report says
        the best point is on its edge. CONFIG_MIN_LR keeps its ratio to
        each."""),
    Grid('wd',
         '0.5',
         prompt='Lion weight decays',
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) Lion cells train
        at, separated by spaces; every learning rate is tried with every
        decay. The default, 0.5, keeps lr x wd at AdamW's 6e-4 x 0.1
        at the grid's centre, as the paper advises."""),
)



def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.sign_descent import Lion
    from gpt2.optim.algorithms.optimizer_base import param_groups
    return Lion(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                betas=(cfg.lion_beta1, cfg.lion_beta2), cautious=cfg.cautious)

METHOD = Optimizer(
    name='lion', order=80, title='Lion',
    summary='Lion: steps by the sign of an interpolated momentum',
    reference='Chen et al. 2023; lion-pytorch 0.2.5 (lucidrains), lion_pytorch.py',
    text="""\
    Lion (Chen et al. 2023): every weight steps by +-lr, the sign of
    an interpolation of the momentum and the gradient. One state
    tensor per weight, half of AdamW's. Its learning rate is typically
    3-10x below AdamW's and its weight decay 3-10x above. Can be made
    cautious (CONFIG_CAUTIOUS).""",
    matrix_text="""\
    Add Lion cells (betas and cautious from the Optimizer menu).""",
    build=build, settings=SETTINGS, reads=('lion_beta1', 'lion_beta2', 'cautious'),
    tuning_grids=GRIDS,
    state_floats=lambda cfg: (1, 1, 1),
    # the signed updates of every tensor at once (foreach), and a tensor's mask and
    # product when cautious
    step_scratch=lambda device, s, cfg: 4 * s.params + (8 * s.largest if cfg.cautious else 0),
)
