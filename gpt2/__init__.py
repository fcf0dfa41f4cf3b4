"""kgpt: train GPT-2 language models from a Kconfig .config.

Package map (each folder is one layer of the system):

- ``gpt2.config``   the typed configuration (one field per Kconfig symbol) and the
                    strict .config loader built on kconfiglib
- ``gpt2.data``     dataset registry, offline GPT-2 tokenizer, preparation of
                    uint16 token files and the memory-mapped batch loader
- ``gpt2.model``    the GPT-2 model and its size presets
- ``gpt2.training`` device/precision, optimizers, pruning, LR schedule,
                    checkpoints, the results folder and the training loop
- ``gpt2.cli``      the make bridge: ``python -m gpt2.cli <target>`` is what every
                    make target runs

The entry points ``gpt2/prepare_data.py``, ``gpt2/train.py`` and
``gpt2/generate.py`` are thin command-line wrappers around these.
"""

from pathlib import Path

__version__ = "0.1.0"

# The checkout: where Kconfig, defconfigs/ and results/ are found. The one place that
# knows it. Nothing heavy is imported here: `make help` imports gpt2 with the system
# python3, before anything is installed.
REPO = Path(__file__).resolve().parent.parent
