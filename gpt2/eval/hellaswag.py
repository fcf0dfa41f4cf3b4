"""HellaSwag (Zellers et al. 2019): pick the right ending of a sentence, zero-shot.

Each example has a context and four endings. Every ending is scored by the model's
loss on the ending's tokens given the context (the ending is encoded with a
leading space, as it continues the sentence), and two accuracies are reported:

* ``acc``: the ending with the lowest total loss is the prediction;
* ``acc_norm``: the lowest loss per token, which does not favour short endings.

A random guess scores 0.25; GPT-2 124M scores about 0.29 acc_norm. Examples longer
than the model's context keep their last ``block_size`` tokens.

The validation file comes from the dataset's public repository when online, or a
local path; tests write small files in the same jsonl format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from gpt2 import storage
from gpt2.data.prepare import download
from gpt2.data.shards import DataError
from gpt2.data.tokenizer import encode

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
VAL_EXAMPLES = 10042  # rows of the published validation file
FILE_NAME = "hellaswag_val.jsonl"


@dataclass(frozen=True)
class Example:
    context: str
    endings: tuple[str, str, str, str]
    label: int


def default_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / "hellaswag" / FILE_NAME


def file_of(cfg) -> Path:
    """The validation file a run's Config names (CONFIG_HELLASWAG_PATH, else the
    data folder's)."""
    return Path(cfg.hellaswag_path or default_path(cfg.data_dir))


def fetch(dest: Path) -> Path:
    """The validation file at ``dest``, downloaded when absent. The published file has
    no checksum of its own to pin: the download is checked by its row count and
    schema instead (every row is parsed on load)."""
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        download(URL, dest, sha256=None)
    rows = sum(1 for line in dest.open(encoding="utf-8") if line.strip())
    if rows != VAL_EXAMPLES:
        print(f"note: {dest} has {rows} examples; the published validation set has "
              f"{VAL_EXAMPLES}")
    return dest


def load(path: Path, limit: int = 0) -> list[Example]:
    """The first ``limit`` examples (0: all), each row checked."""
    if not path.exists():
        raise DataError(f"HellaSwag file {path} is missing: run `make eval-hellaswag` once "
                        "online (it downloads it), or set CONFIG_HELLASWAG_PATH to a local "
                        "copy")
    data = storage.read_regular(path)
    if data is None:
        raise DataError(f"HellaSwag file {path} cannot be read (not a regular file, or not "
                        "this user's to read)")
    out = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            endings = tuple(str(e) for e in row["endings"])
            label = row["label"]
            if isinstance(label, str) and label.strip().isdigit():
                label = int(label)
            if len(endings) != 4 or isinstance(label, bool) or label not in (0, 1, 2, 3):
                raise ValueError("needs 4 endings and a label 0-3")
            out.append(Example(str(row["ctx"]), endings, int(label)))
        except (KeyError, TypeError, ValueError, RecursionError) as e:  # (JSONDecodeError too)
            raise DataError(f"{path}:{number}: not a HellaSwag example ({str(e)[:80]}); each "
                            "line needs ctx, endings (4) and label") from None
        if limit and len(out) == limit:
            break
    if not out:
        raise DataError(f"{path} holds no examples")
    return out


def render(example: Example, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four rows of context + ending tokens, right-padded, and a mask of the ending
    tokens (the ones scored). Rows longer than ``block_size`` lose their start."""
    ctx = encode(example.context)
    rows, masks = [], []
    for ending in example.endings:
        end = encode(" " + ending)
        toks = (ctx + end)[-block_size:]
        n_end = min(len(end), len(toks) - 1)  # the first token has nothing to predict it
        rows.append(toks)
        masks.append([0] * (len(toks) - n_end) + [1] * n_end)
    width = max(map(len, rows))
    tokens = torch.zeros(4, width, dtype=torch.long)
    mask = torch.zeros(4, width, dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        tokens[i, :len(r)] = torch.tensor(r)
        mask[i, :len(m)] = torch.tensor(m, dtype=torch.bool)
    return tokens, mask


@torch.no_grad()
def ending_losses(model, tokens: torch.Tensor, mask: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Total and mean loss over each row's ending tokens."""
    logits = model.all_logits(tokens).float()
    # Position t predicts token t + 1.
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")
    m = mask[:, 1:].float()
    total = (losses * m).sum(1)
    return total, total / m.sum(1)


@torch.no_grad()
def count_correct(model, share: list[tuple[Example, bool]], device: str,
                  autocast) -> dict[str, int]:
    """Counts of right answers over this process's ``share`` of the examples, as
    (example, counted) pairs (gpt2/runtime/distributed.py: Dist.share); the caller
    sums them over processes."""
    was_training = model.training
    model.eval()
    correct = correct_norm = examples = 0
    for ex, counted in share:
        tokens, mask = render(ex, model.cfg.block_size)
        with autocast():
            total, mean = ending_losses(model, tokens.to(device), mask.to(device))
        if counted:
            correct += int(total.argmin().item() == ex.label)
            correct_norm += int(mean.argmin().item() == ex.label)
            examples += 1
    model.train(was_training)
    return {"correct": correct, "correct_norm": correct_norm, "examples": examples}


def accuracies(counts: dict[str, int]) -> dict[str, float | int]:
    n = counts["examples"]
    return {"hellaswag_acc": counts["correct"] / n, "hellaswag_acc_norm":
            counts["correct_norm"] / n, "hellaswag_examples": n}
