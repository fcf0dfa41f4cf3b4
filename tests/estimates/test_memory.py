"""The memory estimator, term by term, against the tensors a real CPU step allocates
(counted by scripts/memtrack.py); the refuse-and-suggest path; auto batch."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re

import pytest
import torch

from helpers import BPE, TINY, only_run_dir, train_tiny
from gpt2.config.options import resolve
from gpt2.model.gpt import GPT
from gpt2.model.build import model_config
from gpt2.estimates import memory
from gpt2.runtime.device import Runtime
from scripts.memtrack import TensorMemory
from gpt2.config.choices import OPTIMIZERS, PRUNING_METHODS, pair_problem
from gpt2.optim.algorithms.optimizers import build_optimizer
from gpt2.sparsity.algorithms.pruning import build_pruner
from gpt2.training.step import Learner, optimizer_step

SMALL = dict(model_size="custom", n_layer=2, n_head=4, n_embd=64, block_size=64, batch_size=4,
             device="cpu", dtype="float32")


def cfg_of(**kw):
    return resolve({**SMALL, **kw})


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def build(cfg, total_steps: int = 100):
    torch.manual_seed(0)
    model = GPT(model_config(cfg))
    optimizer = build_optimizer(model, cfg, "cpu")
    pruner = build_pruner(model, optimizer, cfg, total_steps)
    return model, optimizer, pruner


def batch(cfg):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randint(0, 50257, (cfg.batch_size, cfg.block_size), generator=g)
                 for _ in range(2))


def step(cfg, model, optimizer, pruner, n: int = 1, start: int = 1, fwd=None,
         micro_steps: int | None = None):
    """``n`` optimizer steps from ``start``; ``fwd`` and ``micro_steps`` as the trainer
    passes them (a DDP-wrapped model runs its process's share of the micro-batches)."""
    runtime = Runtime("cpu", cfg.dtype)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    stream = itertools.repeat(batch(cfg))
    for i in range(n):
        optimizer_step(Learner(model, optimizer, scaler, pruner, runtime), stream, start + i, cfg,
                       fwd=fwd, micro_steps=micro_steps)


def state_bytes(optimizer) -> int:
    # Per-parameter state, tensors and lists of them (SOAP's factors and bases); scalar
    # step counters (a few bytes each) are not modelled.
    def tensors(v):
        return [v] if torch.is_tensor(v) else [t for x in v for t in tensors(x)] \
            if isinstance(v, (list, tuple)) else []
    return sum(t.numel() * t.element_size() for s in optimizer.state.values()
               for v in s.values() for t in tensors(v) if t.numel() > 1)


# CONFIG_MODEL_PRECISION=bf16-table: the token table, its gradient and its state in
# bfloat16, the forward in bfloat16 (autocast off inside the model)
BF16_TABLE = dict(model_precision="bf16-table", dtype="bfloat16")


@pytest.mark.parametrize("precision", [{}, BF16_TABLE], ids=["float32", "bf16-table"])
def test_weights_and_gradients_are_the_model_s_tensors(precision):
    # with accumulation every gradient is counted
    cfg = cfg_of(gradient_accumulation=2, **precision)
    model, optimizer, pruner = build(cfg)
    est = memory.estimate(cfg, "cpu")
    assert est.term("weights") == tensor_bytes(model.parameters())
    x, y = batch(cfg)
    model(x, y)[1].backward()
    assert est.term("gradients") == tensor_bytes(p.grad for p in model.parameters())


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_bf16_tables_state_term_matches_the_real_state(optimizer):
    cfg = cfg_of(optimizer=optimizer, **BF16_TABLE)
    model, optimizer, pruner = build(cfg)
    step(cfg, model, optimizer, pruner, n=2)
    assert optimizer.state[model.transformer.wte.weight]["exp_avg"].dtype == torch.bfloat16
    assert memory.estimate(cfg, "cpu").term("optimizer") == state_bytes(optimizer)


def test_normuon_state_term_matches_the_real_state():
    cfg = cfg_of(optimizer="muon", muon_normalization="normuon")
    model, optimizer, pruner = build(cfg)
    step(cfg, model, optimizer, pruner, n=2)
    assert memory.estimate(cfg, "cpu").term("optimizer") == state_bytes(optimizer)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_state_term_matches_the_real_state(name):
    cfg = cfg_of(optimizer=name, pruning_method="none", sgd_momentum=0.9) if name == "sgd" \
        else cfg_of(optimizer=name)
    model, optimizer, pruner = build(cfg)
    step(cfg, model, optimizer, pruner, n=2)
    assert memory.estimate(cfg, "cpu").term("optimizer") == state_bytes(optimizer)


def test_plain_sgd_keeps_no_state():
    cfg = cfg_of(optimizer="sgd", sgd_momentum=0.0, sgd_nesterov=False)
    model, optimizer, pruner = build(cfg)
    step(cfg, model, optimizer, pruner)
    assert memory.estimate(cfg, "cpu").term("optimizer") == state_bytes(optimizer) == 0


@pytest.mark.parametrize("method,extra", [
    ("magnitude", {}), ("movement", {}), ("movement", dict(prune_embeddings=True)),
    ("magnitude", dict(prune_norms_biases=True, pruning_scope="global")), ("state", {})])
def test_pruning_term_is_the_masks_and_scores(method, extra):
    opt = "adamwprune" if pair_problem("adamw", method) else "adamw"
    cfg = cfg_of(optimizer=opt, pruning_method=method, pruning_warmup=1, **extra)
    model, optimizer, pruner = build(cfg)
    step(cfg, model, optimizer, pruner, n=2)
    held = (tensor_bytes(pruner.pruned.values())
            + tensor_bytes(getattr(pruner, "accumulated", {}).values())
            + tensor_bytes(getattr(pruner, "kept", {}).values()))
    assert memory.estimate(cfg, "cpu").term("pruning") == held > 0


def test_every_pruning_method_is_modelled():
    for method in PRUNING_METHODS:
        opt = "adamwprune" if pair_problem("adamw", method) else "adamw"
        est = memory.estimate(cfg_of(optimizer=opt, pruning_method=method), "cpu")
        assert (est.term("pruning") > 0) == (method != "none"), method


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_saved_activations_match_what_autograd_keeps(dtype, mode):
    """After the forward pass: what is alive is exactly the saved activations, the
    autocast weight copies and the saved float32 log-probabilities (4 B x vocab)."""
    # bf16 matmuls are slow on CPUs without bf16 units: one sequence is enough.
    cfg = cfg_of(dtype=dtype, activation_checkpointing=mode,
                 batch_size=1 if dtype == "bfloat16" else 4)
    alive, est = alive_after_forward(cfg)
    tokens = cfg.batch_size * cfg.block_size
    predicted = est.term("activations") + est.term("copies") + 4 * tokens * 50304
    assert predicted == pytest.approx(alive, rel=0.01)


def alive_after_forward(cfg) -> tuple[int, memory.Estimate]:
    """Bytes of tensors alive after the forward pass of ``cfg``'s model (what autograd
    keeps), and the estimate for ``cfg``."""
    model, _, _ = build(cfg)
    x, y = batch(cfg)
    with TensorMemory() as mem:
        with Runtime("cpu", cfg.dtype).autocast():
            loss = model(x, y)[1]
        alive = mem.current
    del loss
    return alive, memory.estimate(cfg, "cpu")


# modded-nanogpt's track 3 architecture (every CONFIG_MODEL_* setting changed)
TRACK3 = dict(model_norm="rmsnorm", model_position="rope-half", model_qk_norm=True,
              model_attention_scale=0.12, model_activation="relu2", model_embedding_norm=True,
              model_head_bias=True, model_logit_cap=15.0, model_init="track3",
              tie_weights=False)
# Each setting that keeps tensors, alone: their terms are separate.
ARCHITECTURES = {"track3": TRACK3, "rmsnorm": dict(model_norm="rmsnorm"),
                 "qk-norm": dict(model_qk_norm=True), "rope": dict(model_position="rope-half"),
                 "embedding-norm": dict(model_embedding_norm=True)}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_saved_activations_of_the_architecture_settings(arch, dtype):
    """As above, for the architecture settings: norms, query-key norms and rotary
    positions keep other tensors than GPT-2's, and the logit cap its float32 input (4 B
    x vocab more)."""
    cfg = cfg_of(dtype=dtype, batch_size=1 if dtype == "bfloat16" else 2,
                 **ARCHITECTURES[arch])
    alive, est = alive_after_forward(cfg)
    tokens = cfg.batch_size * cfg.block_size
    logit_bytes = 8 if cfg.model_logit_cap else 4
    predicted = est.term("activations") + est.term("copies") + logit_bytes * tokens * 50304
    assert predicted == pytest.approx(alive, rel=0.01)
    # (at 1 %, a term of the architecture left out shows: each is over 2 %)
    assert est.term("activations") > memory.estimate(cfg_of(dtype=dtype, batch_size=cfg.batch_size),
                                                      "cpu").term("activations") * 1.02


@pytest.mark.slow
def test_saved_activations_of_the_bf16_table():
    """bf16-table's forward keeps what autocast's does, on the CPU: its norms keep
    float32 copies of their bfloat16 inputs where autocast's keep their float32
    inputs, and each Linear keeps its bfloat16 weight copy as autocast's cast does."""
    cfg = cfg_of(batch_size=1, **TRACK3, **BF16_TABLE)
    alive, est = alive_after_forward(cfg)
    tokens = cfg.batch_size * cfg.block_size
    predicted = est.term("activations") + est.term("copies") + 8 * tokens * 50304
    assert predicted == pytest.approx(alive, rel=0.01)


def test_checkpointing_saves_what_the_estimate_says():
    by_mode = memory.estimate(cfg_of(), "cpu").activations_by_mode
    assert by_mode["full"] < by_mode["selective"] < by_mode["none"]
    # full keeps one float32 residual (4C) per layer and token, plus the head's inputs.
    c, tokens = SMALL["n_embd"], SMALL["batch_size"] * SMALL["block_size"]
    assert by_mode["full"] == tokens * (2 * 4 * c + 16 + 4 * c + 8 + 4 * c)


PEAK_CASES = {
    "fp32": {}, "bf16": dict(dtype="bfloat16", batch_size=1),
    "bf16-selective": dict(dtype="bfloat16", activation_checkpointing="selective",
                           batch_size=1),
    "fp32-full": dict(activation_checkpointing="full"),
    "chunked-loss": dict(loss_chunk_tokens=64),
    "chunked-full": dict(loss_chunk_tokens=64, activation_checkpointing="full"),
    "accumulation": dict(gradient_accumulation=2),
    "movement-global": dict(pruning_method="movement", pruning_scope="global",
                            pruning_warmup=1, pruning_frequency=1),
    # AdamWPrune's rules: one sampled threshold over the blocks and the tied head.
    "state-global": dict(optimizer="adamwprune", pruning_method="state", pruning_warmup=0,
                         pruning_frequency=1),
    "muon": dict(optimizer="muon"), "dropout": dict(dropout=0.1),
    # Few tokens, wide layers: the optimizer step is the peak.
    **{f"wide-{name}": dict(optimizer=name, n_layer=3, n_embd=256, n_head=8, block_size=128,
                            batch_size=2) for name in OPTIMIZERS},
}
# Plain attention keeps its T x T weights: long contexts make them most of the peak.
MATH = dict(attention_backend="math", block_size=512, batch_size=1, n_head=16)
PEAK_CASES.update({"math-attention": MATH, "math-attention-bf16": {**MATH, "dtype": "bfloat16"},
                   "math-attention-dropout": {**MATH, "dropout": 0.1}})
# Many block matrices of one shape: Muon's Newton-Schulz on that stack is the peak.
PEAK_CASES["deep-muon"] = dict(optimizer="muon", n_layer=24, n_embd=256, n_head=8, block_size=32,
                               batch_size=1)
# The fused loss computes the head's gradients in its forward; with accumulation and a
# tied head the end of backward (the head's and the token table's gradients summed)
# is the peak.
PEAK_CASES.update({"fused-loss": dict(loss_chunk_tokens=256, loss_fused=True, n_layer=4,
                                      batch_size=16),
                   "fused-loss-bf16": dict(loss_chunk_tokens=64, loss_fused=True,
                                           dtype="bfloat16", batch_size=2),
                   "fused-accumulation": dict(loss_chunk_tokens=64, loss_fused=True,
                                              gradient_accumulation=2)})
# modded-nanogpt's track 3 model: its norms, rotary positions and logit cap.
PEAK_CASES.update({"track3": TRACK3, "track3-bf16": {**TRACK3, "dtype": "bfloat16",
                                                      "batch_size": 1},
                   "track3-selective-bf16": {**TRACK3, "dtype": "bfloat16", "batch_size": 1,
                                             "activation_checkpointing": "selective"},
                   "track3-full": {**TRACK3, "activation_checkpointing": "full"},
                   "track3-chunked": {**TRACK3, "loss_chunk_tokens": 64},
                   "track3-chunked-bf16": {**TRACK3, "loss_chunk_tokens": 32,
                                           "dtype": "bfloat16", "batch_size": 1},
                   "track3-muon": {**TRACK3, "optimizer": "muon"}})
# bf16-table: the table's 2 B values; Muon's step widens it to float32 (16 B a value);
# a chunked loss's head gradient is summed out of place from the second chunk on.
BF16_TRACK3 = {**TRACK3, **BF16_TABLE, "batch_size": 1}
PEAK_CASES.update({"bf16-table": BF16_TRACK3,
                   # GPT-2's tied head: the bfloat16 table itself, no copy of it
                   "bf16-table-tied": {**BF16_TABLE, "batch_size": 1},
                   "bf16-table-tied-accumulation": {**BF16_TABLE, "batch_size": 1,
                                                    "gradient_accumulation": 2},
                   # (and its chunks' head gradients arrive bfloat16: no cast, summed in place)
                   "bf16-table-tied-chunked": {**BF16_TRACK3, "tie_weights": True,
                                               "loss_chunk_tokens": 32},
                   "bf16-table-muon": {**BF16_TRACK3, "optimizer": "muon"},
                   "bf16-table-chunked": {**BF16_TRACK3, "loss_chunk_tokens": 32},
                   "bf16-table-chunked-wide": {**BF16_TRACK3, "loss_chunk_tokens": 16,
                                               "n_embd": 128},
                   "bf16-table-chunked-accumulation": {**BF16_TRACK3, "loss_chunk_tokens": 32,
                                                       "gradient_accumulation": 2},
                   "bf16-table-muon-wide": {**BF16_TRACK3, "optimizer": "muon", "n_layer": 3,
                                            "n_embd": 256, "n_head": 8, "block_size": 128}})
# NorMuon's per-row state and Polar Express's iteration.
PEAK_CASES["wide-normuon"] = {**PEAK_CASES["wide-muon"], "muon_normalization": "normuon",
                              "muon_coefficients": "polar-express"}
# The cautious forms: masks and masked steps, one tensor at a time.
PEAK_CASES.update({f"wide-{name}-cautious": {**PEAK_CASES[f"wide-{name}"], "cautious": True}
                   for name in ("adamw", "lion")})
# SPAM's peak is a step that clips spikes: let the measured step (the second) clip.
PEAK_CASES["wide-adamwspam"]["spam_clip_delay"] = 2


# Tighter where a term's share of the peak is under 5 % (the capped head's
# low-precision gradient under autocast: 4.5 %)
PEAK_TOLERANCE = {"track3-bf16": 0.01}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(PEAK_CASES))
def test_predicted_peak_matches_the_measured_peak_of_a_step(case):
    """The whole optimizer step (forward, backward, clip, optimizer, pruning hooks)
    after the state exists: tensors it allocates at its peak plus those held
    throughout (weights, optimizer state, masks) against the prediction."""
    cfg = cfg_of(**PEAK_CASES[case])
    model, optimizer, pruner = build(cfg)
    step(cfg, model, optimizer, pruner, n=1)
    held = (tensor_bytes(model.parameters()) + state_bytes(optimizer)
            + tensor_bytes(getattr(pruner, "pruned", {}).values())
            + tensor_bytes(getattr(pruner, "accumulated", {}).values())
            + tensor_bytes(getattr(pruner, "kept", {}).values()))
    with TensorMemory() as mem:
        step(cfg, model, optimizer, pruner, n=1, start=2)
    predicted = memory.estimate(cfg, "cpu").peak
    assert predicted == pytest.approx(held + mem.peak, rel=PEAK_TOLERANCE.get(case, 0.05)), \
        (predicted, held + mem.peak)


