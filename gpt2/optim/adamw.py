"""AdamW: AdamW, fused on CUDA (cautious: kgpt's own)."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting, adam_fused, adam_scratch

SETTINGS = (
    Setting('cautious',
        False,
        ("cautious update: only the elements whose step agrees in sign with the gradient move, "
         "rescaled to the tensor's size (Liang et al. 2024; C-AdamW, C-Lion)"),
        prompt='Cautious update (C-AdamW, C-Lion)',
        text="""\
        Cautious optimizers (Liang et al. 2024): an element moves only
        where its update agrees in sign with its gradient, and the
        elements that move are scaled up by the share that do not (per
        tensor), as the reference C-Optim code does: by
        1/max(kept fraction, 1e-3) for AdamW, numel/(kept + 1) for Lion.
        AdamW then runs kgpt's own code, not torch's fused kernel. Needs
        whole tensors: refused under FSDP.""",
        omit_default=True),
    # modded-nanogpt's track 3 gives the parameters outside the transformer blocks
    # ("aux" there) rates, betas and a decay of their own; these settings say so for
    # AdamW and for Muon's AdamW part (gpt2/optim/algorithms/optimizer_base.py
    # aux_groups).
    Setting('param_groups',
        'kgpt',
        ("parameter groups: kgpt's (one rate; decay on every matrix) or track 3's (the "
         "embeddings, the head and the vectors each at a rate of their own, with betas and "
         "a decay of their own)"),
        prompt='Parameter groups',
        text="""\
        How the parameters outside the transformer blocks' matrices are
        optimized, by AdamW and by Muon's AdamW part.""",
        omit_default=True,
        choices={
            'kgpt': ("kgpt's: one rate, decay on every matrix, none on vectors",
                """\
            Every parameter at CONFIG_LEARNING_RATE with CONFIG_BETA1 and
            CONFIG_BETA2; matrices (embeddings included) decayed by
            CONFIG_WEIGHT_DECAY, biases and norm gains not."""),
            'track3': ("track 3's: embeddings, head and vectors with rates of their own",
                """\
            As modded-nanogpt's optimization benchmark: the blocks' matrices
            as kgpt's (Muon, or AdamW at CONFIG_LEARNING_RATE with
            CONFIG_BETA1/2 and CONFIG_WEIGHT_DECAY); the token (and position)
            tables at CONFIG_AUX_EMBEDDING_LR, an untied head at
            CONFIG_AUX_HEAD_LR, biases and norm gains at CONFIG_AUX_VECTOR_LR,
            all three with CONFIG_AUX_BETA1/2 and decayed by
            CONFIG_AUX_WEIGHT_DECAY (vectors too, as torch's AdamW over
            them does)."""),
        }),
    Setting('aux_embedding_lr',
        0.7,
        "track 3 groups: peak learning rate of the token and position tables",
        prompt='Embedding learning rate (track 3 groups)',
        text="""\
        Peak rate of the embedding tables; the schedule scales it like
        CONFIG_LEARNING_RATE. Track 3's tuned Muon baseline: 0.7.""",
        min=0.0, max=100.0, min_exclusive=True,
        when=(('param_groups', ('track3',)),)),
    Setting('aux_head_lr',
        0.004,
        "track 3 groups: peak learning rate of an untied output head",
        prompt='Head learning rate (track 3 groups)',
        text="""\
        Peak rate of the output head when it is not tied to the
        embedding. Track 3's tuned Muon baseline: 0.004.""",
        min=0.0, max=100.0, min_exclusive=True,
        when=(('param_groups', ('track3',)),)),
    Setting('aux_vector_lr',
        0.015,
        "track 3 groups: peak learning rate of biases and norm gains",
        prompt='Vector learning rate (track 3 groups)',
        text="""\
        Peak rate of every bias and norm gain. Track 3's tuned Muon
        baseline: 0.015.""",
        min=0.0, max=100.0, min_exclusive=True,
        when=(('param_groups', ('track3',)),)),
    Setting('aux_beta1',
        0.8,
        "track 3 groups: Adam beta1 of the embeddings, head and vectors",
        prompt='Aux beta1 (track 3 groups)',
        text="""\
        First-moment decay of the groups outside the blocks' matrices.
        Track 3: 0.8.""",
        min=0.0, max=1.0, max_exclusive=True,
        when=(('param_groups', ('track3',)),)),
    Setting('aux_beta2',
        0.95,
        "track 3 groups: Adam beta2 of the embeddings, head and vectors",
        prompt='Aux beta2 (track 3 groups)',
        text="""\
        Second-moment decay of the groups outside the blocks' matrices.
        Track 3: 0.95.""",
        min=0.0, max=1.0, max_exclusive=True,
        when=(('param_groups', ('track3',)),)),
    Setting('aux_weight_decay',
        0.001,
        "track 3 groups: decoupled decay of the embeddings, head and vectors",
        prompt='Aux weight decay (track 3 groups)',
        text="""\
        p <- p * (1 - lr * wd) with each group's own rate, for the
        embeddings, the head and the vectors alike. Track 3's tuned Muon
        baseline: 0.001; its AdamW baseline: 0.""",
        min=0.0, max=10.0,
        when=(('param_groups', ('track3',)),)),
)

