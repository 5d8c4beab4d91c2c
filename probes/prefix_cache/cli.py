"""``python -m probes.prefix_cache``: the command line. The work (probes/prefix_cache/model.py) loads once the arguments parse:
``--help`` and a usage error need the standard library only."""
from __future__ import annotations

from agent.cli import make_parser, positive_int
from serving.plan import ACTIVE_PARAMS, DEFAULT_MFU, H20_TFLOPS, SLOTS_PER_REQUEST, STATE_GRID, prefill_rate

from . import __doc__ as DOC

__all__ = ["build_parser", "main"]


def build_parser():
    ap = make_parser("python -m probes.prefix_cache", DOC, [
        "python -m probes.prefix_cache runs/react-27b --model-dir /models/Qwen3.5-27B --servers 2",
        "python -m probes.prefix_cache runs/fig2-demo --capacity-tokens 20000   # the demo, a small cache"])
    ap.add_argument("run_dir", help="a ReAct run directory")
    ap.add_argument("--mode", choices=("regenerate", "teacher-forced"), default="regenerate")
    ap.add_argument("--model-dir", help="the model's tokenizer and chat template (default: the run's)")
    ap.add_argument("--capacity-tokens", type=int, default=1_000_000,
                    help="each server's KV pool in tokens (default 1M; SGLang logs its max_total_num_tokens at start)")
    ap.add_argument("--servers", type=int, default=2, help="servers the probe spreads over")
    ap.add_argument("--concurrency", type=int, default=128, help="trajectories in flight per server (the probes' default)")
    ap.add_argument("--limit", type=positive_int, help="the first N trajectories")
    ap.add_argument("--state-grid", type=int, default=STATE_GRID,
                    help=f"Qwen3.5's hybrid cache: SGLang's linear-attention checkpoint grid (default {STATE_GRID}, "
                         "its lcm of the cache chunk and the page; 0 = token-level only)")
    ap.add_argument("--state-slots", type=positive_int, metavar="N",
                    help="each server's linear-attention state pool in slots, as the launcher's dry run prints it "
                         f"(each request in flight holds {SLOTS_PER_REQUEST}; default: unbounded)")
    ap.add_argument("--gpu-cost", action="store_true",
                    help="add prefill GPU-seconds per Figure 2 panel and backbone (an estimate: see above)")
    ap.add_argument("--gpu-tflops", type=float, default=H20_TFLOPS, help="dense bf16 TFLOPS per GPU (default: H20's)")
    ap.add_argument("--mfu", type=float, default=DEFAULT_MFU,
                    help=f"the share of --gpu-tflops a prefill reaches (default {DEFAULT_MFU:g})")
    ap.add_argument("--prefill-rate", action="append", metavar="SIZE=RATE",
                    help="a backbone's measured prefill tokens per GPU-second (replaces the FLOPs model for it)")
    ap.add_argument("--observed", metavar="PROBE_DIR", nargs="?", const="",
                    help="set the server's recorded cached_tokens beside the model's prediction, request by request: "
                         "an entropy probe's regenerate output (default RUN_DIR/probes/entropy-regenerate); pass the "
                         "--servers and --concurrency it ran with; writes cache_calibration.json there")
    return ap


def _rates(a, ap) -> dict:
    """Tokens per GPU-second per backbone: the FLOPs model, then any measured --prefill-rate."""
    rates = {k: prefill_rate(k, a.gpu_tflops, a.mfu) for k in ACTIVE_PARAMS}
    for item in a.prefill_rate or []:
        size, _, v = item.partition("=")
        try:
            rates[size] = float(v)
        except ValueError:
            rates[size] = -1.0
        if size not in ACTIVE_PARAMS or rates[size] <= 0:
            ap.error(f"--prefill-rate {item!r}: want SIZE=TOKENS_PER_GPU_SECOND with SIZE one of "
                     f"{', '.join(ACTIVE_PARAMS)} and a positive rate")
    return rates


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.servers < 1 or a.capacity_tokens < 1 or a.concurrency < 1 or a.state_grid < 0:
        ap.error("--servers, --capacity-tokens and --concurrency must be positive, --state-grid >= 0")
    if not (a.gpu_tflops > 0 and 0 < a.mfu <= 1):
        ap.error("--gpu-tflops must be positive and --mfu in (0, 1]")
    if a.gpu_cost and not a.state_grid:
        ap.error("--gpu-cost compares the token-level bound with the hybrid cache: it needs --state-grid > 0")
    a.prefill_rates = _rates(a, ap)
    from .model import prefix_cache_command  # noqa: PLC0415 - the work loads once the arguments parse

    return prefix_cache_command(a)
