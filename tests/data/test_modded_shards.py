"""modded-nanogpt's token shards read in place (CONFIG_DATASET=fineweb10b): the format,
the refusals, and the order, against a transcription of train_gpt_simple.py's loader.

The shards here are synthetic, written in modded-nanogpt's format (data/fineweb.py's
write_datafile: 256 int32 of header, magic 20240520, version 1, the token count; then
uint16 tokens). ``reference_batches`` transcribes distributed_data_generator of
records/track_3_optimization/train_gpt_simple.py (KellerJordan/modded-nanogpt at
f411b3d) for one process, with numpy in place of the CUDA tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpt2.data.loader import (SequentialBatches, TrainBatches, open_split, train_batches,
                              val_batches, verify_shards)
from gpt2.data.prepare import prepare
from gpt2.data.shards import DataError

T = 16  # tokens per window (the block size)


def write_modded(path: Path, tokens: np.ndarray, magic: int = 20240520, version: int = 1,
                 count: int | None = None) -> None:
    header = np.zeros(256, dtype=np.int32)
    header[:3] = magic, version, len(tokens) if count is None else count
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype=np.uint16).tobytes())


def shard_folder(tmp_path: Path, lengths=(700, 150, 1000, 257, 333), val=900) -> Path:
    """A validation shard and training shards of ``lengths`` tokens; every token
    holds its own position in the split (mod 50,000), so a batch shows where it came
    from. The 150-token shard holds one step of 128 (+1), and its rest is left; the
    257-token one holds one step, not two: a second would need one token more."""
    folder = tmp_path / "fineweb10B"
    folder.mkdir()
    write_modded(folder / "fineweb_val_000000.bin", np.arange(val) % 50_000)
    start = 0
    for i, n in enumerate(lengths, start=1):
        write_modded(folder / f"fineweb_train_{i:06d}.bin", (start + np.arange(n)) % 50_000)
        start += n
    return folder


def reference_batches(folder: Path, pattern: str, batch_size: int, seq_len: int = T):
    """distributed_data_generator for one process, transcribed."""
    def load(file):
        header = np.fromfile(file, dtype=np.int32, count=256)
        assert header[0] == 20240520 and header[1] == 1
        tokens = np.fromfile(file, dtype=np.uint16, offset=256 * 4)
        assert len(tokens) == int(header[2])
        return tokens

    files = iter(sorted(folder.glob(pattern)))
    tokens, pos = load(next(files)), 0
    while True:
        if pos + batch_size + 1 >= len(tokens):
            tokens, pos = load(next(files)), 0
        buf = tokens[pos:][:batch_size + 1].astype(np.int64)
        pos += batch_size
        yield buf[:-1].reshape(-1, seq_len), buf[1:].reshape(-1, seq_len)


def prepared(tmp_path: Path, folder: Path) -> Path:
    data_dir = tmp_path / "data"
    prepare("fineweb10b", data_dir, input_path=str(folder))
    return data_dir


def test_the_shards_are_read_in_place_with_their_tokens(tmp_path):
    folder = shard_folder(tmp_path)
    data_dir = prepared(tmp_path, folder)
    train = open_split(data_dir, "fineweb10b", "train")
    assert len(train) == 700 + 150 + 1000 + 257 + 333
    assert np.array_equal(train.read(690, 20), np.arange(690, 710))
    assert len(open_split(data_dir, "fineweb10b", "val")) == 900
    assert sorted(p.name for p in (data_dir / "fineweb10b").iterdir()) == ["meta.json"]
    assert verify_shards(data_dir, "fineweb10b")[0] == 6
    # a shard changed after indexing is found by its sha256
    write_modded(folder / "fineweb_train_000002.bin", np.zeros(150))
    with pytest.raises(DataError, match="fineweb_train_000002.bin is damaged"):
        verify_shards(data_dir, "fineweb10b")


@pytest.mark.parametrize("accumulation,micro", [(1, 8), (2, 4), (8, 1)])
def test_training_order_is_the_track3_loaders(tmp_path, accumulation, micro):
    """Step by step, whatever the micro-batch split, the windows are the reference's:
    consecutive tokens, the short shard skipped, each shard's tail left, and the
    order starting again after the last shard."""
    folder = shard_folder(tmp_path)
    data_dir = prepared(tmp_path, folder)
    batches = train_batches("fineweb10b", open_split(data_dir, "fineweb10b", "train"), T,
                            micro, accumulation, seed=1)
    assert isinstance(batches, SequentialBatches)
    span = 8 * T  # tokens per step
    # shard steps: 700 -> 5, 150 -> 1, 1000 -> 7, 257 -> 1, 333 -> 2
    assert batches.windows == (5 + 1 + 7 + 1 + 2) * 8
    reference = reference_batches(folder, "fineweb_train_*.bin", span)
    for step in range(16):
        x_ref, y_ref = next(reference)
        parts = [batches.get(step, m) for m in range(accumulation)]
        assert np.array_equal(np.concatenate([x for x, _ in parts]), x_ref), step
        assert np.array_equal(np.concatenate([y for _, y in parts]), y_ref), step
    # the next epoch starts again at the first shard (the reference would stop)
    assert np.array_equal(np.concatenate([batches.get(16, m)[0] for m in range(accumulation)]),
                          np.arange(span).reshape(-1, T))


def test_a_shard_too_short_for_one_step_is_left_out(tmp_path):
    """(The reference would yield a short batch there and fail: real shards hold
    100M tokens. kgpt goes on to the next shard.)"""
    folder = shard_folder(tmp_path, lengths=(300, 120, 300))
    data_dir = prepared(tmp_path, folder)
    batches = train_batches("fineweb10b", open_split(data_dir, "fineweb10b", "train"), T,
                            8, 1, seed=1)
    assert batches.windows == (2 + 0 + 2) * 8
    assert batches.get(2, 0)[0][0, 0] == 300 + 120  # step 2: the third shard's start
    with pytest.raises(DataError, match="no training shard holds one step of 640"):
        train_batches("fineweb10b", open_split(data_dir, "fineweb10b", "train"), T, 40, 1, 1)


def test_an_empty_shard_is_read_as_no_tokens_and_left_out(tmp_path):
    """A shard whose header says 0 tokens and that holds none is a valid file: indexed
    with 0 tokens, read as none, and the order goes on to the next shard."""
    folder = shard_folder(tmp_path, lengths=(300, 0, 300))
    data_dir = prepared(tmp_path, folder)
    train = open_split(data_dir, "fineweb10b", "train")
    assert len(train) == 600 and np.array_equal(train.read(298, 4), np.arange(298, 302))
    batches = train_batches("fineweb10b", train, T, 8, 1, seed=1)
    assert batches.windows == (2 + 2) * 8
    assert batches.get(2, 0)[0][0, 0] == 300  # step 2: the third shard's start


def test_the_validation_windows_are_the_first_tokens_as_track3_scores(tmp_path):
    folder = shard_folder(tmp_path)
    data_dir = prepared(tmp_path, folder)
    val = val_batches("fineweb10b", open_split(data_dir, "fineweb10b", "val"), T,
                      eval_tokens=20 * T, batch_size=3)
    x_ref, y_ref = next(reference_batches(folder, "fineweb_val_*.bin", 20 * T))
    ours = [val.batch(i) for i in range(len(val))]
    assert np.array_equal(np.concatenate([x for x, _ in ours]), x_ref)
    assert np.array_equal(np.concatenate([y for _, y in ours]), y_ref)
    # kgpt's own datasets keep evenly spaced windows over the whole split
    spread = val_batches("shakespeare", open_split(data_dir, "fineweb10b", "val"), T,
                         eval_tokens=20 * T, batch_size=3)
    assert spread.starts[-1] > val.starts[-1]
    assert type(train_batches("shakespeare", open_split(data_dir, "fineweb10b", "train"), T,
                              2, 1, seed=1)) is TrainBatches


@pytest.mark.parametrize("damage,message", [
    (dict(magic=20240521), "not a modded-nanogpt token shard"),
    (dict(version=2), "shard version 2"),
    (dict(count=101), "holds 200 token bytes, its header says 202: the file is truncated or "
                      "damaged"),
    (dict(count=99), "holds 200 token bytes, its header says 198: the file is truncated"),
    (dict(count=-1), "holds 200 token bytes, its header says -2"),
])
def test_a_foreign_or_truncated_shard_is_refused_naming_it(tmp_path, damage, message):
    folder = shard_folder(tmp_path)
    write_modded(folder / "fineweb_train_000003.bin", np.arange(100), **damage)
    with pytest.raises(DataError, match=f"fineweb_train_000003.bin.*{message}"):
        prepared(tmp_path, folder)


def test_a_shard_shorter_than_its_header_is_refused(tmp_path):
    folder = shard_folder(tmp_path)
    (folder / "fineweb_val_000000.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(DataError, match="fineweb_val_000000.bin is shorter than"):
        prepared(tmp_path, folder)


def test_without_a_folder_the_dataset_says_how_to_get_the_shards(tmp_path, monkeypatch):
    # (without a folder, the Hub's shards are downloaded: tests/data/test_hub_shards.py;
    # an unreachable one says how to work offline)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(DataError, match="cached_fineweb10B.py"):
        prepare("fineweb10b", tmp_path / "data")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="holds no fineweb_train_"):
        prepare("fineweb10b", tmp_path / "data", input_path=str(empty))


def test_indexing_again_reads_nothing_when_the_shards_are_unchanged(tmp_path, capsys):
    folder = shard_folder(tmp_path)
    data_dir = prepared(tmp_path, folder)
    capsys.readouterr()
    prepare("fineweb10b", data_dir, input_path=str(folder))
    assert "up to date" in capsys.readouterr().out
    write_modded(folder / "fineweb_train_000005.bin", np.arange(400))  # another size
    prepare("fineweb10b", data_dir, input_path=str(folder))
    assert "indexed" in capsys.readouterr().out
    assert len(open_split(data_dir, "fineweb10b", "train")) == 700 + 150 + 1000 + 257 + 400


def _meta(fmt: str = "modded") -> dict:
    kgpt = fmt == "kgpt"
    shard = (lambda split: {"file": f"{split}_000000.bin" if kgpt else
                            f"fineweb_{split}_000001.bin", "tokens": 10, "sha256": "ab"})
    return {"train_tokens": 10, "val_tokens": 10, "data_sha256": "cd",
            **({} if kgpt else {"shard_format": "modded-nanogpt", "source_dir": "/data/fineweb10B"}),
            "splits": {s: {"tokens": 10, "shards": [shard(s)]} for s in ("train", "val")}}


@pytest.mark.parametrize("change, problem", [
    (lambda m: [m], "it holds an array, not an object"),
    (lambda m: "meta", "it holds a string, not an object"),
    (lambda m: None, "it holds null, not an object"),
    (lambda m: 7, "it holds a number, not an object"),
    (lambda m: {**m, "val_tokens": -1}, '"val_tokens" is missing or not a token count'),
    (lambda m: {**m, "train_tokens": True}, '"train_tokens" is missing or not a token count'),
    (lambda m: {**m, "data_sha256": 5}, '"data_sha256" is missing or not a string'),
    (lambda m: {**m, "shard_format": "npy"}, "\"shard_format\" 'npy' is not one kgpt reads"),
    (lambda m: {**m, "source_dir": "fineweb10B"}, '"source_dir", the folder of the '
     "modded-nanogpt shards, is not an absolute path"),
    (lambda m: {**m, "splits": {"train": m["splits"]["train"]}},
     '"splits" lacks a list of val shards'),
    (lambda m: {**m, "splits": {**m["splits"], "val": {"shards": [
        {"file": "val_000000.bin", "tokens": 10, "sha256": "ab"}]}}},
     'val shard 0 is not an entry prepare writes ("file" fineweb_val_\\d{6}\\.bin, '
     '"tokens", "sha256")'),
])
def test_a_meta_json_problem_is_named(change, problem):
    """meta_problem's answer for each way a meta.json can be wrong, a modded-nanogpt
    folder's own (its format, its absolute folder, its file names) included; the
    kgpt and modded forms prepare writes have none."""
    from gpt2.data.shards import meta_problem

    assert meta_problem(_meta()) is None and meta_problem(_meta("kgpt")) is None
    assert meta_problem(change(_meta())) == problem


def test_the_token_stream_hash_is_the_one_any_reader_computes(tmp_path):
    """The stream hash indexing records in its single pass equals tokens_sha256 over
    the same files read as modded-nanogpt shards (their 1,024-byte header skipped)."""
    from gpt2.data.shards import MODDED, tokens_sha256

    folder = shard_folder(tmp_path)
    meta = json.loads((prepared(tmp_path, folder) / "fineweb10b" / "meta.json").read_text())
    splits = {"train": sorted(folder.glob("fineweb_train_*.bin")),
              "val": sorted(folder.glob("fineweb_val_*.bin"))}
    assert tokens_sha256(splits, MODDED) == meta["tokens_sha256"]


def test_reads_across_shards_stay_inside_the_split():
    """int64 tokens from one shard, across two, up to the very end; one token past
    either end is an IndexError."""
    from gpt2.data.shards import TokenSequence

    seq = TokenSequence([np.arange(5, dtype=np.uint16), np.arange(5, 12, dtype=np.uint16)])
    assert seq.read(0, 5).dtype == np.int64 and seq.read(3, 4).dtype == np.int64
    assert seq.read(0, 5).tolist() == [0, 1, 2, 3, 4]  # a whole shard, to its end
    assert seq.read(3, 4).tolist() == [3, 4, 5, 6] and seq.read(10, 2).tolist() == [10, 11]
    for start, n in ((11, 2), (-1, 2), (0, 13)):
        with pytest.raises(IndexError, match=rf"tokens \[{start}, {start + n}\) outside 0..12"):
            seq.read(start, n)
