"""``python -m agent.rundir check RUN_DIR [--repair] [--json]``."""
import sys

from .check import main

sys.exit(main())
