"""``python -m agent.judge``: see agent/judge/cli.py."""
import sys

from .cli import main

sys.exit(main())
