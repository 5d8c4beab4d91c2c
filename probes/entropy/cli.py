"""``python -m probes.entropy``: the entropy probe's command line (and its embedded demo); the work
(probes/entropy/command.py) loads once the arguments parse.
"""
from __future__ import annotations

from agent.cli import make_parser, positive_int
from probes.cli import ENTROPY_MODES as MODES
from probes.cli import add_backend_args, add_retokenize_arg

from . import __doc__ as PROBE_DOC

__all__ = ["main"]


def build_parser():
    ap = make_parser("python -m probes.entropy", PROBE_DOC, [
        "python -m probes.entropy                                   # the embedded demo (random model)",
        "python -m probes.entropy runs/react-27b --mode teacher-forced --backend sglang --endpoint http://gpu:30000 "
        "--model-dir /models/Qwen3.5-27B"])
    ap.add_argument("run_dir", nargs="?", help="a ReAct run directory of python -m agent.run (none: the embedded demo)")
    ap.add_argument("--mode", default="regenerate", choices=MODES,
                    help="regenerate = the paper's (resample under τ^IR); teacher-forced = score the recorded tokens")
    add_backend_args(ap)
    add_retokenize_arg(ap)
    ap.add_argument("--force", action="store_true", help="probe with a model other than the run's, or a server that "
                                                          "failed the fidelity check (both recorded)")
    ap.add_argument("--skip-fidelity", action="store_true",
                    help="do not run the serving-fidelity check first (probes/fidelity/; recorded in probe.json)")
    ap.add_argument("--include-unparsed", action="store_true",
                    help="keep trajectories whose first call did not parse (the paper excludes them; recorded)")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="trajectories in flight (default: 128 per model server, 8 in-process; probes/cli.py says why)")
    ap.add_argument("--limit", type=positive_int, help="probe the first N trajectories only")
    ap.add_argument("--out", help="output dir (default: RUN_DIR/probes/entropy-MODE)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--demo-dir", default="runs/demo-entropy", help="demo: where the demo run is written")
    ap.add_argument("--demo-samples", type=int, default=3, help="demo: how many demo questions")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .command import entropy_command  # noqa: PLC0415 - the work loads once the arguments parse

    return entropy_command(args)
