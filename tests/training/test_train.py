"""Training end to end on a tiny model: loss falls, the results contract holds, and a
run reports itself when it is run again. Stops, resumes and faults: test_reliability.py."""

from __future__ import annotations

import json
import math
import os
import signal

import pytest
import torch

from helpers import (BPE, PY, REPO, TINY, TINY_DATASET, call_main, only_run_dir, read_jsonl,
                     run_bridge, run_py, signal_at_step, train_tiny)
from gpt2.data.loader import read_meta

SUMMARY_KEYS = {"status", "iters", "tokens", "final_val_loss", "final_val_ppl", "best_val_loss",
                "final_val_loss_se", "val_tokens", "epochs_trained", "train_split_tokens",
                "tokens_per_sec", "peak_memory_mb", "wall_time_s", "device", "dtype",
                "n_params", "optimizer", "pruning", "config_hash", "torch_version",
                "git_commit", "predicted_peak_memory_mb", "micro_batch",
                "gradient_accumulation"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    """One completed tiny run shared by the contract tests, on GPT-2's tokens (the
    product's own path: its loss starts uniform over 50k tokens)."""
    results = tmp_path_factory.mktemp("results")
    proc = train_tiny(data_dir, results, "--dropout=0.1", BPE)
    return results, only_run_dir(results), proc


@pytest.mark.e2e
def test_loss_falls(finished):
    _, run, _ = finished
    rows = read_jsonl(run / "metrics.jsonl")
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    train = [r["train_loss"] for r in rows if "train_loss" in r]
    assert vals[0] > 10.5  # uniform over 50k tokens at step 0
    assert vals[-1] < vals[0] - 1.0, vals
    assert vals == sorted(vals, reverse=True)
    assert sum(train[-5:]) / 5 < sum(train[:5]) / 5 - 1.0


@pytest.mark.e2e
def test_results_contract(finished, data_dir):
    results, run, proc = finished
    assert run.name.startswith("tiny-") and len(run.name) == len("tiny-") + 10
    for name in ("config", "config.json", "metrics.jsonl", "summary.json", "ckpt.pt",
                 "samples.txt", "loss.png"):
        assert (run / name).is_file(), name
    assert (results / "latest").resolve() == run.resolve()
    summary = json.loads((run / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["status"] == "completed" and summary["iters"] == 30
    assert summary["tokens"] == 30 * 4 * 32
    assert summary["final_val_ppl"] == pytest.approx(2.718281828 ** summary["final_val_loss"])
    rows = read_jsonl(run / "metrics.jsonl")
    # The validation set: TINY's 256 tokens, 8 windows; the loss's standard error over
    # them is the last evaluation's (its own figure: test_the_validation_loss_is_...).
    last_eval = [r for r in rows if "val_loss" in r][-1]
    assert summary["val_tokens"] == 256
    assert summary["final_val_loss_se"] == last_eval["val_loss_se"]
    assert 0 < summary["final_val_loss_se"] < 0.5 * summary["final_val_loss"]
    # Epochs: tokens trained over the training split's tokens, as meta.json counts them.
    train_tokens = read_meta(data_dir, "shakespeare")["train_tokens"]
    assert summary["train_split_tokens"] == train_tokens
    assert summary["epochs_trained"] == pytest.approx(30 * 4 * 32 / train_tokens, rel=1e-12)
    assert [r["epochs"] for r in rows] == pytest.approx(
        [r["step"] * 4 * 32 / train_tokens for r in rows], rel=1e-12)
    assert [r["step"] for r in rows] == list(range(31))  # log interval 1, eval at step 0
    for r in rows[1:]:
        assert {"step", "tokens", "train_loss", "lr", "tokens_per_sec", "elapsed_s"} <= set(r)
    assert {r["step"] for r in rows if "val_loss" in r} == {0, 10, 20, 30}
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run / "samples.txt").read_text().count("=== step ") == 4
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["n_layer"] == 2 and cfg["dropout"] == 0.1 and cfg["learning_rate"] == 3e-3
    assert "CONFIG_N_LAYER=2" in (run / "config").read_text()
    assert "summary" not in proc.stderr and "val loss" in proc.stdout
    assert "epochs planned" in proc.stdout and "warning:" not in proc.stdout  # far below 4


@pytest.mark.e2e
def test_checkpoint_loads_with_weights_only(finished):
    _, run, _ = finished
    state = torch.load(run / "ckpt.pt", weights_only=True)
    assert state["step"] == 30 and "optimizer" in state and "rng" in state


@pytest.mark.e2e
def test_lr_schedule_in_metrics_is_warmup_then_cosine(finished):
    _, run, _ = finished
    lrs = {r["step"]: r["lr"] for r in read_jsonl(run / "metrics.jsonl") if "train_loss" in r}
    assert lrs[1] == pytest.approx(1e-3) and lrs[3] == pytest.approx(3e-3)  # 3 warmup steps
    for step in range(4, 31):  # row `step` used the lr of update index step-1
        progress = (step - 1 - 3) / (30 - 3)
        expected = 3e-4 + 0.5 * (1 + math.cos(math.pi * progress)) * (3e-3 - 3e-4)
        assert lrs[step] == pytest.approx(expected, rel=1e-12)
    assert lrs[30] == pytest.approx(3e-4, rel=0.05)


@pytest.mark.e2e
def test_rerunning_a_finished_run_reports_it_and_trains_nothing(finished, data_dir):
    results, run, _ = finished
    before = (run / "metrics.jsonl").read_text()
    proc = train_tiny(data_dir, results, "--dropout=0.1", BPE)
    assert "already complete" in proc.stdout and "val      loss" in proc.stdout
    assert (run / "metrics.jsonl").read_text() == before


@pytest.mark.e2e
def test_a_changed_setting_gets_its_own_folder(finished, data_dir, tmp_path):
    results, run, _ = finished
    proc = call_main("gpt2/train.py", *TINY, f"--data-dir={data_dir}", f"--results-dir={results}",
                     "--run-name=tiny", "--dropout=0.1", "--seed=7", "--dry-run", BPE,
                     check=True)
    assert json.loads(proc.stdout)["run_dir"] != str(run)
    # where files go and how often to print do not change the run
    proc = call_main("gpt2/train.py", *TINY, f"--data-dir={data_dir}", f"--results-dir={results}",
                     "--run-name=tiny", "--dropout=0.1", "--log-interval=5", "--dry-run", BPE,
                     check=True)
    assert json.loads(proc.stdout)["run_dir"] == str(run)


@pytest.mark.reliability
def test_sigint_checkpoints_and_the_run_resumes(data_dir, tmp_path):
    results = tmp_path / "results"
    cmd = [PY, str(REPO / "gpt2/train.py"), *TINY, f"--data-dir={data_dir}",
           f"--results-dir={results}", "--run-name=tiny", "--max-iters=100000",
           "--warmup-iters=3", "--eval-interval=100000", "--checkpoint-interval=100000"]
    rc, out = signal_at_step(cmd, signal.SIGINT)
    assert rc == 130, out
    assert "SIGINT received" in out and "checkpoint saved" in out
    run = only_run_dir(results)
    state = torch.load(run / "ckpt.pt", weights_only=True)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and state["step"] == summary["iters"] >= 5


@pytest.mark.e2e
def test_epochs_bound_the_run(data_dir, tmp_path):
    train_tiny(data_dir, tmp_path, "--max-iters=0", "--epochs=0.02", "--warmup-iters=0")
    train_tokens = json.loads((data_dir / TINY_DATASET / "meta.json").read_text())["train_tokens"]
    windows = (train_tokens - 1 - 32) // 32  # block 32, one block of slack
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["iters"] == math.ceil(0.02 * windows / 4)  # batch 4, no accumulation


@pytest.mark.e2e
def test_bad_flags_are_refused_with_the_symbol(tmp_path):
    proc = call_main("gpt2/train.py", "--learning-rate=fast")
    assert proc.returncode == 2 and "not a number" in proc.stderr
    proc = call_main("gpt2/train.py", "--model-size=gpt2", "--n-layer=3", "--dry-run")
    assert proc.returncode == 2 and "CONFIG_MODEL_SIZE_CUSTOM" in proc.stderr
    proc = call_main("gpt2/train.py", "--run-name=../x", "--dry-run")
    assert proc.returncode == 2 and "CONFIG_RUN_NAME" in proc.stderr
    proc = call_main("gpt2/train.py", *TINY, f"--data-dir={tmp_path}", f"--results-dir={tmp_path}")
    assert proc.returncode == 2 and "make data" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.e2e
def test_generate_without_a_checkpoint_says_what_to_do(tmp_path):
    proc = call_main("gpt2/generate.py", f"--run-dir={tmp_path}")
    assert proc.returncode == 2 and "train first" in proc.stderr


@pytest.mark.e2e
def test_generate_prints_the_prompt_and_a_continuation(finished):
    _, run, _ = finished
    proc = call_main("gpt2/generate.py", f"--run-dir={run}", "--prompt=ROMEO:",
                     "--max-new-tokens=6", "--num-samples=2", "--device=cpu", check=True)
    assert proc.stdout.count("ROMEO:") == 2 and "--- sample 2 ---" in proc.stdout


@pytest.mark.reliability
def test_a_crash_mid_run_is_recorded_and_the_last_checkpoint_kept(data_dir, tmp_path,
                                                                   monkeypatch):
    from gpt2.config.options import resolve
    from gpt2.model.gpt import GPT
    from gpt2.training import trainer

    cfg = resolve(dict(model_size="custom", n_layer=1, n_head=2, n_embd=32, block_size=32,
                       batch_size=2, max_iters=20, warmup_iters=0, eval_interval=100,
                       eval_tokens=64, checkpoint_interval=4, sample_tokens=0, device="cpu",
                       dtype="float32", data_workers=0, data_dir=str(data_dir),
                       results_dir=str(tmp_path), run_name="crash"))
    real_forward, calls = GPT.forward, []

    def failing_forward(self, idx, targets=None, **kw):
        if targets is not None and self.training:
            calls.append(1)
            if len(calls) == 7:  # during step 7
                raise RuntimeError("injected fault")
        return real_forward(self, idx, targets, **kw)

    monkeypatch.setattr(GPT, "forward", failing_forward)
    with pytest.raises(RuntimeError, match="injected fault"):
        trainer.train(cfg)
    run = only_run_dir(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and "injected fault" in summary["error"]
    assert summary["iters"] == 6
    assert torch.load(run / "ckpt.pt", weights_only=True)["step"] == 4


@pytest.mark.e2e
def test_a_run_folder_in_use_is_refused_not_shared(data_dir, tmp_path):
    """Two processes training one folder would interleave checkpoints and metrics."""
    from gpt2.processes import lock_folder

    folder = tmp_path / "cell"
    folder.mkdir()
    held = lock_folder(folder)  # as a trainer of that folder holds it
    try:
        proc = train_tiny(data_dir, tmp_path / "r", f"--run-dir={folder}", check=False)
    finally:
        os.close(held)
    assert proc.returncode == 2
    assert "another process is training" in proc.stderr and "Traceback" not in proc.stderr
    assert not (folder / "metrics.jsonl").exists()
    proc = train_tiny(data_dir, tmp_path / "r", f"--run-dir={folder}", "--max-iters=5")
    assert (folder / "summary.json").is_file()  # free again: it trains there
    assert not (tmp_path / "r" / "latest").exists()  # --run-dir does not move latest


@pytest.mark.e2e
def test_start_up_says_what_it_is_doing(data_dir, tmp_path):
    """The CPU preset was silent for ~90 s before its first step line: the data check,
    the step-0 evaluation and the first step are printed as they happen."""
    proc = train_tiny(data_dir, tmp_path, "--max-iters=3", "--log-interval=5",
                      "--epoch-warning=0.0001")
    out = proc.stdout
    # 3 x 128 tokens pass over the training split more than 0.0001 times: a warning at
    # the start, before any evaluation (the finished run, below 4, has none).
    order = [f"data {TINY_DATASET}: 2 shard(s)", "epochs planned",
             "passes over the", "more than CONFIG_EPOCH_WARNING=0.0001",
             "evaluating the untrained model",
             "step      0/3 | val loss", "step      1/3 | first step done in",
             "step      3/3 | loss"]
    positions = [out.find(text) for text in order]
    assert -1 not in positions and positions == sorted(positions), out


def test_the_epoch_warning_comes_past_its_threshold_and_not_at_it():
    from gpt2.config.options import resolve
    from gpt2.training import epochs

    cfg = resolve(dict(batch_size=4, gradient_accumulation=1, block_size=32, max_iters=100,
                       epoch_warning=4.0))
    # 100 steps x 128 tokens = 12,800 tokens: 4 passes over 3,200, more over 3,199.
    assert epochs.warning(cfg, 100, 3_200) is None
    said = epochs.warning(cfg, 100, 3_199)
    assert said and "4.0 passes over the 3,199-token training split" in said
    assert "CONFIG_EPOCH_WARNING=4" in said and "overfitting" in said
    assert epochs.warning(resolve(dict(epoch_warning=0.0)), 10**6, 1) is None  # 0: never


@pytest.mark.parametrize("chunk", [0, 24])
def test_the_validation_loss_is_the_mean_over_windows_with_its_standard_error(chunk):
    """By hand, window by window: the loss is the mean of the windows' mean losses, so
    a short last batch weighs what its windows weigh (not what a whole batch would),
    and its standard error is their standard deviation over the square root of their
    count. With the loss computed in chunks (CONFIG_LOSS_CHUNK_TOKENS) too."""
    import numpy as np
    import torch.nn.functional as F

    from gpt2.data.loader import ValBatches
    from gpt2.data.shards import TokenSequence
    from gpt2.model.gpt import GPT, GPTConfig
    from gpt2.runtime.device import Runtime
    from gpt2.training.evaluation import validation_loss

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64,
                          loss_chunk_tokens=chunk))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(30)  # windows of very different losses
    seq = TokenSequence([np.random.default_rng(0).integers(0, 64, 3_000).astype(np.uint16)])
    val = ValBatches(seq, 16, eval_tokens=7 * 16, batch_size=3)  # batches of 3, 3 and 1
    got = validation_loss(model, val, Runtime("cpu", "float32"))
    with torch.no_grad():
        per = np.array([F.cross_entropy(
            model.all_logits(torch.from_numpy(seq.read(int(s), 16))[None])[0],
            torch.from_numpy(seq.read(int(s) + 1, 16))).item() for s in val.starts])
    assert (got.windows, got.tokens, len(val)) == (7, 7 * 16, 3)
    assert got.loss == pytest.approx(per.mean(), rel=1e-6)
    by_batch = np.mean([per[:3].mean(), per[3:6].mean(), per[6:].mean()])
    assert abs(by_batch - per.mean()) > 1e-3  # (what a mean of batch means would give)
    assert per.std(ddof=1) > 0.1
    assert got.se == pytest.approx(per.std(ddof=1) / np.sqrt(7), rel=1e-6)


@pytest.mark.e2e
def test_flags_are_never_abbreviated_and_typos_get_a_suggestion():
    """argparse took `--max-it 20` for --max-iters; everything else is strict."""
    proc = call_main("gpt2/train.py", "--max-it", "20", "--dry-run")
    assert proc.returncode == 2 and "did you mean --max-iters?" in proc.stderr
    proc = call_main("gpt2/train.py", "--lerning-rate=1e-3", "--dry-run")
    assert proc.returncode == 2 and "did you mean --learning-rate?" in proc.stderr


@pytest.mark.e2e
def test_dotconfig_is_the_configuration_and_flags_override_it(tmp_path):
    """--dotconfig used to be copied into the run folder without being read, so the
    recorded configuration could contradict the trained one."""
    from gpt2 import train as entry
    from gpt2.config import kconfig

    path = tmp_path / ".config"
    assert call_main("bridge", "defconfig", env={"KCONFIG_CONFIG": str(path)}
                     ).returncode == 0
    parse = entry.build_parser().parse_args
    cfg, record = entry.configuration(parse(["--dotconfig", str(path)]))
    assert cfg == kconfig.to_config(kconfig.load(path))[0] and cfg.n_layer == 4
    assert record == path.read_text()
    cfg, record = entry.configuration(parse(["--dotconfig", str(path), "--max-iters=70",
                                             "--optimizer=sgd"]))
    assert (cfg.max_iters, cfg.optimizer, cfg.n_layer) == (70, "sgd", 4)
    assert "CONFIG_MAX_ITERS=70" in record and "CONFIG_OPTIMIZER_SGD=y" in record
    assert "CONFIG_BETA2" not in record  # AdamW's, no longer in force
    proc = call_main("gpt2/train.py", "--dotconfig", str(REPO / "defconfigs" /
                                                      "gpt2-wikitext103-matrix"), "--dry-run")
    assert proc.returncode == 2 and "test matrix" in proc.stderr


@pytest.mark.e2e
def test_the_compile_mode_reaches_torch_compile_and_needs_compiling(data_dir, tmp_path,
                                                                   monkeypatch):
    """CONFIG_COMPILE_MODE is torch.compile's mode= (recorded here instead of compiling,
    which takes minutes on the CPU); with compiling off it is refused, not ignored, and
    at its default it leaves the run's hash as it was before the setting existed."""
    from gpt2.config.options import Config, resolve
    from gpt2.training import trainer

    modes = []
    real_compile = torch.compile

    def fake_compile(model, mode=None, **kw):
        # A real OptimizedModule, as on a GPU, traced by Dynamo but run eagerly (no
        # C++ compiler, seconds not minutes): the step must take it as it is (bool()
        # of one raises, so `fwd or model` broke every compiled run).
        modes.append(mode)
        return real_compile(model, backend="eager")

    monkeypatch.setattr(torch, "compile", fake_compile)
    base = dict(model_size="custom", n_layer=1, n_head=2, n_embd=32, block_size=32,
                batch_size=2, max_iters=2, warmup_iters=0, eval_interval=100, eval_tokens=64,
                sample_tokens=0, device="cpu", dtype="float32", data_workers=0,
                data_dir=str(data_dir), results_dir=str(tmp_path), compile="on")
    for mode, expected in (("max-autotune", "max-autotune"), ("default", None)):
        cfg = resolve({**base, "compile_mode": mode, "run_name": f"m-{mode}"})
        assert trainer.train(cfg) == 0
        assert modes.pop() == expected
    # Every setting at its default: the hash runs made before compile_mode and
    # attention_backend existed carry (a new setting must not orphan their folders).
    # (It changed once on purpose since: eval_batches became eval_tokens, and runs
    # made before scored their validation loss on other tokens.)
    assert Config().config_hash() == "7e64178f4b"
    assert Config(compile_mode="max-autotune").config_hash() != "7e64178f4b"
    proc = call_main("gpt2/train.py", "--compile=off", "--compile-mode=max-autotune",
                     "--dry-run")
    assert proc.returncode == 2 and "CONFIG_COMPILE_MODE" in proc.stderr


@pytest.mark.parametrize("loss_value,applied", [(1.0, True), (float("nan"), False)])
def test_the_finite_check_is_queued_before_the_last_backward(loss_value, applied):
    """The loss's finiteness is queued after the step's last forward and read after
    its backward: on a GPU the host then waits for the forward only, never for a
    drained queue between backward and update. A non-finite answer still stops the
    step before anything is updated."""
    import itertools

    from gpt2.config.options import resolve
    from gpt2.training import guards
    from gpt2.runtime.device import Runtime
    from gpt2.sparsity.algorithms.pruning import build_pruner
    from gpt2.training.step import Learner, optimizer_step

    events = []

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, x, y):
            loss = self.w * loss_value
            loss.register_hook(lambda g: events.append("backward"))
            return None, loss

    def finite(loss_sum):
        events.append("check")
        return lambda: events.append("read") or bool(torch.isfinite(loss_sum))

    cfg = resolve({"gradient_accumulation": 2, "device": "cpu", "grad_clip": 0.0})
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    pruner = build_pruner(model, optimizer, cfg, 10)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    stream = itertools.repeat((None, None))
    try:
        optimizer_step(Learner(model, optimizer, scaler, pruner, Runtime("cpu", "float32")),
                       stream, 1, cfg, finite=finite)
    except guards.NonFiniteLoss:
        assert not applied
    assert events == ["backward", "check", "backward", "read"]
    assert model.w.item() == (0.5 if applied else 1.0)


