"""``python -m probes.prefix_cache``: see probes/prefix_cache/cli.py."""
import sys

from .cli import main

sys.exit(main())
