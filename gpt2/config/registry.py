"""The registries of methods: every module of gpt2/optim/ (the optimizers) and of
gpt2/sparsity/ (the pruning methods), loaded by its file name.

The configuration knows the folders, not the methods: the way a Kconfig ``source``
glob takes every driver's file, ``load`` takes every module there and reads its
``METHOD`` (gpt2/config/methods.py says what a module declares). Adding a method is
adding a file; nothing here or elsewhere lists them.

The modules are loaded by name at run time, so the import-layer check
(tests/test_architecture.py) does not see this dependency: the methods' layer sits
above training (their builders import its code), and a method module imports
nothing but gpt2/config/methods.py at its top, which that test checks.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from gpt2.config.methods import Optimizer, Pruning, Setting


def load(package: str, kind: type) -> dict[str, Any]:
    """Every ``METHOD`` of the modules in ``package`` (files starting with ``_``, and
    subpackages such as ``algorithms``, are the methods' shared code), keyed by name,
    in their declared order. Two modules declaring one name, or a METHOD of another
    kind, stop the import."""
    pkg = importlib.import_module(package)
    found: dict[str, Any] = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_") or info.ispkg:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        method = getattr(module, "METHOD", None)
        if not isinstance(method, kind):
            raise RuntimeError(f"{module.__name__} declares no METHOD = {kind.__name__}(...): "
                               f"every module of {package} is a method (shared code goes "
                               "in a module whose name starts with _)")
        if method.name in found:
            raise RuntimeError(f"{module.__name__}: a second method named {method.name!r}")
        found[method.name] = method
    return dict(sorted(found.items(), key=lambda item: (item[1].order, item[0])))


def settings_of(methods: dict[str, Any]) -> dict[str, tuple[Setting, tuple[str, ...]]]:
    """Every setting the methods own, with the names of the methods that read it, in
    the order of their owners. (A method may also read settings of Config's own,
    the pruning schedule's: they are not listed here.)"""
    out: dict[str, tuple[Setting, tuple[str, ...]]] = {}
    for method in methods.values():
        for s in method.settings:
            if s.name in out:
                raise RuntimeError(f"setting {s.name!r} is declared twice (by {method.name} "
                                   "and another method): declare it once, list it in the "
                                   "other's reads")
            out[s.name] = (s, ())
    for method in methods.values():
        own = {s.name for s in method.settings}
        if not own <= set(method.reads):
            raise RuntimeError(f"{method.name} owns settings it does not read: "
                               f"{sorted(own - set(method.reads))}")
        for name in method.reads:
            if name in out:
                s, readers = out[name]
                out[name] = (s, readers + (method.name,))
    return out


def default_of(methods: dict[str, Optimizer]) -> str:
    """The name of the one optimizer that declares itself the default."""
    named = [name for name, m in methods.items() if m.default]
    if len(named) != 1:
        raise RuntimeError(f"{len(named)} optimizers declare default=True "
                           f"({', '.join(named) or 'none'}): exactly one must, the optimizer "
                           "a configuration gets when it names none and the matrix's baseline")
    return named[0]


OPTIMIZERS: dict[str, Optimizer] = load("gpt2.optim", Optimizer)
DEFAULT_OPTIMIZER = default_of(OPTIMIZERS)
OPTIMIZER_SETTINGS = settings_of(OPTIMIZERS)
PRUNING_METHODS: dict[str, Pruning] = load("gpt2.sparsity", Pruning)
PRUNING_SETTINGS = settings_of(PRUNING_METHODS)
