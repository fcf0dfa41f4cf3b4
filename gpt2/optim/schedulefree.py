"""Schedule-Free AdamW: evaluated at an average of its iterates, no learning-rate decay."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

SETTINGS = (
    Setting('schedulefree_decay',
        False,
        ("Schedule-Free follows the run's whole schedule, decay included (off: its warmup, then "
         "the peak rate, as the reference)"),
        prompt='Schedule-Free follows the whole learning-rate schedule',
        text="""\
        n (the reference): Schedule-Free takes the schedule's warmup and
        then stays at the peak rate; its average of the iterates does what
        a decay would. y: it follows CONFIG_LR_SCHEDULE to the end like
        every other optimizer (a deviation, for comparisons that give every
        optimizer the same schedule)."""),
)

GRIDS = (
    Grid('lr',
         '6e-4 1.2e-3 2.4e-3',
         prompt='Schedule-Free AdamW learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) Schedule-Free cells
        train at, separated by spaces. The default is x1, x2 and x4
        AdamW's usual 6e-4: with no decay it takes higher rates (the
        package's default is 2.5e-3). Widen the grid when the report says
        the best point is on its edge."""),
    Grid('wd',
         '0.1',
         prompt='Schedule-Free AdamW weight decays',
         text="""\
        Weight decays (CONFIG_WEIGHT_DECAY) Schedule-Free cells train at,
        separated by spaces; every learning rate is tried with every
        decay. The default is one value, 0.1; add more to tune it."""),
)



def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.schedule_free import ScheduleFreeAdamW
    from gpt2.optim.algorithms.optimizer_base import param_groups
    return ScheduleFreeAdamW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                             betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)

METHOD = Optimizer(
    name='schedulefree', order=150, title='Schedule-Free AdamW', packages=('schedulefree',),
    summary=("Schedule-Free AdamW: evaluated at an average of its iterates, no learning-rate "
             "decay needed"),
    reference=("Defazio et al. 2024; Meta's schedulefree 1.4.1 "
               '(adamw_schedulefree_reference.py)'),
    text="""\
    Schedule-Free AdamW (Defazio et al. 2024), Meta's reference
    package: no learning-rate decay, the model evaluated and kept is
    an average of the iterates. Takes the schedule's warmup, then its
    peak rate (CONFIG_SCHEDULEFREE_DECAY to follow the whole
    schedule). Its checkpoints hold both the averaged and the training
    weights. Not under FSDP.""",
    matrix_text="""\
    Add Schedule-Free AdamW cells (they keep the warmup and then the
    peak rate unless CONFIG_SCHEDULEFREE_DECAY).""",
    build=build, settings=SETTINGS, reads=('beta1', 'beta2', 'adam_eps', 'schedulefree_decay'),
    decays="inside",  # at y, through z and the average, as the reference
    tuning_grids=GRIDS, elementwise=False,
    whole="saves its averaged weights from whole tensors only",
    # its warmup, then its peak: it averages instead of decaying
    holds_peak=lambda get: not get("schedulefree_decay", False),
    # z and the second moment; the reference's foreach step: a denominator for every
    # parameter at once (the gradients are normalised in place)
    step_scratch=lambda device, s, cfg: 4 * s.params,
)
