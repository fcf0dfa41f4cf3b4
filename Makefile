# kgpt: `make help` lists the targets. Recipes are one line and call Python;
# the configuration is read by the bridge (python -m gpt2.cli, gpt2/cli/), never
# included here, so no .config value is ever expanded by make or seen by a shell.
# A new target goes in the bridge's table of targets (gpt2/cli/__init__.py) too,
# which `make help` is written from.

.DEFAULT_GOAL := all

# Every variable given on the command line (make PROMPT="..." TRAIN_ARGS="...", and
# any other: make exports them all to the recipes) reaches Python through the
# environment as typed: re-bind each to its unexpanded text, so make never evaluates a
# $(shell ...) inside it. Recipes never mention them. (docs/reliability.md, promise 9;
# the bridge reads the ones it knows, tests/test_input_safety.py TEXT_VARS.)
$(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(eval override $(v) := $$(value $(v)))$(eval export $(v))))

# The variables below are pasted into recipe lines, so a value from the command line
# or the environment would be shell code there: they are kgpt's own (override), and
# PYTHON, the one a user may set, must be a plain path. $(value V), not $(V): a V or
# PYTHON from the environment is never expanded either.
ifeq ($(value V),1)
override Q :=
else
override Q := @
endif

override VENV := .venv
ifdef PYTHON
PATH_CHARS := a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F G H I J K L M \
              N O P Q R S T U V W X Y Z 0 1 2 3 4 5 6 7 8 9 / . _ + - : @ ~
override _rest := $(value PYTHON)
$(foreach c,$(PATH_CHARS),$(eval override _rest := $$(subst $(c),,$$(_rest))))
ifneq ($(_rest),)
  $(error PYTHON must be a path to a Python interpreter (letters, digits and / . _ + - : @ ~); unset it to use .venv)
endif
override PY := $(value PYTHON)
override SETUP :=
else
override PY := $(VENV)/bin/python
override SETUP := $(VENV)/.installed
endif
# Modules, run from this folder: the code of this checkout, whichever one the Python's
# editable install points at.
override KGPT := $(PY) -m gpt2.cli

override CONFIG_TARGETS := defconfig menuconfig guiconfig oldconfig olddefconfig savedefconfig \
                  listnewconfig setconfig
override RUN_TARGETS := all smoke data train extend generate eval-hellaswag prune-oneshot test-matrix plots report \
               bench memcheck resume-check matrix-status matrix-cancel compare results \
               tensorboard export

.PHONY: $(CONFIG_TARGETS) $(RUN_TARGETS) test test-fast test-reliability test-mutation check \
        test-durations bench-optim \
        gpu-check gpu-bundle kconfig-sync bench-noop help clean \
        mrproper distclean

# First use creates .venv with the pinned requirements and kgpt itself, editable (the
# gpt2 package imports from this checkout); PYTHON=... skips this (that Python needs
# `pip install -r requirements.txt -e .`).
$(VENV)/.installed: requirements.txt pyproject.toml
	@echo "  SETUP   $(VENV): installing PyTorch and the pinned requirements, once (a few minutes, quiet)" >&2
	$(Q)python3 -m venv $(VENV) && $(VENV)/bin/pip install --disable-pip-version-check -q -r requirements.txt && $(VENV)/bin/pip install --disable-pip-version-check -q --no-deps -e . && touch $@

# The preset's name reaches Python through the environment, as typed: the target name
# is the user's text (`make 'defconfig-$$(...)'`), never a piece of a shell command.
defconfig-%: export KGPT_DEFCONFIG = $*
defconfig-%: $(SETUP)
	$(Q)$(KGPT) defconfig "$$KGPT_DEFCONFIG"

$(CONFIG_TARGETS) $(RUN_TARGETS): $(SETUP)
	$(Q)$(KGPT) $@

# The whole suite, `check`, is what CI and README run: one pytest session, so the
# workers' tails and collection are paid once. `test` (everything but fault injection)
# and `test-reliability` (signals, kills, damaged files, NaN, OOM, hostile input) are
# its two parts. Two pytest-xdist workers on two cores (a third one made the suite no
# faster, docs/testing.md); tests/conftest.py keeps the tests that share one Slurm
# cluster, the reference matrix or a module's trained run on the same worker.
override PYTEST := $(PY) -m pytest -n 2 --dist loadgroup
check: $(SETUP)
	$(Q)$(PYTEST)

test: $(SETUP)
	$(Q)$(PYTEST) -m "not reliability"

# The unit tier: the tests that run in this process in well under a second or two
# (tests/conftest.py refuses an unmarked test that starts a process or trains through
# the loop; the in-process ones that take seconds each are marked slow).
test-fast: $(SETUP)
	$(Q)KGPT_TIER=unit $(PYTEST) -m "not reliability and not e2e and not slurm and not slow"

test-reliability: $(SETUP)
	$(Q)$(PYTEST) -m reliability

# The suite's cost, test by test, sorted, with each tier's total (docs/testing.md,
# "Keeping it fast"); DURATIONS_ARGS="-m 'not reliability'" picks tests (read by the
# script, unexpanded).
test-durations: $(SETUP)
	$(Q)$(PY) -m scripts.test_durations

# On demand, after changing a module it covers (docs/testing.md): mutmut is installed
# only here, pinned, since neither training nor CI needs it. MUTATION_ARGS="--only
# pruning" runs one module (the script reads the variable itself, unexpanded).
test-mutation: $(SETUP)
	$(Q)$(PY) -m pip install --quiet "mutmut==3.8.1"
	$(Q)$(PY) -m scripts.mutation

# Optimizer x pruning step time and state memory (BENCH_ARGS="--device cuda ...").
bench-optim: $(SETUP)
	$(Q)$(PY) -m scripts.bench_optim

# The GPU acceptance in one command and a time budget (GPU_CHECK_MINUTES, default 9);
# tiny shapes on a machine without a GPU. Writes results/gpu-check-<device>-<commit>/.
gpu-check: $(SETUP)
	$(Q)$(PY) -m scripts.gpu_check

# What a lent GPU machine without network lacks, into gpu-bundle/ (docs/performance.md).
gpu-bundle: $(SETUP)
	$(Q)$(PY) -m scripts.gpu_bundle

# CPU seconds of `make` and `make data` when there is nothing to do.
bench-noop: $(SETUP)
	$(Q)$(PY) -m scripts.noop_bench

# Kconfig's default and range lines, rewritten from Config, their owner.
kconfig-sync: $(SETUP)
	$(Q)$(PY) -m scripts.kconfig_sync --write

# The system python3 before .venv exists: help imports only the standard library.
help:
	@$(or $(PYTHON),python3) -m gpt2.cli help

# ./defconfig is the user's (savedefconfig writes it): clean keeps it.
clean:
	$(Q)rm -rf .pytest_cache && find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

mrproper: clean
	$(Q)rm -rf .config .config.old $(VENV)

distclean: mrproper
	$(Q)rm -rf data
