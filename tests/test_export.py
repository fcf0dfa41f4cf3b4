"""`make export`: a run in Hugging Face format that transformers loads, computing
kgpt's logits; pruned zeros kept; kgpt reads it back (CONFIG_INIT_FROM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import BPE, run_make, run_target, train_tiny
from test_input_safety import assert_clean_error

from gpt2 import export
from gpt2.config.options import Config
from gpt2.data.tokenizer import VOCAB_SIZE, encode
from gpt2.model import pretrained
from gpt2.model.gpt import GPT
from gpt2.model.build import model_config
from gpt2.training import trained

transformers = pytest.importorskip("transformers")
TEXT = "ROMEO: But soft, what light through yonder window breaks?"


@pytest.fixture(scope="module")
def pruned_run(data_dir, tmp_path_factory) -> Path:
    """A tiny run pruned to 50 % by magnitude, without biases or weight tying: the
    export must cover what GPT-2's own layout does not have."""
    results = tmp_path_factory.mktemp("export") / "results"
    train_tiny(data_dir, results, "--max-iters=20", "--pruning-method=magnitude",
               "--target-sparsity=0.5", "--pruning-warmup=2", "--pruning-frequency=2",
               "--no-bias", "--no-tie-weights", BPE)
    (folder,) = [p for p in results.iterdir() if p.is_dir() and not p.is_symlink()]
    return folder


def kgpt_logits(run: Path, ids: torch.Tensor) -> torch.Tensor:
    _, model, _ = trained.model(run)
    with torch.no_grad():
        return model.all_logits(ids)


@pytest.mark.e2e
def test_transformers_loads_the_export_and_computes_kgpts_logits(pruned_run, tmp_path):
    out = tmp_path / "hf"
    proc = run_make("export", f"RUN={pruned_run}", f"EXPORT_ARGS=--out {out}")
    assert proc.returncode == 0, proc.stderr
    assert "GPT2LMHeadModel.from_pretrained" in proc.stdout
    model = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    assert ids[0].tolist() == encode(TEXT)  # the same BPE, offline
    with torch.no_grad():
        theirs = model(ids).logits
    ours = kgpt_logits(pruned_run, ids)
    assert theirs.shape[-1] == VOCAB_SIZE  # the 47 padded rows are cut
    torch.testing.assert_close(theirs, ours[..., :VOCAB_SIZE], rtol=0, atol=2e-5)
    # Pruned weights stay zeros, exactly where the run has them.
    _, net, _ = trained.model(pruned_run)
    for i, block in enumerate(net.transformer.h):
        mine = block.mlp.c_fc.weight
        hf = model.transformer.h[i].mlp.c_fc.weight.t()  # Conv1D stores (in, out)
        assert (mine == 0).sum() > 0.3 * mine.numel()
        assert torch.equal(hf == 0, mine == 0)
    record = json.loads((out / "kgpt.json").read_text())
    assert record["step"] == 20 and record["vocab_rows"] == {"kept": VOCAB_SIZE,
                                                             "in_the_run": 50304}
    assert record["checkpoint_sha256"] and "47 padded vocabulary rows" in \
        record["not_exported"]
    # The model card: what it is, how it was trained, what it reached, what made it,
    # each from the run's own files.
    card = (out / "README.md").read_text()
    summary = json.loads((pruned_run / "summary.json").read_text())
    made = json.loads((pruned_run / "provenance.json").read_text())
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert f"{summary['n_params']:,} parameters" in card
    assert f"final validation loss {summary['final_val_loss']:.4f}" in card
    assert f"steps: 20 of {record['max_iters']} (completed)" in card
    assert f"tokens seen: {summary['tokens']:,}" in card
    assert f"kgpt commit `{made['code']['commit']}`" in card
    assert f"data fingerprint `{made['data']['sha256']}`" in card
    assert f"measured {summary['final_sparsity']:.3f}" in card
    assert record["checkpoint_sha256"] in card and record["config_hash"] in card


