"""``python -m probes.calibrate_unload``: see probes/calibrate_unload/cli.py."""
import sys

from .cli import main

sys.exit(main())
