"""The presets in defconfigs/: `make defconfig-<name>` writes one to .config, and
`make help` lists each with its description, the first comment line of the file.
Standard library only (`make help` imports it)."""

from __future__ import annotations

from gpt2 import REPO

DEFCONFIG_DIR = REPO / "defconfigs"
# `make defconfig` with no name, as in the kernel: the preset that runs on any machine.
DEFAULT_DEFCONFIG = "gpt2-shakespeare-cpu"


def defconfig_names() -> list[str]:
    return sorted(p.name for p in DEFCONFIG_DIR.iterdir() if p.is_file())


def describe_defconfig(name: str) -> str:
    """First comment line of a defconfig: its one-line description."""
    for line in (DEFCONFIG_DIR / name).read_text(errors="replace").splitlines():
        if line.startswith("#") and line.strip("# "):
            return line.lstrip("# ").strip()
    return ""
