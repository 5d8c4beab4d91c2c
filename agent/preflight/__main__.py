"""``python -m agent.preflight``: see agent/preflight/cli.py."""
import sys

from .cli import main

sys.exit(main())
