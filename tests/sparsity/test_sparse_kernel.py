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
from gpt2.sparsity.algorithms import sparse_kernel
from gpt2.training.trainer import train

PRUNED_24 = dict(pruning_method="magnitude", pruning_structure="2:4", target_sparsity=0.5,
                 compile="off")
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
    assert "off: no pruning" in sparse_kernel.problem(Config(pruning_structure="2:4"), "cuda",
                                                      (8, 0))


def test_auto_says_why_on_refuses_and_off_is_off():
    used, note = sparse_kernel.resolve(Config(**AUTO), "cpu")
    assert not used and note.startswith("no sparse kernel used") and "cpu" in note
    used, _ = sparse_kernel.resolve(Config(**AUTO), "cuda", (8, 6))
    assert used
    assert sparse_kernel.resolve(Config(**PRUNED_24), "cuda", (9, 0))[0] is True  # the default
    used, _ = sparse_kernel.resolve(Config(**PRUNED_24, sparse_kernel="off"), "cuda", (9, 0))
    assert not used
    with pytest.raises(ConfigError) as e:
        sparse_kernel.resolve(Config(**PRUNED_24, sparse_kernel="on"), "cpu")
    assert e.value.name == "sparse_kernel" and "cpu" in str(e.value)


def test_auto_is_the_default_and_leaves_a_compiled_model_dense_where_on_runs_it():
    """auto cannot time what a graph break costs a compiled model, so it stays dense
    there and says how to choose; on runs the kernel as an eager island."""
    assert Config().sparse_kernel == "auto"
    compiled = {**PRUNED_24, "compile": "auto"}  # compile auto: compiled on CUDA
    why = sparse_kernel.problem(Config(**compiled), "cuda", (9, 0))
    assert "compiled (CONFIG_COMPILE)" in why and "CONFIG_SPARSE_KERNEL_ON" in why
    assert sparse_kernel.problem(Config(**compiled, sparse_kernel="on"), "cuda", (9, 0)) is None
    assert sparse_kernel.problem(Config(**{**compiled, "compile": "on"}, sparse_kernel="on"),
                                 "cuda", (9, 0)) is None
    assert "cpu" in sparse_kernel.problem(Config(**compiled), "cpu")  # not compiled there


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


class StandIn:
    """The compression's stand-in: refuses a weight that is not 2:4 (as the kernel
    would), records its shape and returns it dense."""

    def __init__(self):
        self.shapes: list[tuple[int, int]] = []
        self.dtypes: list[torch.dtype] = []

    def __call__(self, w):
        assert int((w.view(w.shape[0], -1, 4) != 0).sum(-1).max()) <= 2, "not 2:4 yet"
        self.shapes.append(tuple(w.shape))
        self.dtypes.append(w.dtype)
        return w


class Clock:
    """sparse_kernel.time_ms's stand-in: milliseconds by weight shape when the call
    compresses (``pack`` saw it), ``dense_ms`` when not, so a test decides which
    shapes are faster sparse."""

    def __init__(self, pack: StandIn, sparse_ms: dict[tuple[int, int], float],
                 dense_ms: float = 1.0):
        self.pack, self.sparse_ms, self.dense_ms, self.calls = pack, sparse_ms, dense_ms, []
        self.devices, self.outputs = [], []

    def __call__(self, fn, device):
        before = len(self.pack.shapes)
        out = fn()
        shape = self.pack.shapes[-1] if len(self.pack.shapes) > before else "dense"
        self.calls.append(shape)
        self.devices.append(device)
        self.outputs.append(tuple(out.shape))
        return self.dense_ms if shape == "dense" else self.sparse_ms[shape]


def stand_in(monkeypatch) -> StandIn:
    pack = StandIn()
    monkeypatch.setattr(sparse_kernel.SparseLinear, "pack", staticmethod(pack))
    return pack


CPU = torch.device("cpu")