def test_chunked_loss_never_holds_the_whole_logits():
    whole = memory.estimate(cfg_of(batch_size=8), "cpu")
    chunked = memory.estimate(cfg_of(batch_size=8, loss_chunk_tokens=64), "cpu")
    assert chunked.term("logits") * 4 < whole.term("logits")
    fused = memory.estimate(cfg_of(batch_size=8, loss_chunk_tokens=64, loss_fused=True), "cpu")
    assert fused.term("logits") < chunked.term("logits")


# ---- auto batch, verdicts and the refuse path -----------------------------------------

def test_largest_fitting_batch_keeps_the_sequences_per_step():
    cfg = cfg_of(batch_size=12, gradient_accumulation=2)
    peaks = {b: memory.estimate(cfg, "cpu", b).peak for b in (24, 12, 8, 6, 4, 3, 2, 1)}
    limit = int((peaks[6] + peaks[8]) / 2 / memory.HEADROOM)  # 6 fits, 8 does not
    assert memory.largest_fitting_batch(cfg, "cpu", limit) == (6, 4)
    assert memory.largest_fitting_batch(cfg, "cpu", int(peaks[1] * 0.5)) is None
    assert memory.largest_fitting_batch(cfg, "cpu", None) == (24, 1)


def test_verdicts():
    assert memory.verdict(50, 100).startswith("fits")
    assert memory.verdict(95, 100).startswith("tight")
    assert memory.verdict(101, 100).startswith("does not fit")


