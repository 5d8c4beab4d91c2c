"""``python -m agent.show``: see agent/show/cli.py."""
import sys

from .cli import main

sys.exit(main())
