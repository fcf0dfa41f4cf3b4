"""Sharded, resumable preparation from text, jsonl, parquet and Hub-style sources.

The inputs are small files the tests write; nothing touches the network."""

from __future__ import annotations

import json
import random
import signal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from helpers import run_py
from gpt2.data import documents, prepare as prep
from gpt2.config import datasets as sources
from gpt2.data.loader import open_split
from gpt2.data.prepare import DataError, prepare
from gpt2.data.tokenizer import EOT_TOKEN, encode


def docs_of(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["the", "king", "speaks", "and", "we", "listen", "to", "a", "tale", "of", "ships",
             "\n", "  ", "it's", "1984", "!"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) for _ in range(n)]


def write_jsonl(path, texts, field="text"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


def write_parquet(path, texts, field="text"):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({field: texts, "n": list(range(len(texts)))}), path,
                   row_group_size=7)
    return path


def put(path, data: bytes):
    path.write_bytes(data)
    return path


def tokens(data, dataset, split):
    seq = open_split(data, dataset, split)
    return seq.read(0, len(seq)).tolist()


def joined(texts):
    """What a split of these documents must hold: EOT between documents."""
    out = []
    for i, t in enumerate(texts):
        out += ([EOT_TOKEN] if i else []) + encode(t)
    return out


# ---- cutting text without changing its tokens -------------------------------------

def test_cutting_long_text_never_changes_its_tokens(corpus):
    text = corpus.read_text()[:200_000] + " x\n\n  \t y \n z" * 50
    for size in (997, 4096, 50_000):
        pieces = list(documents.cut_pieces([text[i:i + 3333] for i in range(0, len(text), 3333)],
                                           size))
        assert "".join(pieces) == text and max(map(len, pieces)) <= size
        assert sum((encode(p) for p in pieces), []) == encode(text), size


# ---- jsonl, parquet and folders ---------------------------------------------------

def test_jsonl_documents_get_an_end_of_text_token_between_them(tmp_path):
    texts = docs_of(40)
    write_jsonl(tmp_path / "in" / "corpus.jsonl", texts)
    meta = prepare("custom", tmp_path / "data", str(tmp_path / "in" / "corpus.jsonl"),
                   val_fraction=0.1, workers=1)
    # Every 10th document validates; the rest train, in order.
    assert tokens(tmp_path / "data", "custom", "train") == joined(
        [t for i, t in enumerate(texts, 1) if i % 10])
    assert tokens(tmp_path / "data", "custom", "val") == joined(texts[9::10])
    assert meta["splits"]["val"]["tokens"] == meta["val_tokens"] > 0


def test_a_folder_uses_its_validation_files_and_skips_test_files(tmp_path):
    train_a, train_b, val, test = docs_of(9, 1), docs_of(5, 2), docs_of(4, 3), docs_of(3, 4)
    write_parquet(tmp_path / "in" / "data" / "train-00000-of-00002.parquet", train_a,
                  field="content")
    write_jsonl(tmp_path / "in" / "data" / "train-00001-of-00002.jsonl", train_b,
                field="content")
    write_parquet(tmp_path / "in" / "data" / "validation-00000-of-00001.parquet", val,
                  field="content")
    write_parquet(tmp_path / "in" / "data" / "test-00000-of-00001.parquet", test,
                  field="content")
    (tmp_path / "in" / "README.md").write_text("not data")
    prepare("custom", tmp_path / "data", str(tmp_path / "in"), text_field="content", workers=1)
    assert tokens(tmp_path / "data", "custom", "train") == joined(train_a + train_b)
    assert tokens(tmp_path / "data", "custom", "val") == joined(val)


def test_rows_that_are_lines_of_one_text_are_joined_without_separators(tmp_path, monkeypatch):
    """WikiText's rows are lines of articles: no end-of-text between them."""
    lines = [" = Title = \n", "", " Some text , with spaces . \n", " More @-@ text \n"] * 30
    write_parquet(tmp_path / "in" / "train-0.parquet", lines)
    write_parquet(tmp_path / "in" / "validation-0.parquet", lines[:8])
    prepare("wikitext2", tmp_path / "data", str(tmp_path / "in"), workers=1)
    assert tokens(tmp_path / "data", "wikitext2", "train") == encode("".join(lines))
    assert tokens(tmp_path / "data", "wikitext2", "val") == encode("".join(lines[:8]))


