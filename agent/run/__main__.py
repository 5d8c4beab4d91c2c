"""``python -m agent.run``: see agent/run/cli.py."""
import sys

from .cli import main

sys.exit(main())
