"""``python -m gpt2.cli <target>``: what every make target runs (gpt2/cli/__init__.py)."""

import os
import sys

from gpt2.cli import main

if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # `make help | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
