"""A run's result files (summary.json, metrics.jsonl, ckpt.pt) are read back as
what they are, never blindly: a damaged summary is not a completed run, a summary
that its checkpoint contradicts is not believed, a cut metrics line costs only
itself, a checkpoint of another configuration is not sampled, and the same tokens
cut into other shards are the same data (docs/reliability.md, promise 14)."""

from __future__ import annotations


import pytest

from conftest import synthetic_corpus
from gpt2.config.options import Config
from gpt2.training import provenance


# ---- data identity: the tokens, not their cut into shards -----------------------------------

def test_the_same_tokens_in_other_shards_are_the_same_data(tmp_path):
    from gpt2.data.loader import data_fingerprint, read_meta, same_data
    from gpt2.data.prepare import prepare

    corpus = synthetic_corpus(tmp_path / "corpus.txt", n_lines=3000)
    small, large = tmp_path / "small", tmp_path / "large"
    prepare("shakespeare", small, str(corpus), shard_tokens=1024, workers=1)
    prepare("shakespeare", large, str(corpus), shard_tokens=10**9, workers=1)
    assert len(read_meta(small, "shakespeare")["splits"]["train"]["shards"]) > 1
    assert data_fingerprint(small, "shakespeare") == data_fingerprint(large, "shakespeare")
    then = {"code": provenance.code_identity(),
            "data": provenance.data_identity(small, "shakespeare")}
    assert provenance.changes(then, provenance.identity(large, "shakespeare")) == []
    # The shard size is not part of the run's hash either: it computes nothing.
    assert Config(shard_tokens=1024).config_hash() == Config(shard_tokens=10**9).config_hash()
    # A checkpoint of an older kgpt names the data by its shards, and still resumes.
    meta = read_meta(large, "shakespeare")
    assert same_data(f"{meta['data_sha256'][:16]}:{meta['train_tokens']}", large, "shakespeare")
    # Other tokens are other data.
    other = tmp_path / "other"
    corpus.write_text(corpus.read_text().replace("crown", "crowd"))
    prepare("shakespeare", other, str(corpus), shard_tokens=10**9, workers=1)
    assert not same_data(data_fingerprint(large, "shakespeare"), other, "shakespeare")
    (what,) = provenance.changes(then, provenance.identity(other, "shakespeare"))
    assert what.startswith("data: shakespeare was prepared again with other content (tokens")
