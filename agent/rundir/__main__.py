"""``python -m agent.rundir check RUN_DIR``, ``merge OUT SHARD...``, ``export RUN_DIR OUT``, ``schema --out DIR``."""
import sys

from .check import main as check_main
from .export import main as export_main
from .merge import main as merge_main
from .schema import main as schema_main

args = sys.argv[1:]
commands = {"merge": merge_main, "export": export_main, "schema": schema_main}
sys.exit(commands[args[0]](args[1:]) if args[:1] and args[0] in commands else check_main(args))
