"""``python -m probes.grounding``: see probes/grounding/cli.py."""
import sys

from .cli import main

sys.exit(main())
