"""``python -m agent.rundir check RUN_DIR``, ``merge OUT SHARD...``, ``export RUN_DIR OUT``, ``schema --out DIR``."""
import sys

from .cli import main

sys.exit(main())
