"""``python -m agent.run``: the command line of the runner (its flags and exit statuses); the work is
agent/run/command.py, which loads after the arguments parse (``--help`` and a usage error need the standard library
only)."""
from __future__ import annotations

import argparse
import os

from ..choices import CACHE_MODES as MODES
from ..choices import (
    DEFAULT_PATIENCE,
    DEFAULT_THRESHOLD,
    DEFAULT_TOP_LOGPROBS,
    EMBEDDED_MAX_TOKENS,
    HISTORY_REASONING,
    METHODS,
    PROCESS_CONCURRENCY,
    PROTOCOLS,
    SERVED_MAX_TOKENS,
    UNLOAD_SIGNALS,
    VARIANTS,
    WEBWATCHER_OBSERVATION_IMAGES,
)
from ..cli import (
    DEFAULT_CONCURRENCY,
    add_backend_args,
    make_parser,
    positive_float,
    positive_int,
    temperature,
    top_logprobs,
    top_p,
)
from . import __doc__ as RUN_DOC

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python -m agent.run", RUN_DOC, [
        "python -m agent.run --method react --out runs/demo-react                       # embedded tiny model, offline world",
        "python -m agent.run --method mmcontextfold --backend scripted --out runs/demo-mmcf   # the scripted FAKE demo model",
        "python -m agent.run --method react --benchmark DATA/mmsearch --backend sglang --endpoint http://gpu:30000 "
        "--model-dir /models/Qwen3.5-27B --tools live --trials 3 --out runs/mmsearch-react-27b"])
    ap.add_argument("--method", required=True, choices=METHODS, help="the agent (docs/usage.md: Agents)")
    ap.add_argument("--variant", default="", choices=VARIANTS, help="MM-ContextFold ablation (paper §4.3)")
    ap.add_argument("--protocol", default="paper", choices=PROTOCOLS,
                    help="paper (default; the release where the paper is silent) or release: MM-ContextFold exactly as "
                         "the authors' code runs it, call for call (docs/fidelity.md)")
    ap.add_argument("--remove-images-from-step", type=int, metavar="K", help="ReAct-Removal@K (paper §3.2.3)")
    _release_args(ap)
    _backend_args(ap)
    _sampling_args(ap)
    _tools_args(ap)
    _control_args(ap)
    return ap


def _release_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("adaptive image unloading (ReAct only; ours, agent/methods/unload.py)")
    g.add_argument("--image-unload", default="keep", choices=("keep", "adaptive"),
                   help="adaptive: probe each step's thinking without the query images (teacher-forced) and remove "
                        "them once their influence stays below the threshold (needs a scoring backend)")
    g.add_argument("--unload-signal", choices=UNLOAD_SIGNALS,
                   help="kl = mean KL(with || without) over think tokens; dH = how much the images lower the think "
                        "entropy, max(0, -ΔH_t) (default: kl, or the calibration file's)")
    g.add_argument("--unload-threshold", metavar="EPS|CALIBRATION.json",
                   help=f"ε in nats, or the calibration.json of python -m probes.calibrate_unload "
                        f"(default: {DEFAULT_THRESHOLD['kl']} for kl, {DEFAULT_THRESHOLD['dH']} for dH; ours, uncalibrated)")
    g.add_argument("--unload-patience", type=int, metavar="M",
                   help=f"consecutive steps below ε before unloading (default: {DEFAULT_PATIENCE}, or the "
                        "calibration file's)")
    ap.add_argument("--benchmark", default="demo", help="'demo' (offline) or a benchmark dir / data_unified.jsonl")
    ap.add_argument("--out", required=True, metavar="RUN_DIR", help="the run directory (created, or resumed)")
    ap.add_argument("--trials", type=int, default=1, help="independent trials per sample (paper: 3)")
    ap.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="samples in flight (over all processes)")
    ap.add_argument("--processes", type=_processes_arg, default="auto",
                    help=f"runner processes sharing the jobs (decoding top-20 replies is CPU-bound); auto (default): "
                         f"one per {PROCESS_CONCURRENCY} samples in flight, at most one per CPU")
    ap.add_argument("--limit", type=positive_int, help="the first N samples only")
    ap.add_argument("--shard", type=_shard_arg, metavar="I/N",
                    help="run part I of N (0 <= I < N) of the (sample, trial) units into --out, a directory of its "
                         "own (its own tool cache); needs --seed. Merge the parts with python -m agent.rundir merge "
                         "(docs/serving.md: Scaling out)")
    ap.add_argument("--sample-ids", help="comma-separated ids to run")
    ap.add_argument("--selection", metavar="FILE",
                    help="run the ids a selection file holds for this benchmark (python -m agent.benchmarks subset "
                         "DATA --random-per-benchmark 100 --seed S: the B_max sweep's 700 samples, D.2); recorded in "
                         "header.json")


def _backend_args(ap: argparse.ArgumentParser) -> None:
    add_backend_args(ap, default="local", repeat_endpoint=True)
    ap.set_defaults(logprob_mode=None)  # the launcher's record of the endpoints, else scaled (resolve_logprob_mode)


