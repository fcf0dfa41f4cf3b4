"""GPT-2 size presets: the registry behind CONFIG_MODEL_SIZE and --model-size.

Dimensions are those of the released GPT-2 checkpoints (Radford et al. 2019, as
published with the Hugging Face weights). Pure data: importing this is free.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSize:
    n_layer: int
    n_head: int
    n_embd: int
    label: str  # the usual name for its parameter count


MODEL_SIZES: dict[str, ModelSize] = {
    "gpt2": ModelSize(12, 12, 768, "124M"),
    "gpt2-medium": ModelSize(24, 16, 1024, "350M"),
    "gpt2-large": ModelSize(36, 20, 1280, "774M"),
    "gpt2-xl": ModelSize(48, 25, 1600, "1.5B"),
}

# Not a preset: the dimensions come from --n-layer/--n-head/--n-embd.
CUSTOM = "custom"

MODEL_SIZE_CHOICES: tuple[str, ...] = (*MODEL_SIZES, CUSTOM)


def parameter_count(n_layer: int, n_embd: int, vocab_size: int, block_size: int,
                    bias: bool = True, tie_weights: bool = True, rmsnorm: bool = False,
                    learned_positions: bool = True, embedding_norm: bool = False,
                    head_bias: bool = False) -> int:
    """The unique parameters of kgpt's GPT-2 (gpt2/model/gpt.py; a tied head counts
    once), computed from its shapes without building it: what GPT.num_params() returns,
    for planning a budget in tokens per parameter without torch. The keywords after
    tie_weights are the architecture settings that change the count (CONFIG_MODEL_*)."""
    d = n_embd

    def linear(inputs: int, outputs: int) -> int:
        return inputs * outputs + (outputs if bias else 0)

    # LayerNorm: a gain, and a bias when there are biases; RMSNorm: a gain
    norm = d * (2 if bias and not rmsnorm else 1)
    block = 2 * norm + linear(d, 3 * d) + linear(d, d) + linear(d, 4 * d) + linear(4 * d, d)
    head = (0 if tie_weights else vocab_size * d) + (vocab_size if head_bias else 0)
    positions = block_size * d if learned_positions else 0
    return (vocab_size * d + positions + n_layer * block + norm + head
            + (norm if embedding_norm else 0))
