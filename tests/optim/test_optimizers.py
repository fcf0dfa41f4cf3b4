"""Every optimizer does what its reference does. The expected values come from
transcriptions, written here, of the published algorithms and reference code (AdamW,
SGD, SPAM's SPAM.py, Muon's muon.py): never from the product's own functions. Where
the product runs its own code for something torch also implements (the AdamW part
of Muon, SPAM with its extras off), it is compared with torch as well."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from gpt2.config.options import Config, resolve
from gpt2.errors import ConfigError
from gpt2.model.gpt import GPT, GPTConfig
from gpt2.config.choices import OPTIMIZERS
from gpt2.optim.algorithms.optimizer_base import param_groups
from gpt2.optim.algorithms.optimizers import AdamWSpam, build_optimizer, orthogonalize, spam_warmup_scale
from gpt2.sparsity.algorithms.pruning import build_pruner

STEPS = 5


def tiny_model(seed: int = 0, n_layer: int = 1) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=n_layer, n_head=2, n_embd=16, block_size=8))


def cfg_for(optimizer: str, **kw) -> Config:
    return Config(**{"optimizer": optimizer, "learning_rate": 1e-2, "weight_decay": 0.1, **kw})


def fake_grads(model: torch.nn.Module, step: int) -> list[torch.Tensor]:
    """Reproducible dense gradients (the same for every copy of the model)."""
    gen = torch.Generator().manual_seed(1000 + step)
    grads = [torch.randn(p.shape, generator=gen) for p in model.parameters()]
    for p, g in zip(model.parameters(), grads):
        p.grad = g.clone()
    return grads


def run_steps(model, optimizer, steps=STEPS) -> list[list[torch.Tensor]]:
    """Steps with fake gradients; returns the gradients of each step."""
    history = []
    for step in range(steps):
        history.append(fake_grads(model, step))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return history


# ---- transcriptions of the references ---------------------------------------------------

def adamw_reference(p0, grads, lr, betas, eps, wd, amsgrad=False):
    """AdamW, Loshchilov & Hutter (2019) Algorithm 2 with the decay decoupled and
    applied first, as torch documents it; AMSGrad keeps the running max of v. In
    float64."""
    b1, b2 = betas
    p = p0.double().clone()
    m, v, vmax = (torch.zeros_like(p) for _ in range(3))
    for t, g in enumerate(grads, 1):
        g = g.double()
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        vmax = torch.maximum(vmax, v)
        v_hat = (vmax if amsgrad else v) / (1 - b2 ** t)
        p = p - lr * (m / (1 - b1 ** t)) / (v_hat.sqrt() + eps)
    return p


def sgd_reference(p0, grads, lr, momentum, nesterov, wd):
    """SGD with (Nesterov) momentum in the form torch and Sutskever et al. use
    (buf = mu * buf + g; step along g + mu * buf with Nesterov), plus the decoupled
    decay p <- p * (1 - lr * wd) first."""
    p = p0.double().clone()
    buf = None
    for g in grads:
        g = g.double()
        p = p * (1 - lr * wd)
        buf = g.clone() if buf is None else momentum * buf + g
        p = p - lr * (g + momentum * buf if nesterov else buf)
    return p


def newton_schulz_reference(g: torch.Tensor, steps: int) -> torch.Tensor:
    """zeropower_via_newtonschulz5 of the reference muon.py, in float32 (the product
    runs float32 on the CPU, bfloat16 on GPUs as the reference does)."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    x = g.float()
    if g.size(-2) > g.size(-1):
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = x @ x.mT
        B = b * A + c * A @ A
        x = a * x + B @ x
    if g.size(-2) > g.size(-1):
        x = x.mT
    return x


def muon_reference(p0, grads, lr, wd, beta=0.95, nesterov=True, ns_steps=5, split=1):
    """muon.py's SingleDeviceMuon.step with muon_update, for one weight kept as
    ``split`` matrices stacked along its rows (modded-nanogpt's (3, d, d) QKV bank)."""
    p = p0.clone().float()
    momentum = torch.zeros_like(p).view(split, -1, p.size(-1))
    for g in grads:
        grad = g.clone().float().view(split, -1, p.size(-1))
        momentum.lerp_(grad, 1 - beta)
        update = grad.lerp_(momentum, beta) if nesterov else momentum
        update = newton_schulz_reference(update, ns_steps)
        update = update * max(1, grad.size(-2) / grad.size(-1)) ** 0.5
        p.mul_(1 - lr * wd)
        p.add_(update.reshape(p.shape), alpha=-lr)
    return p


