"""``python -m agent.preflight``: the command line. The work (agent/preflight/checks.py) loads once the arguments parse:
``--help`` and a usage error need the standard library only."""
from __future__ import annotations

from agent.cli import add_backend_args, make_parser

__all__ = ["build_parser", "main"]


def build_parser():
    ap = make_parser("python -m agent.preflight", main.__doc__, [
        "python -m agent.preflight --benchmark DATA/mmsearch --backend sglang --endpoint http://gpu:30000 "
        "--model-dir /models/Qwen3.5-27B --tools live --judge-api-key-env OPENROUTER_API_KEY",
        "python -m agent.preflight --benchmark demo --backend local"])
    ap.add_argument("--benchmark", help="a benchmark dir whose images must all load (default: none checked)")
    ap.add_argument("--tools", choices=("offline", "live"), default="offline",
                    help="live: the search / visit / lens keys and the lens image-URL configuration")
    ap.add_argument("--judge-api-key-env", action="append", default=[], metavar="VAR",
                    help="an API key a judge or annotator stage needs (repeatable)")
    add_backend_args(ap, default=None, repeat_endpoint=True,
                     title="the model server to check (default: none; several --endpoint must serve one model)")
    ap.set_defaults(logprob_mode=None)  # the backend's own: scaled for SGLang, raw for vLLM (agent/backends/vllm.py)
    return ap


def main(argv=None) -> int:
    """``python -m agent.preflight``: every check a chain of commands needs, before the first one starts.

    Used by ``scripts/reproduce_figure2.sh``; exit 0 when everything a later stage needs is in place, 2 (with
    every problem listed) otherwise.
    """
    a = build_parser().parse_args(argv)
    from .checks import preflight_command  # noqa: PLC0415 - the work loads once the arguments parse

    return preflight_command(a)
