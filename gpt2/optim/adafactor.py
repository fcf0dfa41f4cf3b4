"""Adafactor: Adam's second moment kept as row and column averages, steps relative to
each weight's size (Shazeer & Stern 2018), as torch.optim.Adafactor computes it."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

SETTINGS = (
    Setting("adafactor_lr", 1e-2,
            "Adafactor's peak rate: the ceiling of its relative step, min(rate, 1/sqrt(t)), "
            "which scales each weight's RMS",
            prompt="Adafactor learning rate (relative step ceiling)",
            text="""\
            Adafactor moves each weight matrix by about rate x its own RMS
            (its relative step is min(rate, 1/sqrt(t))), so AdamW's absolute
            rate of 6e-4 would leave it nearly still: it has a rate of its
            own, which the schedule scales like CONFIG_LEARNING_RATE. 1e-2 is
            torch.optim.Adafactor's default, the paper's relative step.""",
            min=0.0, max=10.0, min_exclusive=True),
    Setting("adafactor_weight_decay", 0.0,
            "Adafactor's decoupled weight decay on 2-D weights (p <- p * (1 - lr * wd), lr its "
            "own rate)",
            prompt="Adafactor weight decay",
            text="""\
            Decoupled weight decay of the 2-D weights, p <- p * (1 - lr * wd)
            with Adafactor's own rate (CONFIG_ADAFACTOR_LR). Its own setting
            because that rate is ~17x AdamW's: the run's CONFIG_WEIGHT_DECAY
            (0.1) would decay 17x harder. 0 is torch.optim.Adafactor's
            default.""",
            min=0.0, max=10.0),
    Setting("adafactor_beta2_decay", -0.8,
            "Adafactor's second-moment decay exponent: beta2 at step t is 1 - t^this",
            prompt="Adafactor beta2 decay exponent",
            text="""\
            The second-moment averages weigh step t's gradient by t^c, so
            beta2 = 1 - t^c grows towards 1 as training goes on. -0.8 is the
            paper's and torch's default; at most 0.""",
            min=-1e6, max=0.0),
    Setting("adafactor_eps2", 1e-3,
            "Adafactor's floor under a weight's RMS in its relative step",
            prompt="Adafactor relative-step floor (eps2)",
            text="""\
            A weight whose RMS is below this steps as if it were this large,
            so weights at 0 can move. 1e-3, the paper's and torch's default.""",
            min=0.0, max=1.0),
    Setting("adafactor_d", 1.0,
            "Adafactor's update clipping: an update whose RMS exceeds this is scaled down to it",
            prompt="Adafactor update clipping threshold (d)",
            text="""\
            Each tensor's update is divided by max(1, RMS(update) / d). 1.0,
            the paper's and torch's default; at least 1.""",
            min=1.0, max=1e6),
)

GRIDS = (
    Grid("lr", "5e-3 1e-2 2e-2", prompt="Adafactor learning rates",
         text="""\
         Peak rates of Adafactor (CONFIG_ADAFACTOR_LR: the ceiling of its
         relative step), separated by spaces. Its own grid, x0.5, x1 and x2
         around torch's 1e-2: the rate scales each weight's RMS, so AdamW's
         rates do not transfer. Widen the grid when the report says the best
         point is on its edge."""),
    Grid("wd", "0", prompt="Adafactor weight decays",
         text="""\
         Weight decays of Adafactor (CONFIG_ADAFACTOR_WEIGHT_DECAY), separated
         by spaces; every rate is tried with every decay. The default is one
         value, torch's 0; add more to tune it."""),
)


def build(model, cfg, device_type, total_steps=None):
    import torch

    from gpt2.optim.algorithms.optimizer_base import param_groups
    from gpt2.optim.algorithms.optimizers import LR_SCALE
    groups = param_groups(model, cfg.adafactor_weight_decay)
    # its own rate: the schedule's rate times LR_SCALE is each group's
    for group in groups:
        group.update(lr=cfg.adafactor_lr, **{LR_SCALE: cfg.adafactor_lr / cfg.learning_rate})
    return torch.optim.Adafactor(groups, lr=cfg.adafactor_lr,
                                 beta2_decay=cfg.adafactor_beta2_decay,
                                 eps=(None, cfg.adafactor_eps2), d=cfg.adafactor_d)


METHOD = Optimizer(
    name="adafactor", order=155, title="Adafactor",
    summary="Adafactor: factored second moment, steps relative to each weight's size",
    reference="Shazeer & Stern 2018, arXiv:1804.04235; the code: torch.optim.Adafactor "
              "(torch/optim/_adafactor.py, torch 2.13)",
    text="""\
    Adafactor (Shazeer & Stern 2018), torch.optim.Adafactor: Adam's
    second moment of each matrix kept as a row and a column average
    (rows + cols floats instead of rows x cols), no first moment, and
    steps relative to each weight's RMS, min(rate, 1/sqrt(t)), the
    update clipped by its own RMS. The least optimizer state here after
    SGD. Its rate is its own (CONFIG_ADAFACTOR_LR), as is its decay.""",
    matrix_text="""\
    Add Adafactor cells (its own rate and decay: CONFIG_ADAFACTOR_LR,
    CONFIG_ADAFACTOR_WEIGHT_DECAY).""",
    build=build, settings=SETTINGS,
    reads=("adafactor_lr", "adafactor_weight_decay", "adafactor_beta2_decay", "adafactor_eps2",
           "adafactor_d"),
    tuning_grids=GRIDS,
    tuned=lambda cfg: {"lr": "adafactor_lr", "wd": "adafactor_weight_decay"},
    relative_step=True,
    # a row and a column average per matrix, a second moment per vector element
    state_floats=lambda cfg: (0, 0, 1),
    state_extra=lambda cfg, s: 4 * sum(shape[-2] + shape[-1] for shape in s.matrix_shapes),
    state_words="a float per row and per column of each matrix",
    # one tensor at a time on the CPU: the variance estimate, which becomes the update;
    # for all at once (foreach) on CUDA, the estimates and the updates
    step_scratch=lambda device, s, cfg: 8 * s.params if device == "cuda" else 8 * s.largest,
)
