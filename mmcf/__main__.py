"""``python -m mmcf``: the same as the ``mmcf`` console command (mmcf/cli.py)."""
import sys

from mmcf.cli import main

sys.exit(main())