def _sampling_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("sampling (paper defaults)")
    g.add_argument("--temperature", type=temperature, default=0.2, help="paper B.1")
    g.add_argument("--top-p", type=top_p, default=0.95, help="paper B.1")
    g.add_argument("--max-tokens", type=int, help=f"per call (default {SERVED_MAX_TOKENS}, the paper's release; "
                                                  f"{EMBEDDED_MAX_TOKENS} on the tiny model)")
    g.add_argument("--top-logprobs", type=top_logprobs, default=None,
                   help=f"alternatives per token (paper: {DEFAULT_TOP_LOGPROBS}; with --server openrouter 0 unless given: "
                        "no logprob fields are sent, as the release sends none)")
    g.add_argument("--seed", type=int, help="base seed, trial t uses seed + t (honoured by SGLang only with "
                                            "--enable-deterministic-inference); default: drawn once per run and "
                                            "recorded in header.json, so trials are independent on every server")
    g.add_argument("--no-thinking", dest="thinking", action="store_false", help="render prompts with thinking off")
    g.add_argument("--t-max", type=int, default=20, help="LLM calls per trajectory (paper: 20)")
    g.add_argument("--b-max", type=int, default=5, help="calls per branch (paper: 5)")
    g.add_argument("--history-reasoning", default="keep", choices=HISTORY_REASONING,
                   help="keep each step's reasoning in the history as reasoning_content (the chat template decides "
                        "what it renders; paper B.3) or drop it")
    g.add_argument("--observation-images", type=int, default=WEBWATCHER_OBSERVATION_IMAGES, metavar="N",
                   help="lens result images put into the observation (WebWatcher: 5; 0 = none)")


def _tools_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("tools")
    g.add_argument("--tools", default="offline", choices=("offline", "live"),
                   help="offline = the shipped demo world; live = Serper / Jina (keys from the environment)")
    g.add_argument("--world", help="offline world dir (default: the shipped demo world)")
    g.add_argument("--tool-cache", help="SQLite cache path (default RUN_DIR/tools.sqlite)")
    g.add_argument("--cache-mode", default="readwrite", choices=MODES, help="replay = exact replays (a miss is an error)")
    g.add_argument("--live-fallback", action="store_true", help="replay mode: call the tool on a cache miss")


def _control_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("run control")
    g.add_argument("--timeout", type=positive_float, help="seconds per sample (ends it as status=timeout)")
    g.add_argument("--retry-errors", action="store_true", help="rerun pairs that ended in error/timeout")
    g.add_argument("--max-consecutive-errors", type=int, default=10, metavar="N",
                   help="stop the run after N harness errors in a row (0 = never)")
    g.add_argument("--allow-missing-images", action="store_true",
                   help="run the samples whose images load, skip (and list) the others; with --protocol release, "
                        "a file that is no image is sent as the release sends it (its calls fail there as here)")
    g.add_argument("--skip-bad-rows", action="store_true",
                   help="run the manifest's rows that can be run when some cannot (broken JSON, no id, no image "
                        "listed...); without it such a manifest is refused (the rows are recorded in header.json)")
    g.add_argument("--max-image-mb", type=float, help="image size limit in MB (default 20; MMCF_MAX_IMAGE_MB)")
    g.add_argument("--image-cache-mb", type=float,
                   help="memory for images held as bytes (data URIs, downloads) and encoded data URIs, per process, "
                        "least recently used out first (default 512; MMCF_IMAGE_CACHE_MB; 0: no cache); a file's "
                        "image is read again from its file when sent")
    g.add_argument("--request-timeout", type=positive_float, default=600.0, metavar="S",
                   help="seconds one model-server request may take before it is retried (default 600)")
    g.add_argument("--allow-unverified-server", action="store_true",
                   help="resume although the server cannot say the facts the run recorded (its /server_info answers "
                        "404 or lacks a field such as dtype): recorded in header.json")
    g.add_argument("--force", action="store_true", help="--out holds a different run (another method, benchmark, model, sampling…): move it aside to "
                        "OUT.replaced-TIME (printed; never deleted) and start this run afresh")
    g.add_argument("--dry-run", action="store_true",
                   help="project what the planned units cost (tokens, GPU time, tool calls, money) and stop: from "
                        "--pilot's ledger, else from the paper's Table 4; nothing runs or is written (agent/rundir/ledger.py)")
    g.add_argument("--pilot", metavar="RUN_DIR", help="--dry-run: a finished run of the same method to project from")
    g.add_argument("--prices", metavar="FILE", help="--dry-run: a price table (agent/rundir/ledger.py DEFAULT_PRICES' layout)")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    g.add_argument("--token-precision", default="float32", choices=("float32", "float16"),
                   help="storage of the top-k logprobs in the token sidecar (float16: ~35%% smaller, lossy)")


def _shard_arg(v: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in v.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"I/N (e.g. 0/4), not {v!r}") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"I/N needs 0 <= I < N, not {v!r} (shards are numbered from 0, as Slurm's "
                                         "--array=0-(N-1))")
    return i, n


def _processes_arg(v: str):
    if v == "auto":
        return v
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"auto or an integer >= 1, not {v!r}")
    cap = 2 * (os.cpu_count() or 1)
    if n > cap:  # more only share the same cores, each with its own copy of the tokenizer and tools
        raise argparse.ArgumentTypeError(f"{n} processes on a machine with {os.cpu_count()} CPUs: at most {cap} "
                                         "(one per 128 samples in flight is plenty: --processes auto)")
    return n


def main(argv=None) -> int:
    """Exit status: 0 all units finished; 2 refused before any work (a preflight check, a bad argument);
    3 finished, but some units ended in ``error``/``timeout`` (rerun with ``--retry-errors``); 4 stopped
    after ``--max-consecutive-errors`` harness errors in a row; 5 the disk is full (finished units kept; free
    space and rerun); 6 the model server stopped answering (finished units kept; rerun once it is back); 130
    interrupted (rerun to resume)."""

    a = build_parser().parse_args(argv)
    # the work (numpy, pydantic, the HTTP clients) loads once the arguments parse
    from .command import run_command  # noqa: PLC0415

    return run_command(a, argv)