@pytest.mark.parametrize("make_input, message", [
    (lambda p: write_jsonl(p / "x.jsonl", ["a b c"] * 30, field="body"), "no field 'text'"),
    (lambda p: write_parquet(p / "x.parquet", ["a b c"] * 30, field="body"), "no column 'text'"),
    (lambda p: put(p / "x.jsonl", b'{"text": "ok"}\nnot json\n'), "x.jsonl:2"),
    (lambda p: put(p / "x.csv", b"a,b\n"), "unknown kind of file"),
    (lambda p: put(p / "x.txt", b"\xff\xfe bad"), "not UTF-8"),
    (lambda p: write_jsonl(p / "x.jsonl", ["one document"]), "validation split came out empty"),
])
def test_bad_inputs_are_refused_with_what_to_fix(tmp_path, make_input, message):
    (tmp_path / "in").mkdir()
    path = make_input(tmp_path / "in")
    with pytest.raises(DataError, match=message):
        prepare("custom", tmp_path / "data", str(path), workers=1)
    assert not (tmp_path / "data" / "custom" / "meta.json").exists()


def test_custom_without_input_says_what_to_set(tmp_path):
    with pytest.raises(DataError, match="CONFIG_DATA_INPUT"):
        prepare("custom", tmp_path, workers=1)


# ---- shards, workers and resuming ---------------------------------------------------

@pytest.fixture(scope="module")
def big_jsonl(tmp_path_factory):
    """About 25k tokens in 600 documents: many shards of 1024 tokens."""
    return write_jsonl(tmp_path_factory.mktemp("in") / "corpus.jsonl", docs_of(600, 7))


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in (".bin", ".json")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, big_jsonl):
    """The uninterrupted single-process preparation every other one must equal."""
    data = tmp_path_factory.mktemp("ref")
    prepare("custom", data, str(big_jsonl), val_fraction=0.05, shard_tokens=1024, workers=1)
    return snapshot(data / "custom")


