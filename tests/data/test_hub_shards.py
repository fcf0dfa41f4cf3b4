"""modded-nanogpt's FineWeb shards downloaded from the Hugging Face Hub
(CONFIG_DATASET=fineweb10b without CONFIG_DATA_INPUT), against a fake Hub on 127.0.0.1.

The fake answers the three requests kgpt makes, in the shapes the Hub's API gives
them: GET /api/datasets/<repo>/revision/main ({"sha": <commit>}), GET
/api/datasets/<repo>/tree/<commit> (a list of {"type", "path", "size", "oid", "lfs":
{"oid": <sha256>, "size", "pointerSize"}}), and GET
/datasets/<repo>/resolve/<commit>/<file> (the file). HF_ENDPOINT points kgpt at it.
The shards are synthetic and tiny, in modded-nanogpt's format (write_modded).
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from test_modded_shards import write_modded
from gpt2.config.datasets import DATASETS
from gpt2.data.loader import open_split, verify_shards
from gpt2.data.prepare import DataError, prepare
from gpt2.prepare_data import main as prepare_data_main

REPO_ID = "kjj0/fineweb10B-gpt2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
VAL = "fineweb_val_000000.bin"
TRAIN = [f"fineweb_train_{i:06d}.bin" for i in (1, 2, 3)]


def shard_bytes(tmp_path: Path, name: str, n: int, start: int) -> bytes:
    path = tmp_path / "made" / name
    path.parent.mkdir(exist_ok=True)
    write_modded(path, (start + np.arange(n)) % 50_000)
    return path.read_bytes()


@pytest.fixture
def shards(tmp_path) -> dict[str, bytes]:
    """The repository's shards: a validation shard and three training shards of a
    few thousand tokens."""
    return {VAL: shard_bytes(tmp_path, VAL, 3000, 7),
            **{name: shard_bytes(tmp_path, name, 2000 + 500 * i, 10_000 * i)
               for i, name in enumerate(TRAIN, start=1)}}


def entry(path: str, data: bytes) -> dict:
    """A tree entry as the Hub lists an LFS file."""
    return {"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data),
            "path": path, "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                  "pointerSize": 134}}


class FakeHub:
    """The Hub's three answers for one repository at one commit, from 127.0.0.1.
    ``listed``: the files the tree lists (name -> bytes it gives the size and sha256
    of); ``served``: what a download of each returns (default: the listed bytes);
    ``extra``: more tree entries. ``requests`` records every path asked for."""

    def __init__(self, listed: dict[str, bytes], served: dict[str, bytes] | None = None,
                 extra: list[dict] = (), dropped: tuple[str, ...] = ()):
        self.requests: list[str] = []
        served = {**listed, **(served or {})}
        tree = [entry(name, data) for name, data in listed.items()] + list(extra)
        api = f"/api/datasets/{REPO_ID}"
        answers = {f"{api}/revision/main": json.dumps({"id": REPO_ID, "sha": COMMIT}).encode(),
                   f"{api}/tree/{COMMIT}": json.dumps(tree).encode(),
                   **{f"/datasets/{REPO_ID}/resolve/{COMMIT}/{name}": data
                      for name, data in served.items()}}
        # The downloads whose connection drops halfway (after a full Content-Length).
        cut = {f"/datasets/{REPO_ID}/resolve/{COMMIT}/{name}" for name in dropped}
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hub.requests.append(self.path)
                body = answers.get(self.path)
                self.send_response(200 if body is not None else 404)
                body = body if body is not None else b'{"error": "not found"}'
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:len(body) // 2] if self.path in cut else body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def downloads(self) -> list[str]:
        """The files asked for, in order."""
        prefix = f"/datasets/{REPO_ID}/resolve/{COMMIT}/"
        return [p[len(prefix):] for p in self.requests if p.startswith(prefix)]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hub(monkeypatch):
    """Start a FakeHub (``hub(listed, ...)``) and point HF_ENDPOINT at it."""
    started = []

    def start(*args, **kw) -> FakeHub:
        started.append(FakeHub(*args, **kw))
        monkeypatch.setenv("HF_ENDPOINT", started[-1].endpoint + "/")  # (a trailing / too)
        return started[-1]

    yield start
    for server in started:
        server.close()


def files_in(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_downloaded_shards_index_as_the_same_files_in_a_local_folder_do(tmp_path, shards, hub):
    server = hub(shards)
    data_dir = tmp_path / "data"
    meta = prepare("fineweb10b", data_dir, train_shards=3)
    out = data_dir / "fineweb10b"
    assert sorted(server.downloads()) == sorted(shards)
    assert files_in(out) == {*shards, "meta.json"}
    assert {n: (out / n).read_bytes() for n in shards} == shards

    local = tmp_path / "modded"
    local.mkdir()
    for name, data in shards.items():
        (local / name).write_bytes(data)
    other = prepare("fineweb10b", tmp_path / "data2", input_path=str(local))
    for key in ("train_tokens", "val_tokens", "data_sha256", "tokens_sha256", "splits",
                "sizes", "shard_format", "tokenizer"):
        assert meta[key] == other[key], key
    assert meta["source"] == {"repo": REPO_ID, "revision": "main", "commit": COMMIT,
                              "folder": str(out.resolve())}
    assert meta["source_dir"] == str(out.resolve())
    assert meta["train_tokens"] == 2500 + 3000 + 3500 and meta["val_tokens"] == 3000
    assert [s["sha256"] for s in meta["splits"]["train"]["shards"]] == [
        hashlib.sha256(shards[n]).hexdigest() for n in TRAIN]
    # Training reads them where they were downloaded, and their sha256 checks out.
    assert verify_shards(data_dir, "fineweb10b") == (4, sum(map(len, shards.values())))
    train = open_split(data_dir, "fineweb10b", "train")
    assert np.array_equal(train.read(2495, 10), [12_495, 12_496, 12_497, 12_498, 12_499,
                                                 20_000, 20_001, 20_002, 20_003, 20_004])


def test_only_the_validation_shard_and_the_asked_training_shards_are_fetched(tmp_path, shards,
                                                                             hub, capsys):
    server = hub(shards)
    data_dir = tmp_path / "data"
    meta = prepare("fineweb10b", data_dir, train_shards=2)
    assert server.downloads() == [VAL, TRAIN[0], TRAIN[1]]
    assert [s["file"] for s in meta["splits"]["train"]["shards"]] == TRAIN[:2]
    assert TRAIN[2] not in files_in(data_dir / "fineweb10b")
    # Asking for one more later downloads that one only; the others are kept.
    server.requests.clear()
    capsys.readouterr()
    meta = prepare("fineweb10b", data_dir, train_shards=3)
    assert server.downloads() == [TRAIN[2]]
    assert "1 of 4 shard(s) to download" in capsys.readouterr().out
    assert [s["file"] for s in meta["splits"]["train"]["shards"]] == TRAIN
    # And fewer again indexes fewer, deleting none of them.
    server.requests.clear()
    meta = prepare("fineweb10b", data_dir, train_shards=1)
    assert server.downloads() == []
    assert [s["file"] for s in meta["splits"]["train"]["shards"]] == TRAIN[:1]
    assert files_in(data_dir / "fineweb10b") >= {VAL, *TRAIN}


def test_the_cli_passes_data_train_shards_and_only_for_fineweb10b(tmp_path, shards, hub, capsys):
    server = hub(shards)
    assert prepare_data_main(["--dataset=fineweb10b", f"--data-dir={tmp_path}",
                              "--data-train-shards=1"]) == 0
    assert server.downloads() == [VAL, TRAIN[0]]
    assert prepare_data_main(["--dataset=shakespeare", f"--data-dir={tmp_path}",
                              "--data-train-shards=1"]) == 2
    assert "has no effect with dataset 'shakespeare'" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["other bytes", "cut short", "connection dropped"])
def test_a_file_unlike_the_listings_sha256_is_refused_and_left_nowhere(tmp_path, shards, hub,
                                                                       damage):
    good = shards[TRAIN[1]]
    bad = {"other bytes": good[:-2] + b"\x01\x02", "cut short": good[:len(good) // 2],
           "connection dropped": good[:len(good) // 2]}[damage]
    if damage == "connection dropped":
        hub(shards, dropped=(TRAIN[1],))
    else:
        hub(shards, served={TRAIN[1]: bad})
    out = tmp_path / "data" / "fineweb10b"
    with pytest.raises(DataError) as e:
        prepare("fineweb10b", tmp_path / "data", train_shards=3)
    message = str(e.value)
    assert TRAIN[1] in message and "refusing it" in message
    assert hashlib.sha256(good).hexdigest() in message
    assert hashlib.sha256(bad).hexdigest() in message
    # Nothing of it under any name, no meta.json; the shards before it are kept.
    assert not any(TRAIN[1] in name for name in files_in(out))
    assert "meta.json" not in files_in(out) and {VAL, TRAIN[0]} <= files_in(out)


def test_no_path_the_listing_names_outside_the_shard_names_is_asked_for_or_written(
        tmp_path, shards, hub):
    evil = b"not a shard"
    names = ["../evil.bin", "sub/fineweb_train_000001.bin", "README.md", "/fineweb_val_000000.bin",
             "fineweb_train_000004.bin/../../evil.bin", "fineweb_train_000001.bin.part",
             "fineweb_train_1.bin", ".gitattributes"]
    server = hub(shards, served={n: evil for n in names},
                 extra=[entry(n, evil) for n in names] + [
                     {"type": "directory", "oid": "0" * 40, "size": 0, "path": "sub"}])
    data_dir = tmp_path / "work" / "data"
    prepare("fineweb10b", data_dir, train_shards=3)
    assert sorted(server.downloads()) == sorted(shards)
    assert files_in(data_dir / "fineweb10b") == {*shards, "meta.json"}
    written = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "made" not in p.parts}
    assert not [p for p in written if p.name in ("evil.bin", "README.md") or "sub" in p.parts]


def test_a_second_run_asks_nothing_and_works_offline(tmp_path, shards, hub, capsys, monkeypatch):
    server = hub(shards)
    data_dir = tmp_path / "data"
    first = prepare("fineweb10b", data_dir, train_shards=3)
    server.requests.clear()
    capsys.readouterr()
    assert prepare("fineweb10b", data_dir, train_shards=3) == first
    assert server.requests == [] and "up to date" in capsys.readouterr().out
    # Offline: the finished download is used as it is.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert prepare("fineweb10b", data_dir, train_shards=3) == first
    # Without meta.json (a kill before it was written), the shards already there are
    # checked against the listing and kept: nothing is downloaded again.
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    (data_dir / "fineweb10b" / "meta.json").unlink()
    capsys.readouterr()
    assert prepare("fineweb10b", data_dir, train_shards=3) == first
    assert server.downloads() == []
    assert "0 of 4 shard(s) to download" in capsys.readouterr().out


def test_a_killed_downloads_temporary_file_is_removed_and_the_shard_fetched_again(
        tmp_path, shards, hub):
    server = hub(shards)
    out = tmp_path / "data" / "fineweb10b"
    out.mkdir(parents=True)
    (out / f"{TRAIN[0]}.0123456789ab.part").write_bytes(shards[TRAIN[0]][:100])
    (out / "notes.part").write_text("someone's")  # (not a name a download leaves)
    prepare("fineweb10b", tmp_path / "data", train_shards=1)
    assert server.downloads() == [VAL, TRAIN[0]]
    assert files_in(out) == {VAL, TRAIN[0], "meta.json", "notes.part"}


def test_another_file_under_a_shards_name_is_refused_not_replaced(tmp_path, shards, hub):
    server = hub(shards)
    out = tmp_path / "data" / "fineweb10b"
    out.mkdir(parents=True)
    mine = shards[TRAIN[0]][:-2] + b"\x07\x07"  # the same size, another sha256
    (out / TRAIN[0]).write_bytes(mine)
    with pytest.raises(DataError, match=rf"{TRAIN[0]} is not the file {REPO_ID} lists.*"
                       rf"sha256 {hashlib.sha256(mine).hexdigest()}.*Delete or move it away"):
        prepare("fineweb10b", tmp_path / "data", train_shards=1)
    assert (out / TRAIN[0]).read_bytes() == mine and server.downloads() == []
    (out / TRAIN[0]).write_bytes(b"short")
    with pytest.raises(DataError, match=r"it has 5 bytes"):
        prepare("fineweb10b", tmp_path / "data", train_shards=1)


def test_a_meta_json_not_kgpts_is_refused_before_anything_is_downloaded(tmp_path, shards, hub):
    server = hub(shards)
    out = tmp_path / "data" / "fineweb10b"
    out.mkdir(parents=True)
    (out / "meta.json").write_text('{"vocab_size": 50257}')  # nanoGPT's, say
    with pytest.raises(DataError, match="is not kgpt's"):
        prepare("fineweb10b", tmp_path / "data", train_shards=1)
    assert server.requests == [] and files_in(out) == {"meta.json"}


def test_an_unreachable_hub_says_which_url_and_how_to_work_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(DataError, match=r"cannot read http://127\.0\.0\.1:9/api/datasets/"
                       rf"{REPO_ID}/revision/main.*cached_fineweb10B\.py.*CONFIG_DATA_INPUT"):
        prepare("fineweb10b", tmp_path / "data")


def test_an_http_error_names_the_url_and_how_to_work_offline(tmp_path, shards, hub,
                                                            monkeypatch):
    server = hub(shards)
    # A branch the repository does not have: the Hub answers 404.
    monkeypatch.setitem(DATASETS, "fineweb10b", dataclasses.replace(
        DATASETS["fineweb10b"], hub_revision="no/such-branch"))
    with pytest.raises(DataError, match=rf"cannot read {server.endpoint}/api/datasets/"
                       rf"{REPO_ID}/revision/no%2Fsuch-branch: HTTP Error 404.*"
                       "CONFIG_DATA_INPUT"):
        prepare("fineweb10b", tmp_path / "data")


@pytest.mark.parametrize("missing", [VAL, TRAIN[2]])
def test_fewer_shards_on_the_hub_than_asked_is_a_clear_error(tmp_path, shards, hub, missing):
    server = hub({n: d for n, d in shards.items() if n != missing})
    with pytest.raises(DataError, match=rf"has no {missing} .*CONFIG_DATA_TRAIN_SHARDS=3: "
                       "lower it"):
        prepare("fineweb10b", tmp_path / "data", train_shards=3)
    assert server.downloads() == []


def test_many_missing_shards_are_counted_not_all_named(tmp_path, shards, hub):
    hub(shards)
    with pytest.raises(DataError, match=r"has no fineweb_train_000004\.bin, fineweb_train_"
                       r"000005\.bin, fineweb_train_000006\.bin \(and 97 more\)"):
        prepare("fineweb10b", tmp_path / "data")  # (all 103 by default)


def test_a_listing_without_a_sha256_is_not_downloaded(tmp_path, shards, hub):
    plain = {k: v for k, v in entry(TRAIN[0], shards[TRAIN[0]]).items() if k != "lfs"}
    server = hub({n: d for n, d in shards.items() if n != TRAIN[0]}, served=shards,
                 extra=[plain])
    with pytest.raises(DataError, match=f"lists {TRAIN[0]} without an LFS size and sha256"):
        prepare("fineweb10b", tmp_path / "data", train_shards=1)
    assert TRAIN[0] not in server.downloads()


def test_a_listing_whose_size_contradicts_its_sha256_is_refused_and_left_nowhere(
        tmp_path, shards, hub):
    wrong = entry(TRAIN[0], shards[TRAIN[0]])
    wrong["lfs"]["size"] += 2  # (the sha256 of the bytes served, another size)
    hub({n: d for n, d in shards.items() if n != TRAIN[0]}, served=shards, extra=[wrong])
    with pytest.raises(DataError, match=rf"{TRAIN[0]} has the listed sha256 but not the "
                       rf"listed size \({len(shards[TRAIN[0]]) + 2} bytes"):
        prepare("fineweb10b", tmp_path / "data", train_shards=1)
    assert TRAIN[0] not in files_in(tmp_path / "data" / "fineweb10b")
