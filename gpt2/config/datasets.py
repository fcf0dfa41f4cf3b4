"""Dataset registry: the one list behind CONFIG_DATASET, --dataset and prepare_data.

Each entry says where the corpus comes from when online. A plain-text corpus has a
URL and the sha256 it must have, so a download that differs from what we tested is
refused; a Hugging Face dataset is read through the ``datasets`` library (its own
cache and revision pinning). Offline, every dataset also accepts local files
(CONFIG_DATA_INPUT), and ``custom`` takes nothing else.

A dataset also says how its text becomes tokens: GPT-2's BPE (the 50,257 tokens of
gpt2/data/tokenizer.py, a token table padded to 50,304 rows), or, for a
character-level dataset, a fixed alphabet whose i-th character is token i (nanoGPT's
shakespeare_char: the 65 characters of tiny Shakespeare, a 65-row table). The
alphabet is part of the registry, not read from the data, so the model's size is
known before anything is prepared and a text with another character is refused,
never silently given a new vocabulary. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpt2.config.choices import PADDED_VOCAB_SIZE

# nanoGPT's data/shakespeare_char/prepare.py: sorted(set(text)) of tiny Shakespeare.
SHAKESPEARE_CHARACTERS = ("\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                          "abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class TextSource:
    """A single plain-text corpus, split into train/val by position."""

    url: str
    sha256: str
    raw_name: str  # file name of the downloaded corpus inside data/<dataset>/
    description: str
    characters: str = ""  # a character-level alphabet (token i is characters[i]); "": GPT-2 BPE


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


@dataclass(frozen=True)
class ShardFolder:
    """Token shards another project distributes, read in place in their own format
    from the folder CONFIG_DATA_INPUT names, or, without one, downloaded from the Hub
    into data/<dataset>/ (each file checked against the sha256 the Hub lists): nothing
    is tokenized. Their order is that project's: each step reads the next consecutive
    tokens of the training shards, and the validation set is the first
    CONFIG_EVAL_TOKENS of the validation shards (gpt2/data/loader.py)."""

    shard_format: str  # a format gpt2/data/shards.py reads
    description: str
    # The commands that fetch the shards without kgpt, for CONFIG_DATA_INPUT (offline)
    how_to_get: str
    # The Hugging Face dataset repository holding the shard files at its root ("":
    # CONFIG_DATA_INPUT only), the branch resolved to a commit when downloading, and
    # how many training shards it holds (CONFIG_DATA_TRAIN_SHARDS's maximum and default).
    hub_repo: str = ""
    hub_revision: str = "main"
    hub_train_shards: int = 0


Source = TextSource | HubSource | LocalOnly | ShardFolder

DATASETS: dict[str, Source] = {
    "shakespeare": TextSource(
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        raw_name="input.txt",
        description="tiny Shakespeare, 1.1 MB of plays (about 338k GPT-2 tokens)",
    ),
    "shakespeare-char": TextSource(
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        raw_name="input.txt",
        description="tiny Shakespeare by character, as nanoGPT's shakespeare_char: 65 "
                    "characters, about 1M train / 112k val tokens",
        characters=SHAKESPEARE_CHARACTERS,
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
    "fineweb10b": ShardFolder(
        shard_format="modded-nanogpt",
        description="FineWeb 10B in GPT-2 tokens as modded-nanogpt distributes it "
                    "(kjj0/fineweb10B-gpt2): its shards, downloaded or read in place, in "
                    "its order",
        how_to_get="in a modded-nanogpt checkout, `python data/cached_fineweb10B.py 20` "
                   "(2B tokens; 103 for all 10B), then set CONFIG_DATA_INPUT to its "
                   "data/fineweb10B folder",
        # What modded-nanogpt's data/cached_fineweb10B.py downloads: fineweb_val_000000.bin
        # and fineweb_train_000001.bin ... fineweb_train_000103.bin, 100M tokens each.
        hub_repo="kjj0/fineweb10B-gpt2", hub_train_shards=103,
    ),
    "custom": LocalOnly(
        description="your own text, jsonl or parquet files, named by CONFIG_DATA_INPUT",
    ),
}


def sequential(dataset: str) -> bool:
    """Whether ``dataset`` is read in its distributor's order (ShardFolder) rather than
    kgpt's seeded shuffle of windows."""
    return isinstance(DATASETS[dataset], ShardFolder)


def characters(dataset: str) -> str:
    """The alphabet of a character-level dataset; "" for one tokenized by GPT-2's BPE."""
    source = DATASETS[dataset]
    return source.characters if isinstance(source, TextSource) else ""


def vocab_rows(dataset: str) -> int:
    """Rows of the token table a model trained from scratch on ``dataset`` has: the
    alphabet's size for a character-level dataset (nanoGPT's meta_vocab_size, not
    padded), else GPT-2's vocabulary padded to 50,304."""
    return len(characters(dataset)) or PADDED_VOCAB_SIZE
