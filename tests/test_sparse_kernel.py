"""CONFIG_SPARSE_KERNEL: when the 2:4 kernel is used, refused, or skipped with a reason,
and that the sparse Linear computes the dense masked model's forward and gradients.

The kernels themselves are CUDA-only (torch.sparse.to_sparse_semi_structured refuses
CPU tensors), so here the compression is replaced by a stand-in that checks what it is
given is 2:4 and returns it dense: the swap, its timing and the autograd are what is
tested; the kernels' speed is `make bench`'s, on a GPU.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
from torch import nn

from helpers import read_jsonl
from gpt2.config.options import Config, resolve
from gpt2.errors import ConfigError
from gpt2.run_folder import RunDir
from gpt2.training import sparse_kernel
from gpt2.training.trainer import train

PRUNED_24 = dict(pruning_method="magnitude", pruning_structure="2:4", target_sparsity=0.5)
AUTO = dict(PRUNED_24, sparse_kernel="auto")


def test_the_kernel_is_used_only_where_it_can_run():
    cfg = Config(**PRUNED_24)
    assert sparse_kernel.problem(cfg, "cuda", (8, 0)) is None
    assert sparse_kernel.problem(cfg, "cuda", (9, 0)) is None
    assert "7.5" in sparse_kernel.problem(cfg, "cuda", (7, 5))
    assert "cpu" in sparse_kernel.problem(cfg, "cpu")
    assert "mps" in sparse_kernel.problem(cfg, "mps")
    assert "float32" in sparse_kernel.problem(Config(**PRUNED_24, dtype="float32"), "cuda",
                                              (8, 0))
    assert "n_embd 96" in sparse_kernel.problem(
        Config(**PRUNED_24, model_size="custom", n_embd=96, n_head=2), "cuda", (8, 0))
    assert "2:4" in sparse_kernel.problem(Config(pruning_method="magnitude",
                                                 target_sparsity=0.5), "cuda", (8, 0))
    assert "FSDP" in sparse_kernel.problem(Config(**PRUNED_24, parallel="fsdp",
                                                  nproc_per_node=2), "cuda", (8, 0))
    # DDP keeps whole weights; FSDP of one process shards nothing
    for parallel, procs in (("ddp", 2), ("fsdp", 1)):
        assert sparse_kernel.problem(Config(**PRUNED_24, parallel=parallel,
                                            nproc_per_node=procs), "cuda", (8, 0)) is None
    assert "off: no pruning" in sparse_kernel.problem(Config(), "cuda", (8, 0))


def test_auto_says_why_on_refuses_and_off_is_off():
    used, note = sparse_kernel.resolve(Config(**AUTO), "cpu")
    assert not used and note.startswith("no sparse kernel used") and "cpu" in note
    used, _ = sparse_kernel.resolve(Config(**AUTO), "cuda", (8, 6))
    assert used
    # off by default, until a GPU has run the kernel path
    assert sparse_kernel.resolve(Config(**PRUNED_24), "cuda", (9, 0))[0] is False
    used, _ = sparse_kernel.resolve(Config(**PRUNED_24, sparse_kernel="off"), "cuda", (9, 0))
    assert not used
    with pytest.raises(ConfigError) as e:
        sparse_kernel.resolve(Config(**PRUNED_24, sparse_kernel="on"), "cpu")
    assert e.value.name == "sparse_kernel" and "cpu" in str(e.value)


def test_the_setting_is_refused_where_it_does_not_apply():
    with pytest.raises(ConfigError) as e:
        resolve({"pruning_method": "magnitude", "target_sparsity": 0.5, "sparse_kernel": "on"})
    assert e.value.name == "sparse_kernel"


def two_four(shape, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g)
    keep = torch.rand(shape, generator=g).view(shape[0], -1, 4).argsort(-1) < 2
    return w * keep.view(shape)


@pytest.mark.parametrize("autocast", [False, True])
def test_the_sparse_linear_equals_the_dense_one_forward_and_backward(monkeypatch, autocast):
    packed = []

    def pack(w):  # the compression's contract: at most 2 nonzeros in every 4
        assert int((w.view(w.shape[0], -1, 4) != 0).sum(-1).max()) <= 2
        packed.append(w.dtype)
        return w.clone()

    monkeypatch.setattr(sparse_kernel.SparseLinear, "pack", staticmethod(pack))
    dense = nn.Linear(16, 8)
    with torch.no_grad():
        dense.weight.copy_(two_four((8, 16)))
    sparse = sparse_kernel.SparseLinear.of(dense)
    assert sparse.weight is dense.weight and sparse.bias is dense.bias
    x = torch.randn(3, 5, 16, requires_grad=True)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    outs, grads = [], []
    for module in (dense, sparse):
        x.grad = None
        module.zero_grad()
        with ctx:
            y = module(x)
        (y.float() ** 2).sum().backward()
        outs.append(y)
        grads.append((x.grad.clone(), module.weight.grad.clone(), module.bias.grad.clone()))
    assert outs[0].dtype == outs[1].dtype == (torch.bfloat16 if autocast else torch.float32)
    assert packed == [torch.bfloat16 if autocast else torch.float32]
    tol = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[1], outs[0], **tol)
    for got, want in zip(grads[1], grads[0]):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, **tol)


def test_engage_swaps_the_pruned_linears_and_keeps_names_and_parameters():
    from gpt2.model.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64))
    before = dict(model.named_parameters())
    names = [n for n in before if n.startswith("transformer.h.0.mlp.")]
    names.append("transformer.wte.weight")  # an embedding: not a Linear, left alone
    assert sparse_kernel.engage(model, names) == 2
    assert type(model.transformer.h[0].mlp.c_fc) is sparse_kernel.SparseLinear
    assert type(model.transformer.h[1].mlp.c_fc) is nn.Linear
    assert all(p is before[n] for n, p in model.named_parameters())


def quiet_train(cfg) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = train(cfg)
    return rc, out.getvalue()


BASE = dict(model_size="custom", n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4,
            max_iters=16, warmup_iters=2, learning_rate=3e-3, min_lr=3e-4, eval_interval=8,
            eval_tokens=128, log_interval=1, sample_tokens=0, device="cpu", dtype="float32",
            data_workers=0, cpu_threads=1, pruning_warmup=2, pruning_end=0.5,
            pruning_frequency=2, **PRUNED_24)


def test_on_where_it_cannot_run_is_refused_before_the_run_folder(data_dir, tmp_path):
    cfg = resolve({**BASE, "sparse_kernel": "on", "data_dir": str(data_dir),
                   "results_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="CONFIG_SPARSE_KERNEL_ON, but PyTorch has no"):
        quiet_train(cfg)
    assert not RunDir(cfg).path.exists()


def test_a_run_switches_to_the_kernel_once_its_masks_are_final(data_dir, tmp_path,
                                                              monkeypatch):
    """The swap comes the step after the ramp's end, not before (the weights are not
    2:4 yet: the stand-in refuses them), and training goes on as the dense masked run."""
    seen = []

    def pack(w):
        assert int((w.view(w.shape[0], -1, 4) != 0).sum(-1).max()) <= 2, "not 2:4 yet"
        seen.append(1)
        return w

    common = {**BASE, "data_dir": str(data_dir), "results_dir": str(tmp_path)}
    dense = resolve({**common, "sparse_kernel": "off", "run_name": "dense"})
    rc, out = quiet_train(dense)
    assert rc == 0 and "no sparse kernel" not in out and not seen
    monkeypatch.setattr(sparse_kernel, "problem", lambda *a, **k: None)
    monkeypatch.setattr(sparse_kernel.SparseLinear, "pack", staticmethod(pack))
    cfg = resolve({**common, "run_name": "sparse", "sparse_kernel": "auto"})
    rc, out = quiet_train(cfg)
    assert rc == 0, out
    end = 8  # pruning_end 0.5 of 16 steps
    assert f"step {end + 1:>6}/16 | 2:4 masks final: 8 Linear layers" in out
    # 8 Linears x (steps end+1..16) forwards, and the evaluations after the swap
    assert len(seen) >= 8 * (16 - end)
    a = read_jsonl(RunDir(dense).metrics)
    b = read_jsonl(RunDir(cfg).metrics)
    for x, y in zip(a, b):
        if "val_loss" in x:
            assert y["val_loss"] == pytest.approx(x["val_loss"], rel=1e-5)


def test_the_memory_estimate_knows_the_compressed_copies_are_transient():
    """The compressed copy of a weight lives during its Linear's forward only (the
    backward uses the dense weight): named in the estimate, not added to its peak."""
    from gpt2.training import memory

    on = memory.estimate(Config(**AUTO), "cuda")
    off = memory.estimate(Config(**PRUNED_24, sparse_kernel="off"), "cuda")
    assert on.peak == off.peak
    note = next(t.note for t in on.terms if t.key == "copies")
    assert "compressed copies" in note
    assert "compressed" not in next(t.note for t in off.terms if t.key == "copies")
    assert "compressed" not in next(t.note for t in memory.estimate(
        Config(**AUTO), "cpu").terms if t.key == "copies")
