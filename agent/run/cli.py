"""``python -m agent.run``: the command line of the runner (its flags, --dry-run, exit statuses)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import sys
from pathlib import Path

from ..backends.base import DEFAULT_TOP_LOGPROBS, ModelServerDown
from ..backends.images import set_image_cache_mb
from ..benchmarks import resolve_benchmark
from ..cli import (
    DEFAULT_CONCURRENCY,
    add_backend_args,
    done,
    make_parser,
    positive_float,
    positive_int,
    temperature,
    top_logprobs,
    top_p,
)
from ..errors import EXIT_DISK_FULL, ToolkitError, disk_full_message
from ..methods import METHODS, PROTOCOLS, VARIANTS
from ..methods.common import HISTORY_REASONING, WEBWATCHER_OBSERVATION_IMAGES
from ..methods.unload import DEFAULT_PATIENCE, DEFAULT_THRESHOLD
from ..redact import safe_argv
from ..rundir.ledger import format_projection, load_prices, project
from ..rundir.shards import shard_units
from ..tools import MODES
from . import __doc__ as RUN_DOC
from .config import EMBEDDED_MAX_TOKENS, PROCESS_CONCURRENCY, SERVED_MAX_TOKENS, RunConfig, all_units, select_samples
from .execute import EXIT_SERVER_DOWN
from .runner import TERMINATED, run

log = logging.getLogger(__name__)

__all__ = ["build_parser", "config_from_args", "main"]


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
    g.add_argument("--unload-signal", choices=("kl", "dH"),
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
                   help="run the samples whose images load, skip (and list) the others")
    g.add_argument("--skip-bad-rows", action="store_true",
                   help="run the manifest's rows that can be run when some cannot (broken JSON, no id, no image "
                        "listed...); without it such a manifest is refused (the rows are recorded in header.json)")
    g.add_argument("--max-image-mb", type=float, help="image size limit in MB (default 20; MMCF_MAX_IMAGE_MB)")
    g.add_argument("--image-cache-mb", type=float,
                   help="memory for read and encoded images, per process, least recently used out first (default "
                        "512; MMCF_IMAGE_CACHE_MB; 0: no cache)")
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


def _top_logprobs(a) -> int:
    """The paper's top-20 (B.4), except on OpenRouter and under --protocol release, where logprobs are asked for only
    when the user asks (many OpenRouter providers send none; the release sends no logprob fields,
    utils/search_backbone_model.py:116-122)."""
    if a.top_logprobs is not None:
        return a.top_logprobs
    if a.protocol == "release" or (a.backend == "openai" and a.server == "openrouter"):
        return 0
    return DEFAULT_TOP_LOGPROBS


def config_from_args(a) -> RunConfig:
    return RunConfig(
        method=a.method, out=a.out, benchmark=a.benchmark, variant=a.variant, protocol=a.protocol,
        remove_images_from_step=a.remove_images_from_step, image_unload=a.image_unload,
        unload_signal=a.unload_signal, unload_threshold=a.unload_threshold, unload_patience=a.unload_patience,
        trials=a.trials, concurrency=a.concurrency, limit=a.limit,
        sample_ids=[x for x in (a.sample_ids or "").split(",") if x] or None, selection=a.selection,
        backend=a.backend, endpoints=a.endpoint,
        model=a.model, model_dir=a.model_dir, logprob_mode=a.logprob_mode, server="vllm" if a.backend == "vllm" else a.server, api_key_env=a.api_key_env,
        temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens, top_logprobs=_top_logprobs(a), seed=a.seed,
        thinking=a.thinking, t_max=a.t_max, b_max=a.b_max, history_reasoning=a.history_reasoning,
        observation_images=a.observation_images, max_consecutive_errors=a.max_consecutive_errors,
        allow_missing_images=a.allow_missing_images, skip_bad_rows=a.skip_bad_rows, max_image_mb=a.max_image_mb, request_timeout=a.request_timeout,
        tools=a.tools, world=a.world, tool_cache=a.tool_cache,
        cache_mode=a.cache_mode, live_fallback=a.live_fallback, timeout=a.timeout, retry_errors=a.retry_errors,
        force=a.force, allow_unverified_server=a.allow_unverified_server, progress=a.progress, token_precision=a.token_precision, processes=a.processes, shard=a.shard)


def _dry_run(cfg: RunConfig, a) -> int:
    """--dry-run: the planned units and what they are expected to cost; nothing runs, nothing is written."""


    manifest = resolve_benchmark(cfg.benchmark)
    samples = select_samples(manifest, cfg)
    units = all_units(cfg, samples)
    if cfg.shard is not None:
        units = shard_units(units, *cfg.shard)
    cache = cfg.tool_cache or str(Path(cfg.out) / "tools.sqlite")
    p = project(cfg.spec().method, len(units), samples, pilot=a.pilot, cache_path=cache, prices=load_prices(a.prices))
    print("\n".join(format_projection(p)))
    return 0


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
    if a.max_image_mb:
        os.environ["MMCF_MAX_IMAGE_MB"] = str(a.max_image_mb)  # read by every image load, children included
    if a.image_cache_mb is not None:
        if a.image_cache_mb < 0:
            log.error("error: --image-cache-mb must be >= 0")
            return 2

        set_image_cache_mb(a.image_cache_mb)  # and the environment, which worker processes inherit
    try:
        cfg = config_from_args(a)
        cfg.spec()  # validate method/variant/removal before touching anything
        if a.dry_run:
            return _dry_run(cfg, a)
        summary = asyncio.run(run(cfg, argv))
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 143 if TERMINATED["by"] else 130
    except ModelServerDown as e:  # mid-run: the finished units are written, those in flight resume on the rerun
        log.error(f"error: {e}")
        return EXIT_SERVER_DOWN
    except (ToolkitError, ValueError, OSError) as e:
        full = disk_full_message(e, a.out, "Finished units")
        if full:
            log.error(full)
            return EXIT_DISK_FULL
        log.error(f"error: {e}")
        return 2
    bad = sum(summary.get("counts", {}).get(k, 0) for k in ("error", "timeout"))
    # printed: never the URL's credentials nor a key's value (safe_argv)
    retry = shlex.join(["python", "-m", "agent.run", *safe_argv(sys.argv[1:] if argv is None else argv)]
                       + ([] if a.retry_errors else ["--retry-errors"]))
    if summary.get("stopped_after_errors"):
        log.info(f"stopped after {summary['stopped_after_errors']} harness errors in a row; first error: "
                 f"{summary.get('first_error')}\nfix the cause, then rerun: {retry}")
        return 4
    if bad:
        if summary.get("served_model_changed"):
            log.info(f"{summary['served_model_changed']} of them because the served model changed under the run")
        log.info(f"{bad} unit(s) ended in error or timeout; first error: {summary.get('first_error')}\n"
                 f"rerun them with: {retry}")
        return 3

    counts = summary.get("counts", {})
    if cfg.embedded and counts and not counts.get("ok"):
        # random weights never close their reasoning nor write <answer>: say so, and what ends with answers
        log.info("the embedded model's random weights never write an answer (every unit ended "
                 f"{', '.join(sorted(counts))}); the same run with answers, on the scripted fake model (seconds): "
                 f"python -m agent.run --method {cfg.method} --limit {cfg.limit or 2} --backend scripted "
                 f"--out {cfg.out}-scripted")
    judge = "--judge exact" if cfg.embedded or cfg.backend == "scripted" else "(LLM judge: $OPENROUTER_API_KEY)"
    done([f"{cfg.out}/ (results.jsonl, tokens/, images/, header.json)"],
         f"python -m agent.judge {cfg.out} {judge}   |   look at it: python -m agent.show {cfg.out}")
    return 0
