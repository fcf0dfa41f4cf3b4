"""PSGD-Kron: PSGD-Kron: momentum preconditioned by fitted Kronecker factors."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

SETTINGS = (
    Setting('kron_beta1',
        0.9,
        'PSGD-Kron momentum',
        prompt='PSGD-Kron momentum',
        text="""\
        Decay of the momentum the preconditioner is applied to, in
        [0, 1). 0.9, kron_torch's default.""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
    Setting('kron_precond_lr',
        0.1,
        "PSGD-Kron's step size when fitting its factors",
        prompt='PSGD-Kron preconditioner fitting rate',
        text="""\
        Step size of each fitting step of the factors. 0.1, kron_torch's
        default.""",
        min=0.0,
        max=10.0,
        min_exclusive=True),
    Setting('kron_max_triangular',
        8192,
        ("longest dimension PSGD-Kron gives a triangular factor (longer ones, and vectors, get a "
         "diagonal one)"),
        prompt='PSGD-Kron longest dimension with a triangular factor',
        text="""\
        Longer dimensions (the token table's 50,304 rows) get a diagonal
        factor instead of a d x d one. 8192, kron_torch's default.""",
        min=1,
        max=1000000),
    Setting('kron_min_update_prob',
        0.03,
        "PSGD-Kron's lowest chance of fitting its factors at a step, after the flat start",
        prompt='PSGD-Kron lowest chance of fitting at a step',
        text="""\
        After the flat start the factors are fitted with probability
        exp(-0.001 * (step - flat steps)), but never below this (about one
        step in 33). 0.03, kron_torch's default.""",
        min=0.0,
        max=1.0,
        min_exclusive=True),
    Setting('kron_flat_steps',
        500,
        'steps over which PSGD-Kron fits its factors at every step',
        prompt='PSGD-Kron steps fitting at every step',
        text="""\
        The factors are fitted at every step for this many steps first.
        500, kron_torch's default.""",
        min=0,
        max=1000000000),
)

GRIDS = (
    Grid('lr',
         '1.5e-4 3e-4 6e-4',
         prompt='PSGD-Kron learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) PSGD-Kron cells train
        at, separated by spaces. The default is x0.5, x1 and x2 around
        kron_torch's 3e-4 (its update's RMS is clipped to 1.1, about
        AdamW's scale). Widen the grid when the report says the best
        point is on its edge."""),
    Grid('wd',
         '0.1',
         prompt='PSGD-Kron weight decays',
         text="""\
        Weight decays (CONFIG_WEIGHT_DECAY) PSGD-Kron cells train at,
        separated by spaces. The default is one value, 0.1 (kron_torch's
        default is 0); add more to tune it."""),
)



def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.kron import Kron
    from gpt2.optim.algorithms.optimizer_base import param_groups
    return Kron(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                beta1=cfg.kron_beta1, precond_lr=cfg.kron_precond_lr,
                max_triangular=cfg.kron_max_triangular, min_prob=cfg.kron_min_update_prob,
                flat_steps=cfg.kron_flat_steps)

METHOD = Optimizer(
    name='kron', order=140, title='PSGD-Kron',
    summary='PSGD-Kron: momentum preconditioned by fitted Kronecker factors',
    reference='Li (PSGD); evanatyourservice/kron_torch, kron_torch/kron.py',
    text="""\
    PSGD-Kron (Li; kron_torch): the momentum preconditioned by
    Kronecker factors, one triangular d x d matrix per dimension (a
    diagonal for very long ones and for vectors), fitted on random
    probes at every step for CONFIG_KRON_FLAT_STEPS steps and then
    ever more rarely. Its update's RMS is clipped to 1.1.""",
    matrix_text="""\
    Add PSGD-Kron cells.""",
    build=build, settings=SETTINGS,
    reads=("kron_beta1", "kron_precond_lr", "kron_max_triangular", "kron_min_update_prob",
           "kron_flat_steps"),
    tuning_grids=GRIDS, elementwise=False,
    # the momentum, plus a factor per dimension: d x d up to kron_max_triangular, else
    # (and for vectors) d; one tensor at a time, the probe, the two transformed copies,
    # the preconditioned step and a product (five copies of the largest tensor, as
    # measured), and the factors' grams
    state_floats=lambda cfg: (1, 1, 1),
    state_extra=lambda cfg, s: 4 * (s.vectors + sum(
        d * d if 1 < d <= cfg.kron_max_triangular else d
        for shape in s.matrix_shapes for d in shape)),
    state_words=("a d x d factor per dimension d up to KRON_MAX_TRIANGULAR of each tensor, "
                 "d floats beyond"),
    step_scratch=lambda device, s, cfg: 20 * s.largest + 12 * max(
        (d * d for shape in s.matrix_shapes for d in shape if d <= cfg.kron_max_triangular),
        default=0),
)
