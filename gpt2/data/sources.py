"""Dataset registry: the one list behind CONFIG_DATASET, --dataset and prepare_data.

Each entry says where the corpus comes from when online. A plain-text corpus has a
URL and the sha256 it must have, so a download that differs from what we tested is
refused; a Hugging Face dataset is read through the ``datasets`` library (its own
cache and revision pinning). Offline, every dataset also accepts local files
(CONFIG_DATA_INPUT), and ``custom`` takes nothing else. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextSource:
    """A single plain-text corpus, split into train/val by position."""

    url: str
    sha256: str
    raw_name: str  # file name of the downloaded corpus inside data/<dataset>/
    description: str


@dataclass(frozen=True)
class HubSource:
    """A dataset on the Hugging Face Hub, read with ``datasets.load_dataset``."""

    path: str
    name: str | None
    description: str
    train_split: str = "train"
    val_split: str | None = None  # the dataset's own validation split, if it has one
    text_field: str = "text"
    # True: each row is a document (an end-of-text token goes between rows).
    # False: rows are consecutive lines of one text (WikiText), joined as they are.
    rows_are_documents: bool = True
    revision: str | None = None


@dataclass(frozen=True)
class LocalOnly:
    """Files the user names with CONFIG_DATA_INPUT; nothing to download."""

    description: str


Source = TextSource | HubSource | LocalOnly

DATASETS: dict[str, Source] = {
    "shakespeare": TextSource(
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        raw_name="input.txt",
        description="tiny Shakespeare, 1.1 MB of plays (about 338k GPT-2 tokens)",
    ),
    "wikitext2": HubSource(
        path="Salesforce/wikitext", name="wikitext-2-raw-v1", val_split="validation",
        rows_are_documents=False,
        description="WikiText-2 raw: Wikipedia articles, about 2.4M train tokens",
    ),
    "wikitext103": HubSource(
        path="Salesforce/wikitext", name="wikitext-103-raw-v1", val_split="validation",
        rows_are_documents=False,
        description="WikiText-103 raw: Wikipedia articles, about 120M train tokens",
    ),
    "openwebtext": HubSource(
        # The repository's own files are a loading script, which datasets 4+ no
        # longer runs; the Hub's automatic Parquet conversion holds the same rows.
        path="Skylion007/openwebtext", name="plain_text", revision="refs/convert/parquet",
        description="OpenWebText: 8M web documents, about 9B tokens (54 GB of text)",
    ),
    "finewebedu": HubSource(
        path="HuggingFaceFW/fineweb-edu", name="sample-10BT",
        description="FineWeb-Edu, the 10B-token sample: educational web pages",
    ),
    "custom": LocalOnly(
        description="your own text, jsonl or parquet files, named by CONFIG_DATA_INPUT",
    ),
}
