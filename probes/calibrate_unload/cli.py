"""``python -m probes.calibrate_unload``: the command line. The work (probes/calibrate_unload/calibrate.py) loads once the arguments parse:
``--help`` and a usage error need the standard library only."""
from __future__ import annotations

from agent.choices import UNLOAD_SIGNALS as SIGNALS
from agent.cli import make_parser

from . import __doc__ as DOC

__all__ = ["build_parser", "main"]


def build_parser():
    ap = make_parser("python -m probes.calibrate_unload", DOC, [
        "python -m probes.calibrate_unload runs/react-27b",
        "python -m probes.calibrate_unload runs/fig2-demo --signal dH --patience 1,2"])
    ap.add_argument("run_dir", help="a ReAct run with the teacher-forced entropy probe and the removal probe")
    ap.add_argument("--signal", choices=SIGNALS, default="kl", help="the influence the threshold applies to")
    ap.add_argument("--patience", default="1,2,3", help="the M values to consider (comma-separated)")
    ap.add_argument("--out", help="output dir (default: RUN_DIR/probes/calibrate_unload)")
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    from .calibrate import calibrate_command  # noqa: PLC0415 - the work loads once the arguments parse

    return calibrate_command(a)
