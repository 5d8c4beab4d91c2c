"""``python -m probes.fidelity``: the command line. The work (probes/fidelity/checks.py) loads once the arguments parse:
``--help`` and a usage error need the standard library only."""
from __future__ import annotations

from agent.cli import make_parser
from probes.cli import add_backend_args

from . import __doc__ as DOC

__all__ = ["build_parser", "main"]


def build_parser():
    ap = make_parser("python -m probes.fidelity", DOC, [
        "python -m probes.fidelity runs/react-27b --backend sglang --endpoint http://gpu:30000 --model-dir /models/Qwen3.5-27B"])
    ap.add_argument("run_dir", help="a run directory with recorded tokens")
    add_backend_args(ap)
    ap.add_argument("--samples", type=int, default=8, help="calls to check (one per trajectory; default 8)")
    ap.add_argument("--reference-model-dir", help="local weights: also compare with the in-process transformers model")
    ap.add_argument("--no-paths", action="store_true", help="skip the native-vs-chat path check")
    ap.add_argument("--force", action="store_true", help="exit 0 even when a check fails (recorded)")
    ap.add_argument("--out", help="output dir (default: RUN_DIR/probes/fidelity)")
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    from .checks import fidelity_command  # noqa: PLC0415 - the work loads once the arguments parse

    return fidelity_command(a)
