"""HellaSwag scoring on small files in the published jsonl format."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from helpers import BPE, TINY, call_main, only_run_dir, read_jsonl, run_py, train_tiny
from gpt2.data.shards import DataError
from gpt2.data.tokenizer import encode
from gpt2.eval import hellaswag
from gpt2.model.gpt import GPT, GPTConfig
from gpt2.runtime.device import Runtime
from gpt2.training.evaluation import hellaswag_scores

ROWS = [
    ("A man is sitting on a roof. He", ["is using wrap to wrap a pair of skis.",
                                        "is ripping level tiles off.",
                                        "is holding a rubik's cube.",
                                        "starts pulling up roofing on a roof."]),
    ("A woman walks into the kitchen and", ["opens the fridge.", "sings to the moon loudly.",
                                            "takes a pan", "the the the the"]),
    ("The children run outside. They", ["play in the snow with their friends for hours.",
                                        "eat.", "sleep on the grass", "fly away"]),
    ("Then, the chef adds salt to the soup. He", ["stirs it.", "tastes it slowly and smiles.",
                                                  "drives a car", "reads a book about soup"]),
    ("A dog chases a ball across the park and", ["brings it back.", "sits.",
                                                 "writes a letter to the ball",
                                                 "is a cat"]),
]


def write(path, labels):
    path.write_text("".join(json.dumps({"ind": i, "ctx": ctx, "endings": endings,
                                        "label": label, "split": "val"}) + "\n"
                            for i, ((ctx, endings), label) in enumerate(zip(ROWS, labels))))
    return path


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64)).eval()


def reference_losses(model, example):
    """Each ending's total and mean loss, one next-token prediction at a time through
    the sampling path (forward without targets): another route to the same numbers."""
    ctx = encode(example.context)
    out = []
    for ending in example.endings:
        toks = ctx + encode(" " + ending)
        losses = []
        for t in range(len(ctx), len(toks)):
            with torch.no_grad():
                logits = model(torch.tensor([toks[:t]]))[0][0, -1]
            losses.append(-F.log_softmax(logits.float(), -1)[toks[t]].item())
        out.append((sum(losses), sum(losses) / len(losses)))
    return out


@pytest.mark.slow
def test_ending_losses_equal_one_token_at_a_time(model, tmp_path):
    for ex in hellaswag.load(write(tmp_path / "h.jsonl", [0] * 5)):
        tokens, mask = hellaswag.render(ex, 64)
        total, mean = hellaswag.ending_losses(model, tokens, mask)
        ref = torch.tensor(reference_losses(model, ex))
        torch.testing.assert_close(total, ref[:, 0], rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(mean, ref[:, 1], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_accuracy_follows_the_labels(model, tmp_path):
    """Labels set to each example's best ending by the reference score 1.0; set to the
    worst, 0.0: acc counts total loss, acc_norm loss per token."""
    examples = hellaswag.load(write(tmp_path / "h.jsonl", [0] * 5))
    refs = [reference_losses(model, ex) for ex in examples]
    runtime = Runtime("cpu", "float32")
    for which, key in ((0, "hellaswag_acc"), (1, "hellaswag_acc_norm")):
        best = [min(range(4), key=lambda i: r[i][which]) for r in refs]
        worst = [max(range(4), key=lambda i: r[i][which]) for r in refs]
        for labels, expected in ((best, 1.0), (worst, 0.0)):
            ex = hellaswag.load(write(tmp_path / "h.jsonl", labels))
            scores = hellaswag_scores(model, ex, runtime)
            assert scores[key] == expected and scores["hellaswag_examples"] == 5


def test_long_examples_keep_their_last_tokens():
    ex = hellaswag.Example("word " * 100, ("ends here", "b", "c", "d"), 0)
    tokens, mask = hellaswag.render(ex, 16)
    assert tokens.shape[1] == 16
    assert tokens[0].tolist() == (encode(ex.context) + encode(" ends here"))[-16:]
    assert mask[0].sum() == len(encode(" ends here"))


@pytest.mark.parametrize("line, message", [
    ('{"ctx": "a", "endings": ["b", "c"], "label": 0}', "4 endings"),
    ('{"ctx": "a", "endings": ["b", "c", "d", "e"]}', "label"),
    ("not json", "h.jsonl:2"),
])
def test_bad_files_are_refused_with_the_line(tmp_path, line, message):
    path = write(tmp_path / "h.jsonl", [0] * 5)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], line, *lines[2:]]) + "\n")
    with pytest.raises(DataError, match=message):
        hellaswag.load(path)
    with pytest.raises(DataError, match="make eval-hellaswag"):
        hellaswag.load(tmp_path / "missing.jsonl")


@pytest.mark.e2e
def test_training_evaluates_hellaswag_and_the_cli_scores_a_run(data_dir, tmp_path):
    path = write(tmp_path / "h.jsonl", [0, 0, 1, 2, 3])
    proc = train_tiny(data_dir, tmp_path / "results", "--max-iters=4", "--eval-interval=4",
                      "--hellaswag-interval=2", "--hellaswag-examples=4",
                      f"--hellaswag-path={path}", "--sample-tokens=0", BPE)
    assert "hellaswag acc" in proc.stdout
    run = only_run_dir(tmp_path / "results")
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "hellaswag_acc" in r]
    assert [r["step"] for r in rows] == [2, 4] and rows[0]["hellaswag_examples"] == 4
    summary = json.loads((run / "summary.json").read_text())
    assert summary["hellaswag_acc_norm"] == rows[-1]["hellaswag_acc_norm"]
    # The same model scored afterwards by the command-line tool gives the same figures.
    cli = call_main("gpt2/evaluate.py", f"--run-dir={run}", f"--hellaswag-path={path}",
                    "--examples=4", "--device=cpu", check=True)
    assert "acc_norm" in cli.stdout
    result = json.loads((run / "hellaswag.json").read_text())
    assert result["hellaswag_acc_norm"] == rows[-1]["hellaswag_acc_norm"] and result["step"] == 4


@pytest.mark.e2e
def test_the_cli_scores_pretrained_weights(hf_model, tmp_path):
    """The scores, against transformers' own model: each label is set to the ending
    that model's total loss ranks best, so acc must be 1.0, and acc_norm the share
    of examples whose best ending by loss per token is that same one."""
    hf, folder = hf_model
    labels, agree = [], 0
    for ex in hellaswag.load(write(tmp_path / "h.jsonl", [0] * 5)):
        ctx = encode(ex.context)
        scores = []
        for ending in ex.endings:
            toks = ctx + encode(" " + ending)
            with torch.no_grad():
                logp = F.log_softmax(hf(torch.tensor([toks])).logits[0].float(), -1)
            losses = [-logp[t - 1, toks[t]].item() for t in range(len(ctx), len(toks))]
            scores.append((sum(losses), sum(losses) / len(losses)))
        best = min(range(4), key=lambda i: scores[i][0])
        labels.append(best)
        agree += best == min(range(4), key=lambda i: scores[i][1])
    path = write(tmp_path / "h.jsonl", labels)
    out = tmp_path / "r.json"
    call_main("gpt2/evaluate.py", f"--init-from={folder}", f"--hellaswag-path={path}",
              "--device=cpu", f"--json={out}", check=True)
    result = json.loads(out.read_text())
    assert result["hellaswag_examples"] == 5 and result["weights"] == str(folder)
    assert result["hellaswag_acc"] == 1.0 and result["hellaswag_acc_norm"] == agree / 5
    assert agree < 5  # the two scores differ here, so each is checked
    missing = call_main("gpt2/evaluate.py", f"--run-dir={tmp_path}/nothing")
    assert missing.returncode == 2 and "INIT_FROM" in missing.stderr


@pytest.mark.e2e
def test_make_eval_hellaswag_scores_the_run_it_is_given(data_dir, tmp_path):
    from helpers import run_make

    path = write(tmp_path / "h.jsonl", [0] * 5)
    train_tiny(data_dir, tmp_path / "results", "--max-iters=2", "--warmup-iters=1",
               "--eval-interval=2", "--sample-tokens=0", BPE)
    run = only_run_dir(tmp_path / "results")
    config = tmp_path / ".config"
    env = {"KCONFIG_CONFIG": str(config)}
    assert run_make("defconfig-gpt2-shakespeare-cpu", env=env).returncode == 0
    config.write_text(config.read_text().replace('CONFIG_HELLASWAG_PATH=""',
                                                 f'CONFIG_HELLASWAG_PATH="{path}"'))
    proc = run_make("eval-hellaswag", f"RUN={run}", "EXAMPLES=3", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run / "hellaswag.json").read_text())["hellaswag_examples"] == 3


@pytest.mark.reliability
def test_a_stop_during_hellaswag_is_redone_on_resume(data_dir, tmp_path):
    """A signal as step 2's HellaSwag evaluation starts abandons it; the resume redoes
    it, and every figure equals a run never stopped."""
    path = write(tmp_path / "h.jsonl", [0, 0, 1, 2, 3])
    args = [*TINY, f"--data-dir={data_dir}", "--run-name=tiny", "--max-iters=4",
            "--eval-interval=4", "--hellaswag-interval=2", "--hellaswag-examples=4",
            f"--hellaswag-path={path}", "--sample-tokens=0", BPE]
    run_py("gpt2/train.py", *args, f"--results-dir={tmp_path / 'a'}", check=True)
    stopped = run_py("gpt2/train.py", *args, f"--results-dir={tmp_path / 'b'}",
                     env={"KGPT_FAULTS": "sigint-in-hellaswag@2"})
    assert stopped.returncode == 130 and "SIGINT during evaluation" in stopped.stdout
    run_py("gpt2/train.py", *args, f"--results-dir={tmp_path / 'b'}", check=True)
    figures = [[(r["step"], r.get("train_loss"), r.get("val_loss"), r.get("hellaswag_acc"),
                 r.get("hellaswag_acc_norm")) for r in read_jsonl(only_run_dir(tmp_path / d)
                                                                  / "metrics.jsonl")]
               for d in ("a", "b")]
    assert figures[0] == figures[1]
    assert [f[0] for f in figures[1] if f[3] is not None] == [2, 4]