class SpamReference:
    """SPAM.py's AdamW.step (the authors' SPAM-Optimizer repository) for one
    parameter group without GaLore masks (density 1), weight decay 0: the reset when
    total_step + 1 is a multiple of update_proj_gap, clipping only from step
    grad_accu_steps on and outside the first grad_accu_steps after each reset, a
    bias-correction count that is never reset, and the re-warmup factor
    1 - CosineDecay(0.99, warmup_epoch), driven by torch's CosineAnnealingLR exactly
    as the reference drives it."""

    def __init__(self, params, lr, betas, eps, warmup_epoch, threshold, grad_accu_steps,
                 update_proj_gap):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.thres, self.grad_accu_steps, self.gap = threshold, grad_accu_steps, update_proj_gap
        self.warmup_epoch = warmup_epoch
        self.state = {id(p): {} for p in params}
        self.total_step = 0
        self.current_step = warmup_epoch + 1
        self.warmup = self._cosine_decay()

    def _cosine_decay(self):
        sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.99)
        return sgd, torch.optim.lr_scheduler.CosineAnnealingLR(sgd, self.warmup_epoch + 1, 0)

    def get_dr(self, current_step):
        if current_step >= self.warmup_epoch:  # CosineDecay.T_max
            return 0
        sgd, stepper = self.warmup
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # step(epoch) is deprecated, still what it calls
            stepper.step(current_step)
        return sgd.param_groups[0]["lr"]

    @torch.no_grad()
    def step(self):
        scale_factor = 1 - self.get_dr(self.current_step)
        for p in self.params:
            grad = p.grad.clone()
            state = self.state[id(p)]
            state.setdefault("step", 0)
            if "exp_avg" not in state:
                state["exp_avg"] = torch.zeros_like(grad)
                state["exp_avg_sq"] = torch.zeros_like(grad)
            if (self.total_step + 1) % self.gap == 0:
                state["exp_avg"] = torch.zeros_like(grad)
                state["exp_avg_sq"] = torch.zeros_like(grad)
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            beta1, beta2 = self.betas
            state["step"] += 1
            if self.thres != 0:
                current_step = self.total_step + 1
                if current_step >= self.grad_accu_steps:
                    mask = (grad ** 2) > (self.thres * exp_avg_sq)
                    if current_step % self.gap >= self.grad_accu_steps:
                        grad[mask] = grad[mask].sign() * torch.sqrt(exp_avg_sq[mask] * self.thres)
            exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
            denom = exp_avg_sq.sqrt().add_(self.eps)
            step_size = self.lr * math.sqrt(1.0 - beta2 ** state["step"]) / (
                1.0 - beta1 ** state["step"])
            p.add_(exp_avg / denom, alpha=-step_size * scale_factor)
        self.total_step += 1
        self.current_step += 1
        if self.total_step != 0 and (self.total_step + 1) % self.gap == 0:
            self.current_step = 0
            self.warmup = self._cosine_decay()


