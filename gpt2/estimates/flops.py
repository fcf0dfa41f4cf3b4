"""Model FLOPs per token, device peaks, and model FLOPs utilisation (MFU).

FLOPs follow the PaLM paper's appendix B: a token costs 6N FLOPs in the matmuls of
its forward and backward pass (N = parameters that take part in matmuls), plus
12·L·H·Q·T for attention scores and values (L layers, H heads of width Q, so
H·Q = n_embd, over a context of T tokens). N here is the model without its position
table; a token table tied to the output head counts once, as the head's matmul.
Counting model FLOPs, not hardware FLOPs, means recomputation (activation
checkpointing) does not raise MFU.

For GPT-2 124M at T = 1024 (vocabulary padded to 50304) that is 855,383,040 FLOPs
per token, so an H100 SXM (989.4 dense bf16 TFLOP/s) tops out at about 1.16M tokens/s.
"""

from __future__ import annotations

import re

# Dense (no structured sparsity) peak tensor throughput in TFLOP/s, from the vendors'
# datasheets, per precision a run can use: bf16/fp16 autocast, float32 with TF32
# matmuls, plain float32. Matched as whole words against torch.cuda.get_device_name()
# ("L4" is not "L40S"), first match wins, so longer names come first.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200 NVL", {"bf16": 835.0, "tf32": 417.5, "fp32": 60.0}),
    ("H200", {"bf16": 989.4, "tf32": 494.7, "fp32": 67.0}),
    ("H100 NVL", {"bf16": 835.0, "tf32": 417.5, "fp32": 60.0}),
    ("H100 PCIe", {"bf16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("H100", {"bf16": 989.4, "tf32": 494.7, "fp32": 67.0}),
    ("A100", {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("A10", {"bf16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("W7900", {"bf16": 122.6, "fp32": 61.3}),
    ("MI300X", {"bf16": 1307.4, "tf32": 653.7, "fp32": 163.4}),
)


def flops_per_token(n_params: int, n_layer: int, n_embd: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N + 12·L·(H·Q)·T (PaLM, appendix B)."""
    return 6.0 * n_params + 12.0 * n_layer * n_embd * seq_len


def precision_key(dtype: str, tf32: bool) -> str:
    """Which peak a run is measured against."""
    if dtype in ("bfloat16", "float16"):
        return "bf16"
    return "tf32" if tf32 else "fp32"


def peak_tflops(device_name: str, dtype: str, tf32: bool) -> float | None:
    """The device's dense peak for this precision, or None when we do not know it
    (the CPU, an unlisted GPU): then only achieved FLOP/s are reported."""
    key = precision_key(dtype, tf32)
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(rf"\b{re.escape(pattern)}\b", device_name):
            return peaks.get(key)
    return None


def mfu(tokens_per_sec: float, flops_token: float, peak: float | None) -> float | None:
    """Achieved model FLOP/s as a fraction of the peak (peak in TFLOP/s)."""
    if not peak or tokens_per_sec is None:
        return None
    return tokens_per_sec * flops_token / (peak * 1e12)


def speed_figures(model, cfg, device_type: str, device_name: str,
                  tokens_per_sec: float | None) -> dict[str, float | None]:
    """Model FLOPs per token of ``model`` (a GPT configured by ``cfg``), achieved
    TFLOP/s and MFU at ``tokens_per_sec``; None where unknown (no speed, or a device
    whose peak is not listed, such as a CPU)."""
    n_layer, _, n_embd = cfg.dims()
    per_token = flops_per_token(model.num_params(non_embedding=True), n_layer, n_embd,
                                cfg.block_size)
    achieved = tokens_per_sec * per_token / 1e12 if tokens_per_sec else None
    peak = peak_tflops(device_name, cfg.dtype, cfg.tf32) if device_type == "cuda" else None
    return {"flops_per_token": per_token, "achieved_tflops": achieved, "peak_tflops": peak,
            "mfu": mfu(tokens_per_sec, per_token, peak) if tokens_per_sec else None}
