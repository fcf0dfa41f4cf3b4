"""Dataset registry: the one list behind CONFIG_DATASET, --dataset and prepare_data.

Each entry says where the raw corpus comes from when online and the sha256 it must
have, so a download that differs from what we tested is refused. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextSource:
    """A single plain-text corpus split into train/val by position."""

    url: str
    sha256: str
    raw_name: str  # file name of the raw corpus inside data/<dataset>/
    description: str


DATASETS: dict[str, TextSource] = {
    "shakespeare": TextSource(
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        raw_name="input.txt",
        description="tiny Shakespeare, 1.1 MB of plays (about 338k GPT-2 tokens)",
    ),
}
