"""The runner's work once its arguments parse: the configuration they make, ``--dry-run``'s projection, the run, and
the exit status with what to do next (agent/run/cli.py holds the flags)."""
from __future__ import annotations

import asyncio
import logging
import os
import shlex
import sys
from pathlib import Path

from ..backends.base import ModelServerDown
from ..benchmarks import resolve_benchmark
from ..choices import DEFAULT_TOP_LOGPROBS
from ..cli import done
from ..errors import EXIT_DISK_FULL, ToolkitError, disk_full_message
from ..images import set_image_cache_mb
from ..redact import safe_argv
from ..rundir.ledger import format_projection, load_prices, project
from ..rundir.shards import shard_units
from .config import RunConfig, all_units, select_samples
from .execute import EXIT_SERVER_DOWN
from .runner import TERMINATED, run

log = logging.getLogger(__name__)

__all__ = ["config_from_args", "run_command"]


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


def run_command(a, argv=None) -> int:
    """The run the parsed arguments ``a`` ask for; its exit status (agent/run/cli.py ``main`` lists them)."""
    if a.max_image_mb:
        os.environ["MMCF_MAX_IMAGE_MB"] = str(a.max_image_mb)  # read by every image load, children included
    if a.image_cache_mb is not None:
        if a.image_cache_mb < 0:
            log.error("error: --image-cache-mb must be >= 0")
            return 2

        set_image_cache_mb(a.image_cache_mb)  # and the environment, which worker processes inherit
    try:
        cfg = config_from_args(a)  # validates the flags together before touching anything (ConfigError)
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
