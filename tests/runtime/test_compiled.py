"""The compiled training step, without a GPU.

Every compiled run was once broken for a week (`fwd or model` on a compiled module)
and nobody saw it, because CI has no GPU and every CPU test trained eagerly. These
tests compile the real Trainer's step on the CPU: with aot_eager everywhere (Dynamo
and AOTAutograd trace forward and backward exactly as for inductor, then torch's own
kernels run them: seconds, no compiler), and with inductor where a C++ compiler
exists. They fail when the compiled step breaks, computes something else, breaks its
graph, or compiles again as the steps go on.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from helpers import read_jsonl, only_run_dir

TINY = dict(model_size="custom", n_layer=1, n_head=2, n_embd=32, block_size=32,
            batch_size=2, gradient_accumulation=2, warmup_iters=0, eval_interval=3,
            eval_tokens=64, sample_tokens=0, device="cpu", dtype="float32",
            data_workers=0, seed=7, log_interval=1, learning_rate=1e-2, min_lr=1e-3)


def train(data_dir, results, steps: int, **settings) -> tuple[list[dict], dict]:
    """Train the tiny model in this process; its metrics and what torch.compile did
    meanwhile (graphs compiled, graph breaks)."""
    from gpt2.config.options import resolve
    from gpt2.training import trainer
    from gpt2.runtime.device import compile_counts

    torch._dynamo.reset()
    before = compile_counts()
    cfg = resolve({**TINY, "data_dir": str(data_dir), "results_dir": str(results),
                   "max_iters": steps, "run_name": "c", **settings})
    assert trainer.train(cfg) == 0
    after = compile_counts()
    counts = {k: after[k] - before[k] for k in after}
    return read_jsonl(only_run_dir(results) / "metrics.jsonl"), counts


def losses(metrics: list[dict]) -> list[tuple[int, str, float]]:
    return [(m["step"], k, m[k]) for m in metrics for k in ("train_loss", "val_loss") if k in m]


@pytest.fixture(scope="module")
def eager(data_dir, tmp_path_factory):
    return train(data_dir, tmp_path_factory.mktemp("eager"), 6, compile="off")[0]


@pytest.mark.e2e
def test_the_compiled_step_trains_as_the_eager_one_in_two_graphs(data_dir, tmp_path, eager):
    """aot_eager: the real Trainer, compiled, gives eager's losses at every step
    and evaluation; it compiles once for the step and once for evaluation (no grad),
    with no graph break, however many steps it trains."""
    short, counts = train(data_dir, tmp_path / "a", 3, compile="on", compile_backend="aot_eager")
    assert counts == {"graphs": 2, "graph_breaks": 0}
    metrics, counts = train(data_dir, tmp_path / "b", 6, compile="on",
                            compile_backend="aot_eager")
    assert counts == {"graphs": 2, "graph_breaks": 0}  # (6 steps: not one graph more than 3)
    got, want = losses(metrics), losses(eager)
    assert [g[:2] for g in got] == [w[:2] for w in want] and len(got) >= 8
    for (step, name, value), (_, _, expected) in zip(got, want):
        assert value == pytest.approx(expected, rel=1e-5, abs=1e-6), (step, name)
    assert want[-1][2] < want[0][2]  # (it learns: the comparison is of a moving run)


@pytest.mark.e2e
@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                    reason="inductor on the CPU needs a C++ compiler")
def test_inductor_compiles_the_step_on_the_cpu(data_dir, tmp_path, eager):
    """The backend a GPU run uses, generating C++ kernels here (the first time about a
    minute on two cores; cached after): the same graphs, and eager's losses up to
    the rounding of fused kernels."""
    metrics, counts = train(data_dir, tmp_path, 6, compile="on")
    assert counts == {"graphs": 2, "graph_breaks": 0}
    for (step, name, value), (_, _, expected) in zip(losses(metrics), losses(eager)):
        assert value == pytest.approx(expected, rel=1e-4), (step, name)


@pytest.mark.e2e
def test_a_step_that_recompiles_is_counted(data_dir, tmp_path):
    """What the two tests above would see if the step compiled again each step: a
    value Dynamo guards on (a Python number read in forward) changing every step.
    compile_counts must count it, or the tests above could not fail."""
    from gpt2.model import gpt

    real = gpt.Block.forward
    calls = {"n": 0}

    def forward(self, *args, **kwargs):
        calls["n"] += 1
        out = real(self, *args, **kwargs)
        return out * (1.0 + 0.0 * self.planted_step) if hasattr(self, "planted_step") else out

    def planted(self, *args, **kwargs):
        self.planted_step = calls["n"]  # a new Python int each call: a guard that fails
        return forward(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gpt.Block, "forward", planted)
        _, counts = train(data_dir, tmp_path, 5, compile="on", compile_backend="aot_eager")
    assert counts["graphs"] > 2


@pytest.mark.e2e
@pytest.mark.parametrize("lever", [
    {"attention_backend": "math"},
    {"attention_backend": "flash"},
    {"loss_chunk_tokens": 32},
    {"loss_chunk_tokens": 32, "loss_fused": True},
    {"batch_size": 1, "gradient_accumulation": 4},
], ids=lambda lever: ",".join(f"{k}={v}" for k, v in lever.items()))
def test_no_speed_lever_changes_the_losses_beyond_rounding(data_dir, tmp_path, eager, lever):
    """Each speed lever (docs/performance.md) changes how the step runs, never what it
    computes: the tiny model's metrics.jsonl, step by step, is eager's default run's
    to float32 rounding (the same tokens per step: 2 x 2 sequences, or 1 x 4)."""
    metrics, _ = train(data_dir, tmp_path, 6, compile="off", **lever)
    got, want = losses(metrics), losses(eager)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    for (step, name, value), (_, _, expected) in zip(got, want):
        assert value == pytest.approx(expected, rel=2e-5), (step, name)


def test_a_mode_needs_the_inductor_backend():
    from gpt2.config.options import resolve
    from gpt2.errors import ConfigError

    with pytest.raises(ConfigError, match="CONFIG_COMPILE_BACKEND_INDUCTOR"):
        resolve({**TINY, "compile": "on", "compile_backend": "aot_eager",
                 "compile_mode": "max-autotune"})
    assert resolve({**TINY, "compile": "on", "compile_mode": "max-autotune"})


TRACK3_ARCH = dict(tie_weights=False, model_norm="rmsnorm", model_position="rope-half",
                   model_qk_norm=True, model_attention_scale=0.12, model_activation="relu2",
                   model_embedding_norm=True, model_head_bias=True, model_logit_cap=15.0,
                   model_init="track3", n_head=2, n_embd=32)


@pytest.mark.e2e
@pytest.mark.parametrize("precision", [{}, dict(model_precision="bf16-table", dtype="bfloat16")],
                         ids=["float32", "bf16-table"])
def test_the_track3_model_compiles_in_two_graphs_and_trains_as_eagerly(data_dir, tmp_path,
                                                                       precision):
    """Track 3's architecture (rotary positions computed in the step, the logit cap's
    own autograd function) under aot_eager: no graph break, and eager's losses; with
    its bfloat16 table too (the casts, and autocast switched off inside the model)."""
    arch = {**TRACK3_ARCH, **precision}
    eager_run = train(data_dir, tmp_path / "e", 4, compile="off", **arch)[0]
    metrics, counts = train(data_dir, tmp_path / "c", 4, compile="on",
                            compile_backend="aot_eager", **arch)
    assert counts == {"graphs": 2, "graph_breaks": 0}
    got, want = losses(metrics), losses(eager_run)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    for (step, name, value), (_, _, expected) in zip(got, want):
        assert value == pytest.approx(expected, rel=1e-5, abs=1e-6), (step, name)
