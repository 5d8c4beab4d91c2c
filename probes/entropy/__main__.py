"""``python -m probes.entropy``: see probes/entropy/cli.py."""
import sys

from .cli import main

sys.exit(main())