def test_a_config_that_does_not_fit_is_refused_with_a_suggestion():
    cfg = cfg_of(batch_size=16)
    tight = dataclasses.replace(cfg, memory_budget_mb=_budget_between(cfg, 2, 16))
    with pytest.raises(memory.MemoryPlanError) as e:
        memory.check(tight, "cpu")
    text = str(e.value)
    assert "CONFIG_BATCH_SIZE" in text and "exceeds the budget" in text
    assert "logits and loss" in text and "CONFIG_AUTO_BATCH=y" in text
    assert "CONFIG_GRADIENT_ACCUMULATION=" in text
    # Turning the check off lets it through unchanged.
    off = dataclasses.replace(tight, memory_check=False)
    assert memory.check(off, "cpu")[0] == off


TRAIN_PY_RSS = 300 * memory.MiB  # about what a fresh train.py holds before training


def _budget_between(cfg, fits_batch: int, not_batch: int, rss: int | None = None) -> int:
    """A budget in MiB where micro-batch fits_batch fits and not_batch does not, for
    a process of resident size ``rss`` (default: this one)."""
    rss = memory.process_rss() if rss is None else rss
    lo = memory.estimate(cfg, "cpu", fits_batch, rss).peak
    hi = memory.estimate(cfg, "cpu", not_batch, rss).peak
    return int((lo + hi) / 2 / memory.HEADROOM / memory.MiB)


