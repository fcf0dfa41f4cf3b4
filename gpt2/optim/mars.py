"""MARS (AdamW form): MARS-AdamW: variance-reduced AdamW on matrices, AdamW on the rest."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

SETTINGS = (
    Setting('mars_beta1',
        0.95,
        "MARS beta1 (the matrices' momentum)",
        prompt='MARS beta1',
        text="""\
        Momentum of the matrices' variance-reduced gradient, in [0, 1).
        0.95 as the reference's GPT-2 configs.""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
    Setting('mars_beta2',
        0.99,
        "MARS beta2 (the matrices' second moment)",
        prompt='MARS beta2',
        text="""\
        Second-moment decay of the matrices, in [0, 1). 0.99 as the
        reference's GPT-2 configs.""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
    Setting('mars_gamma',
        0.025,
        'MARS gamma: the weight of the gradient correction g - g_prev',
        prompt='MARS gamma',
        text="""\
        Weight of the correction g - g_prev (times beta1/(1-beta1)). The
        reference's 0.025. 0 gives AdamW on the clipped gradient.""",
        min=0.0,
        max=1.0),
    Setting('mars_lr_1d',
        0.003,
        'MARS peak learning rate of the tensors it leaves to AdamW (biases and norms)',
        prompt='MARS learning rate of biases and norms',
        text="""\
        Peak learning rate of the tensors MARS leaves to AdamW (biases
        and LayerNorm gains); the schedule scales it like
        CONFIG_LEARNING_RATE. 3e-3 as the reference's lr_1d.""",
        min=0.0,
        max=10.0,
        min_exclusive=True),
)

GRIDS = (
    Grid('lr',
         '3e-3 6e-3 1.2e-2',
         prompt='MARS learning rates', part="matrices",
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) MARS cells train at,
        separated by spaces. The default is x0.5, x1 and x2 around 6e-3, the reference's
        rate for GPT-2 small (its correction is clipped to norm 1). Widen the grid when the report says
        the best point is on its edge. CONFIG_MIN_LR keeps its ratio to
        each."""),
    Grid('wd',
         '0.01',
         prompt='MARS weight decays',
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) MARS cells train
        at, separated by spaces; every learning rate is tried with every
        decay. The default is the reference's 0.01 for GPT-2 small."""),
    Grid('adam_lr',
         '1.5e-3 3e-3 6e-3',
         prompt="MARS's AdamW-part learning rates", part="biases and norms",
         text="""\
        Peak learning rates (CONFIG_MARS_LR_1D) of the biases and
        LayerNorm gains MARS leaves to AdamW, separated by spaces; every
        point of MARS's own grid is tried with each. The default is x0.5,
        x1 and x2 around the reference's lr_1d, 3e-3."""),
)



def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.adam_variants import Mars
    from gpt2.optim.algorithms.optimizers import LR_SCALE
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay,
         "variance_reduced": True},
        # the reference's optimize_1d=False: AdamW at lr_1d, following the schedule
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0,
         "lr": cfg.mars_lr_1d, LR_SCALE: cfg.mars_lr_1d / cfg.learning_rate},
    ]
    return Mars([g for g in groups if g["params"]], lr=cfg.learning_rate,
                betas=(cfg.mars_beta1, cfg.mars_beta2), gamma=cfg.mars_gamma,
                adam_betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)

METHOD = Optimizer(
    name='mars', order=120, title='MARS (AdamW form)',
    summary='MARS-AdamW: variance-reduced AdamW on matrices, AdamW on the rest',
    reference=('Yuan et al. 2024; AGI-Arena/MARS, MARS/optimizers/mars.py (mars-adamw, '
               'is_approx=True)'),
    text="""\
    MARS-AdamW (Yuan et al. 2024): AdamW on a variance-reduced
    gradient, g + gamma * beta1/(1-beta1) * (g - previous g), for the
    weight matrices; plain AdamW at CONFIG_MARS_LR_1D for biases and
    norms. Keeps the previous gradient: one more state tensor than
    AdamW for each matrix.""",
    matrix_text="""\
    Add MARS cells.""",
    build=build, settings=SETTINGS,
    reads=("mars_beta1", "mars_beta2", "mars_gamma", "mars_lr_1d", "beta1", "beta2",
           "adam_eps"),
    # the matrices' rate and decay, and the rate of its AdamW part (biases and norms,
    # which take no decay)
    tuning_grids=GRIDS, tuned=lambda cfg: {"lr": "learning_rate", "wd": "weight_decay",
                                    "adam_lr": "mars_lr_1d"}, elementwise=False,
    # + the previous gradient of each matrix; one tensor at a time, the correction,
    # the denominator and the step
    state_floats=lambda cfg: (3, 3, 2),
    step_scratch=lambda device, s, cfg: 12 * s.largest,
)
