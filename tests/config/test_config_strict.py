"""Strict .config loading: every way a setting can silently fail to take is an error
naming file, line, symbol and reason."""

from __future__ import annotations

import re

import pytest

from helpers import METHODS, REPO, run_make
from gpt2.config import kconfig, matrix
from gpt2.config.kconfig import KconfigError

CPU = (REPO / "defconfigs" / "gpt2-shakespeare-cpu").read_text()

# (what goes wrong, file body, the whole error: {f} is the file). The messages are
# written out: a reworded or misplaced part is a change the user sees.
DEP = ("enable that first, or remove this line (`make olddefconfig` removes such leftovers "
       "and lists them)")
HINT = "(inline '# comments' are not allowed; put the comment on its own line)"
BAD = [
    ("int out of range", "CONFIG_BLOCK_SIZE=4\n",
     "{f}:1: CONFIG_BLOCK_SIZE=4: did not take: 4 is outside the allowed range [8, 8192]; "
     "choose a value in it"),
    ("SPAM clipping from step 1", "CONFIG_OPTIMIZER_ADAMWSPAM=y\nCONFIG_SPAM_CLIP_DELAY=1\n",
     "{f}:2: CONFIG_SPAM_CLIP_DELAY=1: did not take: 1 is outside the allowed range [2, "
     "1000000000] (at step 1 the second moment holds no gradient yet, so no spike can be "
     "measured: the reference clips every gradient to 0 there, and the optimizer never moves); "
     "choose a value in it"),
    ("unmet dependency", "CONFIG_N_LAYER=4\n",
     "{f}:1: CONFIG_N_LAYER=4: did not take: unmet dependency (MODEL_SIZE_CUSTOM); " + DEP),
    ("inline comment on an int", "CONFIG_BATCH_SIZE=8 # eight\n",
     "{f}:1: CONFIG_BATCH_SIZE: '8 # eight' is not an integer " + HINT),
    ("inline comment on a string", 'CONFIG_LEARNING_RATE="1e-3" # faster\n',
     "{f}:1: CONFIG_LEARNING_RATE: unexpected text ' # faster' after the closing quote " + HINT),
    ("inline comment on a bool", "CONFIG_BIAS=y # yes\n",
     "{f}:1: CONFIG_BIAS: 'y # yes' is not a bool value: use y or n " + HINT),
    ("undefined symbol", 'CONFIG_LEARNIN_RATE="1e-3"\n',
     "{f}:1: CONFIG_LEARNIN_RATE: undefined symbol (not in Kconfig: misspelt, or removed) (did "
     "you mean CONFIG_LEARNING_RATE?); fix the name or remove the line"),
    ("unquoted float", "CONFIG_LEARNING_RATE=1e-3\n",
     "{f}:1: CONFIG_LEARNING_RATE: '1e-3' is not a quoted string: string symbols (floats "
     'included) need quotes, e.g. CONFIG_LEARNING_RATE="1e-3"'),
    ("no closing quote", 'CONFIG_RUN_NAME="abc\n',
     "{f}:1: CONFIG_RUN_NAME: '\"abc' has no closing quote: a string ends on its own line"),
    ("an escape other than quote and backslash", 'CONFIG_RUN_NAME="a\\nb"\n',
     '{f}:1: CONFIG_RUN_NAME: \\n is not an escape: inside quotes only \\" and \\\\ are (write '
     "\\\\ for a backslash)"),
    ("a control character", 'CONFIG_RUN_NAME="a\x01b"\n',
     "{f}:1: CONFIG_RUN_NAME: control character '\\x01' at column 19: a .config line is one "
     "line of printable text; remove it"),
    ("a control character on no symbol's line", "x\x7fy\n",
     "{f}:1: control character '\\x7f' at column 2: a .config line is one line of printable "
     "text; remove it"),
    ("float that is not a number", 'CONFIG_WEIGHT_DECAY=""\nCONFIG_LEARNING_RATE="fast"\n',
     "{f}:2: CONFIG_LEARNING_RATE (--learning-rate): 'fast' is not a number (write e.g. 6e-4 or "
     "0.1)\n{f}:1: CONFIG_WEIGHT_DECAY (--weight-decay): '' is not a number (write e.g. 6e-4 or "
     "0.1)"),
    ("float out of range", 'CONFIG_DROPOUT="1.5"\n',
     "{f}:1: CONFIG_DROPOUT (--dropout): 1.5 is out of range: must be < 1"),
    ("bool that is not y/n", "CONFIG_BIAS=maybe\n",
     "{f}:1: CONFIG_BIAS: 'maybe' is not a bool value: use y or n"),
    ("two entries of one choice", "CONFIG_DEVICE_CPU=y\nCONFIG_DEVICE_CUDA=y\n",
     "{f}:1: CONFIG_DEVICE_CPU=y: did not take: only one entry of this choice can be y, and "
     "CONFIG_DEVICE_CUDA (line 2) is selected; set one of them to y and remove the other"),
    ("the selected choice entry set to n", "# CONFIG_DEVICE_AUTO is not set\n",
     "{f}:1: CONFIG_DEVICE_AUTO=n: did not take: a choice always has one entry selected; set "
     "another one to y"),
    ("set twice", "CONFIG_SEED=1\nCONFIG_SEED=2\n",
     "{f}:2: CONFIG_SEED: set more than once (first at line 1)"),
    ("malformed line", "CONFIG_SEED 1\n",
     "{f}:1: malformed line 'CONFIG_SEED 1': expected CONFIG_NAME=value, '# CONFIG_NAME is not "
     "set' or a comment line starting with #"),
    ("'not set' on an int", "# CONFIG_SEED is not set\n",
     "{f}:1: CONFIG_SEED: 'is not set' only applies to bool symbols"),
    ("min_lr above lr", 'CONFIG_LEARNING_RATE="1e-4"\nCONFIG_MIN_LR="1e-3"\n',
     "{f}:2: CONFIG_MIN_LR (--min-lr): 0.001 is above learning_rate 0.0001"),
    ("run name that is a path", 'CONFIG_RUN_NAME="../../etc"\n',
     "{f}:1: CONFIG_RUN_NAME (--run-name): '../../etc' is not a valid run name: use 1-128 "
     "letters, digits, '.', '_' or '-', starting with a letter or digit (it becomes a folder "
     "under the results dir)"),
    ("magnitude pruning with AdamWPrune",
     "CONFIG_OPTIMIZER_ADAMWPRUNE=y\nCONFIG_PRUNING_METHOD_MAGNITUDE=y\n",
     "{f}:2: CONFIG_PRUNING_METHOD_MAGNITUDE=y: did not take: unmet dependency "
     "(!OPTIMIZER_ADAMWPRUNE && <choice PRUNING_METHOD>); " + DEP),
    ("state pruning without AdamWPrune", "CONFIG_PRUNING_METHOD_STATE=y\n",
     "{f}:1: CONFIG_PRUNING_METHOD_STATE=y: did not take: unmet dependency "
     "(OPTIMIZER_ADAMWPRUNE && <choice PRUNING_METHOD>); " + DEP),
    ("an optimizer knob of another optimizer", 'CONFIG_SGD_MOMENTUM="0.5"\n',
     '{f}:1: CONFIG_SGD_MOMENTUM="0.5": did not take: unmet dependency '
     "(OPTIMIZER_SGD || MATRIX_OPTIMIZER_SGD); " + DEP),
    ("sparsity of 1", 'CONFIG_PRUNING_METHOD_MAGNITUDE=y\nCONFIG_TARGET_SPARSITY="1"\n',
     "{f}:2: CONFIG_TARGET_SPARSITY (--target-sparsity): 1.0 is out of range: must be < 1"),
    ("pruning that ends before it starts",
     'CONFIG_PRUNING_METHOD_MOVEMENT=y\nCONFIG_MAX_ITERS=100\nCONFIG_PRUNING_WARMUP=90\n',
     "{f}:3: CONFIG_PRUNING_WARMUP (--pruning-warmup): pruning would start after step 90 but "
     "must reach its target by step 75 (pruning_end=0.75 of 100 steps); lower pruning_warmup "
     "or raise pruning_end"),
    ("a default that the file's other values break",
     "CONFIG_PRUNING_METHOD_MOVEMENT=y\nCONFIG_MAX_ITERS=50\n",
     "{f} (Kconfig default): CONFIG_PRUNING_WARMUP (--pruning-warmup): pruning would start "
     "after step 100 but must reach its target by step 38 (pruning_end=0.75 of 50 steps); "
     "lower pruning_warmup or raise pruning_end"),
    ("heads that do not divide width",
     "CONFIG_MODEL_SIZE_CUSTOM=y\nCONFIG_N_HEAD=5\nCONFIG_N_EMBD=128\n",
     "{f}:2: CONFIG_N_HEAD (--n-head): n_embd=128 is not divisible by n_head=5"),
    ("a matrix where one run is expected",
     "CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_SGD=y\nCONFIG_MATRIX_PRUNING_NONE=y\n",
     "{f}:1: CONFIG_MATRIX=y: this configuration describes a test matrix, not one run; run it "
     "with `make test-matrix` (or `make`)"),
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


@pytest.mark.parametrize("body,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_values_are_refused_with_file_line_symbol_and_reason(tmp_path, body, message):
    with pytest.raises(KconfigError) as err:
        _load(tmp_path, body)
    assert str(err.value) == message.format(f=tmp_path / "config")


def test_a_file_that_is_missing_or_not_utf8_is_refused_saying_so(tmp_path):
    with pytest.raises(KconfigError) as err:
        kconfig.load(tmp_path / "nothing")
    assert str(err.value) == f"{tmp_path / 'nothing'}: no such configuration file"
    path = tmp_path / "config"
    path.write_bytes(b'CONFIG_SEED=1\nCONFIG_RUN_NAME="a\xffb"\n')
    with pytest.raises(KconfigError) as err:
        kconfig.load(path)
    assert str(err.value) == f"{path}:2: not UTF-8 text (byte 0xff): save the file as UTF-8"


def test_a_repair_load_lists_what_becomes_of_each_line_it_cannot_keep(tmp_path):
    """The configuration tools' mode: lines that name no symbol or do not take are
    listed, in file order, with what they become, instead of refused."""
    path = tmp_path / "config"
    path.write_text('CONFIG_SEED=1\nCONFIG_DEVICE_CPU=y\nCONFIG_LEARNIN_RATE="1"\n'
                    "CONFIG_N_LAYER=3\nCONFIG_DEVICE_CUDA=y\n")
    loaded = kconfig.load(path, repair=True)
    assert loaded.repairs == [
        f"{path}:2: CONFIG_DEVICE_CPU=y: only one entry of this choice can be y, and "
        "CONFIG_DEVICE_CUDA (line 5) is selected: now # CONFIG_DEVICE_CPU is not set",
        f"{path}:3: CONFIG_LEARNIN_RATE: undefined symbol (not in Kconfig: misspelt, or removed) "
        "(did you mean CONFIG_LEARNING_RATE?): dropped",
        f"{path}:4: CONFIG_N_LAYER=3: unmet dependency (MODEL_SIZE_CUSTOM): dropped"]
    assert kconfig.to_config(loaded)[0].device == "cuda"
    path.write_text("CONFIG_SEED 1\n")  # unreadable lines stay errors when repairing
    with pytest.raises(KconfigError, match="malformed line"):
        kconfig.load(path, repair=True)


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


@pytest.mark.e2e
def test_full_config_missing_a_setting_says_run_olddefconfig(tmp_path):
    path = tmp_path / "config"
    path.write_text("CONFIG_SEED=1\n")
    with pytest.raises(KconfigError) as err:
        kconfig.load(path, complete=True)
    new = kconfig.new_symbols(kconfig.load(path).kconf)
    assert new[:3] == ["MODEL_SIZE", "BLOCK_SIZE", "DROPOUT"]  # a choice named once
    assert "SEED" not in new and "N_LAYER" not in new  # set; not in force
    assert str(err.value) == (
        f"{path}: {len(new)} setting(s) are missing, most likely added to Kconfig since this "
        f"file was written: {', '.join(new)}. Run `make olddefconfig` to take their defaults "
        "(`make listnewconfig` lists them, `make oldconfig` asks for each)")
    full = tmp_path / "full"
    full.write_text("CONFIG_SEED=1\n")
    assert run_make("olddefconfig", env={"KCONFIG_CONFIG": str(full)}).returncode == 0
    assert kconfig.new_symbols(kconfig.load(full, complete=True).kconf) == []


@pytest.mark.e2e
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


# ---- `make setconfig` edits and the menus' value checks (in-process) ----------------------

NAME_RULE = ("is not a valid run name: use 1-128 letters, digits, '.', '_' or '-', starting "
             "with a letter or digit (it becomes a folder under the results dir)")


def test_setconfig_edits_take_in_order_each_checked_like_a_file_line(tmp_path):
    path = tmp_path / "config"
    path.write_text("CONFIG_SEED=1\n")
    loaded = kconfig.load(path)
    assert kconfig.apply_settings(loaded, [
        "LEARNING_RATE=1e-3", "config_max_iters=500", "OPTIMIZER=muon", "MODEL_SIZE=custom",
        "N_LAYER=3", "CONFIG_BIAS=n", 'DATA_DIR=a"b\\c']) == [
        "CONFIG_LEARNING_RATE=1e-3", "CONFIG_MAX_ITERS=500", "CONFIG_OPTIMIZER=muon",
        "CONFIG_MODEL_SIZE=custom", "CONFIG_N_LAYER=3", "CONFIG_BIAS=n",
        'CONFIG_DATA_DIR=a"b\\c']
    syms = loaded.kconf.syms
    assert [syms[n].str_value for n in ("LEARNING_RATE", "MAX_ITERS", "N_LAYER", "BIAS",
                                        "DATA_DIR")] == ["1e-3", "500", "3", "n", 'a"b\\c']
    assert loaded.kconf.named_choices["OPTIMIZER"].selection.name == "OPTIMIZER_MUON"
    assert kconfig.apply_settings(loaded, ["MATRIX=y", "MATRIX_BACKEND=slurm",
                                           "MATRIX_OPTIMIZER_SGD=y", "MATRIX_PRUNING_NONE=y"])[:2] == [
        "CONFIG_MATRIX=y", "CONFIG_MATRIX_BACKEND=slurm"]
    assert kconfig.to_matrix(loaded).backend == "slurm"


@pytest.mark.parametrize("item,message", [
    ("LEARNING_RATE", "'LEARNING_RATE': write NAME=value, e.g. LEARNING_RATE=1e-3"),
    ("=3", "'=3': write NAME=value, e.g. LEARNING_RATE=1e-3"),
    ("OPTIMIZER=adamv", "CONFIG_OPTIMIZER=adamv: not one of "
                        + ", ".join(METHODS["optimizers"]) + " (did you mean adam?)"),
    ("MATRIX_BACKEND=nope", "CONFIG_MATRIX_BACKEND=nope: not one of local, slurm"),
    ("LEARNIN_RATE=1", "CONFIG_LEARNIN_RATE: undefined symbol (not in Kconfig) (did you mean "
                       "LEARNING_RATE?)"),
    ("MAX_ITERS=abc", "CONFIG_MAX_ITERS=abc: 'abc' is not an integer"),
    ("BIAS=yes", "CONFIG_BIAS=yes: 'yes' is not a bool value: use y or n"),
    ("LEARNING_RATE=fast", "CONFIG_LEARNING_RATE=fast: 'fast' is not a number (write e.g. 6e-4 "
                           "or 0.1)"),
    ('RUN_NAME=a"b', f"CONFIG_RUN_NAME=a\"b: 'a\"b' {NAME_RULE}"),
    ("N_LAYER=3", "CONFIG_N_LAYER=3: did not take: unmet dependency (MODEL_SIZE_CUSTOM); set "
                  "what it depends on first, earlier in the same SET"),
    ("BLOCK_SIZE=3", "CONFIG_BLOCK_SIZE=3: did not take: 3 is outside the allowed range [8, "
                     "8192]; choose a value in it"),
])
def test_a_bad_setconfig_edit_is_refused_naming_it(tmp_path, item, message):
    path = tmp_path / "config"
    path.write_text("CONFIG_SEED=1\n")
    with pytest.raises(KconfigError) as err:
        kconfig.apply_settings(kconfig.load(path), ["SEED=2", item])
    assert str(err.value) == message


@pytest.mark.parametrize("name,text,problem", [
    ("MATRIX_SPARSITIES", "0.5 2", "2 is not a sparsity: each level must be strictly between 0 "
                                   "and 1 (0.7 prunes 70 %)"),
    ("MATRIX_SEEDS", "a", "'a' is not a seed: use whole numbers from 0 to 2147483647"),
    ("MATRIX_SWEEP", "X=1", "X: not a setting (`make menuconfig` shows their names)"),
    ("MATRIX_LR_MUON", "0 1", "0 is not a positive finite number"),
    ("MATRIX_WD_MUON", "0 1", None),  # a zero decay is a fair grid point; a zero rate is not
    ("LEARNING_RATE", "x", "'x' is not a number (write e.g. 6e-4 or 0.1)"),
    ("LEARNING_RATE", "20", "20.0 is out of range: must be <= 10"),
    ("RUN_NAME", "../x", f"'../x' {NAME_RULE}"),
    ("DATA_DIR", "a\x01", "holds a control character"),
    ("DATA_DIR", "ok", None),
    ("SLURM_PARTITION", "a b", "'a b' is not a Slurm name: use letters, digits and _ . , + - "
                               "(empty: the cluster's default)"),
    ("SEED", "x", None),  # an int: Kconfig's own type check
])
def test_the_menus_check_a_value_as_make_would(name, text, problem):
    assert kconfig.value_problem(name, text) == problem


def test_the_matrix_menu_reads_into_settings_and_an_empty_matrix_is_refused(tmp_path):
    path = tmp_path / "config"
    path.write_text("CONFIG_MATRIX=y\n")
    with pytest.raises(KconfigError) as err:
        kconfig.to_matrix(kconfig.load(path))
    assert str(err.value) == (
        f"{path}: the test matrix has no optimizer: enable at least one "
        "CONFIG_MATRIX_OPTIMIZER_* (`make menuconfig`, Test matrix menu)\n"
        f"{path}: the test matrix has no pruning method: enable at least one "
        'CONFIG_MATRIX_PRUNING_* ("none" for dense cells)')
    path.write_text('CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_SGD=y\nCONFIG_MATRIX_OPTIMIZER_MUON=y\n'
                    'CONFIG_MATRIX_PRUNING_MAGNITUDE=y\nCONFIG_MATRIX_SPARSITIES="0.3 0.6"\n'
                    'CONFIG_MATRIX_SEEDS="5 6"\nCONFIG_MATRIX_JOBS=3\nCONFIG_MATRIX_TUNE=y\n'
                    'CONFIG_MATRIX_LR_SGD="0.1 0.2"\nCONFIG_MATRIX_WD_SGD="0"\n'
                    'CONFIG_MATRIX_SWEEP="DROPOUT=0,0.1"\nCONFIG_MATRIX_BASELINE="sgd"\n')
    s = kconfig.to_matrix(kconfig.load(path))
    assert (s.optimizers, s.pruning_methods, s.sparsities, s.seeds, s.jobs, s.backend) == (
        ("sgd", "muon"), ("magnitude",), (0.3, 0.6), (5, 6), 3, "local")
    assert s.grids["sgd"] == {"lr": (0.1, 0.2), "wd": (0.0,)} and set(s.grids) == {"sgd", "muon"}
    assert s.sweep == (matrix.Sweep("dropout", (0.0, 0.1)),)
    path.write_text("CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_SGD=y\nCONFIG_MATRIX_PRUNING_NONE=y\n"
                    'CONFIG_MATRIX_TUNE=y\nCONFIG_MATRIX_LR_SGD="0"\nCONFIG_MATRIX_SEEDS="x"\n')
    with pytest.raises(KconfigError) as err:
        kconfig.to_matrix(kconfig.load(path))
    assert str(err.value) == (
        f"{path}:6: CONFIG_MATRIX_SEEDS: 'x' is not a seed: use whole numbers from 0 to "
        f"2147483647\n{path}:5: CONFIG_MATRIX_LR_SGD: 0 is not a positive finite number")
    path.write_text("CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_SGD=y\nCONFIG_MATRIX_PRUNING_NONE=y\n")
    s = kconfig.to_matrix(kconfig.load(path))
    assert (s.sparsities, s.jobs, s.grids, s.sweep) == ((), 1, {}, ())  # no pruning: no levels
    path.write_text("CONFIG_SEED=1\n")
    assert kconfig.to_matrix(kconfig.load(path)) is None


def test_a_command_line_flag_over_the_file_is_named_as_such_when_it_breaks(tmp_path):
    """train.py run on a .config with flags over it (TRAIN_ARGS): the file's settings
    the flags put out of force are dropped; a bad combination names its source."""
    from gpt2.config.options import TRAIN

    path = tmp_path / "config"
    path.write_text('CONFIG_OPTIMIZER_ADAMWSPAM=y\nCONFIG_SPAM_THRESHOLD="100"\nCONFIG_MAX_ITERS=200\n')
    loaded = kconfig.load(path)
    cfg, changed = kconfig.to_config_with(loaded, TRAIN, {"optimizer": "sgd"})
    assert (cfg.optimizer, cfg.max_iters, changed) == ("sgd", 200, True)
    cfg, changed = kconfig.to_config_with(loaded, TRAIN, {"max_iters": 200})
    assert (cfg.spam_threshold, changed) == (100.0, False)
    with pytest.raises(KconfigError) as err:
        kconfig.to_config_with(loaded, TRAIN, {"warmup_iters": 500})
    assert str(err.value) == ("its command line: CONFIG_WARMUP_ITERS (--warmup-iters): 500 "
                              "warmup steps exceed max_iters=200")
    with pytest.raises(KconfigError) as err:
        kconfig.to_config_with(loaded, TRAIN, {"max_iters": 50})
    assert str(err.value).startswith(f"{path} (Kconfig default): CONFIG_WARMUP_ITERS")


def test_every_bad_line_is_reported_not_only_the_first(tmp_path):
    path = tmp_path / "config"
    path.write_text("CONFIG_SEED=\x01\nCONFIG_BIAS=maybe\nCONFIG_MAX_ITERS=x\n")
    with pytest.raises(KconfigError) as err:
        kconfig.load(path)
    assert [p.split(": ")[0] for p in err.value.problems] == [f"{path}:1", f"{path}:2",
                                                             f"{path}:3"]


def test_a_setconfig_value_may_hold_an_equals_sign(tmp_path):
    path = tmp_path / "config"
    path.write_text("CONFIG_MATRIX=y\nCONFIG_MATRIX_OPTIMIZER_SGD=y\nCONFIG_MATRIX_PRUNING_NONE=y\n")
    loaded = kconfig.load(path)
    assert kconfig.apply_settings(loaded, ["MATRIX_SWEEP=WARMUP_ITERS=10,20"]) == [
        "CONFIG_MATRIX_SWEEP=WARMUP_ITERS=10,20"]
    assert kconfig.to_matrix(loaded).sweep == (matrix.Sweep("warmup_iters", (10, 20)),)
    assert kconfig.apply_settings(loaded, ["MATRIX_BACKEND=slurm"])
    assert kconfig.to_matrix(loaded).jobs == 1  # MATRIX_JOBS is not in force on Slurm


def test_a_smoke_adjustment_and_a_file_value_against_a_flag(tmp_path):
    from gpt2.config.options import TRAIN

    path = tmp_path / "config"
    path.write_text("CONFIG_SEED=1\nCONFIG_MAX_ITERS=500\nCONFIG_WARMUP_ITERS=100\n")
    loaded = kconfig.load(path)
    cfg, _ = kconfig.to_config(loaded, adjust=lambda v: {**v, "max_iters": 120})
    assert (cfg.max_iters, cfg.warmup_iters) == (120, 100)
    with pytest.raises(KconfigError) as err:
        kconfig.to_config_with(loaded, TRAIN, {"max_iters": 50})
    assert str(err.value) == (f"{path}:3: CONFIG_WARMUP_ITERS (--warmup-iters): 100 warmup steps "
                              "exceed max_iters=50")


@pytest.mark.parametrize("tags, why", [
    ("good bad/tag", "'bad/tag' is not a tag"),
    ("-leading", "'-leading' is not a tag"),
    ("x" * 41, "is not a tag"),
    (" ".join(f"t{i}" for i in range(21)), "21 tags: at most 20"),
    ("same other same", "'same' is given twice"),
])
def test_run_tags_are_words_from_an_allowlist(tags, why):
    from gpt2.config.options import Config, validate
    from gpt2.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(why)):
        validate(Config(run_tags=tags))
    validate(Config(run_tags="baseline ablation:warmup v1.2 lr+wd under_score"))
