"""``python -m agent.rundir check RUN_DIR [--repair] [--json]`` and ``python -m agent.rundir merge OUT SHARD...``."""
import sys

from .check import main as check_main
from .merge import main as merge_main

args = sys.argv[1:]
sys.exit(merge_main(args[1:]) if args[:1] == ["merge"] else check_main(args))
