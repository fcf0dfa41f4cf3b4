"""AdamWSpam (SPAM): AdamW with SPAM spike clipping, momentum reset and re-warmup."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

SETTINGS = (
    Setting('spam_threshold',
        5000.0,
        'SPAM spike threshold theta: clip where g^2 > theta*v (0: no clipping)',
        prompt='SPAM spike threshold (theta)',
        text="""\
        A gradient element g is a spike when g^2 > theta * v, v being the
        second moment after the previous step; it is clipped to
        sign(g) * sqrt(theta * v). The SPAM paper uses 5000. "0" disables
        clipping.""",
        min=0.0,
        max=1000000000000.0),
    Setting('spam_reset_interval',
        500,
        'SPAM momentum reset every this many steps (0: never)',
        prompt='SPAM momentum reset interval (steps)',
        text="""\
        Both Adam moments are zeroed at every step that is a multiple of
        this (the paper's Delta T, 500); bias correction keeps counting
        from the start, as in the reference. 0 never resets.""",
        min=0,
        max=1000000000),
    Setting('spam_warmup',
        150,
        'SPAM cosine re-warmup steps after each reset (0: none)',
        prompt='SPAM re-warmup after a reset (steps)',
        text="""\
        From the step that resets the moments, the step size climbs back
        from 0.01 of itself along a cosine over this many steps, then stays
        whole until the next reset. 0 disables it. Must not exceed the
        reset interval.

        150 is SPAM.py's default for this (its warmup_steps) and the
        paper's N. The authors' training script (torchrun_main.py) passes
        its learning-rate warmup there instead, --warmup_steps 1000, with
        resets every 500 steps: the cosine never ends, and after the first
        reset the step averages 0.19 of itself over each interval, against
        0.85 with 150 here. kgpt refuses a re-warmup longer than the
        interval, so that schedule cannot be set.""",
        min=0,
        max=1000000000),
    Setting('spam_clip_delay',
        20,
        ("SPAM clips no spike in the first steps of training and after each reset, while the "
         "second moment accumulates (the reference's grad_accu_steps)"),
        prompt='SPAM steps without spike clipping after a start or reset',
        text="""\
        Spikes are measured against the second moment v, which needs a
        few steps to accumulate: in the first this many steps of training,
        and in as many after each reset, nothing is clipped (the
        reference's grad_accu_steps, 20). At least 2: at step 1 (and, with
        0, at each reset) v is 0 everywhere, and the reference's rule
        clips every gradient to 0 there, so v stays 0 and the optimizer
        never moves. Must be below the reset interval when clipping is on.""",
        min=2,
        max=1000000000,
        why=("at step 1 the second moment holds no gradient yet, so no spike can be measured: the"
             " reference clips every gradient to 0 there, and the optimizer never moves")),
    Setting('spam_clip_unseen',
        False,
        ("SPAM clips elements whose second moment is exactly 0 (no history) to 0, as the "
         "reference does: their moment then stays 0, so a weight whose state pruning cleared "
         "(movement pruning regrows such weights) never learns until the next reset (off: only "
         "elements with a second moment are clipped)"),
        prompt='SPAM clips elements with no second moment yet (reference)',
        text="""\
        Whether an element whose second moment v is exactly 0 is clipped.
        It has no history, so no gradient of it can be called a spike.
        The reference (SPAM.py) clips it anyway, to sqrt(theta * 0) = 0;
        its v then stays 0 and so does every later gradient of it, until
        the next momentum reset. Such elements are weights whose optimizer
        state was cleared, or zeroed by a reset, while pruning held them at
        0 and that then grow back (movement pruning): with
        CONFIG_MOVEMENT_FREEZE_PRUNED=y, which clears a pruned weight's
        state, all 42,468 weights regrown by step 200 of a measured run
        still had v = 0 there (none of 32,083 with n); with movement's
        default rule, the weights a reset found pruned.
        An embedding row whose token first appears late would be another
        (not with GPT-2's tied embeddings).

        n (default): only elements with v > 0 are clipped. y: as the
        reference."""),
)

GRIDS = (
    Grid('lr',
         '3e-4 6e-4 1.2e-3',
         prompt='AdamWSpam learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) AdamWSpam cells train at,
        separated by spaces. The default is x0.5, x1 and x2 around its
        usual 6e-4; widen the grid when the report says the best
        point is on its edge. CONFIG_MIN_LR keeps its ratio to each."""),
    Grid('wd',
         '0.1',
         prompt='AdamWSpam weight decays',
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) AdamWSpam cells train
        at, separated by spaces; every learning rate is tried with every
        decay. The default is one value, 0.1; add more to tune it."""),
)



def check(cfg):
    if cfg.spam_reset_interval and cfg.spam_warmup > cfg.spam_reset_interval:
        return ("spam_warmup", f"{cfg.spam_warmup} re-warmup steps exceed the reset interval "
                f"spam_reset_interval={cfg.spam_reset_interval}")
    # (without clipping, spam_threshold 0, the delay does nothing: any interval goes)
    if (cfg.spam_reset_interval and cfg.spam_threshold
            and cfg.spam_clip_delay >= cfg.spam_reset_interval):
        return ("spam_clip_delay", f"{cfg.spam_clip_delay} steps without clipping after each "
                "reset leave none with it: keep it below "
                f"spam_reset_interval={cfg.spam_reset_interval}")
    return None


def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.optimizers import AdamWSpam
    from gpt2.optim.algorithms.optimizer_base import param_groups
    return AdamWSpam(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                     betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                     threshold=cfg.spam_threshold, reset_interval=cfg.spam_reset_interval,
                     warmup=cfg.spam_warmup, clip_delay=cfg.spam_clip_delay,
                     clip_unseen=cfg.spam_clip_unseen)

METHOD = Optimizer(
    name='adamwspam', order=50, title='AdamWSpam (SPAM)',
    summary='AdamW with SPAM spike clipping, momentum reset and re-warmup',
    reference=("Huang et al. 2025, 'SPAM: Spike-Aware Adam with Momentum Reset'; the "
               "authors' SPAM-Optimizer repository, SPAM.py"),
    text="""\
    SPAM (Huang et al. 2025): AdamW plus spike-aware clipping of
    gradient elements against the second moment, a reset of both
    moments every CONFIG_SPAM_RESET_INTERVAL steps, and a cosine
    learning-rate re-warmup after each reset.""",
    matrix_text="""\
    Add AdamWSpam cells (spike clipping and momentum resets, set in the
    Optimizer menu).""",
    build=build, settings=SETTINGS,
    reads=("beta1", "beta2", "adam_eps", "spam_threshold", "spam_reset_interval",
           "spam_warmup", "spam_clip_delay", "spam_clip_unseen"),
    tuning_grids=GRIDS, check=check,
    # the clip's bound and clipped gradients, one float32 each for every parameter
    # (foreach over all at once)
    step_scratch=lambda device, s, cfg: 8 * s.params,
)
