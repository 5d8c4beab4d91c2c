"""``python -m probes.removal``: see probes/removal/cli.py."""
import sys

from .cli import main

sys.exit(main())
