"""Muon: Muon on block matrices, AdamW on the rest."""

from __future__ import annotations

from gpt2.config.methods import widened_table, Grid, Optimizer, Setting

SETTINGS = (
    Setting('muon_scale',
        'shape',
        ("scale of Muon's orthogonalized update: the reference's sqrt(max(1, rows/cols)) with its"
         " own learning rate and decay, or Moonlight's 0.2*sqrt(max(rows, cols)) with AdamW's"),
        prompt='Muon update scale',
        text="""\
        How large Muon's orthogonalized update of each block matrix is,
        and so which learning rate and weight decay it takes.""",
        choices={
            'shape': ("reference: sqrt(max(1, rows/cols)), Muon's own LR and decay",
                """\
            As the reference muon.py and the modded-nanogpt speedrun: the
            update is scaled by sqrt(max(1, rows/cols)) and the block matrices
            use CONFIG_MUON_LR and CONFIG_MUON_WEIGHT_DECAY."""),
            'moonlight': ("Moonlight: 0.2 * sqrt(max(rows, cols)), AdamW's LR and decay",
                """\
            Liu et al. 2025 ("Muon is Scalable for LLM Training"): the update
            is scaled to about AdamW's update RMS, 0.2 * sqrt(max(rows, cols)),
            so the block matrices take CONFIG_LEARNING_RATE and
            CONFIG_WEIGHT_DECAY like the rest of the model. A deviation from
            the reference, for comparisons that transfer AdamW's settings."""),
        }),
    Setting('muon_lr',
        0.02,
        'Muon peak learning rate for block matrices',
        prompt='Muon learning rate',
        text="""\
        Peak learning rate of the block matrices updated by Muon; the
        schedule scales it like CONFIG_LEARNING_RATE, which the AdamW part
        uses. The reference and the speedrun use 0.02-0.05.""",
        min=0.0,
        max=10.0,
        min_exclusive=True,
        when=(('muon_scale', ('shape',)),)),
    Setting('muon_weight_decay',
        0.01,
        'Muon decoupled weight decay for block matrices (p <- p * (1 - muon_lr * wd))',
        prompt='Muon weight decay',
        text="""\
        Decoupled weight decay of the block matrices:
        p <- p * (1 - lr * wd) with Muon's learning rate. Its own setting
        because Muon's rate is ~30x AdamW's: the run's
        CONFIG_WEIGHT_DECAY (0.1) would decay them ~33x more than AdamW
        decays its weights. 0.01 is the reference muon.py's example.""",
        min=0.0,
        max=10.0,
        when=(('muon_scale', ('shape',)),)),
    Setting('muon_momentum',
        0.95,
        'Muon momentum',
        prompt='Muon momentum',
        text="""\
        Momentum of the Muon part, in [0, 1). Typical: 0.95.""",
        min=0.0,
        max=1.0,
        max_exclusive=True),
    Setting('muon_nesterov',
        True,
        'Muon Nesterov momentum',
        prompt='Muon Nesterov momentum',
        text="""\
        Orthogonalize the Nesterov look-ahead of the momentum (the
        reference default)."""),
    Setting('muon_ns_steps',
        5,
        'Muon Newton-Schulz iterations',
        prompt='Muon Newton-Schulz iterations',
        text="""\
        Iterations of the quintic Newton-Schulz orthogonalization. Five is
        the reference setting.""",
        min=1,
        max=20),
    Setting('muon_split_qkv',
        True,
        ("orthogonalize attention's Q, K and V weights as three matrices, as the reference does "
         "(off: the fused 3C x C one)"),
        prompt='Muon orthogonalizes Q, K and V separately',
        text="""\
        The attention weight here is one fused (3C x C) matrix; the
        reference keeps Q, K and V as three C x C matrices, each
        orthogonalized on its own. Say n to orthogonalize the fused matrix
        as one, a deviation: a large gradient in one of Q, K, V then
        shrinks the others' updates."""),
    Setting('muon_coefficients',
        'jordan',
        ("Muon's Newton-Schulz quintics: its own, repeated (jordan), the Polar Express sequence, "
         "or track 3's convergent one"),
        prompt='Muon Newton-Schulz coefficients',
        text="""\
        Which quintics the Newton-Schulz iteration applies.""",
        omit_default=True,
        choices={
            'jordan': ('reference: (3.4445, -4.7750, 2.0315) at every iteration',
                """\
            Muon's own quintic, the same at every iteration (muon.py and the
            speedrun)."""),
            'polar-express': ('Polar Express: the best quintic for each iteration',
                """\
            Amsel et al. 2025: a sequence of quintics, each optimal for the
            singular values the previous ones leave, computed as the authors'
            polar_express.py does (singular values from 1e-3, 1 % safety
            factor, cushion 0.02); the input is divided by 1.01 times its
            norm. Closer to U V^T in as many iterations."""),
            'track3': ("track 3's: (2, -1.5, 0.5) at every iteration, converging to U V^T",
                """\
            modded-nanogpt's optimization benchmark (track 3,
            train_gpt_simple.py): the quintic 2x - 1.5x^3 + 0.5x^5, which
            takes every singular value to 1 itself, slowly; track 3 runs 12
            iterations (CONFIG_MUON_NS_STEPS=12)."""),
        }),
    Setting('muon_normalization',
        'none',
        ("what Muon does to an orthogonalized update before scaling it: nothing, or NorMuon's "
         "per-row normalisation"),
        prompt='Muon update normalization',
        text="""\
        What Muon does to each orthogonalized update before scaling it.""",
        omit_default=True,
        choices={
            'none': ('none (reference Muon)',
                """\
            The orthogonalized update as it is."""),
            'normuon': ('NorMuon: per-row second-moment normalization',
                """\
            NorMuon (Li et al. 2025): each row of the update is divided by
            the square root of an EMA of its mean square
            (CONFIG_MUON_NORMUON_BETA2), then the matrix is scaled back to the
            norm it had, as the authors' normuon.py. One number per row of
            state."""),
        }),
    Setting('muon_normuon_beta2',
        0.95,
        "NorMuon beta2: decay of each row's mean-square average",
        prompt='NorMuon beta2',
        text="""\
        Decay of each row's mean-square average, in [0, 1). 0.95 is the
        reference's default.""",
        min=0.0,
        max=1.0,
        max_exclusive=True,
        when=(('muon_normalization', ('normuon',)),)),
)

