"""Model FLOPs per token, the peak table and MFU: the formula against a hand count and
against torch's own FLOP counter, the arithmetic against the reference figures."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers import only_run_dir, train_tiny
from gpt2.model.gpt import GPT, GPTConfig
from gpt2.estimates.flops import flops_per_token, mfu, peak_tflops


def test_gpt2_124m_at_1024_tokens_matches_the_reference_limit():
    """The issue's reference: about 1.16M tokens/s at 100 % MFU on one H100."""
    with torch.device("meta"):
        model = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024))
    n = model.num_params(non_embedding=True)
    # The released 124M, plus the 47 rows that pad the vocabulary to 50304 (the head
    # computes them too), minus the position table.
    assert n == 124_439_808 + 47 * 768 - 1024 * 768
    per_token = flops_per_token(n, 12, 768, 1024)
    assert per_token == 6 * 123_689_472 + 12 * 12 * 768 * 1024 == 855_383_040
    limit = peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16", True) * 1e12 / per_token
    assert round(limit / 1e6, 2) == 1.16
    assert mfu(limit / 2, per_token, 989.4) == pytest.approx(0.5)


def test_the_formula_counts_what_torch_counts_in_a_training_step():
    """FlopCounterMode counts every matmul of a forward and backward pass; with SDPA's
    math kernel attention is plain matmuls over the full T x T scores, which is what
    12LHQT assumes. 6N + 12LHQT must match to within the few non-matmul parameters
    (LayerNorm gains) that N includes."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, bias=False)
    model = GPT(cfg)
    x = torch.randint(0, 50304, (2, cfg.block_size))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        _, loss = model(x, x)
        loss.backward()
    counted = counter.get_total_flops() / x.numel()
    predicted = flops_per_token(model.num_params(non_embedding=True), 2, 64, cfg.block_size)
    # The attention term alone is 2.5e-3 of the total here: leaving it out fails.
    assert counted == pytest.approx(predicted, rel=5e-4)


@pytest.mark.parametrize("name,dtype,tf32,peak", [
    ("NVIDIA H100 80GB HBM3", "bfloat16", True, 989.4),
    ("NVIDIA H100 PCIe", "bfloat16", True, 756.0),
    ("NVIDIA H200", "float16", False, 989.4),
    ("NVIDIA A100-SXM4-80GB", "float32", True, 156.0),
    ("NVIDIA A100-SXM4-80GB", "float32", False, 19.5),
    ("NVIDIA L4", "bfloat16", True, 121.0),
    ("NVIDIA L40S", "bfloat16", True, 362.05),  # not the L4's
    ("NVIDIA L40", "bfloat16", True, None),  # unlisted: no MFU rather than a wrong one
    ("AMD Radeon PRO W7900", "bfloat16", True, 122.6),
    ("cpu (2 cores, 2 threads)", "float32", True, None),
])
def test_peaks_are_looked_up_by_whole_name_and_precision(name, dtype, tf32, peak):
    assert peak_tflops(name, dtype, tf32) == peak


def test_mfu_is_none_without_a_known_peak():
    assert mfu(1e6, 1e9, None) is None


@pytest.mark.e2e
def test_a_run_summary_carries_flops_and_no_mfu_on_the_cpu(data_dir, tmp_path):
    train_tiny(data_dir, tmp_path, "--max-iters=5")
    run = only_run_dir(tmp_path)
    s = json.loads((run / "summary.json").read_text())
    model_params = s["n_params"] - 32 * 32  # minus the position table (block 32 x width 32)
    assert s["flops_per_token"] == flops_per_token(model_params, 2, 32, 32)
    assert s["achieved_tflops"] == pytest.approx(s["tokens_per_sec"] * s["flops_per_token"]
                                                 / 1e12)
    assert s["mfu"] is None and s["peak_tflops"] is None
