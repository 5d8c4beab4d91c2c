"""``python -m serving.check``: see serving/check/cli.py."""
import sys

from .cli import main

sys.exit(main())