def test_the_check_keeps_a_shape_sparse_only_where_it_is_right_and_faster(monkeypatch):
    clock = Clock(stand_in(monkeypatch), {(32, 64): 1.0, (64, 32): 1.96}, dense_ms=2.0)
    cfg = Config(**AUTO, batch_size=2, block_size=8)
    verdicts = sparse_kernel.decide(cfg, [(64, 32), (32, 64), (64, 32)], torch.float32, CPU,
                                    clock=clock)
    assert [v.shape for v in verdicts] == [(32, 64), (64, 32)]  # each shape once, sorted
    assert [v.sparse for v in verdicts] == [True, False]  # 2 % faster is not enough: 1.96 < 2
    assert "1.000 ms sparse with compression vs 2.000 ms dense, 16 rows" in verdicts[0].why
    assert verdicts[1].line().startswith("64x32: dense (1.960 ms sparse")
    assert clock.calls == [(32, 64), "dense", (64, 32), "dense"]
    assert clock.devices == [CPU] * 4  # each timed on the run's device, the same product
    assert clock.outputs == [(2, 8, 32), (2, 8, 32), (2, 8, 64), (2, 8, 64)]
    # on: checked, not timed, every shape kept
    on = sparse_kernel.decide(Config(**PRUNED_24, sparse_kernel="on"), [(64, 32)],
                              torch.float32, CPU, clock=clock)
    assert on[0].sparse is True and on[0].shape == (64, 32) and on[0].why.startswith("checked")
    assert len(clock.calls) == 4


@pytest.mark.parametrize("fault", ["raises", "wrong", "nan", "shape"])
def test_a_kernel_that_fails_its_check_keeps_auto_dense_and_refuses_on(monkeypatch, fault):
    def bad(w):
        if fault == "raises":
            raise RuntimeError("CUDA error: operation not supported\nmore")
        return {"wrong": w.flip(1), "nan": w * float("nan"), "shape": w[:-4]}[fault]

    monkeypatch.setattr(sparse_kernel.SparseLinear, "pack", staticmethod(bad))
    clock = Clock(StandIn(), {})
    [v] = sparse_kernel.decide(Config(**AUTO, batch_size=2, block_size=8, bias=False),
                               [(16, 32)], torch.float32, CPU, clock=clock)
    assert v.sparse is False and v.shape == (16, 32)
    assert not clock.calls  # not timed: wrong is wrong however fast
    assert {"raises": "the kernel failed: RuntimeError: CUDA error: operation not supported",
            "wrong": "differs from the dense one by", "nan": "differs from the dense one by nan",
            "shape": "has shape (2, 8, 12), not (2, 8, 16)"}[fault] in v.why
    with pytest.raises(ConfigError) as e:
        sparse_kernel.decide(Config(**PRUNED_24, sparse_kernel="on", batch_size=2,
                                    block_size=8, bias=False), [(16, 32)], torch.float32, CPU)
    assert e.value.name == "sparse_kernel" and "16x32: dense (" in str(e.value)


def test_the_check_does_not_disturb_the_runs_random_streams(monkeypatch):
    pack = stand_in(monkeypatch)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    sparse_kernel.check((16, 32), (2, 4), torch.float32, CPU, timed=True, bias=True,
                        clock=Clock(pack, {(16, 32): 1}))
    assert pack.shapes
    assert torch.equal(torch.get_rng_state(), before)


def test_the_processes_of_a_run_agree_on_one_decision(monkeypatch):
    """Each process times its own GPU; a shape runs sparse only where all found it
    faster, so every process runs the same kernels."""
    V = sparse_kernel.Verdict
    rank0 = [V((32, 64), True, "0.4 ms"), V((64, 32), True, "0.5 ms")]
    rank1 = [V((32, 64), True, "0.3 ms"), V((64, 32), False, "0.9 ms vs 0.8")]
    assert sparse_kernel.agree([rank0, rank1]) == [rank0[0], rank1[1]]
    assert sparse_kernel.agree([rank1, rank0]) == [rank1[0], rank1[1]]
    clock = Clock(stand_in(monkeypatch), {(32, 64): 0.5, (64, 32): 0.5})
    gathered = []

    def gather(mine):  # Dist.gather: every process's verdicts, in rank order
        gathered.append(mine)
        return [mine, rank1]

    verdicts = sparse_kernel.decide(Config(**AUTO, batch_size=2, block_size=8),
                                    [(64, 32), (32, 64)], torch.float32, CPU, gather=gather,
                                    clock=clock)
    assert [v.sparse for v in gathered[0]] == [True, True]
    assert verdicts == [gathered[0][0], rank1[1]]


