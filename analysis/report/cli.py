"""``python -m analysis.report``: the command line. The work (analysis/report/make.py) loads once the arguments parse:
``--help`` and a usage error need the standard library only."""
from __future__ import annotations

from agent.cli import make_parser

from . import __doc__ as DOC

__all__ = ["build_parser", "main"]


def build_parser():
    ap = make_parser("python -m analysis.report", DOC, [
        "python -m analysis.report --react runs/react-9b runs/react-27b runs/react-35b --out figures/out",
        "python -m analysis.report --runs runs/*-mmsearch runs/*-simplevqa --judge llm"])
    ap.add_argument("--react", nargs="*", default=[], help="probed ReAct runs (Figures 1 and 2; several are pooled)")
    ap.add_argument("--runs", nargs="*", default=[], help="judged runs (Tables 1, 4, 5; Figure 4)")
    ap.add_argument("--removal-runs", nargs="*", default=[], help="judged ReAct / ReAct-Removal@k runs (Table 3)")
    ap.add_argument("--unload-runs", nargs="*", default=[],
                    help="judged adaptive-unloading runs (--image-unload adaptive): the unloading figure, against the "
                         "--removal-runs and the --react runs' removal replays")
    ap.add_argument("--judge", metavar="NAME", help="which judge's grades: llm, exact, or a second judge's --judge-name "
                                                   "(needed when runs were graded differently)")
    ap.add_argument("--out", default="figures/out", help="where figures (PNG, PDF, CSV) and tables (MD, CSV) go")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if not (a.react or a.runs or a.removal_runs or a.unload_runs):
        ap.error("give --react and/or --runs and/or --removal-runs and/or --unload-runs")
    from .make import report_command  # noqa: PLC0415 - the work loads once the arguments parse

    return report_command(a)