# ---- the one decay rule -----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", tuple(OPTIMIZERS))
def test_weight_decay_is_decoupled_and_only_on_2d_weights(name):
    """Against the same optimizer without decay, each step differs by exactly
    -lr*wd*p (the group's rate and decay) on tensors with 2+ dims and not at all
    elsewhere. L2 decay (added to the gradient) would instead leak into momentum and
    adaptive scaling and fail this."""
    method = OPTIMIZERS[name]
    # every decay it has (its grids' *wd settings: Muon's two), at 0.1, then at 0
    decays = {"weight_decay"} | {f for label, f in method.tuned(cfg_for(name)).items()
                                 if label.endswith("wd")}
    cfg = cfg_for(name, **dict.fromkeys(decays, 0.1))
    with_wd, without = tiny_model(), tiny_model()
    opt_wd = build_optimizer(with_wd, cfg, "cpu")
    no_decay = dict.fromkeys(decays, 0.0)
    opt_0 = build_optimizer(without, Config(**{**cfg.to_dict(), **no_decay}), "cpu")
    group_of = {id(p): g for g in opt_wd.param_groups for p in g["params"]}
    assert all(group_of[id(p)]["weight_decay"] > 0 for p in with_wd.parameters() if p.dim() >= 2)
    diff = {n: torch.zeros_like(p) for n, p in with_wd.named_parameters()}
    for step in range(3):
        before = {n: p.detach().clone() for n, p in with_wd.named_parameters()}
        q_before = [q.detach().clone() for q in without.parameters()]
        for m in (with_wd, without):
            fake_grads(m, step)
        # (PSGD-Kron draws random probes from torch's generator: the same for both)
        torch.manual_seed(step)
        opt_wd.step()
        torch.manual_seed(step)
        opt_0.step()
        for i, ((n, p), q) in enumerate(zip(with_wd.named_parameters(), without.parameters())):
            # (a relative step scales by the weight's RMS, which the decay changed:
            # past the first step the updates differ too)
            if p.dim() >= 2 and (method.decays == "inside"
                                 or (method.relative_step and step > 0)):
                # (Schedule-Free's reference decays at y through z and the average,
                # test_optimizer_references.py): only that it acts, on matrices
                assert not torch.equal(p, q), n
                continue
            # (a first step that only measures moves nothing, decay included)
            if p.dim() >= 2 and (method.first_step_moves or step > 0):
                g = group_of[id(p)]
                # decayed after its update: the point decayed is p + (its update), the
                # update being the one the run without decay took
                point = before[n] + (q - q_before[i]) if method.decays == "after" else before[n]
                diff[n] = diff[n] - g["lr"] * g["weight_decay"] * point
            torch.testing.assert_close(p - q, diff[n], rtol=1e-4, atol=1e-7,
                                       msg=f"{name}: {n} step {step}")


def test_decay_groups_cover_every_parameter_once():
    model = tiny_model()
    groups = param_groups(model, 0.1)
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())
    assert all(p.dim() >= 2 for p in groups[0]["params"])
    assert all(p.dim() < 2 for p in groups[1]["params"]) and groups[1]["weight_decay"] == 0


# ---- Adam family and SGD ----------------------------------------------------------------

@pytest.mark.parametrize("name,amsgrad", [("adam", False), ("adamw", False),
                                          ("adamwprune", False), ("adamwadv", True)])
def test_adam_family_equals_the_adamw_algorithm(name, amsgrad):
    """Decay is decoupled for every optimizer, so Adam takes AdamW's steps too."""
    cfg = cfg_for(name, beta2=0.99, adam_eps=1e-6)
    model = tiny_model()
    start = [p.detach().clone() for p in model.parameters()]
    history = run_steps(model, build_optimizer(model, cfg, "cpu"))
    for i, (p, p0) in enumerate(zip(model.parameters(), start)):
        expected = adamw_reference(p0, [h[i] for h in history], cfg.learning_rate,
                                   (cfg.beta1, cfg.beta2), cfg.adam_eps,
                                   cfg.weight_decay if p.dim() >= 2 else 0.0, amsgrad)
        torch.testing.assert_close(p.double(), expected, rtol=1e-5, atol=1e-6)


def test_sgd_equals_momentum_sgd_with_decoupled_decay():
    for nesterov in (True, False):
        cfg = cfg_for("sgd", sgd_momentum=0.8, sgd_nesterov=nesterov)
        model = tiny_model()
        start = [p.detach().clone() for p in model.parameters()]
        history = run_steps(model, build_optimizer(model, cfg, "cpu"))
        for i, (p, p0) in enumerate(zip(model.parameters(), start)):
            expected = sgd_reference(p0, [h[i] for h in history], cfg.learning_rate, 0.8,
                                     nesterov, cfg.weight_decay if p.dim() >= 2 else 0.0)
            torch.testing.assert_close(p.double(), expected, rtol=1e-5, atol=1e-6)


# ---- SPAM ---------------------------------------------------------------------------------