GRIDS = (
    Grid('lr',
         '3e-4 6e-4 1.2e-3',
         prompt='AdamW learning rates',
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) AdamW cells train at,
        separated by spaces. The default is x0.5, x1 and x2 around its
        usual 6e-4; widen the grid when the report says the best
        point is on its edge. CONFIG_MIN_LR keeps its ratio to each."""),
    Grid('wd',
         '0.1',
         prompt='AdamW weight decays',
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) AdamW cells train
        at, separated by spaces; every learning rate is tried with every
        decay. The default is one value, 0.1; add more to tune it."""),
)



def build(model, cfg, device_type, total_steps=None):
    import torch
    from gpt2.optim.algorithms.optimizer_base import aux_groups, param_groups, torch_adamw
    if cfg.param_groups == "track3":
        # the blocks' matrices at the run's rate, betas and decay; the rest track 3's
        blocks, rest = aux_groups(model, cfg)
        groups = [{"params": blocks, "weight_decay": cfg.weight_decay}, *rest]
    else:
        groups = param_groups(model, cfg.weight_decay)
    groups = [g for g in groups if g["params"]]
    if cfg.cautious:
        from gpt2.optim.algorithms.adam_variants import CautiousAdamW
        return CautiousAdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2),
                             eps=cfg.adam_eps)
    if cfg.param_groups == "track3":
        return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2),
                                 eps=cfg.adam_eps, fused=adam_fused(device_type, cfg))
    return torch_adamw(model, cfg, device_type)

METHOD = Optimizer(
    name='adamw', order=30, title='AdamW', default=True,
    summary="AdamW, fused on CUDA (cautious: kgpt's own)",
    reference=('Loshchilov & Hutter 2019, torch.optim.AdamW; cautious: Liang et al. '
               '2024, kyleliang919/C-Optim'),
    text="""\
    Adam with decoupled weight decay (Loshchilov & Hutter 2019), the
    GPT-2 standard. Uses the fused CUDA kernel on NVIDIA GPUs.""",
    matrix_text="""\
    Add AdamW cells: the usual baseline.""",
    build=build, settings=SETTINGS,
    reads=('beta1', 'beta2', 'adam_eps', 'cautious', 'param_groups', 'aux_embedding_lr',
           'aux_head_lr', 'aux_vector_lr', 'aux_beta1', 'aux_beta2', 'aux_weight_decay'),
    tuning_grids=GRIDS,
    # torch's fused kernel for a bfloat16 table (config.methods.adam_fused); the cautious
    # update is kgpt's own code, untested on one
    bf16_table=lambda cfg: not cfg.cautious,
    # cautious, one tensor at a time: its denominator, mask and masked moment
    # (torch's, fused or not: adam_scratch)
    step_scratch=lambda device, s, cfg: (12 * s.largest if cfg.cautious else
                                         adam_scratch(device, s, cfg)),
)
