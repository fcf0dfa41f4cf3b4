"""The typed configuration's rules (gpt2/config/options.py): every cross-field rule
refuses exactly what it is for, with the message a user reads, and lets its boundary
through; flags, argv, .config rendering and the run hash agree with one another."""

from __future__ import annotations

import argparse

import pytest

from helpers import METHODS
from gpt2.config.options import (MAX_STRING_BYTES, TRAIN, Config, ConfigError, add_arguments,
                                 check_value, config_from_namespace, from_record, opt,
                                 parse_float, parse_train_flags, resolve, to_argv, to_dotconfig)
from gpt2.eval import hellaswag
from gpt2.model.build import model_config

NAME_RULE = ("is not a valid run name: use 1-128 letters, digits, '.', '_' or '-', starting "
             "with a letter or digit (it becomes a folder under the results dir)")
SPAM = {"optimizer": "adamwspam"}
SPAM_DELAY_WHY = ("(at step 1 the second moment holds no gradient yet, so no spike can be "
                  "measured: the reference clips every gradient to 0 there, and the optimizer "
                  "never moves)")

# (what is wrong, the values given, the whole message; then a neighbour that is fine)
RULES = [
    ("a value too long for one argument", {"data_dir": "x" * (MAX_STRING_BYTES + 1)},
     "CONFIG_DATA_DIR (--data-dir): the value is 32,769 bytes long, more than the 32,768 a "
     "setting may hold (it is passed to train.py as one command-line argument): shorten it",
     {"data_dir": "x" * MAX_STRING_BYTES}),
    ("counted in bytes, not characters", {"data_dir": "é" * (MAX_STRING_BYTES // 2 + 1)},
     "CONFIG_DATA_DIR (--data-dir): the value is 32,770 bytes long, more than the 32,768 a "
     "setting may hold (it is passed to train.py as one command-line argument): shorten it",
     {"data_dir": "é" * (MAX_STRING_BYTES // 2)}),
    ("upper bound, exclusive", {"dropout": 1.0},
     "CONFIG_DROPOUT (--dropout): 1.0 is out of range: must be < 1", {"dropout": 0.999}),
    ("lower bound, inclusive", {"dropout": -0.1},
     "CONFIG_DROPOUT (--dropout): -0.1 is out of range: must be >= 0", {"dropout": 0.0}),
    ("lower bound, exclusive", {"learning_rate": 0.0},
     "CONFIG_LEARNING_RATE (--learning-rate): 0.0 is out of range: must be > 0",
     {"learning_rate": 1e-9, "min_lr": 0.0}),
    ("upper bound, inclusive", {"learning_rate": 10.5},
     "CONFIG_LEARNING_RATE (--learning-rate): 10.5 is out of range: must be <= 10",
     {"learning_rate": 10.0}),
    ("not finite", {"learning_rate": float("nan")},
     "CONFIG_LEARNING_RATE (--learning-rate): nan is not a finite number", {}),
    ("not a choice", {"optimizer": "nope"},
     "CONFIG_OPTIMIZER (--optimizer): 'nope' is not one of "
     + ", ".join(METHODS["optimizers"]),
     {"optimizer": "muon"}),
    ("a run name that is a path", {"run_name": "a/b"},
     f"CONFIG_RUN_NAME (--run-name): 'a/b' {NAME_RULE}", {"run_name": "a.b_c-1"}),
    ("a control character", {"data_dir": "a\x01b"},
     "CONFIG_DATA_DIR (--data-dir): 'a\\x01b' holds the control character '\\x01': a .config "
     "line cannot hold it; give the value on one line", {"data_dir": "a\tb"}),
    ("an empty results folder", {"results_dir": " "},
     "CONFIG_RESULTS_DIR (--results-dir): must not be empty", {"results_dir": "r"}),
    ("an empty data folder", {"data_dir": " "},
     "CONFIG_DATA_DIR (--data-dir): must not be empty", {"data_dir": "d"}),
    ("an empty text field", {"data_text_field": " "},
     "CONFIG_DATA_TEXT_FIELD (--data-text-field): must not be empty", {"data_text_field": "t"}),
    ("weights of another size", {"init_from": "gpt2-medium"},
     "CONFIG_INIT_FROM (--init-from): gpt2-medium weights need model size gpt2-medium, not "
     "gpt2: select CONFIG_MODEL_SIZE_GPT2_MEDIUM=y",
     {"init_from": "gpt2-medium", "model_size": "gpt2-medium"}),
    ("heads that do not divide the width", {"model_size": "custom", "n_head": 5, "n_embd": 128},
     "CONFIG_N_HEAD (--n-head): n_embd=128 is not divisible by n_head=5",
     {"model_size": "custom", "n_head": 4, "n_embd": 128}),
    ("a dimension against the size preset", {"model_size": "gpt2", "n_layer": 3},
     "CONFIG_N_LAYER (--n-layer): 3 conflicts with model size 'gpt2' (n_layer=12); use "
     "--model-size custom (CONFIG_MODEL_SIZE_CUSTOM=y) to set dimensions",
     {"model_size": "gpt2", "n_layer": 12}),
    ("no length at all", {"max_iters": 0, "epochs": 0},
     "CONFIG_MAX_ITERS (--max-iters): both max_iters and epochs are 0: set at least one",
     {"max_iters": 0, "epochs": 1}),
    ("FSDP with a whole-matrix optimizer", {"parallel": "fsdp", "optimizer": "muon"},
     "CONFIG_PARALLEL (--parallel): FSDP shards each weight, and muon needs whole matrices: "
     "use CONFIG_PARALLEL_DDP or another optimizer", {"parallel": "fsdp", "optimizer": "adamw"}),
    ("FSDP with pruning", {"parallel": "fsdp", "pruning_method": "magnitude"},
     "CONFIG_PARALLEL (--parallel): pruning ranks whole tensors, which FSDP shards: use "
     "CONFIG_PARALLEL_DDP with pruning", {"parallel": "ddp", "pruning_method": "magnitude"}),
    ("FSDP in float16", {"parallel": "fsdp", "dtype": "float16"},
     "CONFIG_PARALLEL (--parallel): FSDP here runs bfloat16 or float32 (float16 needs a "
     "sharded loss scaler): use CONFIG_DTYPE_BFLOAT16", {"parallel": "fsdp", "dtype": "bfloat16"}),
    ("micro-batches that do not divide among processes",
     {"gradient_accumulation": 3, "nproc_per_node": 2},
     "CONFIG_GRADIENT_ACCUMULATION (--gradient-accumulation): 3 micro-batches per step do not "
     "divide among 2 processes (CONFIG_NPROC_PER_NODE): use a multiple of it (each process "
     "runs an equal share, so tokens per step stay batch_size x gradient_accumulation x "
     "block_size)", {"gradient_accumulation": 4, "nproc_per_node": 2}),
    ("the fused loss without chunks", {"loss_fused": True},
     "CONFIG_LOSS_FUSED (--loss-fused): the fused loss works chunk by chunk: set "
     "CONFIG_LOSS_CHUNK_TOKENS (e.g. 8192) or turn CONFIG_LOSS_FUSED off",
     {"loss_fused": True, "loss_chunk_tokens": 512}),
    ("a floor above the peak", {"min_lr": 1e-3, "learning_rate": 1e-4},
     "CONFIG_MIN_LR (--min-lr): 0.001 is above learning_rate 0.0001",
     {"min_lr": 1e-4, "learning_rate": 1e-4}),
    ("a pair that cannot work", {"optimizer": "adamwprune", "pruning_method": "magnitude"},
     "CONFIG_PRUNING_METHOD (--pruning-method): optimizer 'adamwprune' works only with pruning "
     "method 'none' or 'state'; with optimizer 'adamwprune' choose one of: none, state",
     {"optimizer": "adamwprune", "pruning_method": "state"}),
    ("Nesterov without momentum", {"optimizer": "sgd", "sgd_nesterov": True, "sgd_momentum": 0.0},
     "CONFIG_SGD_NESTEROV (--sgd-nesterov): Nesterov momentum needs sgd_momentum > 0; set a "
     "momentum or turn Nesterov off", {"optimizer": "sgd", "sgd_nesterov": True,
                                       "sgd_momentum": 0.5}),
    ("a knob of the Adam family under SGD", {"optimizer": "sgd", "beta1": 0.8},
     "CONFIG_BETA1 (--beta1): has no effect with optimizer 'sgd'; it applies to optimizer adam, "
     "adamw, adamwadv, adamwspam, adamwprune, muon, adopt, ademamix, mars, schedulefree. Remove "
     "it, or choose one of those",
     {"optimizer": "adam", "beta1": 0.8}),
    ("a knob of another optimizer", {"optimizer": "adamw", "sgd_nesterov": True},
     "CONFIG_SGD_NESTEROV (--sgd-nesterov): has no effect with optimizer 'adamw'; it applies "
     "to optimizer sgd. Remove it, or choose one of those", {"optimizer": "sgd"}),
    ("SPAM re-warmup longer than its interval",
     {**SPAM, "spam_warmup": 11, "spam_clip_delay": 2, "spam_reset_interval": 10},
     "CONFIG_SPAM_WARMUP (--spam-warmup): 11 re-warmup steps exceed the reset interval "
     "spam_reset_interval=10", {**SPAM, "spam_warmup": 10, "spam_clip_delay": 2,
                                "spam_reset_interval": 10}),
    ("SPAM clipping from step 1", {**SPAM, "spam_clip_delay": 1},
     "CONFIG_SPAM_CLIP_DELAY (--spam-clip-delay): 1 is out of range: must be >= 2 "
     + SPAM_DELAY_WHY, {**SPAM, "spam_clip_delay": 2}),
    ("SPAM clipping from step 1 and at every reset", {**SPAM, "spam_clip_delay": 0},
     "CONFIG_SPAM_CLIP_DELAY (--spam-clip-delay): 0 is out of range: must be >= 2 "
     + SPAM_DELAY_WHY, {**SPAM, "spam_clip_delay": 2}),
    ("SPAM clip delay as long as its interval",
     {**SPAM, "spam_warmup": 5, "spam_clip_delay": 10, "spam_reset_interval": 10},
     "CONFIG_SPAM_CLIP_DELAY (--spam-clip-delay): 10 steps without clipping after each reset "
     "leave none with it: keep it below spam_reset_interval=10",
     {**SPAM, "spam_warmup": 5, "spam_clip_delay": 9, "spam_reset_interval": 10}),
    ("SPAM without resets has no interval to exceed",
     {**SPAM, "spam_warmup": 500, "spam_clip_delay": 900, "spam_reset_interval": 0, "epochs": -1},
     "CONFIG_EPOCHS (--epochs): -1 is out of range: must be >= 0",
     {**SPAM, "spam_warmup": 500, "spam_clip_delay": 900, "spam_reset_interval": 0}),
    ("pruning that cannot finish", {"pruning_method": "magnitude", "max_iters": 100,
                                    "pruning_warmup": 90, "warmup_iters": 10},
     "CONFIG_PRUNING_WARMUP (--pruning-warmup): pruning would start after step 90 but must "
     "reach its target by step 75 (pruning_end=0.75 of 100 steps); lower pruning_warmup or "
     "raise pruning_end", {"pruning_method": "magnitude", "max_iters": 100,
                           "pruning_warmup": 70, "warmup_iters": 10}),
    ("a schedule shorter than its warmup", {"schedule_iters": 50, "warmup_iters": 60},
     "CONFIG_SCHEDULE_ITERS (--schedule-iters): 50 steps cannot hold the 60 warmup steps "
     "(warmup_iters)", {"schedule_iters": 60, "warmup_iters": 60}),
    ("extend and init together", {"extend_from": "a", "init_from": "gpt2"},
     "CONFIG_EXTEND_FROM (--extend-from): continues a run with its whole state, init_from "
     "starts a new run from weights: set one of them", {"extend_from": "a"}),
    ("a warmup longer than the run", {"max_iters": 50, "warmup_iters": 60},
     "CONFIG_WARMUP_ITERS (--warmup-iters): 60 warmup steps exceed max_iters=50",
     {"max_iters": 60, "warmup_iters": 60}),
]


@pytest.mark.parametrize("given,message,fine", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_each_rule_refuses_exactly_its_case(given, message, fine):
    with pytest.raises(ConfigError) as err:
        resolve(given)
    assert str(err.value) == message
    resolve(fine)  # the boundary, or the repair the message asks for, is accepted


def test_a_float_is_parsed_strictly():
    assert parse_float("dropout", "0.25") == 0.25
    for text, why in (("fast", "'fast' is not a number (write e.g. 6e-4 or 0.1)"),
                      ("inf", "'inf' is not a finite number"), (None, "None is not a number "
                                                                       "(write e.g. 6e-4 or 0.1)")):
        with pytest.raises(ConfigError) as err:
            parse_float("dropout", text)
        assert err.value.message == why and err.value.name == "dropout"
    check_value("dropout", True)  # a bool is not range-checked as a number
    with pytest.raises(ConfigError, match="inf is not a finite number"):
        check_value("learning_rate", float("inf"))


def _parser(used_by: str = TRAIN) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser, used_by)
    return parser


def test_flags_parse_to_typed_values_and_only_given_ones_are_set():
    parser = _parser()
    ns = parser.parse_args(["--learning-rate=1e-3", "--max-iters", "700", "--no-bias",
                            "--optimizer=muon", "--run-name=x"])
    assert vars(ns) == {"learning_rate": 1e-3, "max_iters": 700, "bias": False,
                        "optimizer": "muon", "run_name": "x"}
    cfg = config_from_namespace(ns, TRAIN)
    assert (cfg.learning_rate, cfg.max_iters, cfg.bias, cfg.optimizer) == (1e-3, 700, False, "muon")
    with pytest.raises(argparse.ArgumentError, match="'fast' is not a number"):
        parser.parse_args(["--learning-rate=fast"])
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'nope'"):
        parser.parse_args(["--optimizer=nope"])
    text = " ".join(parser.format_help().split())  # argparse wraps lines
    assert "training: " in text and "model: " in text  # one heading per group
    assert "--learning-rate FLOAT" in text
    assert "peak learning rate [CONFIG_LEARNING_RATE; default 0.0006]" in text
    assert "[CONFIG_OPTIMIZER_*; default 'adamw']" in text
    assert "--bias, --no-bias" in text


def test_train_args_are_read_as_train_py_reads_them():
    given, unknown = parse_train_flags(["--max-iters=9", "--bias", "--lerning-rate=1",
                                        "--frobnicate"])
    assert given == {"max_iters": 9, "bias": True}
    assert "--lerning-rate" in unknown and "--learning-rate" in unknown
    assert "--frobnicate" in unknown
    assert parse_train_flags(["--seed=3"]) == ({"seed": 3}, "")
    # what TRAIN_ARGS may set is train.py's flags only: not -h, not data preparation's
    given, unknown = parse_train_flags(["-h", "--shard-tokens=4096", "--input=x"])
    assert given == {} and "-h" in unknown and "--shard-tokens" in unknown
    with pytest.raises(argparse.ArgumentError):
        parse_train_flags(["--max-iters", "x"])


def test_argv_and_dotconfig_reproduce_the_configuration():
    cfg = resolve({"optimizer": "sgd", "sgd_momentum": 0.5, "bias": False, "learning_rate": 1e-3,
                   "min_lr": 1e-4, "run_name": "r", "data_dir": 'a"b\\c'})
    argv = to_argv(cfg, TRAIN)
    assert {"--optimizer=sgd", "--sgd-momentum=0.5", "--no-bias", "--learning-rate=0.001",
            "--min-lr=0.0001", "--run-name=r", '--data-dir=a"b\\c'} <= set(argv)
    assert not any(a.startswith("--spam") for a in argv)  # not in force under sgd
    assert config_from_namespace(_parser().parse_args(argv), TRAIN) == cfg
    assert sorted(to_argv(cfg, TRAIN, ["max_iters", "bias", "spam_threshold"])) == [
        f"--max-iters={cfg.max_iters}", "--no-bias"]
    text = to_dotconfig(cfg).splitlines()
    assert text[0] == "# kgpt configuration rendered from its settings"
    for line in ("CONFIG_OPTIMIZER_SGD=y", "# CONFIG_BIAS is not set", 'CONFIG_SGD_MOMENTUM="0.5"',
                 'CONFIG_LEARNING_RATE="0.001"', 'CONFIG_DATA_DIR="a\\"b\\\\c"',
                 f"CONFIG_MAX_ITERS={cfg.max_iters}", "CONFIG_MODEL_SIZE_GPT2=y"):
        assert line in text, line
    assert not any(ln.startswith(("CONFIG_N_LAYER", "CONFIG_N_HEAD", "CONFIG_N_EMBD",
                                  "CONFIG_SPAM")) for ln in text)
    assert to_dotconfig(cfg).endswith("\nCONFIG_TRACKER_NONE=y\n")  # the last setting, one line
    custom = to_dotconfig(resolve({"model_size": "custom", "n_layer": 3}))
    assert "CONFIG_N_LAYER=3" in custom.splitlines() and "CONFIG_TIE_WEIGHTS=y" in custom


def test_the_hash_covers_what_changes_results_and_nothing_else():
    base = Config()
    assert base.config_hash() == Config().config_hash() and len(base.config_hash()) == 10
    for changed in ({"learning_rate": 1e-3}, {"seed": 2}, {"optimizer": "sgd"},
                    {"model_size": "gpt2-medium"}, {"loss_fused": True, "loss_chunk_tokens": 64}):
        assert Config(**changed).config_hash() != base.config_hash(), changed
    for same in ({"log_interval": 3}, {"results_dir": "x"}, {"run_name": "other"},
                 {"spam_threshold": 3.0}):  # not hashed, or not in force
        assert Config(**same).config_hash() == base.config_hash(), same
    assert not opt("log_interval").hashed and opt("learning_rate").hashed
    # a preset's dimensions are hashed as the preset's, whatever the custom fields hold
    assert Config(n_layer=3).config_hash() == base.config_hash()
    assert Config(model_size="custom").config_hash() != base.config_hash()
    custom = Config(model_size="custom", n_layer=2, n_head=2, n_embd=32)
    for dims in ({"n_layer": 3}, {"n_head": 4}, {"n_embd": 64}):
        assert Config(**{**custom.to_dict(), **dims}).config_hash() != custom.config_hash()
    # a setting hashed only away from its default leaves older runs' hashes alone
    assert opt("loss_fused").omit_default
    assert Config(loss_fused=False).config_hash() == base.config_hash()


def test_the_hash_of_the_default_configuration_is_stable():
    """Every result is filed under its hash: a change to how it is computed (key order,
    what is hashed) would orphan every run made before it. When a change to the
    hash is meant (a new setting that changes results at its default), update this
    value in the same commit and say so. (Changed when eval_batches became eval_tokens:
    the validation set of the default configuration is other tokens.)"""
    assert Config().config_hash() == "7e64178f4b"


def test_a_recorded_configuration_reads_back_with_new_fields_at_their_defaults():
    cfg = resolve({"optimizer": "sgd", "max_iters": 330})
    record = {**cfg.to_dict(), "a_field_removed_since": 1}
    del record["dropout"]
    back = from_record(record)
    assert (back.optimizer, back.max_iters, back.dropout) == ("sgd", 330, Config.dropout)
    with pytest.raises(ConfigError, match="must not be empty"):
        from_record({**cfg.to_dict(), "data_dir": ""})


def test_derived_values():
    cfg = resolve({"batch_size": 4, "gradient_accumulation": 3, "block_size": 64,
                   "schedule_iters": 0, "data_dir": "d"})
    assert cfg.tokens_per_step() == 4 * 3 * 64
    assert (cfg.schedule_steps(500), resolve({"schedule_iters": 200}).schedule_steps(500)) == (
        500, 200)
    assert str(hellaswag.file_of(cfg)) == "d/hellaswag/hellaswag_val.jsonl"
    assert str(hellaswag.file_of(resolve({"hellaswag_path": "h.jsonl"}))) == "h.jsonl"
    g = model_config(resolve({"model_size": "custom", "n_layer": 2, "n_head": 2, "n_embd": 32, "bias": False,
                 "block_size": 64, "dropout": 0.1, "tie_weights": False,
                 "activation_checkpointing": "full", "loss_chunk_tokens": 64, "loss_fused": True,
                 "attention_backend": "math"}))
    assert (g.n_layer, g.n_head, g.n_embd, g.block_size, g.dropout, g.bias, g.tie_weights,
            g.vocab_size, g.checkpointing, g.loss_chunk_tokens, g.loss_fused,
            g.attention_backend) == (2, 2, 32, 64, 0.1, False, False, 50304, "full", 64, True,
                                     "math")


def test_the_token_table_size_follows_where_the_weights_come_from(tmp_path):
    """kgpt pads to 50304; released GPT-2 weights (or a Hugging Face folder) keep
    50257; a kgpt run folder has whatever its recorded model had."""
    import json

    from gpt2.model.build import init_vocab

    assert init_vocab("", "shakespeare") == 50304
    assert init_vocab("gpt2", "shakespeare") == 50257
    run = tmp_path / "run"
    run.mkdir()
    (run / "ckpt.pt").write_bytes(b"")
    record = resolve({"init_from": "gpt2", "model_size": "gpt2"}).to_dict()
    (run / "config.json").write_text(json.dumps(record))
    assert init_vocab(str(run), "shakespeare") == 50257  # its own model came from released weights
    (run / "config.json").write_text(json.dumps(Config().to_dict()))
    assert init_vocab(str(run), "shakespeare") == 50304
    (run / "config.json").write_text("{cut")
    assert init_vocab(str(run), "shakespeare") == 50304  # unreadable: the load says why, later
    (run / "model.safetensors").write_bytes(b"")  # an exported folder: Hugging Face's size
    assert init_vocab(str(run), "shakespeare") == 50257
    assert model_config(resolve({"init_from": str(run)})).vocab_size == 50257
