"""``python -m agent.show``: see agent/show/cli.py."""
import os
import sys

from .cli import main

try:
    sys.exit(main())
except BrokenPipeError:  # `python -m agent.show RUN | head`: the reader left; not an error
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
