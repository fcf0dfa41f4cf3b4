"""AdamW: AdamW, fused on CUDA (cautious: kgpt's own)."""

from __future__ import annotations

from gpt2.config.methods import Grid, Optimizer, Setting

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
    from gpt2.optim.algorithms.optimizer_base import param_groups, torch_adamw
    if cfg.cautious:
        from gpt2.optim.algorithms.adam_variants import CautiousAdamW
        return CautiousAdamW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                             betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)
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
    build=build, settings=SETTINGS, reads=('beta1', 'beta2', 'adam_eps', 'cautious'),
    tuning_grids=GRIDS,
    # cautious, one tensor at a time: its denominator, mask and masked moment
    step_scratch=lambda device, s, cfg: (12 * s.largest if cfg.cautious else
                                         0 if device == "cuda" else 8 * s.largest),
)
