"""kgpt: train GPT-2 language models from a Kconfig .config.

Package map (each folder is one layer; tests/test_architecture.py holds the order and
docs/architecture.md draws it):

- ``gpt2.config``     the typed configuration (one field per Kconfig symbol), the method
                      registry and the strict .config loader built on kconfiglib
- ``gpt2.data``       datasets, the offline GPT-2 tokenizer, token shards and batches
- ``gpt2.model``      the GPT-2 model, and ``build`` to make one from settings
- ``gpt2.runtime``    device and precision, distributed processes, launching
- ``gpt2.optim`` and ``gpt2.sparsity``   one module per optimizer and pruning method,
                      their tensor code in ``algorithms/``
- ``gpt2.estimates``  memory and FLOPs, predicted from the settings
- ``gpt2.eval``       benchmarks a trained model is scored on (HellaSwag)
- ``gpt2.eval``       benchmarks a trained model is scored on (HellaSwag)
- ``gpt2.training``   the loop and what it owns: state, step, checkpoints, evaluation
- ``gpt2.matrix`` and ``gpt2.results``   the test matrix, its reports and pages
- ``gpt2.slurm``      running a matrix or a run on a Slurm cluster
- ``gpt2.slurm``      running a matrix or a run on a Slurm cluster
- ``gpt2.cli``        the make bridge: ``python -m gpt2.cli <target>`` is what every
                      make target runs

The entry points (``gpt2/train.py``, ``gpt2/prepare_data.py``, ``gpt2/generate.py``
and the others at the top) are thin command-line wrappers around these.
"""

import os
from pathlib import Path

# Torch's CPU allocator puts buffers of 2 MiB and more on transparent huge pages when
# this is set. It reads it once, at its first allocation, so it is set here, before any
# module of ours imports torch. On the CPU every large buffer is unmapped when freed
# (gpt2/runtime/device.py:return_large_buffers); with huge pages, mapping the next
# step's buffers again takes 512 times fewer page faults. Measured on 2 cores: 40 steps
# of the CPU preset at 1,437 tokens/s with them and 1,274 without, back to back; the
# whole preset at 1,407 tokens/s, as fast as when glibc kept every freed buffer (1,415).
# A value the user set is kept.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"

# The checkout: where Kconfig, defconfigs/ and results/ are found. The one place that
# knows it. Nothing heavy is imported here: `make help` imports gpt2 with the system
# python3, before anything is installed.
REPO = Path(__file__).resolve().parent.parent
