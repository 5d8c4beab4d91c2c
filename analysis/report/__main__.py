"""``python -m analysis.report``: see analysis/report/cli.py."""
import sys

from .cli import main

sys.exit(main())