@pytest.mark.e2e
def test_a_run_switches_to_the_kernel_once_its_masks_are_final(data_dir, tmp_path,
                                                              monkeypatch):
    """The swap comes the step after the ramp's end, not before (the weights are not
    2:4 yet: the stand-in refuses them), on the shapes the check found faster, and
    training goes on as the dense masked run."""
    common = {**BASE, "data_dir": str(data_dir), "results_dir": str(tmp_path)}
    dense = resolve({**common, "sparse_kernel": "off", "run_name": "dense"})
    rc, out = quiet_train(dense)
    pack = stand_in(monkeypatch)
    assert rc == 0 and "no sparse kernel" not in out and "kernel check" not in out
    monkeypatch.setattr(sparse_kernel, "problem", lambda *a, **k: None)
    # of the 2-layer model's four pruned shapes, the MLP's two are faster sparse
    clock = Clock(pack, {(32, 32): 2.0, (96, 32): 1.0, (128, 32): 0.5, (32, 128): 0.5})
    monkeypatch.setattr(sparse_kernel, "time_ms", clock)
    cfg = resolve({**common, "run_name": "sparse", "sparse_kernel": "auto"})
    rc, out = quiet_train(cfg)
    assert rc == 0, out
    assert ("sparse kernel check, per pruned weight shape (out x in):\n"
            "  32x32: dense (2.000 ms sparse with compression vs 1.000 ms dense, 128 rows)\n"
            "  32x128: sparse (0.500 ms") in out
    assert "  96x32: dense (1.000 ms" in out and "  128x32: sparse (0.500 ms" in out
    end = 8  # pruning_end 0.5 of 16 steps
    assert f"step {end + 1:>6}/16 | 2:4 masks final: 4 Linear layers" in out
    assert len(clock.calls) == 8  # each shape timed once sparse, once dense
    in_training = pack.shapes[2 * 4:]  # (each shape's check compressed it twice)
    assert set(in_training) == {(128, 32), (32, 128)}  # after the check, the MLP's only
    # 4 Linears x (steps end+1..16) forwards, and the evaluations after the swap
    assert len(in_training) >= 4 * (16 - end)
    assert RunDir(cfg).summary().sparse_kernel_layers == 4
    assert RunDir(dense).summary().sparse_kernel_layers is None
    assert "sparse_kernel_layers" not in RunDir(dense).summary().to_dict()
    a = read_jsonl(RunDir(dense).metrics)
    b = read_jsonl(RunDir(cfg).metrics)
    for x, y in zip(a, b):
        if "val_loss" in x:
            assert y["val_loss"] == pytest.approx(x["val_loss"], rel=1e-5)


@pytest.mark.e2e
def test_a_resume_runs_the_kernels_its_run_decided_on(data_dir, tmp_path, monkeypatch):
    """The decision is in the checkpoint: a resume whose timing would choose otherwise
    (another GPU, another load) runs the kernels the run began with, without a check."""
    monkeypatch.setattr(sparse_kernel, "problem", lambda *a, **k: None)
    pack = stand_in(monkeypatch)
    monkeypatch.setattr(sparse_kernel, "time_ms", Clock(pack, {(32, 32): 0.5, (96, 32): 2.0,
                                                                (128, 32): 2.0, (32, 128): 2.0}))
    cfg = resolve({**BASE, "data_dir": str(data_dir), "results_dir": str(tmp_path),
                   "sparse_kernel": "auto"})
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        assert train(cfg, stop_at_step=4) == 130
    assert "  32x32: sparse (" in out.getvalue()
    monkeypatch.setattr(sparse_kernel, "time_ms", Clock(pack, {}))  # a check now would raise
    rc, out = quiet_train(cfg)
    assert rc == 0, out
    assert "kernel check" not in out
    assert "sparse kernel: as this run decided before its first step, on 32x32" in out
    assert "step      9/16 | 2:4 masks final: 2 Linear layers" in out  # two attn c_proj


def test_the_memory_estimate_carries_the_kernels_measured_cost():
    """The compressed copy of a weight lives during its Linear's forward only (the
    backward uses the dense weight): named, not added. What the kernel's forward
    holds at the backward's peak was measured on a GPU at 3.9x the activations (the
    prediction without it was 2.25x short): the estimate adds 4x where the kernel can
    run, and nothing where it cannot (off, or on the CPU)."""
    from gpt2.estimates import memory

    on = memory.estimate(Config(**AUTO), "cuda")
    off = memory.estimate(Config(**PRUNED_24, sparse_kernel="off"), "cuda")
    cpu = memory.estimate(Config(**AUTO), "cpu")
    assert on.phase == off.phase == "backward through the output head"
    assert on.peak - off.peak == int(4.0 * off.term("activations")) > 0
    assert on.term("sparse") == on.peak - off.peak
    assert "sparse" not in {t.key for t in off.terms} | {t.key for t in cpu.terms}
    assert cpu.peak == memory.estimate(Config(**PRUNED_24, sparse_kernel="off"), "cpu").peak
    note = next(t.note for t in on.terms if t.key == "copies")
    assert "compressed copies" in note
    assert "compressed" not in next(t.note for t in off.terms if t.key == "copies")
    assert "compressed" not in next(t.note for t in cpu.terms if t.key == "copies")


