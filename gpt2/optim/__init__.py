"""The optimizers: one module each, ``METHOD = Optimizer(...)`` declaring everything
about it (gpt2/config/methods.py says what; docs/architecture.md how to add one).
Modules whose names start with ``_`` hold code the methods share; ``algorithms/``
holds their tensor code."""