GRIDS = (
    Grid('lr',
         '0.01 0.02 0.04',
         prompt='Muon learning rates',
         text="""\
        Peak learning rates of the block matrices Muon updates
        (CONFIG_MUON_LR; with the Moonlight scale, CONFIG_LEARNING_RATE,
        which Muon then shares with its AdamW part), separated by spaces.
        Muon's own grid: its reference rate 0.02 is ~30x AdamW's. Its
        AdamW part (embeddings, head, norms, biases) has a grid of its own
        below, so neither rate is borrowed from another optimizer.""",
         defaults=(('3e-4 6e-4 1.2e-3', 'MUON_SCALE_MOONLIGHT'),), part="matrices"),
    Grid('wd',
         '0.01',
         prompt='Muon weight decays',
         text="""\
        Weight decays of the block matrices (CONFIG_MUON_WEIGHT_DECAY;
        with the Moonlight scale, CONFIG_WEIGHT_DECAY), separated by
        spaces. Muon's own: decay is p <- p * (1 - lr * wd) with Muon's
        rate, so AdamW's 0.1 would decay ~33x harder.""",
         defaults=(('0.1', 'MUON_SCALE_MOONLIGHT'),)),
    Grid('adam_lr',
         '3e-4 6e-4 1.2e-3',
         prompt="Muon's AdamW-part learning rates",
         text="""\
        Peak learning rates (CONFIG_LEARNING_RATE) of the parameters Muon
        leaves to AdamW: embeddings, head, LayerNorm gains and biases.
        Every point of Muon's own grid is tried with each. Measured on
        the CPU tuning preset, this rate moved tuned Muon's final loss by
        0.27, more than the differences between optimizers, so it is
        tuned like any other rate. CONFIG_MIN_LR keeps its ratio to each.
        (With the Moonlight scale the two parts share one rate: the grid
        above.)""",
         depends='!MUON_SCALE_MOONLIGHT', part="the rest"),
    Grid('adam_wd',
         '0.1',
         prompt="Muon's AdamW-part weight decays",
         text="""\
        Decoupled weight decays (CONFIG_WEIGHT_DECAY) of the 2-D
        parameters Muon leaves to AdamW (embeddings, an untied head).
        The default is one value, 0.1; add more to tune it.""",
         depends='!MUON_SCALE_MOONLIGHT'),
)



def tuned(cfg) -> dict[str, str]:
    # Moonlight's scale shares one rate and decay between the block matrices and the
    # AdamW part; the shape scale gives each its own.
    if cfg.muon_scale == "shape":
        return {"lr": "muon_lr", "wd": "muon_weight_decay",
                "adam_lr": "learning_rate", "adam_wd": "weight_decay"}
    return {"lr": "learning_rate", "wd": "weight_decay"}


