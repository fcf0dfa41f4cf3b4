#!/usr/bin/env python3
"""Every setting's metadata and default, every method's facts, and the config hash of
every valid optimizer x pruning pair, as JSON: run it at two commits and diff the
outputs to show that a refactor changed no setting and moved no run folder (a run's
folder is named by its config hash).

    python -m scripts.config_fingerprint > after.json
    git stash; python -m scripts.config_fingerprint > before.json; git stash pop
    diff before.json after.json

It reads only what every kgpt version since the registries has (Config's fields and
their Opt, the OPTIMIZERS and PRUNING_METHODS tables of gpt2/config/choices.py), so
it runs unchanged at older commits: copy it there (issue 46 compared c384942 with
the method modules this way).
"""

from __future__ import annotations

import dataclasses
import json
import sys

from gpt2.config.choices import OPTIMIZERS, PRUNING_METHODS, pair_problem
from gpt2.config.options import Config, fields, opt, resolve


def _plain(value):
    """A value as the same text in every process (a set's order is not)."""
    if isinstance(value, (set, frozenset)):
        return sorted(map(_plain, value))
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def fingerprint() -> dict:
    out: dict = {"settings": {}, "hashes": {}, "optimizers": {}, "pruning_methods": {}}
    for f in fields():
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        out["settings"][f.name] = [repr(f.default), kind, _plain(dataclasses.asdict(opt(f.name)))]
    for o in OPTIMIZERS:
        for m in PRUNING_METHODS:
            if pair_problem(o, m) is None:
                cfg = resolve({"optimizer": o, "pruning_method": m, "max_iters": 1000})
                out["hashes"][f"{o} {m}"] = cfg.config_hash()
        spec = OPTIMIZERS[o]
        out["optimizers"][o] = [spec.summary, list(spec.hparams), spec.pruning, spec.elementwise,
                                spec.whole, list(spec.grids),
                                spec.tuned(Config(optimizer=o, max_iters=100))]
    for m, spec in PRUNING_METHODS.items():
        out["pruning_methods"][m] = [spec.summary, list(spec.hparams), spec.optimizer,
                                     spec.family]
    return out


def main() -> int:
    json.dump(fingerprint(), sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