@pytest.mark.e2e
def test_the_cpu_hands_freed_memory_back_after_each_evaluation(data_dir, tmp_path, monkeypatch):
    """An evaluation's heap buffers (those below device.LARGE_BUFFER) differ in size
    from a training step's; after each evaluation (the untrained model's included) the
    heap's freed space goes back to the OS, and only then."""
    from gpt2.config.options import resolve
    from gpt2.training import trainer

    calls = []
    monkeypatch.setattr(trainer, "return_freed_memory", lambda: calls.append(len(steps)))
    steps = []
    real_step = trainer.Trainer._optimizer_step
    monkeypatch.setattr(trainer.Trainer, "_optimizer_step",
                        lambda self, *a: (steps.append(a[1]), real_step(self, *a))[1])
    cfg = resolve(dict(model_size="custom", n_layer=1, n_head=2, n_embd=32, block_size=32,
                       batch_size=2, max_iters=5, warmup_iters=0, eval_interval=2,
                       eval_tokens=64, sample_tokens=0, device="cpu", dtype="float32",
                       data_workers=0, data_dir=str(data_dir), results_dir=str(tmp_path),
                       run_name="trim"))
    assert trainer.train(cfg) == 0
    # After the evaluations at steps 0, 2 and 4; the last step's ends the run.
    assert calls == [0, 2, 4]


