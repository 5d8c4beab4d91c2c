"""``python -m probes.grounding``: the command line. The work (probes/grounding/annotate.py) loads once the arguments parse:
``--help`` and a usage error need the standard library only."""
from __future__ import annotations

import sys

from agent.cli import add_judge_args, make_parser, positive_int

from . import __doc__ as DOC

__all__ = ["build_parser", "main"]


# --judge names the judge as the judge command and the removal probe do (llm: a model behind an OpenAI-compatible
# server); "openai" was this flag's value when it was --judge-backend
JUDGES = ("llm", "local", "scripted")


def _judge_kind(v: str) -> str:
    if v == "openai":
        print("notice: --judge openai is now --judge llm; the old value works in this version only", file=sys.stderr)
        return "llm"
    return v


def build_parser():
    ap = make_parser("python -m probes.grounding", DOC, [
        "python -m probes.grounding runs/react-27b                      # Gemini-3-Flash on OpenRouter",
        "python -m probes.grounding runs/react-27b --judge-endpoint http://gpu:30001 --judge-model qwen3.5-27b",
        "python -m probes.grounding runs/demo-react --judge scripted   # the FAKE demo annotator"])
    ap.add_argument("run_dir", help="a ReAct run directory")
    add_judge_args(ap, role="annotator", repeat_endpoint=True)
    ap.add_argument("--judge", type=_judge_kind, choices=JUDGES, default="llm",
                    help="llm = the model at the server above; local = an in-process model (--judge-model-dir, "
                         "default the embedded tiny model); scripted = the FAKE demo annotator")
    ap.add_argument("--judge-model-dir", help="the in-process annotator's model directory")
    ap.add_argument("--re-asks", type=int, default=2, help="re-asks for an unusable or invalid reply")
    ap.add_argument("--observation-chars", type=int, default=1500, help="each observation is cut at this length")
    ap.add_argument("--max-tokens", type=int, default=8192, help="per annotator reply")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="trajectories annotated at once (default: 8 per annotator server; OpenRouter's rate limits)")
    ap.add_argument("--limit", type=positive_int, help="the first N trajectories only")
    ap.add_argument("--include-unparsed", action="store_true",
                    help="keep trajectories whose first call did not parse (the paper excludes them)")
    ap.add_argument("--out", help="output dir (default: RUN_DIR/probes/grounding)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    from .annotate import grounding_command  # noqa: PLC0415 - the work loads once the arguments parse

    return grounding_command(a)