@pytest.mark.e2e
def test_a_tied_model_is_exported_tied_and_transformers_computes_its_logits(two_runs, tmp_path):
    """kgpt ties the head to the token table by default: the export must say so
    (tie_word_embeddings), or transformers gives the head weights of its own (random:
    logits off by several units)."""
    from gpt2 import export

    run = two_runs[1][0]
    assert json.loads((run / "config.json").read_text())["tie_weights"] is True
    export.export(run, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["tie_word_embeddings"]
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([encode(TEXT)[:16]])
    with torch.no_grad():
        theirs = model(ids).logits
    torch.testing.assert_close(theirs, kgpt_logits(run, ids)[..., :VOCAB_SIZE], rtol=0,
                               atol=2e-5)


@pytest.mark.e2e
def test_the_padded_vocabulary_can_be_kept(pruned_run, tmp_path):
    from gpt2 import export

    export.export(pruned_run, tmp_path / "hf", keep_padded_vocab=True)
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([encode(TEXT)])
    with torch.no_grad():
        theirs = model(ids).logits
    torch.testing.assert_close(theirs, kgpt_logits(pruned_run, ids), rtol=0, atol=2e-5)


@pytest.mark.e2e
def test_kgpt_starts_from_its_own_export(two_runs, tmp_path):
    """Export -> CONFIG_INIT_FROM=<folder> gives back the run's model (on the real
    vocabulary: a model started from Hugging Face weights has GPT-2's 50257 rows)."""
    from gpt2 import export

    run = two_runs[1][0]
    export.export(run, tmp_path / "hf")
    cfg, original, _ = trained.model(run)
    again = GPT(model_config(Config(**{**cfg.to_dict(), "init_from": str(tmp_path / "hf")})))
    pretrained.load_into(again, tmp_path / "hf")
    ids = torch.tensor([encode(TEXT)[:cfg.block_size]])
    with torch.no_grad():
        torch.testing.assert_close(again.eval().all_logits(ids),
                                   original.all_logits(ids)[..., :VOCAB_SIZE], rtol=0, atol=0)


@pytest.mark.e2e
def test_exporting_a_folder_without_a_checkpoint_says_so(tmp_path):
    proc = run_target("export", f"RUN={tmp_path}")
    assert proc.returncode == 2 and "has no checkpoint" in proc.stderr


def test_the_model_card_states_the_final_loss_not_the_best():
    """A run whose loss rose after its best evaluation: the card states where the
    exported weights are (the final evaluation), not the best one they no longer have."""
    from gpt2.config.options import Config
    from gpt2.export import model_card
    from gpt2.run_folder import Summary

    summary = Summary(status="completed", iters=40, tokens=5120, final_val_loss=5.4321,
                      final_val_ppl=228.7, best_val_loss=5.1234, val_tokens=2048)
    record = {"step": 40, "max_iters": 40, "status": "completed", "config_hash": "abc",
              "checkpoint": "ckpt.pt", "checkpoint_sha256": "00ff", "not_exported": ["x"]}
    card = model_card(Config(run_name="rose"), record, summary, None, 1234)
    assert "final validation loss 5.4321 (perplexity 228.70) on 2,048 validation tokens" in card
    assert "5.1234" not in card


# ---- where an export may go: only into a folder of its own -----------------------------------

@pytest.mark.e2e
def test_an_export_onto_its_own_earlier_export_with_a_users_file_says_so(pruned_run, tmp_path,
                                                                        capsys):
    """The run's earlier export, with a file the user put in it: the export would
    replace the folder whole, so it is refused and the file stays."""
    out = tmp_path / "hf"
    assert export.main(["--run-dir", str(pruned_run), "--out", str(out)]) == 0
    (out / "my-notes.txt").write_text("mine")
    capsys.readouterr()
    assert export.main(["--run-dir", str(pruned_run), "--out", str(out)]) == 2
    text = assert_clean_error(capsys.readouterr().err, "this run's earlier export",
                              "files kgpt did not write there (my-notes.txt)")
    assert "another run" not in text
    assert (out / "my-notes.txt").read_text() == "mine"


@pytest.mark.e2e
def test_an_earlier_export_holding_a_folder_under_an_export_files_name_is_refused(
        pruned_run, tmp_path, capsys):
    out = tmp_path / "exp"
    out.mkdir()
    (out / "kgpt.json").write_text(json.dumps({"run": str(pruned_run.resolve())}))
    (out / "config.json").mkdir()
    (out / "config.json" / "precious.txt").write_text("data")
    assert export.main(["--run-dir", str(pruned_run), "--out", str(out)]) == 2
    assert_clean_error(capsys.readouterr().err, "files kgpt did not write there (config.json)")
    assert (out / "config.json" / "precious.txt").read_text() == "data"
