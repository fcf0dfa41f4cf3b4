"""`make help`: the targets of the table in gpt2/cli/__init__.py, section by
section, then the make variables and the presets. Standard library only: `make
help` runs with the system python3, before the virtual environment exists."""

from __future__ import annotations

from gpt2.cli import DEFAULT_TARGET, SECTIONS, TARGETS
from gpt2.cli.presets import defconfig_names, describe_defconfig
from gpt2.processes import terminal_safe

TITLE = "kgpt: train GPT-2 models from a Kconfig .config"
VARIABLES = """\
Variables:
  TRAIN_ARGS="--max-iters 20"  extra train.py flags, last one wins (every matrix cell)
  NGPU=8            train with 8 processes (GPUs) through torchrun and DDP
  TORCHRUN_ARGS=    torchrun rendezvous flags for several machines (README)
  IF_CHANGED=rerun  a result made under other code or data is set aside and trained
                    again (reuse: reported or resumed anyway; default: refuse, saying why)
  SLURM=1           `make`/`make train`: submit the run to Slurm (the Slurm menu)
  DETACH=1          a Slurm matrix: submit and return; a job writes the report
  DRY_RUN=1         print what would run      V=1  print full commands
  PYTHON=/path      use this Python instead of creating .venv
  KCONFIG_CONFIG=   use another configuration file instead of .config"""
NAME_WIDTH = 16  # a target's name, then two spaces, then its help


def text() -> str:
    lines = [TITLE]
    for section, heading in SECTIONS.items():
        lines += ["", f"{heading}:"]
        for target in TARGETS:
            if target.section != section:
                continue
            name = target.name + (" (default)" if target.name == DEFAULT_TARGET else "")
            first, *more = target.help.splitlines()
            lines.append(f"  {name:<{NAME_WIDTH}}  {first}")
            lines += [" " * (NAME_WIDTH + 4) + line for line in more]
    lines += ["", VARIABLES, "", "Defconfigs (make defconfig-<name>):"]
    lines += [f"  {name:<32}{describe_defconfig(name)}" for name in defconfig_names()]
    return "\n".join(lines)


def cmd_help() -> int:
    print(terminal_safe(text()))  # (defconfigs' names and comments are anyone's files)
    return 0