def _spiky_grads(shape, steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in range(1, steps + 1):
        g = torch.randn(shape, generator=gen)
        if t % 7 == 0:  # a spike in a few elements
            g[0] *= 40.0
        out.append(g)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("clip_unseen", [False, True], ids=["kgpt", "clip unseen"])
@pytest.mark.parametrize("beta2,gap,warmup,delay,threshold", [
    (0.95, 12, 5, 4, 3.0), (0.999, 12, 5, 4, 3.0), (0.95, 1, 1, 0, 0.0)],
    ids=["beta2=0.95", "beta2=0.999", "a reset every step"])
def test_spam_equals_the_reference_code_across_resets(beta2, gap, warmup, delay, threshold,
                                                      clip_unseen):
    """40 steps with resets every 12, a 5-step re-warmup, no clipping in the first 4
    steps after a start or reset, and a low threshold so that clipping is frequent
    in between: three parameters of different shapes (the product steps them
    together, the reference one by one) follow SPAM.py step by step. And the edge
    of the reset rule: an interval of 1 resets the moments at every step (clipping
    off: against moments zeroed every step it would clip every gradient to 0).
    Wherever clipping applies here every v is above 0, so kgpt's rule (no bound where
    v is 0) and the reference's (SPAM_CLIP_UNSEEN) take the same steps."""
    steps = 40
    shapes = [(5, 4), (7,), (3, 2, 2)]
    gen = torch.Generator().manual_seed(1)
    ours_ps = [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in shapes]
    ref_ps = [torch.nn.Parameter(p.detach().clone()) for p in ours_ps]
    ours = AdamWSpam(ours_ps, lr=0.01, betas=(0.9, beta2), eps=1e-8, threshold=threshold,
                     reset_interval=gap, warmup=warmup, clip_delay=delay, clip_unseen=clip_unseen)
    ref = SpamReference(ref_ps, lr=0.01, betas=(0.9, beta2), eps=1e-8, warmup_epoch=warmup,
                        threshold=threshold, grad_accu_steps=delay, update_proj_gap=gap)
    history = [_spiky_grads(shape, steps, seed=i) for i, shape in enumerate(shapes)]
    for t, grads in enumerate(zip(*history), 1):
        if threshold and t >= delay and t % gap >= delay:  # this step clips
            assert all((ref.state[id(q)]["exp_avg_sq"] > 0).all() for q in ref_ps), t
        for p, q, g in zip(ours_ps, ref_ps, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
        for i, (p, q) in enumerate(zip(ours_ps, ref_ps)):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=f"step {t}, tensor {i}")
            assert ours.state[p]["step"] == t  # bias correction keeps counting
    start = torch.Generator().manual_seed(1)
    assert all(not torch.equal(p, torch.randn(shape, generator=start))
               for p, shape in zip(ours_ps, shapes))  # it trained: the comparison says something


def test_spam_timing_in_words():
    """The reference's schedule, stated plainly: the reset is at step 500 (not 501),
    the re-warmup starts there at 1 % of the step, and clipping waits for the delay."""
    assert spam_warmup_scale(499, 500, 150) == 1.0
    assert spam_warmup_scale(500, 500, 150) == pytest.approx(0.01)
    assert 0.01 < spam_warmup_scale(560, 500, 150) < 1.0
    assert spam_warmup_scale(650, 500, 150) == 1.0
    assert spam_warmup_scale(1000, 500, 150) == pytest.approx(0.01)
    assert spam_warmup_scale(700, 0, 150) == 1.0  # resets off: no re-warmup, whatever warmup
    assert spam_warmup_scale(500, 500, 0) == 1.0  # re-warmup off
    p = torch.nn.Parameter(torch.zeros(1))
    opt = AdamWSpam([p], lr=0.1, betas=(0.9, 0.95), eps=1e-8, threshold=1.0,
                    reset_interval=0, warmup=0, clip_delay=3)
    used = []  # the gradient each step fed to the moments: (v_t - b2 * v_{t-1}) / (1 - b2)
    for g in (1.0, 100.0, 100.0, 100.0):
        v_before = opt.state[p]["exp_avg_sq"].item() if opt.state[p] else 0.0
        p.grad = torch.tensor([g])
        opt.step()
        used.append(((opt.state[p]["exp_avg_sq"].item() - 0.95 * v_before) / 0.05) ** 0.5)
        if len(used) >= 3:  # from step 3 on, clipped to sqrt(theta * v_{t-1})
            assert used[-1] == pytest.approx(v_before ** 0.5, rel=1e-4)
    assert used[:2] == pytest.approx([1.0, 100.0], rel=1e-4)  # steps 1-2: nothing clipped
    assert used[2] < 100.0 and used[3] < 100.0


def test_spam_without_clipping_or_reset_is_adamw_but_for_where_eps_goes():
    """With clipping and resets off SPAM is AdamW. The reference adds eps to sqrt(v)
    before the bias correction, torch after it; with eps = 0 the two agree."""
    ours_model, ref_model = tiny_model(), tiny_model()
    ours = AdamWSpam(param_groups(ours_model, 0.1), lr=1e-2, betas=(0.9, 0.95), eps=0.0,
                     threshold=0.0, reset_interval=0, warmup=0, clip_delay=0)
    run_steps(ours_model, ours)
    run_steps(ref_model, torch.optim.AdamW(param_groups(ref_model, 0.1), lr=1e-2,
                                           betas=(0.9, 0.95), eps=0.0))
    for p, q in zip(ours_model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_spam_clip_delay_must_leave_clipping_between_resets():
    with pytest.raises(ConfigError, match="SPAM_CLIP_DELAY"):
        resolve({"optimizer": "adamwspam", "spam_reset_interval": 20, "spam_clip_delay": 20,
                 "spam_warmup": 5})
    # Without clipping the delay means nothing, and any interval goes (even 1).
    assert resolve({"optimizer": "adamwspam", "spam_threshold": 0.0, "spam_reset_interval": 1,
                    "spam_clip_delay": 2, "spam_warmup": 1}).spam_reset_interval == 1


@pytest.mark.parametrize("clip_unseen", [False, True], ids=["kgpt", "reference"])
def test_spam_elements_whose_state_was_cleared_learn_again(clip_unseen):
    """Pruning clears a weight's optimizer state (every state tensor of the weight's
    shape, masked_fill_ with 0), as a mask update does; when the weight comes back its
    gradient is not 0 but v is. It has no history to call a gradient a spike against:
    kgpt does not clip it, so v becomes > 0 and the weight moves. SPAM.py clips it to
    sqrt(theta * 0) = 0 (SPAM_CLIP_UNSEEN): v stays 0 and the weight is frozen at every
    later step until a reset, exactly as the reference steps it."""
    shapes = [(6, 5), (9,)]
    gen = torch.Generator().manual_seed(3)
    ours_ps = [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in shapes]
    ref_ps = [torch.nn.Parameter(p.detach().clone()) for p in ours_ps]
    ours = AdamWSpam(ours_ps, lr=0.01, betas=(0.9, 0.95), eps=1e-8, threshold=5000.0,
                     reset_interval=0, warmup=0, clip_delay=2, clip_unseen=clip_unseen)
    ref = SpamReference(ref_ps, lr=0.01, betas=(0.9, 0.95), eps=1e-8, warmup_epoch=0,
                        threshold=5000.0, grad_accu_steps=2, update_proj_gap=10**9)
    masks = [torch.rand(shape, generator=gen) < 0.4 for shape in shapes]
    history = [_spiky_grads(shape, 16, seed=i) for i, shape in enumerate(shapes)]
    for t, grads in enumerate(zip(*history), 1):
        for p, q, g in zip(ours_ps, ref_ps, grads):
            p.grad, q.grad = g.clone(), g.clone()
        before = [p.detach().clone() for p in ours_ps]
        ours.step()
        ref.step()
        if t > 8:  # the steps after the state was cleared
            for p, q, was, mask in zip(ours_ps, ref_ps, before, masks):
                v = ours.state[p]["exp_avg_sq"]
                if clip_unseen:
                    assert (v[mask] == 0).all() and torch.equal(p[mask], was[mask]), t
                    torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=f"step {t}")
                else:
                    assert (v[mask] > 0).all() and (p[mask] != was[mask]).all(), t
                assert (v[~mask] > 0).all()  # the others keep learning either way
        if t == 8:  # clear the state of some elements, as a pruning mask update does
            for opt, params, key in ((ours, ours_ps, None), (ref, ref_ps, id)):
                for p, mask in zip(params, masks):
                    state = opt.state[key(p) if key else p]
                    for value in state.values():
                        if torch.is_tensor(value) and value.shape == p.shape:
                            value.masked_fill_(mask, 0)


@pytest.mark.slow
@pytest.mark.parametrize("clip_unseen", [False, True], ids=["kgpt", "reference"])
def test_spam_weights_movement_pruning_regrows_are_alive(clip_unseen):
    """SPAM with movement pruning on a small model: a regrown weight whose v is 0 (its
    state cleared when pruned, or zeroed by a reset while it was pruned and had no
    gradient) learns at the next step with kgpt's rule; with the reference's it stays
    dead, its v still 0, through every step that clips."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=256))
    interval, steps = 8, 24
    optimizer = AdamWSpam(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
                          threshold=5000.0, reset_interval=interval, warmup=0, clip_delay=2,
                          clip_unseen=clip_unseen)
    cfg = Config(optimizer="adamwspam", pruning_method="movement", target_sparsity=0.5,
                 pruning_warmup=2, pruning_end=0.5, pruning_frequency=2)
    pruner = build_pruner(model, optimizer, cfg, steps)
    x = torch.randint(0, 256, (4, 8), generator=torch.Generator().manual_seed(7))
    watched: dict[str, torch.Tensor] = {}  # regrown with v = 0, before a step that clips
    alive = dead = 0
    for t in range(1, steps + 1):
        _, loss = model(x, x)
        loss.backward()
        pruner.before_step()
        optimizer.step()
        for name, p in pruner.targets:
            if name in watched:
                v = optimizer.state[p]["exp_avg_sq"][watched[name]]
                alive, dead = alive + int((v > 0).sum()), dead + int((v == 0).sum())
        old = {name: m.clone() for name, m in pruner.pruned.items()}
        pruner.after_step(t)
        clips = t + 1 >= 2 and (t + 1) % interval >= 2
        watched = {name: back for name, p in pruner.targets
                   if clips and (back := old[name] & ~pruner.pruned[name]
                                 & (optimizer.state[p]["exp_avg_sq"] == 0)).any()}
        optimizer.zero_grad(set_to_none=True)
    assert alive + dead > 100  # the run regrew weights with v = 0
    assert (alive, dead) == ((0, alive + dead) if clip_unseen else (alive + dead, 0))


# ---- Muon ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(32, 32), (96, 32), (32, 128), (3, 16, 16)])
def test_muon_orthogonalization_approximates_u_vt(shape):
    """Newton-Schulz output is close to U V^T of the SVD, matrix by matrix for a
    stack: singular values pushed near 1 (the quintic's known band, about 0.7-1.2)
    and the same singular vectors."""
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    o = orthogonalize(g, steps=5)
    s = torch.linalg.svdvals(o)
    assert 0.6 < s.min() and s.max() < 1.25, s
    u, _, vt = torch.linalg.svd(g, full_matrices=False)
    exact = u @ vt
    cos = (o * exact).sum(dim=(-2, -1)) / (o.norm(dim=(-2, -1)) * exact.norm(dim=(-2, -1)))
    assert (cos > 0.95).all(), cos


def test_muon_orthogonalizes_a_stack_matrix_by_matrix():
    """A stack is orthogonalized as separate matrices: one ten times larger than the
    others changes nothing in theirs (each is normalized by its own norm)."""
    g = torch.randn(3, 16, 16, generator=torch.Generator().manual_seed(0))
    g[0] *= 10
    stacked = orthogonalize(g, steps=5)
    for i in range(3):
        torch.testing.assert_close(stacked[i], orthogonalize(g[i], steps=5))


def _muon_groups(opt, model):
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g for g in opt.param_groups for p in g["params"]}


def test_muon_splits_block_matrices_from_the_rest():
    cfg = cfg_for("muon", muon_lr=0.05, muon_weight_decay=0.02)
    model = tiny_model()
    groups = _muon_groups(build_optimizer(model, cfg, "cpu"), model)
    muon = {n for n, g in groups.items() if g["orthogonal"]}
    assert muon == {n for n, p in model.named_parameters() if ".h." in n and p.dim() == 2}
    assert all(groups[n]["lr_scale"] == 0.05 / 1e-2 and groups[n]["weight_decay"] == 0.02
               for n in muon)
    assert groups["transformer.h.0.attn.c_attn.weight"]["split"] == 3
    assert groups["transformer.wte.weight"]["weight_decay"] == 0.1  # AdamW part: the run's
    # The schedule's rate reaches each group at its own peak: at the peak (1e-2 here)
    # the matrices train at muon_lr and the rest at learning_rate; halfway, half each.
    from gpt2.training.step import apply_learning_rate

    opt = build_optimizer(model, cfg, "cpu")
    for rate in (1e-2, 5e-3):
        apply_learning_rate(opt, rate)
        got = _muon_groups(opt, model)
        assert all(abs(got[n]["lr"] - 0.05 * rate / 1e-2) < 1e-12 for n in muon)
        assert got["transformer.wte.weight"]["lr"] == rate


@pytest.mark.slow
@pytest.mark.parametrize("nesterov,n_layer", [(True, 1), (False, 1), (True, 3), (False, 3)])
def test_muon_equals_the_reference_code(nesterov, n_layer):
    """Four steps of muon.py's update (momentum 0.95, Nesterov or not, Q, K and V
    orthogonalized as three matrices, decoupled decay with Muon's own rate and decay)
    on the block matrices; AdamW's algorithm everywhere else. With three layers the
    product orthogonalizes same-shaped matrices as one stack; the reference, one by
    one."""
    cfg = cfg_for("muon", muon_nesterov=nesterov, muon_lr=0.03, muon_weight_decay=0.05)
    model = tiny_model(n_layer=n_layer)
    start = [p.detach().clone() for p in model.parameters()]
    opt = build_optimizer(model, cfg, "cpu")
    groups = _muon_groups(opt, model)
    history = run_steps(model, opt, 4)
    for i, ((n, p), p0) in enumerate(zip(model.named_parameters(), start)):
        grads = [h[i] for h in history]
        if groups[n]["orthogonal"]:
            expected = muon_reference(p0, grads, 0.03, 0.05, nesterov=nesterov,
                                      split=3 if n.endswith("c_attn.weight") else 1)
            torch.testing.assert_close(p.detach(), expected, rtol=1e-4, atol=1e-6, msg=n)
        else:
            expected = adamw_reference(p0, grads, cfg.learning_rate, (cfg.beta1, cfg.beta2),
                                       cfg.adam_eps, cfg.weight_decay if p.dim() >= 2 else 0.0)
            torch.testing.assert_close(p.double(), expected, rtol=1e-5, atol=1e-6, msg=n)


def test_muon_adamw_part_equals_torch_adamw():
    """The AdamW steps of Muon's other groups are this module's own code."""
    cfg = cfg_for("muon")
    ours_model, ref_model = tiny_model(), tiny_model()
    opt = build_optimizer(ours_model, cfg, "cpu")
    groups = _muon_groups(opt, ours_model)
    run_steps(ours_model, opt, 3)
    rest = [(n, p) for n, p in ref_model.named_parameters() if not groups[n]["orthogonal"]]
    ref = torch.optim.AdamW([{"params": [p for _, p in rest if p.dim() >= 2],
                              "weight_decay": cfg.weight_decay},
                             {"params": [p for _, p in rest if p.dim() < 2],
                              "weight_decay": 0.0}],
                            lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)
    run_steps(ref_model, ref, 3)
    for (n, p), q in zip(ours_model.named_parameters(), ref_model.parameters()):
        if not groups[n]["orthogonal"]:
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=n)


def _qkv_steps(split: bool) -> list[float]:
    """RMS of the Q, K and V parts of one Muon step when Q's gradient is 10x larger."""
    cfg = cfg_for("muon", muon_momentum=0.0, muon_nesterov=False, muon_weight_decay=0.0,
                  muon_split_qkv=split)
    model = tiny_model()
    opt = build_optimizer(model, cfg, "cpu")
    w = model.transformer.h[0].attn.c_attn.weight
    before = w.detach().clone()
    fake_grads(model, 0)
    w.grad[:16] *= 10
    opt.step()
    return [(w.detach() - before)[i * 16:(i + 1) * 16].pow(2).mean().sqrt().item()
            for i in range(3)]


def test_muon_qkv_split_keeps_k_and_v_steps_whatever_q_does():
    split, fused = _qkv_steps(True), _qkv_steps(False)
    # Split: each part is orthogonalized alone, so all three take full-size steps.
    assert max(split) / min(split) < 1.3
    # Fused (the old behaviour): Q's large gradient takes the spectrum, K and V shrink.
    assert fused[1] < 0.7 * split[1] and fused[2] < 0.7 * split[2]


def test_muon_moonlight_scale_gives_adamw_sized_updates_with_adamw_settings():
    cfg = cfg_for("muon", muon_scale="moonlight", muon_momentum=0.0, muon_nesterov=False,
                  weight_decay=0.0)
    model = tiny_model()
    opt = build_optimizer(model, cfg, "cpu")
    groups = _muon_groups(opt, model)
    assert all(g["lr"] == cfg.learning_rate and g["lr_scale"] == 1.0
               for g in groups.values() if g["orthogonal"])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    run_steps(model, opt, 1)
    for n, p in model.named_parameters():
        if groups[n]["orthogonal"]:  # RMS of the update / lr: 0.2 within Newton-Schulz's spread
            rms = ((p.detach() - before[n]).pow(2).mean().sqrt() / cfg.learning_rate).item()
            assert 0.13 < rms < 0.24, (n, rms)
    with pytest.raises(ConfigError, match="MUON_LR"):
        resolve({"optimizer": "muon", "muon_scale": "moonlight", "muon_lr": 0.02})


def test_muon_lr_and_decay_are_its_own_not_adamws():
    """The run's weight_decay (0.1) with Muon's rate (0.02) would shrink the block
    matrices 33x faster than AdamW's; Muon has its own decay setting instead."""
    cfg = Config(optimizer="muon")
    model = tiny_model()
    groups = _muon_groups(build_optimizer(model, cfg, "cpu"), model)
    block = groups["transformer.h.0.mlp.c_fc.weight"]
    adamw = groups["transformer.wte.weight"]
    assert block["lr"] * block["weight_decay"] == pytest.approx(0.02 * 0.01)
    assert adamw["lr"] * adamw["weight_decay"] == pytest.approx(6e-4 * 0.1)


def test_muon_split_changes_only_the_attention_weight():
    """Only c_attn is split: the other block matrices take the same steps either way."""
    runs = {}
    for split in (True, False):
        model = tiny_model()
        opt = build_optimizer(model, cfg_for("muon", muon_split_qkv=split), "cpu")
        run_steps(model, opt, 2)
        runs[split] = dict(model.named_parameters())
    for n, p in runs[True].items():
        assert torch.equal(p, runs[False][n]) == ("c_attn.weight" not in n), n


@pytest.mark.parametrize("name", ["adam", "adamw", "adamwadv"])
def test_torchs_adam_family_uses_the_fused_kernel_exactly_on_cuda(name):
    """The fused kernel does the whole update in one launch on a GPU; elsewhere the
    default implementation. Built on CPU tensors (no test may need a GPU): the flag
    is what reaches torch."""
    for device_type, fused in (("cuda", True), ("cpu", False)):
        opt = build_optimizer(tiny_model(), resolve({"optimizer": name}), device_type)
        assert bool(opt.defaults["fused"]) is fused, device_type
        assert opt.defaults["amsgrad"] is (name == "adamwadv")


def test_each_muon_group_gets_its_own_rate_and_decay():
    """Muon's matrices use their own rate and decay; with Moonlight's scale they share
    AdamW's; the AdamW part decays its other matrices, never its vectors."""
    for scale, lr, wd in (("shape", 0.02, 0.01), ("moonlight", 6e-4, 0.1)):
        own = {"muon_lr": 0.02, "muon_weight_decay": 0.01} if scale == "shape" else {}
        cfg = resolve({"optimizer": "muon", "muon_scale": scale, "learning_rate": 6e-4,
                       "weight_decay": 0.1, **own})
        groups = build_optimizer(tiny_model(), cfg, "cpu").param_groups
        muon = [g for g in groups if g["orthogonal"]]
        assert muon and all((g["lr"], g["weight_decay"]) == (lr, wd) for g in muon), scale
        adamw = [g for g in groups if not g["orthogonal"]]
        assert sorted(g["weight_decay"] for g in adamw) == [0.0, 0.1]
        assert all(p.dim() < 2 for g in adamw if g["weight_decay"] == 0.0 for p in g["params"])


def test_a_run_records_the_settings_of_its_own_optimizer():
    from gpt2.config.choices import optimizer_hparams as hparams

    assert hparams(resolve({"optimizer": "sgd"})) == {
        "learning_rate": 6e-4, "min_lr": 6e-5, "weight_decay": 0.1, "sgd_momentum": 0.9,
        "sgd_nesterov": True}
    assert hparams(resolve({"optimizer": "adamwspam"})) == {
        "learning_rate": 6e-4, "min_lr": 6e-5, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
        "adam_eps": 1e-8, "spam_threshold": 5000.0, "spam_reset_interval": 500,
        "spam_warmup": 150, "spam_clip_delay": 20, "spam_clip_unseen": False}