def build(model, cfg, device_type, total_steps=None):
    from gpt2.optim.algorithms.optimizer_base import is_hidden_matrix
    from gpt2.optim.algorithms.optimizers import LR_SCALE, Muon, is_fused_qkv
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    hidden = [(n, p) for n, p in named if is_hidden_matrix(n, p)]
    other2d = [p for n, p in named if not is_hidden_matrix(n, p) and p.dim() >= 2]
    vectors = [p for n, p in named if p.dim() < 2]
    # Moonlight's scale lets the matrices share AdamW's rate and decay; otherwise they
    # have their own (the reference's lr 0.02 is ~30x AdamW's).
    moonlight = cfg.muon_scale == "moonlight"
    lr = cfg.learning_rate if moonlight else cfg.muon_lr
    decay = cfg.weight_decay if moonlight else cfg.muon_weight_decay
    # LR_SCALE: the schedule's rate times it is each group's rate, so Muon's peak is
    # its own while the AdamW groups peak at learning_rate.
    matrices = {"orthogonal": True, "weight_decay": decay, "lr": lr,
                LR_SCALE: lr / cfg.learning_rate}
    split = 3 if cfg.muon_split_qkv else 1
    if cfg.param_groups == "track3":  # the AdamW part in track 3's groups (adamw.py)
        from gpt2.optim.algorithms.optimizer_base import aux_groups
        rest = aux_groups(model, cfg)[1]
    else:
        rest = [{"params": other2d, "weight_decay": cfg.weight_decay},
                {"params": vectors, "weight_decay": 0.0}]
    groups = [
        {"params": [p for n, p in hidden if is_fused_qkv(n)], **matrices, "split": split},
        {"params": [p for n, p in hidden if not is_fused_qkv(n)], **matrices},
        *rest,
    ]
    return Muon([g for g in groups if g["params"]], lr=cfg.learning_rate,
                momentum=cfg.muon_momentum, nesterov=cfg.muon_nesterov,
                ns_steps=cfg.muon_ns_steps, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                scale=cfg.muon_scale, coefficients=cfg.muon_coefficients,
                normuon_beta2=(cfg.muon_normuon_beta2 if cfg.muon_normalization == "normuon"
                               else None))

METHOD = Optimizer(
    name='muon', order=70, title='Muon',
    summary='Muon on block matrices, AdamW on the rest',
    reference=('Jordan et al. 2024, muon.py (KellerJordan/Muon) and the modded-nanogpt '
               'speedrun; Polar Express (NoahAmsel/PolarExpress), NorMuon '
               "(zichongli5/NorMuon), Moonlight's scale (Liu et al. 2025)"),
    text="""\
    Muon (Jordan et al. 2024): momentum orthogonalized by Newton-Schulz
    iteration for the 2-D weights inside the transformer blocks, AdamW
    for embeddings, head, biases and LayerNorm, as in the GPT-2
    speedrun. Block matrices use CONFIG_MUON_LR and
    CONFIG_MUON_WEIGHT_DECAY.""",
    matrix_text="""\
    Add Muon cells.""",
    build=build, settings=SETTINGS,
    # the table is in its AdamW part, stepped in float32 and rounded once
    # (optimizer_base.DecoupledOptimizer), as track 3's fused AdamW steps it
    bf16_table=lambda cfg: True,
    reads=("beta1", "beta2", "adam_eps", "param_groups", "aux_embedding_lr", "aux_head_lr",
           "aux_vector_lr", "aux_beta1", "aux_beta2", "aux_weight_decay",
           "muon_lr", "muon_weight_decay", "muon_momentum",
           "muon_nesterov", "muon_ns_steps", "muon_split_qkv", "muon_scale",
           "muon_coefficients", "muon_normalization", "muon_normuon_beta2"),
    tuning_grids=GRIDS, tuned=tuned, elementwise=False,
    state_floats=lambda cfg: (1, 2, 2),  # momentum; AdamW elsewhere
    # NorMuon: one float per row of each block matrix
    state_extra=lambda cfg, s: 4 * s.hidden_rows if cfg.muon_normalization == "normuon" else 0,
    # the larger of its AdamW part (a float32 denominator for every tensor outside the
    # blocks) and Newton-Schulz on the largest stack (the stack, normalized, and the
    # iterate before and after a step, in float32: an upper bound for CUDA's bfloat16
    # iterates)
    step_scratch=lambda device, s, cfg: (max(4 * (s.params - s.hidden), 18 * s.largest_stack)
                                         + widened_table(s, cfg)),
)