# GPT-2's 50k-token head, so the logits dominate: batches far apart. In a process of
# its own: the prediction counts train.py's resident size (TRAIN_PY_RSS).
BIG_HEAD = ["--block-size=128", "--batch-size=16", BPE]


@pytest.mark.e2e
def test_train_refuses_a_run_predicted_not_to_fit(data_dir, tmp_path):
    cfg = resolve({**SMALL, "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 128,
                   "batch_size": 16})
    budget = _budget_between(cfg, 2, 16, TRAIN_PY_RSS)
    proc = train_tiny(data_dir, tmp_path, *BIG_HEAD, f"--memory-budget-mb={budget}",
                      check=False, process=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "CONFIG_BATCH_SIZE" in proc.stderr and "exceeds the budget" in proc.stderr
    assert "CONFIG_AUTO_BATCH=y" in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing was created


@pytest.mark.e2e
def test_auto_batch_trains_with_the_largest_fitting_micro_batch(data_dir, tmp_path):
    cfg = resolve({**SMALL, "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 128,
                   "batch_size": 16})
    # Between 2 and 16 with room to spare for train.py's own resident size; the
    # exact pick is read from its output.
    budget = _budget_between(cfg, 2, 16, TRAIN_PY_RSS)
    args = [*BIG_HEAD, f"--memory-budget-mb={budget}", "--max-iters=2", "--warmup-iters=1",
            "--eval-interval=2", "--eval-tokens=128", "--sample-tokens=0"]
    auto = train_tiny(data_dir, tmp_path / "auto", *args, "--auto-batch", process=True)
    picked = re.search(r"auto batch: micro-batch (\d+) x (\d+) accumulation", auto.stdout)
    micro, accum = int(picked[1]), int(picked[2])
    assert 2 <= micro < 16 and micro * accum == 16
    summary = json.loads((only_run_dir(tmp_path / "auto") / "summary.json").read_text())
    assert (summary["micro_batch"], summary["gradient_accumulation"]) == (micro, accum)
    assert summary["tokens"] == 2 * 16 * 128  # the tokens per step asked for
    # The same sequences per step as training micro x accum by hand: the same losses.
    manual = train_tiny(data_dir, tmp_path / "manual", *args, f"--batch-size={micro}",
                        f"--gradient-accumulation={accum}", process=True)
    assert manual.returncode == 0
    by_hand = json.loads((only_run_dir(tmp_path / "manual") / "summary.json").read_text())
    assert summary["final_val_loss"] == pytest.approx(by_hand["final_val_loss"], rel=1e-6)


@pytest.mark.e2e
def test_memcheck_reports_the_breakdown_and_exit_status(tmp_path):
    from helpers import call_main

    args = [a for a in TINY if not a.startswith("--batch-size")]
    ok = call_main("scripts/memcheck.py", *args, "--batch-size=4", f"--json={tmp_path}/m.json")
    assert ok.returncode == 0, ok.stderr
    for label in ("weights", "gradients", "optimizer state (adamw)", "activations",
                  "logits and loss", "predicted peak", "budget", "verdict: fits"):
        assert label in ok.stdout, label
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["peak_bytes"] == sum(data["terms"].values())
    no = call_main("scripts/memcheck.py", *args, "--batch-size=4", "--memory-budget-mb=100")
    assert no.returncode == 4 and "does not fit" in no.stdout  # docs/reliability.md


def test_expandable_segments_is_the_default_and_a_user_setting_wins():
    from gpt2.runtime.device import configure_allocator

    env: dict[str, str] = {}
    assert configure_allocator(env) and env == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        user = {name: "max_split_size_mb:128"}
        assert not configure_allocator(user) and user == {name: "max_split_size_mb:128"}


def test_docs_memory_tables_are_the_estimator_s():
    """docs/memory.md is generated: a change to the estimator must regenerate it
    (python scripts/memory_tables.py)."""
    from helpers import load_script

    tables = load_script("memory_tables")
    assert tables.is_current(validate=False), "run: python scripts/memory_tables.py"


@pytest.mark.e2e
def test_make_memcheck_uses_the_config(tmp_path):
    from helpers import run_make

    config = tmp_path / ".config"
    assert run_make("defconfig-gpt2-shakespeare-cpu",
                    env={"KCONFIG_CONFIG": str(config)}).returncode == 0
    proc = run_make("memcheck", env={"KCONFIG_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stderr
    assert "4 layers x 128 wide, context 128" in proc.stdout
    assert "micro-batch 16 x 1 accumulation" in proc.stdout and "verdict: fits" in proc.stdout


# The card each GPU preset is written for, in GiB torch can use (about 92 % of the
# marketed size: the CUDA context and driver take the rest). A preset that stops
# fitting after a change (a new term, a bigger default) fails here, not on the card.
PRESET_CARDS = {"gpt2-shakespeare-l4": 22.0, "gpt2-shakespeare-w7900": 44.0,
                "gpt2-shakespeare-h100": 73.0, "gpt2-fineweb10b-track3-muon": 73.0,
                "gpt2-shakespeare-simple": 22.0, "gpt2-shakespeare-conservative": 14.5}


@pytest.mark.parametrize("name", list(PRESET_CARDS))
def test_gpu_presets_are_predicted_to_fit_their_card(name):
    from helpers import REPO
    from gpt2.config import kconfig

    cfg, _ = kconfig.to_config(kconfig.load(REPO / "defconfigs" / name))
    est = memory.estimate(cfg, "cuda")
    assert memory.fits(est, int(PRESET_CARDS[name] * 2**30)), memory.breakdown(est)


def _gpu_matrix_presets() -> list[str]:
    from helpers import REPO
    out = []
    for path in sorted((REPO / "defconfigs").iterdir()):
        lines = path.read_text().splitlines()
        if "CONFIG_MATRIX=y" in lines and "CONFIG_DEVICE_CPU=y" not in lines:
            out.append(path.name)
    return out


# A GPU matrix preset written for a larger card than 24 GB: the GiB that card leaves
MATRIX_CARDS = {"gpt2-fineweb10b-track3": 73.0}


@pytest.mark.parametrize("name", _gpu_matrix_presets())
def test_every_cell_of_a_gpu_matrix_preset_fits_a_24_gb_card(name):
    """The GPU matrix presets promise one 24 GB+ GPU per running cell (track 3's: one
    80 GB card): every cell (each optimizer's state, SOAP's and PSGD-Kron's factors
    included) is predicted to fit in the 22 GiB such a card leaves."""
    from helpers import REPO
    from gpt2.config import kconfig
    from gpt2.matrix.plan import plan_from_dotconfig

    plan = plan_from_dotconfig(kconfig.load(REPO / "defconfigs" / name), [])
    assert plan.cells
    for optimizer in sorted({c.cfg.optimizer for c in plan.cells}):
        cell = next(c for c in plan.cells if c.cfg.optimizer == optimizer)
        est = memory.estimate(cell.cfg, "cuda")
        assert memory.fits(est, int(MATRIX_CARDS.get(name, 22.0) * 2**30)), \
            (cell.id, memory.breakdown(est))


def test_track3_fits_an_80_gb_card_on_one_gpu_and_on_eight():
    """Track 3's 524,288 tokens a step: 8 micro-batches of 64 x 1,024 on one GPU, or
    one on each of eight (make NGPU=8, DDP and its buckets): every cell fits an 80 GB
    card either way, and a process of eight holds no gradient at its peak."""
    from helpers import REPO
    from gpt2.config import kconfig
    from gpt2.matrix.plan import plan_from_dotconfig

    plan = plan_from_dotconfig(kconfig.load(REPO / "defconfigs" / "gpt2-fineweb10b-track3"), [])
    for cell in plan.cells:
        assert cell.cfg.tokens_per_step() == 524_288
        one = memory.estimate(cell.cfg, "cuda")
        eight = memory.estimate(dataclasses.replace(cell.cfg, nproc_per_node=8), "cuda")
        for est in (one, eight):
            assert memory.fits(est, int(73.0 * 2**30)), (cell.id, memory.breakdown(est))
        assert eight.term("gradients") == 0 and eight.term("buckets") == one.term("weights")


def test_fsdp_divides_the_training_state_among_the_processes():
    """Weights, gradients and optimizer state per process shrink with the shard count;
    two whole blocks are gathered at a time."""
    big = {"model_size": "gpt2-large", "batch_size": 1, "block_size": 1024,
           "gradient_accumulation": 8}
    ddp = memory.estimate(resolve({**big, "nproc_per_node": 8}), "cuda")
    fsdp = memory.estimate(resolve({**big, "nproc_per_node": 8, "parallel": "fsdp"}), "cuda")
    d, f = ({t.key: t.bytes for t in e.terms} for e in (ddp, fsdp))
    s = memory.shapes(resolve(big))
    assert f["optimizer"] == -(-d["optimizer"] // 8)
    assert f["weights"] == -(-d["weights"] // 8) + 8 * (s.attn_weights + s.mlp_weights)
    assert fsdp.peak < ddp.peak - 0.8 * (d["weights"] + d["optimizer"])


@pytest.mark.parametrize("accumulation,precision", [(2, {}), (4, {}), (2, BF16_TABLE)],
                         ids=["2", "4", "2-bf16-table"])
def test_ddp_keeps_its_gradient_buckets_and_each_process_runs_its_share(tmp_path,
                                                                         accumulation,
                                                                         precision):
    """NGPU=2 with DDP: the step of one of the two processes (its share of the
    micro-batches, the model wrapped as the trainer wraps it; gloo, alone in its
    group) against the prediction. DDP's buckets are a second float32 copy of the
    gradients from the wrap on (rebuilt once, in the order gradients arrived, during
    the first steps: the third is measured); with 2 micro-batches a process runs 1,
    so no gradient exists yet at the backward through the head; with 4 it runs 2. A
    bfloat16 table's bucket is bfloat16, as its gradient."""
    import torch.distributed as torch_dist

    cfg = cfg_of(n_embd=128, block_size=32, nproc_per_node=2,
                 gradient_accumulation=accumulation, **precision)
    model, optimizer, pruner = build(cfg)
    torch_dist.init_process_group("gloo", store=torch_dist.FileStore(str(tmp_path / "s"), 1),
                                  rank=0, world_size=1)
    try:
        with TensorMemory() as wrap:
            ddp = torch.nn.parallel.DistributedDataParallel(model)
        buckets = wrap.current
        share = accumulation // 2
        step(cfg, model, optimizer, pruner, n=2, fwd=ddp, micro_steps=share)
        with TensorMemory() as mem:
            step(cfg, model, optimizer, pruner, n=1, start=3, fwd=ddp, micro_steps=share)
    finally:
        torch_dist.destroy_process_group()
    est = memory.estimate(cfg, "cpu")
    assert est.term("buckets") == buckets == tensor_bytes(model.parameters())
    measured = tensor_bytes(model.parameters()) + state_bytes(optimizer) + buckets + mem.peak
    assert est.peak == pytest.approx(measured, rel=0.02), (est.peak, measured)


def test_the_validation_set_keeps_window_offsets_only():
    """ValBatches once kept every validation window in RAM as int64 arrays
    (--eval-batches 150000 was left out of the prediction: predicted 1.60 GiB, 1.56 GiB
    resident before step 1). It now keeps the windows' offsets, 8 B each, and reads a
    batch when it is evaluated; the whole-process prediction counts the offsets."""
    import tracemalloc

    import numpy as np

    from gpt2.data.loader import ValBatches
    from gpt2.data.shards import TokenSequence

    cfg = cfg_of(eval_tokens=3000 * 64)
    tokens = TokenSequence([np.arange(200_000, dtype=np.uint16) % 50_000])
    tracemalloc.start()
    try:
        kept = ValBatches(tokens, cfg.block_size, eval_tokens=cfg.eval_tokens,
                          batch_size=cfg.batch_size)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert kept.windows == 3000 and len(kept) == 750
    term = memory.estimate(cfg, "cpu", runtime_bytes=1).term("validation")
    assert 0.9 * held <= term <= 1.1 * held, (term, held)
    # A thousand times the windows: a thousand times 8 B, not gigabytes.
    more = memory.estimate(cfg_of(eval_tokens=3_000_000 * 64), "cpu", runtime_bytes=1)
    assert more.term("validation") < 8 * 3_000_000 + 1000


@pytest.mark.e2e
def test_a_compiled_run_s_prediction_says_it_is_an_upper_bound():
    """The estimate models eager PyTorch; under torch.compile (CONFIG_COMPILE_ON, or
    auto on CUDA) every place that prints it says it is an upper bound."""
    assert memory.bound_note(cfg_of(compile="on"), "cpu") == memory.COMPILED_BOUND
    assert memory.bound_note(cfg_of(compile="auto"), "cuda") == memory.COMPILED_BOUND
    assert memory.bound_note(cfg_of(compile="auto"), "cpu") == ""
    assert memory.bound_note(cfg_of(compile="off"), "cuda") == ""
    from helpers import call_main

    proc = call_main("scripts/memcheck.py", "--model-size=custom", "--n-layer=1", "--n-head=2",
                     "--n-embd=32", "--block-size=16", "--device=cpu", "--dtype=float32",
                     "--compile=on")
    assert memory.COMPILED_BOUND.strip() in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="answers for a GPU this machine lacks")
def test_memcheck_answers_for_a_gpu_preset_on_a_machine_without_the_gpu(tmp_path):
    """`make defconfig-gpt2-shakespeare-l4 && make memcheck` on a laptop or a login node
    predicts for the preset's card (CONFIG_TARGET_CARD), against its memory, saying it
    was not measured there; CARD= names another card or a size; a CUDA configuration
    that names no card is refused with what to type, and a bad CARD is refused."""
    from helpers import call_main

    config = tmp_path / ".config"
    env = {"KCONFIG_CONFIG": str(config)}
    assert call_main("bridge", "defconfig", "gpt2-shakespeare-l4", env=env).returncode == 0
    proc = call_main("bridge", "memcheck", env=env)
    assert proc.returncode == 0, proc.stderr
    budget = next(line for line in proc.stdout.splitlines() if line.strip().startswith("budget"))
    assert "22.35 GiB" in budget and "NVIDIA L4 (24 GB)" in budget  # 24e9 B
    assert "not measured on that card" in budget and "| cuda bfloat16 |" in proc.stdout
    # The same run on a 16 GB card does not fit (16.8 GiB predicted): the exit status says so.
    proc = call_main("bridge", "memcheck", env={**env, "CARD": "16GB"})
    assert proc.returncode == 4 and "does not fit" in proc.stdout and "a 16 GB GPU" in proc.stdout
    proc = call_main("bridge", "memcheck", env={**env, "CARD": "h100"})
    assert proc.returncode == 0 and "NVIDIA H100 80GB (80 GB), from CARD" in proc.stdout
    proc = call_main("bridge", "memcheck", env={**env, "CARD": "24TB"})
    assert proc.returncode == 2 and "neither a card kgpt knows" in proc.stderr
    assert call_main("bridge", "setconfig", env={**env, "SET": 'TARGET_CARD=""'}).returncode == 0
    proc = call_main("bridge", "memcheck", env=env)
    assert proc.returncode == 2 and "make memcheck CARD=l4" in proc.stderr
    proc = call_main("bridge", "setconfig", env={**env, "SET": 'TARGET_CARD="k80"'})
    assert proc.returncode != 0 and "not a card kgpt knows" in proc.stdout + proc.stderr


def test_a_card_is_a_known_name_or_a_memory_size():
    """CARD= as memcheck reads it: a name from the table, or GB (10^9 B) / GiB."""
    from gpt2.errors import ConfigError
    from scripts.memcheck import card_budget

    assert card_budget("L4", "x").bytes == 24 * 10**9
    assert card_budget("80GiB", "x").bytes == 80 * 2**30
    assert card_budget("24.5 GB", "x").bytes == 24_500_000_000
    for bad in ("h1000", "24TB", "-5GB", "0GB", "1e3GB", ""):
        with pytest.raises(ConfigError, match="CONFIG_TARGET_CARD|card"):
            card_budget(bad, "x")
