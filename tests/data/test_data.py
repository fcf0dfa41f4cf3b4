"""Data preparation, the offline tokenizer, downloads (against a local server) and
the deterministic batch plan."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading

import numpy as np
import pytest

from helpers import run_py
from gpt2.data import loader, prepare as prep
from gpt2.data.loader import TrainBatches, ValBatches, open_split
from gpt2.data.shards import TokenSequence
from gpt2.data.prepare import DataError, prepare
from gpt2.data.tokenizer import EOT_TOKEN, decode, encode, gpt2_encoding


def test_tokenizer_matches_gpt2_ids_offline():
    # Reference ids from OpenAI's GPT-2 encoder (the same as tiktoken's "gpt2").
    assert encode("Hello world") == [15496, 995]
    assert encode(" the") == [262]
    assert encode("<|endoftext|>") != [EOT_TOKEN]  # plain text, never the special token
    assert gpt2_encoding().n_vocab == 50257
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
    assert decode(encode(text)) == text


def test_prepare_writes_shards_and_meta(fresh_corpus_dir, corpus):
    meta = prepare("shakespeare", fresh_corpus_dir, val_fraction=0.1, workers=1)
    out = fresh_corpus_dir / "shakespeare"
    assert sorted(p.name for p in out.glob("*.bin")) == ["train_000000.bin", "val_000000.bin"]
    train, val = (open_split(fresh_corpus_dir, "shakespeare", s) for s in ("train", "val"))
    assert (len(train), len(val)) == (meta["train_tokens"], meta["val_tokens"])
    # The head of the text trains and the tail validates, tokenized exactly as the
    # whole text would be.
    text = corpus.read_text()
    cut = int(len(text) * 0.9)
    assert train.read(0, len(train)).tolist() == encode(text[:cut])
    assert val.read(0, len(val)).tolist() == encode(text[cut:])
    on_disk = json.loads((out / "meta.json").read_text())
    assert on_disk["tokenizer"].startswith("gpt2-bpe") and on_disk["dtype"] == "uint16"
    assert on_disk["splits"]["train"]["shards"][0]["sha256"] == hashlib.sha256(
        (out / "train_000000.bin").read_bytes()).hexdigest()


def test_prepare_again_is_a_no_op_until_something_changes(fresh_corpus_dir, capsys):
    prepare("shakespeare", fresh_corpus_dir, workers=1)
    train_bin = fresh_corpus_dir / "shakespeare" / "train_000000.bin"
    mtime = train_bin.stat().st_mtime_ns
    capsys.readouterr()
    prepare("shakespeare", fresh_corpus_dir, workers=1)
    assert "up to date" in capsys.readouterr().out
    assert train_bin.stat().st_mtime_ns == mtime
    meta = prepare("shakespeare", fresh_corpus_dir, val_fraction=0.2, workers=1)  # redone
    assert meta["val_fraction"] == 0.2 and train_bin.stat().st_mtime_ns != mtime


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:1000], "truncated or damaged"),
    (lambda b: b + b"\0\0", "truncated or damaged"),
    (lambda b: b"", "not a kgpt token shard"),
    (lambda b: b"\x00" * 64 + b[64:], "not a kgpt token shard"),
    (lambda b: b[:8] + b"\x09" + b[9:], "format version 9"),
])
def test_damaged_or_foreign_shards_are_refused_with_what_to_run(data_copy, damage, message):
    path = data_copy / "shakespeare" / "val_000000.bin"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataError, match=f"val_000000.bin.*{message}.*make data"):
        open_split(data_copy, "shakespeare", "val")


def test_older_data_format_says_to_prepare_again(data_copy):
    meta_path = data_copy / "shakespeare" / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "format_version": 1}))
    with pytest.raises(DataError, match="another kgpt version.*make data"):
        open_split(data_copy, "shakespeare", "train")


def _reshape(meta, how):
    meta = json.loads(json.dumps(meta))
    if how == "a list":
        return [meta]
    if how == "no data_sha256":
        del meta["data_sha256"]
    elif how == "no splits":
        del meta["splits"]
    elif how == "shards not a list":
        meta["splits"]["val"]["shards"] = {"file": "val_000000.bin"}
    elif how == "tokens a string":
        meta["splits"]["train"]["shards"][0]["tokens"] = "many"
    elif how == "file a path":
        meta["splits"]["train"]["shards"][0]["file"] = "../../../etc/passwd"
    elif how == "train_tokens missing":
        del meta["train_tokens"]
    return meta


@pytest.mark.reliability
@pytest.mark.parametrize("how", ["a list", "no data_sha256", "no splits", "shards not a list",
                                 "tokens a string", "file a path", "train_tokens missing"])
def test_a_meta_json_of_the_wrong_shape_is_refused_saying_what_to_run(data_copy, how):
    from gpt2.training import provenance

    meta_path = data_copy / "shakespeare" / "meta.json"
    meta_path.write_text(json.dumps(_reshape(json.loads(meta_path.read_text()), how)))
    readers = [lambda: open_split(data_copy, "shakespeare", "train"),
               lambda: loader.verify_shards(data_copy, "shakespeare"),
               lambda: loader.data_fingerprint(data_copy, "shakespeare"),
               lambda: provenance.data_identity(data_copy, "shakespeare")]
    for read in readers:
        with pytest.raises(DataError) as err:
            read()
        message = str(err.value)
        assert message.startswith(f"{meta_path} is damaged (") and "\n" not in message
        assert "make data" in message and f"delete {data_copy / 'shakespeare'}" in message


@pytest.mark.reliability
def test_make_data_prepares_again_over_a_meta_json_of_the_wrong_shape(data_copy, corpus):
    meta_path = data_copy / "shakespeare" / "meta.json"
    good = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps([good]))
    assert prepare("shakespeare", data_copy, input_path=str(corpus), workers=1) == good


def test_missing_data_says_to_run_make_data(tmp_path):
    with pytest.raises(DataError, match="not prepared.*make data"):
        open_split(tmp_path, "shakespeare", "train")


class _Server:
    """A throwaway HTTP server on 127.0.0.1 serving one payload."""

    def __init__(self, payload: bytes):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/input.txt"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_download_checks_the_pinned_sha256(tmp_path, real_corpus):
    corpus = real_corpus
    server = _Server(corpus.read_bytes())
    try:
        meta = prepare("shakespeare", tmp_path, url=server.url, workers=1)
    finally:
        server.close()
    assert (tmp_path / "shakespeare" / "input.txt").read_bytes() == corpus.read_bytes()
    assert meta["train_tokens"] > 0


def test_download_with_wrong_content_is_refused_and_left_nowhere(tmp_path):
    server = _Server(b"not shakespeare at all\n" * 100)
    try:
        with pytest.raises(DataError, match="sha256"):
            prepare("shakespeare", tmp_path, url=server.url)
    finally:
        server.close()
    assert list((tmp_path / "shakespeare").iterdir()) == []


def test_download_failure_says_how_to_work_offline(tmp_path, monkeypatch):
    monkeypatch.setattr(prep, "DOWNLOAD_TIMEOUT_S", 2)
    with pytest.raises(DataError, match="--input"):
        prepare("shakespeare", tmp_path, url="http://127.0.0.1:9/nothing")


@pytest.mark.e2e
def test_prepare_data_cli_takes_a_local_input(tmp_path, corpus):
    proc = run_py("gpt2/prepare_data.py", "--dataset=shakespeare", f"--data-dir={tmp_path}",
                  f"--input={corpus}", "--prepare-workers=1", check=True)
    assert "train" in proc.stdout and (tmp_path / "shakespeare" / "meta.json").is_file()
    proc = run_py("gpt2/prepare_data.py", f"--data-dir={tmp_path}", "--input=/no/such/file")
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_batches_are_a_function_of_seed_and_step():
    tokens = TokenSequence([np.arange(10_000, dtype=np.uint16)])
    a = TrainBatches(tokens, block_size=16, batch_size=4, accumulation=2, seed=1)
    b = TrainBatches(tokens, block_size=16, batch_size=4, accumulation=2, seed=1)
    x, y = a.get(7, 1)
    assert np.array_equal(x, b.get(7, 1)[0]) and np.array_equal(y, x + 1)  # shifted targets
    assert not np.array_equal(x, TrainBatches(tokens, 16, 4, 2, seed=2).get(7, 1)[0])


@pytest.mark.parametrize("chunk_windows", [1 << 16, 7, 1])
def test_an_epoch_visits_every_window_once(monkeypatch, chunk_windows):
    """With one chunk, and with many chunks whose last one is short."""
    monkeypatch.setattr(loader, "CHUNK_WINDOWS", chunk_windows)
    tokens = TokenSequence([np.arange(20_000, dtype=np.uint16)])
    b = TrainBatches(tokens, block_size=32, batch_size=5, accumulation=1, seed=0)
    steps = b.windows // 5
    starts = np.concatenate([b.starts(s, 0) for s in range(steps)])
    offset = starts[0] % 32
    assert len(set(starts.tolist())) == len(starts) == steps * 5
    assert all(s % 32 == offset for s in starts)
    assert b.steps_for_epochs(1.0) == -(-b.windows // 5)


def test_validation_batches_are_fixed_and_tiny_splits_are_refused():
    tokens = np.arange(5_000, dtype=np.uint16)
    seq = TokenSequence([tokens])
    v1 = ValBatches(seq, 64, eval_tokens=700, batch_size=4)
    v2 = ValBatches(seq, 64, eval_tokens=700, batch_size=4)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(v1, v2))
    with pytest.raises(DataError, match="CONFIG_BLOCK_SIZE"):
        ValBatches(TokenSequence([tokens[:10]]), 64, eval_tokens=700, batch_size=4)
    with pytest.raises(DataError, match="CONFIG_BLOCK_SIZE"):
        TrainBatches(TokenSequence([tokens[:100]]), 64, 4, 1, 0)


def _windows(val: ValBatches) -> tuple[np.ndarray, np.ndarray]:
    """Every window the evaluation reads, batch after batch, in order."""
    xs, ys = zip(*val)
    return np.concatenate(xs), np.concatenate(ys)


def test_the_validation_windows_do_not_depend_on_the_batch_size():
    """They once did: eval_batches x batch_size windows, spread over the split, so a
    batch-size sweep scored its cells on different tokens. Now the set is sized in
    tokens: ceil(eval_tokens / block_size) windows, whatever the batch size, and only
    the batching of the forward passes changes (the last batch may be short)."""
    seq = TokenSequence([np.arange(20_000, dtype=np.uint16)])
    small = ValBatches(seq, 32, eval_tokens=900, batch_size=2)
    large = ValBatches(seq, 32, eval_tokens=900, batch_size=8)
    assert small.windows == large.windows == 29 and small.n_tokens == 29 * 32
    assert (len(small), len(large)) == (15, 4)  # both with a short last batch
    assert np.array_equal(small.starts, large.starts)
    xs, ys = _windows(small)
    assert np.array_equal(xs, _windows(large)[0]) and np.array_equal(ys, xs + 1)
    assert [len(large.batch_starts(i)) for i in range(len(large))] == [8, 8, 8, 5]
    # Evenly spread over the split (624 whole windows, every 21st or 22nd taken), on
    # the grid of consecutive windows.
    assert small.split_windows == 624 and small.starts[0] == 0
    assert set(np.diff(small.starts) // 32) == {21, 22}


def test_eval_tokens_0_or_more_than_the_split_covers_the_whole_split():
    """Every whole window, consecutive: each token but the first is a target once;
    only a remainder shorter than a window at the end is left out."""
    n, block = 10_007, 64
    seq = TokenSequence([np.arange(n, dtype=np.uint16)])
    whole = ValBatches(seq, block, eval_tokens=0, batch_size=3)
    assert whole.windows == whole.split_windows == (n - 1) // block == 156
    assert np.array_equal(whole.starts, np.arange(156) * block)
    targets = _windows(whole)[1].ravel()
    assert np.array_equal(targets, np.arange(1, 156 * block + 1))  # each once, in order
    assert n - 1 - targets[-1] < block
    assert np.array_equal(ValBatches(seq, block, eval_tokens=10**9, batch_size=7).starts,
                          whole.starts)


