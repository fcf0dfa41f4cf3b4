"""One-shot pruning (magnitude, Wanda, SparseGPT) against transcriptions of the reference
code: IST-DASLab/sparsegpt sparsegpt.py at 5e3e2d1 (SparseGPT.add_batch, fasterprune),
locuslab/wanda lib/layerwrapper.py at 42e856e (WrappedGPT.add_batch) and lib/prune.py at
069ac97 (prune_wanda's and prune_magnitude's masks). Their N:M arguments count the
weights pruned per group (prune_n of prune_m); kgpt's N:M counts those kept."""

from __future__ import annotations

import math

import pytest
import torch

from gpt2.model.gpt import GPT, GPTConfig
from gpt2.training import oneshot


# ---- transcriptions ------------------------------------------------------------------

def ref_sparsegpt_H(batches):
    """SparseGPT.add_batch over batches of inputs (each [samples, tokens, columns])."""
    columns = batches[0].shape[-1]
    H = torch.zeros((columns, columns))
    nsamples = 0
    for inp in batches:
        if len(inp.shape) == 2:
            inp = inp.unsqueeze(0)
        tmp = inp.shape[0]
        if len(inp.shape) == 3:
            inp = inp.reshape((-1, inp.shape[-1]))
        inp = inp.t()
        H *= nsamples / (nsamples + tmp)
        nsamples += tmp
        inp = math.sqrt(2 / nsamples) * inp.float()
        H += inp.matmul(inp.t())
    return H


def ref_fasterprune(W, H, sparsity, prunen=0, prunem=0, blocksize=128, percdamp=.01):
    """fasterprune, without the quantizer and the debug prints: returns W and the
    summed error it prints."""
    W = W.clone().float()
    rows, columns = W.shape
    H = H.clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    Losses = torch.zeros(rows)
    damp = percdamp * torch.mean(torch.diag(H))
    diag = torch.arange(columns)
    H[diag, diag] += damp
    H = torch.linalg.cholesky(H)
    H = torch.cholesky_inverse(H)
    H = torch.linalg.cholesky(H, upper=True)
    Hinv = H
    mask = None
    for i1 in range(0, columns, blocksize):
        i2 = min(i1 + blocksize, columns)
        count = i2 - i1
        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Losses1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        if prunen == 0:
            if mask is not None:
                mask1 = mask[:, i1:i2]
            else:
                tmp = W1 ** 2 / (torch.diag(Hinv1).reshape((1, -1))) ** 2
                thresh = torch.sort(tmp.flatten())[0][int(tmp.numel() * sparsity)]
                mask1 = tmp <= thresh
        else:
            mask1 = torch.zeros_like(W1) == 1
        for i in range(count):
            w = W1[:, i]
            d = Hinv1[i, i]
            if prunen != 0 and i % prunem == 0:
                tmp = W1[:, i:(i + prunem)] ** 2 / (torch.diag(Hinv1)[i:(i + prunem)].reshape((1, -1))) ** 2
                mask1.scatter_(1, i + torch.topk(tmp, prunen, dim=1, largest=False)[1], True)
            q = w.clone()
            q[mask1[:, i]] = 0
            Q1[:, i] = q
            Losses1[:, i] = (w - q) ** 2 / d ** 2
            err1 = (w - q) / d
            W1[:, i:] -= err1.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
            Err1[:, i] = err1
        W[:, i1:i2] = Q1
        Losses += torch.sum(Losses1, 1) / 2
        W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])
    return W, torch.sum(Losses).item()


def ref_wanda_scaler_row(batches):
    """WrappedGPT.add_batch (for nn.Linear)."""
    columns = batches[0].shape[-1]
    scaler_row = torch.zeros(columns)
    nsamples = 0
    for inp in batches:
        if len(inp.shape) == 2:
            inp = inp.unsqueeze(0)
        tmp = inp.shape[0]
        if len(inp.shape) == 3:
            inp = inp.reshape((-1, inp.shape[-1]))
        inp = inp.t()
        scaler_row *= nsamples / (nsamples + tmp)
        nsamples += tmp
        inp = inp.type(torch.float32)
        scaler_row += torch.norm(inp, p=2, dim=1) ** 2 / nsamples
    return scaler_row


