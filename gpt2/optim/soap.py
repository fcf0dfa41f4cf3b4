"""SOAP: SOAP: Adam in the eigenbasis of Shampoo's Kronecker factors."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

SETTINGS = (
    Setting('soap_beta1',
        0.95,
        'SOAP beta1 (momentum, in the rotated space)',
        prompt='SOAP beta1',
        text="""\
        Momentum decay, in [0, 1), in the rotated space. 0.95 is the
        reference's default.""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
    Setting('soap_beta2',
        0.95,
        "SOAP beta2 (second moment and the Kronecker factors' decay)",
        prompt='SOAP beta2',
        text="""\
        Decay of the second moment and of the Kronecker factors, in
        [0, 1). 0.95 is the reference's default (its shampoo_beta follows
        beta2 unless set).""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
    Setting('soap_frequency',
        10,
        "steps between refreshes of SOAP's eigenbases",
        prompt='SOAP eigenbasis refresh interval (steps)',
        text="""\
        Every this many steps the bases are refreshed by one power
        iteration and a QR decomposition. 10, the reference's default;
        its paper finds SOAP robust to larger values.""",
        min=1,
        max=1000000),
    Setting('soap_max_dim',
        10000,
        ("longest dimension SOAP rotates (longer ones, such as the token table's rows, are left "
         "as they are)"),
        prompt='SOAP longest dimension rotated',
        text="""\
        Dimensions longer than this keep no factor and are not rotated:
        with 10000 (the reference's default) the token table's 50,304
        rows are left alone and its embedding dimension is rotated.""",
        min=1,
        max=1000000),
)

GRIDS = (
    Grid('lr',
         '1.5e-3 3e-3 6e-3',
         prompt='SOAP learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) SOAP cells train at,
        separated by spaces. The default is x0.5, x1 and x2 around the
        reference's 3e-3. Widen the grid when the report says the best
        point is on its edge."""),
    Grid('wd',
         '0.01',
         prompt='SOAP weight decays',
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) SOAP cells train at,
        separated by spaces. The default is the reference's 0.01."""),
)



def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.soap import Soap
    from gpt2.optim.algorithms.optimizer_base import param_groups
    return Soap(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                betas=(cfg.soap_beta1, cfg.soap_beta2), eps=cfg.adam_eps,
                frequency=cfg.soap_frequency, max_dim=cfg.soap_max_dim)

METHOD = Optimizer(
    name='soap', order=130, title='SOAP',
    summary="SOAP: Adam in the eigenbasis of Shampoo's Kronecker factors",
    reference='Vyas et al. 2024; nikhilvyas/SOAP, soap.py',
    text="""\
    SOAP (Vyas et al. 2024): Adam run in the eigenbasis of Shampoo's
    Kronecker factors (EMAs of G G^T and G^T G per weight matrix),
    the bases refreshed every CONFIG_SOAP_FREQUENCY steps. Keeps two
    d x d matrices per dimension d of each weight besides Adam's
    moments, and an eigendecomposition per matrix at the start.""",
    matrix_text="""\
    Add SOAP cells.""",
    build=build, settings=SETTINGS,
    reads=("soap_beta1", "soap_beta2", "adam_eps", "soap_frequency", "soap_max_dim"),
    # the reference decays after its update, and its first step only measures
    decays="after", first_step_moves=False,
    tuning_grids=GRIDS, elementwise=False,
    # Adam's two moments (in the rotated space), plus a factor and a basis, d x d each,
    # for every dimension d <= soap_max_dim of every matrix; one tensor at a time, the
    # projections there and back (four float32 copies of it) and a new factor
    state_extra=lambda cfg, s: 8 * sum(d * d for shape in s.matrix_shapes for d in shape
                                       if d <= cfg.soap_max_dim),
    state_words=("a factor and a basis, d x d each, per dimension d up to SOAP_MAX_DIM of "
                 "each matrix"),
    step_scratch=lambda device, s, cfg: 16 * s.largest + 4 * max(
        (d * d for shape in s.matrix_shapes for d in shape if d <= cfg.soap_max_dim),
        default=0),
)