def test_in_a_compiled_model_the_sparse_linear_runs_eagerly_every_call(monkeypatch):
    """CONFIG_SPARSE_KERNEL_ON with torch.compile: the compiler must not trace the
    compression into its graph (a semi-structured tensor made at trace time would be
    reused stale), so each call compresses the weight as it is then. The stand-in
    compression would make dynamo break the graph by itself, so the mark that keeps
    the real one out is checked too."""
    pack = stand_in(monkeypatch)
    torch.manual_seed(0)
    dense = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 8))
    with torch.no_grad():
        for layer in (dense[0], dense[2]):
            layer.weight.copy_(two_four(tuple(layer.weight.shape)))
    model = nn.Sequential(*[sparse_kernel.SparseLinear.of(m) if isinstance(m, nn.Linear) else m
                            for m in dense])
    assert type(model[0]).forward._torchdynamo_disable  # (marked by the first of())
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(4, 16)
    for call in range(3):
        with torch.no_grad():
            dense[2].weight.mul_(0.5)  # what an optimizer step does between calls
        torch.testing.assert_close(compiled(x), dense(x))
    assert len(pack.shapes) == 2 * 3


@pytest.mark.e2e
def test_a_run_whose_kernel_fails_its_check_trains_dense_and_says_so(data_dir, tmp_path,
                                                                    monkeypatch):
    """auto on a GPU whose build cannot compress (say, no cuSPARSELt): the run is
    told why, trains on dense matmuls to the end, and never swaps a Linear."""
    def broken(w):
        raise RuntimeError("cuSPARSELt not supported on your machine.")

    monkeypatch.setattr(sparse_kernel, "problem", lambda *a, **k: None)
    monkeypatch.setattr(sparse_kernel.SparseLinear, "pack", staticmethod(broken))
    engaged = []
    monkeypatch.setattr(sparse_kernel, "engage", lambda *a: engaged.append(a) or 0)
    cfg = resolve({**BASE, "data_dir": str(data_dir), "results_dir": str(tmp_path),
                   "max_iters": 10, "sparse_kernel": "auto"})
    rc, out = quiet_train(cfg)
    assert rc == 0, out
    assert ("  32x32: dense (the kernel failed: RuntimeError: cuSPARSELt not supported on your "
            "machine.)") in out
    assert "sparse kernel: no weight shape passed; the masks apply to dense matmuls" in out
    assert "masks final" not in out and not engaged
    assert RunDir(cfg).summary().sparse_kernel_layers == 0


@pytest.mark.parametrize("bias", [True, False])
def test_the_check_runs_the_runs_own_linear_shape_batch_and_bias(monkeypatch, bias):
    """The kernel's products with and without a bias, and on 2-D or 3-D inputs, are
    different calls: the check makes the one training makes."""
    calls = []
    monkeypatch.setattr(sparse_kernel, "check", lambda *a: calls.append(a) or
                        sparse_kernel.Verdict(a[0], True, "stub"))
    cfg = Config(**AUTO, batch_size=3, block_size=16, bias=bias)
    sparse_kernel.decide(cfg, [(64, 32)], torch.bfloat16, CPU)
    [(shape, batch, dtype, device, timed, with_bias, _)] = calls
    assert (shape, batch, dtype, timed, with_bias) == ((64, 32), (3, 16), torch.bfloat16, True,
                                                       bias)
    monkeypatch.undo()  # the real check, through the Linear it builds, in the run's dtype
    pack = stand_in(monkeypatch)
    v = sparse_kernel.check((64, 32), (3, 16), torch.bfloat16, CPU, timed=False, bias=bias)
    assert v.sparse and pack.shapes == [(64, 32)] and pack.dtypes == [torch.bfloat16]


def test_the_clock_is_the_median_of_ten_calls_after_three_untimed(monkeypatch):
    calls = []
    ticks = iter([0.0, 0.001, 1.0, 1.005, 2.0, 2.002, 3.0, 3.001, 4.0, 4.009,
                  5.0, 5.003, 6.0, 6.001, 7.0, 7.004, 8.0, 8.002, 9.0, 9.003])
    monkeypatch.setattr(sparse_kernel.time, "perf_counter", lambda: next(ticks))
    ms = sparse_kernel.time_ms(lambda: calls.append(1), CPU)
    assert len(calls) == 13  # 3 untimed, 10 timed
    # the ten durations: 1 5 2 1 9 3 1 4 2 3 ms; their median 2.5
    assert ms == pytest.approx(2.5)
