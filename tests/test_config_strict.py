"""Strict .config loading: every way a setting can silently fail to take is an error
naming file, line, symbol and reason."""

from __future__ import annotations

import pytest

from helpers import REPO, run_make
from gpt2.config import kconfig
from gpt2.config.kconfig import KconfigError

CPU = (REPO / "defconfigs" / "gpt2-shakespeare-cpu").read_text()

# (what goes wrong, file body, strings the error must contain)
BAD = [
    ("int out of range", "CONFIG_BLOCK_SIZE=4\n",
     [":1:", "CONFIG_BLOCK_SIZE", "outside the allowed range [8, 8192]"]),
    ("unmet dependency", "CONFIG_N_LAYER=4\n",
     [":1:", "CONFIG_N_LAYER", "unmet dependency", "MODEL_SIZE_CUSTOM"]),
    ("inline comment on an int", "CONFIG_BATCH_SIZE=8 # eight\n",
     [":1:", "CONFIG_BATCH_SIZE", "inline"]),
    ("inline comment on a string", 'CONFIG_LEARNING_RATE="1e-3" # faster\n',
     [":1:", "CONFIG_LEARNING_RATE", "inline"]),
    ("undefined symbol", 'CONFIG_LEARNIN_RATE="1e-3"\n',
     [":1:", "CONFIG_LEARNIN_RATE", "undefined symbol", "did you mean CONFIG_LEARNING_RATE?"]),
    ("unquoted float", "CONFIG_LEARNING_RATE=1e-3\n",
     [":1:", "CONFIG_LEARNING_RATE", "not a quoted string", '"1e-3"']),
    ("float that is not a number", 'CONFIG_WEIGHT_DECAY=""\nCONFIG_LEARNING_RATE="fast"\n',
     [":2:", "CONFIG_LEARNING_RATE", "not a number"]),
    ("float out of range", 'CONFIG_DROPOUT="1.5"\n',
     [":1:", "CONFIG_DROPOUT", "out of range", "< 1"]),
    ("bool that is not y/n", "CONFIG_BIAS=maybe\n", [":1:", "CONFIG_BIAS", "use y or n"]),
    ("two entries of one choice", "CONFIG_DEVICE_CPU=y\nCONFIG_DEVICE_CUDA=y\n",
     [":1:", "CONFIG_DEVICE_CPU", "only one entry", "CONFIG_DEVICE_CUDA"]),
    ("set twice", "CONFIG_SEED=1\nCONFIG_SEED=2\n", [":2:", "CONFIG_SEED", "more than once"]),
    ("malformed line", "CONFIG_SEED 1\n", [":1:", "malformed line"]),
    ("'not set' on an int", "# CONFIG_SEED is not set\n", [":1:", "CONFIG_SEED", "bool"]),
    ("min_lr above lr", 'CONFIG_LEARNING_RATE="1e-4"\nCONFIG_MIN_LR="1e-3"\n',
     [":2:", "CONFIG_MIN_LR", "above learning_rate"]),
    ("run name that is a path", 'CONFIG_RUN_NAME="../../etc"\n',
     [":1:", "CONFIG_RUN_NAME", "not a valid run name"]),
    ("magnitude pruning with AdamWPrune",
     "CONFIG_OPTIMIZER_ADAMWPRUNE=y\nCONFIG_PRUNING_METHOD_MAGNITUDE=y\n",
     [":2:", "CONFIG_PRUNING_METHOD_MAGNITUDE", "unmet dependency"]),
    ("state pruning without AdamWPrune", "CONFIG_PRUNING_METHOD_STATE=y\n",
     [":1:", "CONFIG_PRUNING_METHOD_STATE", "unmet dependency", "OPTIMIZER_ADAMWPRUNE"]),
    ("an optimizer knob of another optimizer", 'CONFIG_SGD_MOMENTUM="0.5"\n',
     [":1:", "CONFIG_SGD_MOMENTUM", "unmet dependency", "OPTIMIZER_SGD"]),
    ("sparsity of 1", 'CONFIG_PRUNING_METHOD_MAGNITUDE=y\nCONFIG_TARGET_SPARSITY="1"\n',
     [":2:", "CONFIG_TARGET_SPARSITY", "out of range", "< 1"]),
    ("pruning that ends before it starts",
     'CONFIG_PRUNING_METHOD_MOVEMENT=y\nCONFIG_MAX_ITERS=100\nCONFIG_PRUNING_WARMUP=90\n',
     [":3:", "CONFIG_PRUNING_WARMUP", "must reach its target by step 75"]),
    ("heads that do not divide width",
     "CONFIG_MODEL_SIZE_CUSTOM=y\nCONFIG_N_HEAD=5\nCONFIG_N_EMBD=128\n",
     [":2:", "CONFIG_N_HEAD", "not divisible"]),
]


