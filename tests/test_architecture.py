"""The shape of the package: no import cycle among gpt2/ modules (function-level
imports included: hiding a cycle inside a function is still a cycle), every module
importable on its own, the error types in a leaf anyone may import, and functions in
gpt2/training short enough to read, or saying why not."""

from __future__ import annotations

import ast
import subprocess

import pytest

from helpers import PY, REPO

PACKAGE = REPO / "gpt2"


def module_name(path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path) -> set[str]:
    """The gpt2 modules ``path`` imports anywhere in it, except under TYPE_CHECKING
    (annotations only: nothing runs)."""
    found: set[str] = set()

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    visit([child])

    visit(ast.parse(path.read_text()).body)
    return {m for m in found if m in MODULES} - {module_name(path)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    out, done = [], set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                out.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                walk(nxt, path + [nxt])
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            walk(node, [node])
    return out


def test_no_import_cycle_among_the_package_modules():
    graph = {name: imports(path) for name, path in MODULES.items()}
    assert graph["gpt2.training.trainer"], "the walk found no imports at all"
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_error_types_live_in_a_leaf():
    assert imports(MODULES["gpt2.errors"]) <= {"gpt2.names", "gpt2.config"}
    assert imports(MODULES["gpt2.names"]) == set()


@pytest.mark.e2e
def test_every_module_imports_on_its_own():
    """Each module imported first, into an interpreter holding no other gpt2 module:
    an import that works only because another module happened to load first fails."""
    script = (
        "import importlib, sys, traceback\n"
        "import torch, numpy\n"  # third-party modules may stay loaded
        f"names = {sorted(MODULES)!r}\n"
        "bad = []\n"
        "for name in names:\n"
        "    for loaded in [m for m in sys.modules if m == 'gpt2' or m.startswith('gpt2.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except BaseException:\n"
        "        bad.append(name + ': ' + traceback.format_exc(limit=1).splitlines()[-1])\n"
        "print('\\n'.join(bad))\n")
    proc = subprocess.run([PY, "-c", script], capture_output=True, text=True, cwd=REPO,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


LONG = 80  # lines
REASON = "# Longer than most functions on purpose"


def long_functions(text: str, name: str) -> list[str]:
    """Functions (methods included) of the module ``text`` over LONG lines without a
    comment just above the def (or its decorators) that starts with REASON."""
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            above = [ln.strip() for ln in lines[:first - 1] if ln.strip()][-6:]
            explained = any(ln.startswith(REASON) for ln in above if ln.startswith("#"))
            if node.end_lineno - node.lineno + 1 > LONG and not explained:
                found.append(f"{name}:{node.lineno} {node.name}")
    return found


def test_training_functions_are_short_or_say_why():
    long = [f for p in sorted((PACKAGE / "training").glob("*.py"))
            for f in long_functions(p.read_text(), p.name)]
    assert long == []


def test_the_length_check_finds_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(LONG))
    assert long_functions(f"import os\n\n\ndef f():\n{body}\n", "m.py") == ["m.py:4 f"]
    assert long_functions(f"{REASON}: a reason.\n# more of it\ndef f():\n{body}\n",
                          "m.py") == []
    short = "\n".join(body.splitlines()[:LONG - 1])
    assert long_functions(f"def f():\n{short}\n", "m.py") == []


# ---- layers: every import points down (docs/architecture.md) -----------------------------

# Bottom to top. A module may import its own layer and those below it, never above:
# training never imports a driver, config (plain settings) never imports what it
# configures, an entry point never imports the drivers that start it.
LAYERS = (
    ("foundation", {"gpt2", "errors", "storage", "checksums", "faults", "processes",
                    "records", "names"}),
    ("config", {"config"}),  # plain settings and tables (sizes, datasets, methods)
    ("model, data, run folder and runtime", {"model", "data", "eval", "run_folder",
                                             "runtime"}),
    # the methods' tensor code, taking plain arguments
    ("algorithms", {"optim.algorithms", "sparsity.algorithms"}),
    ("estimates", {"estimates"}),  # what a run will cost: memory, FLOPs
    ("training", {"training"}),  # the loop and what it owns
    # the methods, one module each: loaded by name by gpt2/config/registry.py, their
    # builders import the algorithms
    ("methods", {"optim", "sparsity"}),
    ("entry points", {"train", "evaluate", "generate", "export", "prepare_data",
                      "prune_oneshot"}),
    # what starts the entry points, reads their results and publishes pages
    ("drivers", {"matrix", "slurm", "results", "cli"}),
)
# Each folder is one layer: no module is listed on its own in another folder's layer.
def layer_of(module: str) -> int:
    """The layer of a module: of its own name where a layer lists it (a leaf
    module of a package), else of its package (gpt2.<package>)."""
    parts = module.split(".")[1:] or ["gpt2"]
    for key in (".".join(parts[:2]), parts[0]):
        for i, (_, packages) in enumerate(LAYERS):
            if key in packages:
                return i
    raise LookupError(f"{module}: no layer holds it (LAYERS)")


def upward_imports(graph: dict[str, set[str]]) -> set[str]:
    """'a -> b' for each import of a module b in a higher layer than a's module."""
    return {f"{a} -> {b}" for a, targets in graph.items() for b in targets
            if layer_of(b) > layer_of(a)}


METHOD_PACKAGES = ("optim", "sparsity")


def top_level_imports(path) -> set[str]:
    """The modules ``path`` imports outside its functions and classes."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("package", METHOD_PACKAGES)
def test_a_method_module_imports_only_the_declarations_at_its_top(package):
    """The configuration reads every method module (gpt2/config/registry.py) on every
    `make`: at its top a module may import only what declares a method, so reading
    the declarations imports no torch and nothing above the config layer."""
    paths = sorted((PACKAGE / package).glob("*.py"))
    assert len(paths) > 5
    for path in paths:
        assert top_level_imports(path) <= {"__future__", "gpt2.config.methods"}, path


def test_the_model_knows_its_own_configuration_only():
    """gpt2/model/gpt.py builds from GPTConfig: it imports no setting (a run's Config,
    .config) and no run folder; gpt2/model/build.py turns those into a GPTConfig."""
    assert imports(PACKAGE / "model" / "gpt.py") & {
        "gpt2.config.options", "gpt2.config.kconfig", "gpt2.run_folder"} == set()
    assert "gpt2.config.options" in imports(PACKAGE / "model" / "build.py")


def test_every_package_has_a_layer():
    for name in MODULES:
        layer_of(name)  # raises LookupError for a package no layer names


def test_imports_point_down_the_layers():
    graph = {name: {t for t in imports(path) if t in MODULES}
             for name, path in MODULES.items()}
    # (an import of a package's name counts as its __init__'s; of a name in a module,
    # as the module's: ``imports`` lists both, the module's is enough here)
    assert upward_imports(graph) == set()


# The upward imports the package had (issue 30), each planted again: the check must
# name it.
FORMER_UPWARD = (
    "gpt2.training.trainer -> gpt2.results.pages",  # training published its own page
    "gpt2.config.options -> gpt2.optim.algorithms.optimizers",  # settings took choices from code
    "gpt2.config.options -> gpt2.model.gpt",
    "gpt2.run_folder -> gpt2.training.checkpoint",  # the run folder's state needed torch
    "gpt2.train -> gpt2.results.pages",  # an entry point publishing through a driver
)


@pytest.mark.parametrize("planted", FORMER_UPWARD)
def test_the_layer_check_finds_each_former_upward_import(planted):
    a, b = planted.split(" -> ")
    graph = {name: imports(path) for name, path in MODULES.items()}
    graph[a] = graph[a] | {b}
    assert upward_imports(graph) == {planted}


# What must import without torch (nor numpy's or matplotlib's weight where noted):
# everything `make` runs before it knows there is training to do, and the readers of
# results. tests/config/test_registry.py holds the configuration to the same.
TORCH_FREE = ("gpt2.config.options", "gpt2.config.kconfig", "gpt2.config.matrix",
              "gpt2.run_folder", "gpt2.training.reporting", "gpt2.runtime.launch",
              "gpt2.train", "gpt2.prepare_data", "gpt2.cli", "gpt2.cli.run_commands",
              "gpt2.cli.matrix_commands", "gpt2.results.catalog", "gpt2.results.pages",
              "gpt2.matrix.runner", "gpt2.matrix.collect", "gpt2.matrix.slurm_backend",
              "gpt2.slurm.task")


@pytest.mark.e2e
@pytest.mark.parametrize("module", TORCH_FREE)
def test_modules_that_decide_whether_to_train_import_no_torch(module):
    script = (f"import sys, importlib\nimportlib.import_module({module!r})\n"
              "print('torch' in sys.modules)")
    out = subprocess.run([PY, "-c", script], capture_output=True, text=True, cwd=REPO,
                         check=True).stdout
    assert out.strip() == "False"


# ---- writers: a folder kgpt keeps is never a link (docs/reliability.md, promise 20) ------

# Who may make a folder without storage.own_folder's refusal of a link: only where the
# folder is the user's to name (and may be a link of theirs, e.g. results/ on another
# disk). Every other folder kgpt writes into is made by own_folder; a new caller here
# must say why (a planted <run>/oneshot link was once written through, issue 49).
FOLDER_MAKERS = {
    ("gpt2/export.py", "make_folder"): "--out, or the folder holding it: the user's",
    ("gpt2/evaluate.py", "make_folder"): "--json's folder, or the run folder named by RUN=",
    ("gpt2/data/prepare.py", "mkdir"): "CONFIG_DATA_DIR/<dataset>: the user's data folder",
    ("gpt2/eval/hellaswag.py", "mkdir"): "the data folder the file is kept in (CONFIG_DATA_DIR)",
}


def folder_makers(source: str) -> set[str]:
    """The folder-making calls in ``source``: make_folder(), .mkdir(), os.makedirs()."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else \
                getattr(node.func, "id", "")
            if name in ("make_folder", "mkdir", "makedirs"):
                found.add(name)
    return found


def test_only_folders_a_user_names_are_made_without_the_link_check():
    made = {(str(p.relative_to(REPO)), name) for p in PACKAGE.rglob("*.py")
            if p.name != "storage.py" for name in folder_makers(p.read_text())}
    assert made == set(FOLDER_MAKERS)


def test_the_folder_check_finds_a_new_maker():
    assert folder_makers("from gpt2.storage import make_folder\nmake_folder(p / 'oneshot')\n") \
        == {"make_folder"}
    assert folder_makers("import os\nos.makedirs(x)\n(p / 'x').mkdir()\n") == {"makedirs", "mkdir"}
