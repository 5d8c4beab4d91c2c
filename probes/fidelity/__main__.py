"""``python -m probes.fidelity``: see probes/fidelity/cli.py."""
import sys

from .cli import main

sys.exit(main())
