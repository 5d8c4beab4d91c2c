"""``python -m agent.benchmarks``: see agent/benchmarks/cli.py."""
import sys

from .cli import main

sys.exit(main())