@pytest.mark.e2e
def test_a_progress_lines_speed_leaves_out_evaluations_wherever_they_fall(data_dir, tmp_path,
                                                                          monkeypatch):
    """Each step takes 1 s and each evaluation 100 s of a fake clock. Evaluations at
    steps 6 and 12 fall inside the lines of steps 8 and 12 (every 4): every line must
    still give one step's tokens a second. (Restarting the clock after an evaluation
    but keeping the tokens counted before it gave the line of step 8 twice that: seen
    on a GPU, with track 3's evaluations every 25 steps and lines every 10.)"""
    import types

    from gpt2.config.options import resolve
    from gpt2.training import trainer

    clock = [0.0]
    monkeypatch.setattr(trainer, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def advancing(method, seconds):
        def run(self, *a, **k):
            out = method(self, *a, **k)
            clock[0] += seconds
            return out
        return run

    monkeypatch.setattr(trainer.Trainer, "_optimizer_step",
                        advancing(trainer.Trainer._optimizer_step, 1.0))
    monkeypatch.setattr(trainer.Trainer, "_validate", advancing(trainer.Trainer._validate, 100.0))
    cfg = resolve(dict(model_size="custom", n_layer=1, n_head=2, n_embd=32, block_size=32,
                       batch_size=2, max_iters=12, warmup_iters=0, eval_interval=6,
                       log_interval=4, eval_tokens=64, sample_tokens=0, device="cpu",
                       dtype="float32", data_workers=0, data_dir=str(data_dir),
                       results_dir=str(tmp_path), run_name="speed"))
    assert trainer.train(cfg) == 0
    run = only_run_dir(tmp_path)
    lines = [r for r in read_jsonl(run / "metrics.jsonl") if "tokens_per_sec" in r]
    assert [r["step"] for r in lines] == [4, 8, 12]
    assert [r["tokens_per_sec"] for r in lines] == [2 * 32] * 3
    summary = json.loads((run / "summary.json").read_text())
    assert summary["tokens_per_sec"] == 2 * 32
