"""AdamWPrune (AdamW whose state drives pruning): AdamW whose moments drive state pruning."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer

GRIDS = (
    Grid('lr',
         '3e-4 6e-4 1.2e-3',
         prompt='AdamWPrune learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) AdamWPrune cells train at,
        separated by spaces. The default is x0.5, x1 and x2 around its
        usual 6e-4; widen the grid when the report says the best
        point is on its edge. CONFIG_MIN_LR keeps its ratio to each."""),
    Grid('wd',
         '0.1',
         prompt='AdamWPrune weight decays',
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) AdamWPrune cells train
        at, separated by spaces; every learning rate is tried with every
        decay. The default is one value, 0.1; add more to tune it."""),
)



def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.optimizer_base import torch_adamw
    return torch_adamw(model, cfg, device_type)

METHOD = Optimizer(
    name='adamwprune', order=60, title='AdamWPrune (AdamW whose state drives pruning)',
    summary='AdamW whose moments drive state pruning',
    reference=("AdamWPrune (lib/optimizers.py): torch's AdamW, its moments read by "
               'state pruning'),
    text="""\
    AdamW whose first and second moments rank weights for pruning
    (state pruning). Pairs only with no pruning, where it is plain
    AdamW, or with state pruning.""",
    matrix_text="""\
    Add AdamWPrune cells. AdamWPrune pairs only with no pruning and
    with state pruning, so enable at least one of those.""",
    build=build, settings=(), reads=('beta1', 'beta2', 'adam_eps'),
    tuning_grids=GRIDS, pruning=(),  # the dense baseline and state pruning, which demands it
)
