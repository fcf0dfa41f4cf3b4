"""AdamWAdv (AdamW + AMSGrad): AdamW with AMSGrad."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer

GRIDS = (
    Grid('lr',
         '3e-4 6e-4 1.2e-3',
         prompt='AdamWAdv learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) AdamWAdv cells train at,
        separated by spaces. The default is x0.5, x1 and x2 around its
        usual 6e-4; widen the grid when the report says the best
        point is on its edge. CONFIG_MIN_LR keeps its ratio to each."""),
    Grid('wd',
         '0.1',
         prompt='AdamWAdv weight decays',
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) AdamWAdv cells train
        at, separated by spaces; every learning rate is tried with every
        decay. The default is one value, 0.1; add more to tune it."""),
)



def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.optimizer_base import torch_adamw
    return torch_adamw(model, cfg, device_type, amsgrad=True)

METHOD = Optimizer(
    name='adamwadv', order=40, title='AdamWAdv (AdamW + AMSGrad)',
    summary='AdamW with AMSGrad',
    reference='Reddi et al. 2018 (AMSGrad), torch.optim.AdamW(amsgrad=True)',
    text="""\
    AdamW with AMSGrad: the denominator uses the running maximum of the
    second moment, so the step size never grows back after a spike.
    Costs one more state tensor per weight.""",
    matrix_text="""\
    Add AdamWAdv cells.""",
    build=build, settings=(), reads=('beta1', 'beta2', 'adam_eps'),
    tuning_grids=GRIDS,
    state_floats=lambda cfg: (3, 3, 3),  # + the running maximum of v
)