def ref_wanda_mask(W, scaler_row, sparsity_ratio, prune_n=0, prune_m=0):
    """prune_wanda's mask for one layer (use_variant off)."""
    W_metric = torch.abs(W) * torch.sqrt(scaler_row.reshape((1, -1)))
    W_mask = (torch.zeros_like(W_metric) == 1)
    if prune_n != 0:
        for ii in range(W_metric.shape[1]):
            if ii % prune_m == 0:
                tmp = W_metric[:, ii:(ii + prune_m)].float()
                W_mask.scatter_(1, ii + torch.topk(tmp, prune_n, dim=1, largest=False)[1], True)
    else:
        sort_res = torch.sort(W_metric, dim=-1, stable=True)
        indices = sort_res[1][:, :int(W_metric.shape[1] * sparsity_ratio)]
        W_mask.scatter_(1, indices, True)
    return W_mask


def ref_magnitude_mask(W, sparsity_ratio, prune_n=0, prune_m=0):
    """prune_magnitude's mask for one layer."""
    W_metric = torch.abs(W)
    if prune_n != 0:
        W_mask = (torch.zeros_like(W) == 1)
        for ii in range(W_metric.shape[1]):
            if ii % prune_m == 0:
                tmp = W_metric[:, ii:(ii + prune_m)].float()
                W_mask.scatter_(1, ii + torch.topk(tmp, prune_n, dim=1, largest=False)[1], True)
    else:
        thresh = torch.sort(W_metric.flatten())[0][int(W.numel() * sparsity_ratio)]
        W_mask = (W_metric <= thresh)
    return W_mask


# ---- a small layer with correlated inputs -----------------------------------------

