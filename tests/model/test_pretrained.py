"""Hugging Face format GPT-2 weights (CONFIG_INIT_FROM), against transformers' own
GPT2LMHeadModel on the same weights. The checkpoints are tiny ones the tests write."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import BPE, only_run_dir, read_jsonl, train_tiny
from gpt2.config.options import resolve
from gpt2.errors import ConfigError
from gpt2.model import pretrained
from gpt2.model.gpt import GPT
from gpt2.model.build import model_config
from gpt2.model.pretrained import init_from

DIMS = dict(model_size="custom", n_layer=2, n_head=2, n_embd=32, block_size=32)


def ours_from(folder, **extra) -> GPT:
    cfg = resolve({**DIMS, "init_from": str(folder), **extra})
    model = GPT(model_config(cfg))
    init_from(model, cfg)
    return model.eval()


def test_logits_equal_transformers_gpt2(hf_model):
    hf, folder = hf_model
    ours = ours_from(folder)
    assert ours.cfg.vocab_size == 50257  # released weights keep their vocabulary
    idx = torch.randint(0, 50257, (3, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(idx).logits
        logits, loss = ours(idx, idx)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    reference = torch.nn.functional.cross_entropy(expected.view(-1, 50257), idx.view(-1))
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-5)


def test_old_style_bin_checkpoints_load_the_same_weights(hf_model, tmp_path):
    """pytorch_model.bin without the transformer. prefix and with the attention mask
    buffers, as the original release has them."""
    hf, folder = hf_model
    state = {k.removeprefix("transformer."): v.clone() for k, v in hf.state_dict().items()
             if k != "lm_head.weight"}
    for i in range(2):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    a, b = ours_from(folder).state_dict(), ours_from(tmp_path).state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # Conv1D (in, out) became Linear (out, in).
    c_attn = hf.state_dict()["transformer.h.0.attn.c_attn.weight"]
    assert torch.equal(b["transformer.h.0.attn.c_attn.weight"], c_attn.t())


@pytest.mark.parametrize("extra, message", [
    (dict(n_layer=3), "holds 2 layers"),
    (dict(block_size=128), "64 positions"),
    (dict(bias=False), "CONFIG_BIAS=y"),
])
def test_weights_that_do_not_fit_the_model_are_refused(hf_model, extra, message):
    with pytest.raises(ConfigError, match=message):
        ours_from(hf_model[1], **extra)


def test_a_release_needs_its_model_size_and_the_cache(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="CONFIG_MODEL_SIZE_GPT2_MEDIUM"):
        resolve({"init_from": "gpt2-medium"})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(pretrained.PretrainedError, match="hf download openai-community/gpt2"):
        pretrained.find("gpt2")


@pytest.mark.e2e
def test_fine_tuning_starts_from_the_weights_and_resumes_from_its_checkpoint(
        data_dir, hf_model, tmp_path):
    hf, folder = hf_model
    args = [f"--init-from={folder}", "--max-iters=4", "--eval-interval=2",
            "--checkpoint-interval=2", "--sample-tokens=0", BPE]
    first = train_tiny(data_dir, tmp_path, *args, "--stop-at-step=2", check=False)
    assert first.returncode == 130 and f"weights from {folder}" in first.stdout
    run = only_run_dir(tmp_path)
    # Step 0's validation loss is the pretrained model's own.
    from gpt2.data.loader import ValBatches, open_split

    val = ValBatches(open_split(data_dir, "shakespeare", "val"), 32, eval_tokens=256,
                     batch_size=4)  # TINY's
    with torch.no_grad():
        losses = [torch.nn.functional.cross_entropy(
            hf(torch.from_numpy(x)).logits.reshape(-1, 50257), torch.from_numpy(y).reshape(-1))
            for x, y in val]
    row0 = read_jsonl(run / "metrics.jsonl")[0]
    assert row0["val_loss"] == pytest.approx(float(sum(losses) / len(losses)), rel=1e-5)
    second = train_tiny(data_dir, tmp_path, *args)
    assert "weights from" not in second.stdout and "from step 2" in second.stdout
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