def test_shards_split_the_stream_and_read_back_as_one(tmp_path, big_jsonl, reference):
    prepare("custom", tmp_path, str(big_jsonl), val_fraction=0.05, shard_tokens=10**9,
            workers=1)
    whole = tokens(tmp_path, "custom", "train")
    n_train = sum(1 for name in reference if name.startswith("train_"))
    assert n_train == -(-len(whole) // 1024) > 20
    sharded = tmp_path / "sharded"
    (sharded / "custom").mkdir(parents=True)
    for name, data in reference.items():
        (sharded / "custom" / name).write_bytes(data)
    seq = open_split(sharded, "custom", "train")
    assert seq.read(0, len(seq)).tolist() == whole
    assert seq.read(1020, 12).tolist() == whole[1020:1032]  # across a shard boundary


def test_worker_processes_write_the_same_bytes(tmp_path, big_jsonl, reference, monkeypatch):
    monkeypatch.setattr(prep, "BATCH_CHARS", 2000)  # many batches: the pool really runs
    meta = prepare("custom", tmp_path, str(big_jsonl), val_fraction=0.05, shard_tokens=1024,
                   workers=2)
    assert snapshot(tmp_path / "custom") == reference
    assert meta["train_tokens"] > 20_000


@pytest.mark.reliability
def test_a_killed_preparation_resumes_to_identical_bytes(tmp_path, big_jsonl, reference):
    args = ["--dataset=custom", f"--data-dir={tmp_path}", f"--input={big_jsonl}",
            "--val-fraction=0.05", "--shard-tokens=1024", "--prepare-workers=1"]
    killed = run_py("gpt2/prepare_data.py", *args, env={"KGPT_FAULTS": "kill-in-prepare@5"})
    assert killed.returncode == -signal.SIGKILL
    folder = tmp_path / "custom"
    assert not (folder / "meta.json").exists() and (folder / prep.STATE_NAME).exists()
    kept = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.bin")}
    assert len(kept) == 5
    resumed = run_py("gpt2/prepare_data.py", *args, check=True)
    assert "5 finished shard(s) kept" in resumed.stdout
    assert snapshot(folder) == reference
    assert all(folder.joinpath(n).stat().st_mtime_ns == t for n, t in kept.items())
    assert not (folder / prep.STATE_NAME).exists()


@pytest.mark.reliability
def test_a_full_disk_during_preparation_keeps_finished_shards(tmp_path, big_jsonl, reference,
                                                              monkeypatch, capsys):
    from gpt2 import prepare_data
    from gpt2.data.shards import read_count

    args = ["--dataset=custom", f"--data-dir={tmp_path}", f"--input={big_jsonl}",
            "--val-fraction=0.05", "--shard-tokens=1024", "--prepare-workers=1"]
    monkeypatch.setenv("KGPT_FAULTS", "enospc-in-shard@3")  # halfway through train_000003
    assert prepare_data.main(args) == 2
    folder = tmp_path / "custom"
    err = capsys.readouterr().err
    assert err == (f"error: disk full while writing {folder / 'train_000003.bin'}: free space "
                   "and run the same command again to resume\n")
    assert not (folder / "meta.json").exists() and not list(folder.glob("*.tmp"))
    kept = sorted(p.name for p in folder.glob("*.bin"))
    assert [n for n in kept if n.startswith("train")] == [f"train_00000{i}.bin" for i in range(3)]
    assert all(read_count(folder / name, "") for name in kept)  # each one whole
    monkeypatch.delenv("KGPT_FAULTS")
    assert prepare_data.main(args) == 0
    assert f"{len(kept)} finished shard(s) kept" in capsys.readouterr().out
    assert snapshot(folder) == reference


@pytest.mark.reliability
def test_a_changed_shard_is_not_kept_on_resume(tmp_path, big_jsonl, reference):
    args = ["--dataset=custom", f"--data-dir={tmp_path}", f"--input={big_jsonl}",
            "--val-fraction=0.05", "--shard-tokens=1024", "--prepare-workers=1"]
    run_py("gpt2/prepare_data.py", *args, env={"KGPT_FAULTS": "kill-in-prepare@3"})
    shard = tmp_path / "custom" / "train_000001.bin"
    shard.write_bytes(shard.read_bytes()[:-2] + b"\x01\x00")
    resumed = run_py("gpt2/prepare_data.py", *args, check=True)
    assert "kept" not in resumed.stdout
    assert snapshot(tmp_path / "custom") == reference


# ---- the Hugging Face datasets path, offline ----------------------------------------

def test_hub_datasets_are_read_through_the_datasets_library(tmp_path, monkeypatch):
    """A local folder in the Hub's layout stands in for the Hub: load_dataset reads
    it with the same code path, offline."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    texts = docs_of(30, 5)
    write_parquet(tmp_path / "hub" / "train-00000-of-00001.parquet", texts)
    monkeypatch.setitem(sources.DATASETS, "finewebedu", sources.HubSource(
        path=str(tmp_path / "hub"), name=None, description="stand-in"))
    for streaming in (True, False):
        data = tmp_path / f"data-{streaming}"
        meta = prepare("finewebedu", data, val_fraction=0.2, workers=1, streaming=streaming)
        assert meta["source"]["kind"] == "hub"
        assert tokens(data, "finewebedu", "train") == joined(
            [t for i, t in enumerate(texts, 1) if i % 5])
        assert tokens(data, "finewebedu", "val") == joined(texts[4::5])


def test_an_unreachable_hub_dataset_says_how_to_work_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(DataError, match="CONFIG_DATA_INPUT"):
        prepare("wikitext2", tmp_path / "data", workers=1)


def test_every_registered_dataset_can_be_prepared_from_local_files(tmp_path):
    for name in sources.DATASETS:
        if sources.characters(name):  # character-level: one text, of its characters
            (tmp_path / name).mkdir()
            (tmp_path / name / "input.txt").write_text("First Citizen:\nBefore we proceed.\n" * 9)
        elif isinstance(sources.DATASETS[name], sources.ShardFolder):  # tokenized shards
            from test_modded_shards import shard_folder
            (tmp_path / name).mkdir()
            meta = prepare(name, tmp_path / "data", str(shard_folder(tmp_path / name)))
            assert meta["train_tokens"] > 0 and meta["val_tokens"] > 0, name
            continue
        else:
            write_jsonl(tmp_path / name / "train.jsonl", docs_of(20, 9))
            write_jsonl(tmp_path / name / "validation.jsonl", docs_of(3, 10))
        meta = prepare(name, tmp_path / "data", str(tmp_path / name), workers=1)
        assert meta["train_tokens"] > 0 and meta["val_tokens"] > 0, name
    assert len(list((tmp_path / "data").iterdir())) == len(sources.DATASETS)


@pytest.mark.e2e
def test_training_reads_many_shards_as_one_stream(data_dir, corpus, tmp_path):
    """The same tokens cut into many shards train to the same losses as one shard, and
    each checkpoint records the data position a resume continues from."""
    from helpers import BPE, only_run_dir, read_jsonl, train_tiny

    sharded = tmp_path / "sharded"
    meta = prepare("shakespeare", sharded, str(corpus), val_fraction=0.1, shard_tokens=20_000,
                   workers=1)
    n_shards = len(list((sharded / "shakespeare").glob("train_*.bin")))
    assert n_shards == -(-meta["train_tokens"] // 20_000) > 4  # 16 with the real corpus
    runs = {}
    for name, data in (("one", data_dir), ("many", sharded)):
        train_tiny(data, tmp_path / name, "--max-iters=6", "--eval-interval=3",
                   "--checkpoint-interval=3", "--sample-tokens=0", BPE)
        run = only_run_dir(tmp_path / name)
        runs[name] = [(r["step"], r.get("train_loss"), r.get("val_loss"))
                      for r in read_jsonl(run / "metrics.jsonl")]
        state = torch.load(run / "ckpt.pt", weights_only=True)
        assert state["data_position"]["next_sample"] == 6 * 4  # 6 steps x 4 sequences
    assert runs["one"] == runs["many"]