def layer_data(rows=24, columns=48, samples=6, tokens=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(rows, columns, generator=g)
    mix = torch.randn(columns, columns, generator=g) / math.sqrt(columns)
    scale = torch.linspace(0.2, 3.0, columns)  # features of very different sizes
    batches = [(torch.randn(2, tokens, columns, generator=g) @ mix) * scale
               for _ in range(samples // 2)]
    return W, batches


@pytest.mark.slow
@pytest.mark.parametrize("structure,blocksize", [(None, 128), (None, 16), ((2, 4), 128),
                                                 ((1, 4), 16), ((4, 8), 16)])
def test_sparsegpt_equals_the_reference_on_a_small_layer(structure, blocksize):
    """The Hessian, the pruned and updated weights and the reconstruction error the
    reference prints, to float tolerance; blocks of 16 over 48 columns take the
    between-block updates and a mask per block; N:M (kgpt's N kept) is the
    reference's prunen = M - N."""
    W, batches = layer_data()
    stats = oneshot.SparseGPTStats(W.shape[1], "cpu")
    for b in batches:
        stats.add_batch(b)
    H = ref_sparsegpt_H(batches)
    assert torch.allclose(stats.H, H, rtol=1e-5, atol=1e-5)
    prunen, prunem = (0, 0) if structure is None else (structure[1] - structure[0], structure[1])
    ref_W, ref_error = ref_fasterprune(W, H, 0.5, prunen, prunem, blocksize=blocksize)
    new, mask, error = oneshot.sparsegpt_prune(W, H, 0.5, structure, blocksize=blocksize)
    assert torch.equal(mask, ref_W == 0)
    assert torch.allclose(new, ref_W, rtol=1e-4, atol=1e-5)
    assert error == pytest.approx(ref_error, rel=1e-4)
    # and the error is what it says: the output error it saves over plain zeroing
    X = torch.cat([b.reshape(-1, b.shape[-1]) for b in batches])
    plain = torch.where(mask, 0.0, W)
    assert ((X @ new.t() - X @ W.t()) ** 2).sum() < ((X @ plain.t() - X @ W.t()) ** 2).sum()
    if structure is not None:
        n, m = structure
        assert (mask.view(mask.shape[0], -1, m).sum(-1) == m - n).all()


@pytest.mark.parametrize("structure", [None, (2, 4), (1, 4)])
def test_wanda_and_magnitude_masks_equal_the_reference(structure):
    W, batches = layer_data(seed=1)
    stats = oneshot.WandaStats(W.shape[1], "cpu")
    for b in batches:
        stats.add_batch(b)
    scaler = ref_wanda_scaler_row(batches)
    assert torch.allclose(stats.scaler_row, scaler, rtol=1e-5)
    prune_n, prune_m = (0, 0) if structure is None else (structure[1] - structure[0], structure[1])
    assert torch.equal(oneshot.wanda_mask(W, scaler, 0.5, structure),
                       ref_wanda_mask(W, scaler, 0.5, prune_n, prune_m))
    assert torch.equal(oneshot.magnitude_mask(W, 0.5, structure),
                       ref_magnitude_mask(W, 0.5, prune_n, prune_m))
    # the activations matter: Wanda keeps weights of large features magnitude drops
    assert not torch.equal(oneshot.wanda_mask(W, scaler, 0.5, structure),
                           oneshot.magnitude_mask(W, 0.5, structure))


@pytest.mark.parametrize("optimizer", ["adamw", "muon", "schedulefree"])
def test_the_fine_tune_after_one_shot_holds_its_masks_and_trains(optimizer):
    """The fine-tune trains every weight the one-shot pruning kept (its loss on repeated
    batches falls) and none it pruned, under decoupled weight decay (AdamW), an update
    spread over whole matrices (Muon) and an evaluation point that is an average
    (Schedule-Free): the model it leaves holds exactly the one-shot masks."""
    import itertools

    from gpt2.config.options import Config
    from gpt2.runtime.device import setup_runtime

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    model.eval()
    x = torch.randint(0, 64, (4, 9), generator=torch.Generator().manual_seed(1))
    batches = [x[:, :8]]
    out = oneshot.prune_blocks(model, model.transformer.h, batches, "wanda", 0.5)
    pruned = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = Config(optimizer=optimizer, weight_decay=0.1, muon_weight_decay=0.1,
                 gradient_accumulation=1, grad_clip=1.0)
    runtime = setup_runtime("cpu", "float32", False, 0)
    stream = itertools.repeat((x[:, :8], x[:, 1:]))
    # The optimizer never sees a gradient on a pruned weight: Muon orthogonalizes the
    # whole matrix, so a pruned weight's gradient would move the kept ones (re-masking
    # after the step would hide it from the masks, not from the update).
    params = dict(model.named_parameters())
    seen = []

    def before_step(opt, args, kwargs):
        seen.extend(bool((params[n].grad[m] == 0).all()) for n, m in out["masks"].items())

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    hook = register_optimizer_step_pre_hook(before_step)
    try:
        losses = oneshot.finetune(model, cfg, runtime, out["masks"], stream, 12, 3e-3)
    finally:
        hook.remove()
    assert len(seen) >= 12 * len(out["masks"]) and all(seen)
    assert len(losses) == 12 and losses[-1] < losses[0] - 0.05, losses
    params = dict(model.named_parameters())
    for name, mask in out["masks"].items():
        assert (params[name][mask] == 0).all(), name
        assert (params[name][~mask] != pruned[name][~mask]).float().mean() > 0.9, name
    assert not model.training


@pytest.mark.parametrize("method", oneshot.ONESHOT)
def test_a_model_is_pruned_block_by_block_to_the_sparsity(method):
    """A tiny GPT: every Linear of every block at half sparsity (per row for Wanda, per
    tensor for magnitude), pruned weights 0, and SparseGPT's layers after the first
    calibrated on inputs from the pruned blocks before them."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8))
    model.eval()
    batches = [torch.randint(0, 200, (2, 8), generator=torch.Generator().manual_seed(i))
               for i in range(3)]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = oneshot.prune_blocks(model, model.transformer.h, batches, method, 0.5)
    params = dict(model.named_parameters())
    assert len(out["masks"]) == 8
    for name, mask in out["masks"].items():
        assert (params[name][mask] == 0).all()
        assert abs(mask.float().mean().item() - 0.5) < 0.02, name
    changed = [n for n, p in params.items() if not torch.equal(p, before[n])]
    assert set(changed) == set(out["masks"])
    if method == "sparsegpt":
        assert set(out["errors"]) == set(out["masks"]) and all(e > 0 for e in out["errors"].values())
        kept = [n for n, m in out["masks"].items()]
        assert any(not torch.equal(params[n][~out["masks"][n]], before[n][~out["masks"][n]])
                   for n in kept)  # the survivors were updated


@pytest.mark.e2e
def test_prune_oneshot_scores_a_trained_run_and_leaves_it_as_it_was(data_dir, tmp_path,
                                                                   monkeypatch):
    """`python -m gpt2.prune_oneshot` on a finished tiny run: its "before" is the run's
    own final validation loss (the same weights and windows), the block Linears end at
    the sparsity, the result lands in <run>/oneshot/, and the run's checkpoint is not
    touched; a wrong structure and a missing checkpoint are one-line errors."""
    import hashlib
    import json

    from helpers import TINY, TINY_DATASET, call_main as run_py

    results = tmp_path / "results"
    # (min_lr 2e-4: neither the rate 3e-3 nor a tenth of it, so the fine-tune's default
    # rate below tells the run's min_lr from either)
    run_py("gpt2/train.py", *TINY, "--min-lr=2e-4", f"--data-dir={data_dir}",
           f"--results-dir={results}", "--run-name=dense", check=True)
    (run,) = results.glob("dense-*")
    ckpt = (run / "ckpt.pt").resolve()
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    final = json.loads((run / "summary.json").read_text())["final_val_loss"]
    losses = {}
    for method, extra in (("magnitude", ["--sparsity=0.5"]), ("wanda", ["--sparsity=0.5"]),
                          ("sparsegpt", ["--structure=2:4"])):
        proc = run_py("gpt2/prune_oneshot.py", f"--run-dir={run}", f"--method={method}",
                      "--calibration-samples=8", *extra)
        assert proc.returncode == 0, proc.stderr
        name = f"{method}-{'2of4' if method == 'sparsegpt' else '50'}.json"
        result = json.loads((run / "oneshot" / name).read_text())
        assert result["val_loss_before"] == pytest.approx(final, abs=1e-6)
        assert result["measured_sparsity"] == pytest.approx(0.5, abs=1e-3)
        assert result["calibration_tokens"] == 8 * 32
        losses[method] = result["val_loss"]
    assert all(loss != final for loss in losses.values()), losses  # it pruned something
    # FINETUNE: the same pruning (its loss recorded as "pruned"), then steps that lower it
    proc = run_py("gpt2/prune_oneshot.py", f"--run-dir={run}", "--method=wanda",
                  "--calibration-samples=8", "--sparsity=0.5", "--finetune-steps=8",
                  "--finetune-lr=3e-3")
    assert proc.returncode == 0, proc.stderr
    tuned = json.loads((run / "oneshot" / "wanda-50-ft8.json").read_text())
    assert tuned["val_loss_pruned"] == pytest.approx(losses["wanda"], abs=1e-6)
    assert tuned["val_loss"] < tuned["val_loss_pruned"]
    assert tuned["measured_sparsity"] == pytest.approx(0.5, abs=1e-3)
    assert tuned["finetune_tokens"] == 8 * 4 * 32 and tuned["finetune_lr"] == 3e-3
    assert "fine-tuned 8 steps at lr 0.003" in proc.stdout
    # ... on the batches the run would have trained on next (its step 31 onwards)
    from gpt2 import prune_oneshot
    from gpt2.data.loader import TrainBatches, open_split

    seen, rates = [], []

    def spy(model, cfg, runtime, masks, stream, steps, lr):
        seen.append(next(stream)[0])
        rates.append(lr)
        return [0.0]

    monkeypatch.setattr(prune_oneshot.oneshot, "finetune", spy)
    assert prune_oneshot.main([f"--run-dir={run}", "--method=magnitude", "--sparsity=0.5",
                               "--finetune-steps=1", "--device=cpu"]) == 0
    nxt = TrainBatches(open_split(str(data_dir), TINY_DATASET, "train"), 32, 4, 1,
                       1337).get(30, 0)[0]
    assert torch.equal(seen[0], torch.from_numpy(nxt))
    assert rates == [2e-4]  # without --finetune-lr: the run's own min_lr
    assert json.loads((run / "oneshot" / "magnitude-50-ft1.json").read_text())[
        "finetune_lr"] == 2e-4
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == digest
    bad = run_py("gpt2/prune_oneshot.py", f"--run-dir={run}", "--method=wanda",
                 "--structure=2:4", "--sparsity=0.7")
    assert bad.returncode == 2 and "prunes 0.5, not 0.7" in bad.stderr
    none = run_py("gpt2/prune_oneshot.py", f"--run-dir={tmp_path}", "--method=wanda",
                  "--sparsity=0.5")
    assert none.returncode == 2 and "no checkpoint at" in none.stderr
    assert "Traceback" not in none.stderr + bad.stderr


def test_calibration_windows_are_drawn_from_the_training_split_by_seed(data_dir):
    """The references draw random windows (seed 0): the same seed gives the same windows,
    another seed others, the windows differ from one another, and each is a run of the
    training split's own tokens."""
    import numpy as np

    from gpt2.config.options import Config
    from gpt2.data.loader import open_split
    from gpt2.prune_oneshot import calibration_batches

    cfg = Config(data_dir=str(data_dir), block_size=32)
    a = np.concatenate(calibration_batches(cfg, 6, 0, 4))
    assert a.shape == (6, 32)
    assert np.array_equal(a, np.concatenate(calibration_batches(cfg, 6, 0, 4)))
    assert not np.array_equal(a, np.concatenate(calibration_batches(cfg, 6, 1, 4)))
    assert len({row.tobytes() for row in a}) == 6
    tokens = open_split(str(data_dir), "shakespeare", "train")
    text = tokens.read(0, len(tokens))
    for row in a[:2]:
        starts = np.flatnonzero(text[:len(text) - 31] == row[0])
        assert any(np.array_equal(text[s:s + 32], row) for s in starts)


def test_sparsegpt_zeroes_the_weights_of_inputs_calibration_never_saw():
    """An input column that is zero in every calibration batch (a dead feature) has no
    curvature: the reference sets its Hessian diagonal to 1 and its weights to 0, so
    the inverse exists and nothing is updated through it. kgpt does the same."""
    W, batches = layer_data()
    dead = [3, 17, 40]
    for b in batches:
        b[..., dead] = 0.0
    stats = oneshot.SparseGPTStats(W.shape[1], "cpu")
    for b in batches:
        stats.add_batch(b)
    assert (torch.diag(stats.H)[dead] == 0).all()
    ref_W, ref_error = ref_fasterprune(W, stats.H, 0.5, blocksize=16)
    new, mask, error = oneshot.sparsegpt_prune(W, stats.H, 0.5, None, blocksize=16)
    assert torch.isfinite(new).all() and (new[:, dead] == 0).all() and mask[:, dead].all()
    assert torch.equal(mask, ref_W == 0)
    assert torch.allclose(new, ref_W, rtol=1e-4, atol=1e-5)
    assert error == pytest.approx(ref_error, rel=1e-4)