def test_an_int_with_leading_zeros_is_its_value(tmp_path):
    """CONFIG_SEED=007 was refused as "outside the allowed range" (kconfiglib keeps
    the text "007", which differs from "7")."""
    assert _load(tmp_path, "CONFIG_SEED=007\n")[0].seed == 7


def _load(tmp_path, body: str, complete: bool = False):
    path = tmp_path / "config"
    path.write_text(body)
    loaded = kconfig.load(path, complete=complete)
    return kconfig.to_config(loaded)


@pytest.mark.parametrize("body,needles", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_values_are_refused_with_file_line_symbol_and_reason(tmp_path, body, needles):
    with pytest.raises(KconfigError) as err:
        _load(tmp_path, body)
    message = str(err.value)
    assert str(tmp_path / "config") in message
    for needle in needles:
        assert needle in message, f"{needle!r} missing from:\n{message}"


def test_good_values_take(tmp_path):
    cfg, active = _load(tmp_path, 'CONFIG_MODEL_SIZE_CUSTOM=y\nCONFIG_N_LAYER=3\n'
                        'CONFIG_LEARNING_RATE="1.5e-3"\n# CONFIG_BIAS is not set\n'
                        "CONFIG_DEVICE_CPU=y\n# a comment line is fine\n\n")
    assert (cfg.n_layer, cfg.learning_rate, cfg.bias, cfg.device) == (3, 1.5e-3, False, "cpu")
    assert "n_layer" in active


def test_preset_dimensions_come_from_the_registry(tmp_path):
    cfg, active = _load(tmp_path, "CONFIG_MODEL_SIZE_GPT2_MEDIUM=y\n")
    assert cfg.dims() == (24, 16, 1024) and (cfg.n_layer, cfg.n_embd) == (24, 1024)
    assert "n_layer" not in active  # only in force for custom sizes


def test_full_config_missing_a_setting_says_run_olddefconfig(tmp_path):
    path = tmp_path / "config"
    path.write_text("CONFIG_SEED=1\n")
    with pytest.raises(KconfigError) as err:
        kconfig.load(path, complete=True)
    assert "make olddefconfig" in str(err.value) and "LEARNING_RATE" in str(err.value)


def test_make_refuses_a_bad_config_before_doing_anything(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text(CPU + 'CONFIG_RESULTS_DIR="' + str(tmp_path / "results") + '"\n')
    assert run_make("olddefconfig", env={"KCONFIG_CONFIG": str(cfg)}).returncode == 0
    cfg.write_text(cfg.read_text().replace("CONFIG_BATCH_SIZE=16", "CONFIG_BATCH_SIZE=16 # x"))
    proc = run_make("train", env={"KCONFIG_CONFIG": str(cfg)})
    assert proc.returncode != 0
    assert "CONFIG_BATCH_SIZE" in proc.stderr and "inline" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_defconfig_with_bad_value_is_refused(tmp_path, monkeypatch, capsys):
    """`make defconfig-X` goes through the same loader: a broken preset never becomes
    a .config. (The bridge in this process, its presets folder pointed at a
    temporary one: nothing is written into the checkout.)"""
    import gpt2.cli
    from gpt2.cli import config_tools

    presets = tmp_path / "defconfigs"
    presets.mkdir()
    (presets / "zz-test-broken").write_text("# broken on purpose\nCONFIG_BLOCK_SIZE=3\n")
    monkeypatch.setattr(config_tools, "DEFCONFIG_DIR", presets)
    monkeypatch.setenv("KCONFIG_CONFIG", str(tmp_path / "config"))
    assert gpt2.cli.main(["defconfig", "zz-test-broken"]) != 0
    assert "CONFIG_BLOCK_SIZE" in capsys.readouterr().err
    assert not (tmp_path / "config").exists()
