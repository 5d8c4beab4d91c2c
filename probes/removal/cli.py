"""``python -m probes.removal``: the command line. The work (probes/removal/replays.py) loads once the arguments parse:
``--help`` and a usage error need the standard library only."""
from __future__ import annotations

from agent.cli import add_judge_args, make_parser, positive_int
from probes.cli import add_backend_args, add_retokenize_arg

from . import __doc__ as DOC

__all__ = ["build_parser", "main"]


def build_parser():
    ap = make_parser("python -m probes.removal", DOC, [
        "python -m probes.removal runs/react-27b --steps 1..5          # judged by the paper's LLM judge",
        "python -m probes.removal runs/demo-react --steps 1..3 --judge exact --backend scripted"])
    ap.add_argument("run_dir", help="a plain ReAct run directory")
    ap.add_argument("--steps", default="1..5", help="k values: 1..5, or 1,2,4")
    add_backend_args(ap)
    add_retokenize_arg(ap)
    ap.add_argument("--judge", default="llm", choices=("llm", "exact"),
                    help="llm = the paper's E.5 judge; exact = offline exact match (labelled so)")
    add_judge_args(ap)
    ap.add_argument("--concurrency", type=int, default=None,
                    help="trajectories in flight (default: 128 per model server, 8 in-process; probes/cli.py says why)")
    ap.add_argument("--limit", type=positive_int, help="the first N trajectories only")
    ap.add_argument("--force", action="store_true", help="replay with a model other than the run's (recorded)")
    ap.add_argument("--out", help="output dir (default: RUN_DIR/probes/removal)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    from .replays import removal_command  # noqa: PLC0415 - the work loads once the arguments parse

    return removal_command(a)
