"""SGD: SGD with momentum, optional Nesterov."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

SETTINGS = (
    Setting('sgd_momentum',
        0.9,
        'SGD momentum (0: plain SGD)',
        prompt='SGD momentum',
        text="""\
        Momentum factor in [0, 1). 0 gives plain SGD. Typical: 0.9.""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
    Setting('sgd_nesterov',
        True,
        'SGD Nesterov momentum',
        prompt='SGD Nesterov momentum',
        text="""\
        Use Nesterov's look-ahead form of momentum (needs momentum > 0)."""),
)

GRIDS = (
    Grid('lr',
         '0.03 0.1 0.3',
         prompt='SGD learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) SGD cells train at,
        separated by spaces. The default is x0.5, x1 and x2 around its
        usual 0.1; widen the grid when the report says the best
        point is on its edge. CONFIG_MIN_LR keeps its ratio to each."""),
    Grid('wd',
         '5e-4',
         prompt='SGD weight decays',
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) SGD cells train
        at, separated by spaces; every learning rate is tried with every
        decay. The default is one value, 5e-4: with decay decoupled, p shrinks by lr * wd per step, and
        SGD's rates are ~100x AdamW's; add more to tune it."""),
)



def check(cfg):
    if cfg.sgd_nesterov and cfg.sgd_momentum == 0:
        return ("sgd_nesterov", "Nesterov momentum needs sgd_momentum > 0; set a momentum or "
                "turn Nesterov off")
    return None


def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.optimizers import SGDW
    from gpt2.optim.algorithms.optimizer_base import param_groups
    return SGDW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                momentum=cfg.sgd_momentum, nesterov=cfg.sgd_nesterov)

METHOD = Optimizer(
    name='sgd', order=10, title='SGD',
    summary='SGD with momentum, optional Nesterov',
    reference="torch.optim.SGD (momentum, Nesterov), with kgpt's decoupled decay",
    text="""\
    Stochastic gradient descent with momentum and optional Nesterov
    momentum (torch.optim.SGD), with decoupled weight decay.""",
    matrix_text="""\
    Add SGD cells (momentum and Nesterov from the Optimizer menu).""",
    build=build, settings=SETTINGS, reads=('sgd_momentum', 'sgd_nesterov'),
    tuning_grids=GRIDS, check=check,
    state_floats=lambda cfg: (1, 1, 1) if cfg.sgd_momentum else (0, 0, 0),
    # foreach on CUDA: Nesterov's update is one new tensor per parameter
    step_scratch=lambda device, s, cfg: 4 * s.params if device == "cuda" else 8 * s.largest,
)
