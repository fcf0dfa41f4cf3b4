"""Adam: Adam (decay decoupled, as for every optimizer)."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

SETTINGS = (
    Setting('beta1',
        0.9,
        'Adam beta1 (first-moment decay)',
        prompt='Adam beta1',
        text="""\
        Decay rate of the first-moment (momentum) average, in [0, 1).
        Typical: 0.9. Muon and MARS use it for their AdamW part, ADOPT
        and AdEMAMix for their (fast) momentum.""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
    Setting('beta2',
        0.95,
        'Adam beta2 (second-moment decay)',
        prompt='Adam beta2',
        text="""\
        Decay rate of the second-moment average, in [0, 1). GPT-style
        pretraining uses 0.95; the PyTorch default is 0.999. Muon and MARS
        use it for their AdamW part.""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
    Setting('adam_eps',
        1e-08,
        'Adam epsilon',
        prompt='Adam epsilon',
        text="""\
        Added to the denominator for numerical stability. Typical: 1e-8.""",
        min=0.0,
        max=1.0,
        min_exclusive=True),
)

GRIDS = (
    Grid('lr',
         '3e-4 6e-4 1.2e-3',
         prompt='Adam learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) Adam cells train at,
        separated by spaces. The default is x0.5, x1 and x2 around its
        usual 6e-4; widen the grid when the report says the best
        point is on its edge. CONFIG_MIN_LR keeps its ratio to each."""),
    Grid('wd',
         '0.1',
         prompt='Adam weight decays',
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) Adam cells train
        at, separated by spaces; every learning rate is tried with every
        decay. The default is one value, 0.1; add more to tune it."""),
)



def build(model, cfg, device_type, total_steps=None):
    import torch
    from gpt2.optim.algorithms.optimizer_base import param_groups
    return torch.optim.Adam(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                            betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                            decoupled_weight_decay=True, fused=device_type == "cuda")

METHOD = Optimizer(
    name='adam', order=20, title='Adam',
    summary='Adam (decay decoupled, as for every optimizer)',
    reference='Kingma & Ba 2015; torch.optim.Adam(decoupled_weight_decay=True)',
    text="""\
    Adam (Kingma & Ba 2015), torch.optim.Adam. Because decay is
    decoupled for every optimizer, it takes the same steps as AdamW at
    equal settings; use it to reproduce runs that name Adam.""",
    matrix_text="""\
    Add Adam cells. With decoupled decay Adam takes the same steps as
    AdamW; include it only to reproduce work that names Adam.""",
    build=build, settings=SETTINGS, reads=('beta1', 'beta2', 'adam_eps'),
    tuning_grids=GRIDS,
)
