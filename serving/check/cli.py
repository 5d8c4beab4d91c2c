"""``python -m serving.check``: the command line. The work (serving/check/smoke.py) loads once the arguments parse:
``--help`` and a usage error need the standard library only."""
from __future__ import annotations

from agent.cli import add_backend_args, make_parser, positive_float, top_logprobs

from . import __doc__ as DOC

__all__ = ["build_parser", "main"]


def build_parser():
    ap = make_parser("python -m serving.check", DOC, [
        "python -m serving.check --endpoint http://localhost:30000                          # OpenAI chat API",
        "python -m serving.check --backend sglang --endpoint http://localhost:30000 --model-dir /models/Qwen3.5-27B",
        "python -m serving.check --json                                                     # the embedded tiny model"])
    add_backend_args(ap, default=None, title="model backend (default: openai with --endpoint, else local)")
    ap.add_argument("--image", help="image file (default: a generated test image)")
    ap.add_argument("--prompt", default="Describe this image in one sentence.", help="the request's text")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens to generate")
    ap.add_argument("--top-logprobs", type=top_logprobs, default=20, help="alternatives per token")
    ap.add_argument("--retries", type=int, default=2, help="retries on 429/5xx/connection errors")
    ap.add_argument("--timeout", type=positive_float, default=120.0, help="seconds per request")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .smoke import check_command  # noqa: PLC0415 - the work loads once the arguments parse

    return check_command(args)
