"""The resumable runner: a method over a benchmark, N trials, recorded into a run directory.

    python -m agent.run --method react --out runs/demo-react              # embedded default: tiny model, offline world, demo
    python -m agent.run --method mmcontextfold --benchmark data/mmsearch --backend sglang \\
        --endpoint http://gpu:30000 --endpoint http://gpu:30001 --model-dir /models/Qwen3.5-27B \\
        --tools live --trials 3 --concurrency 64 --out runs/mmsearch-cf-27b

asyncio workers (``--concurrency``) share the backends (one per ``--endpoint``; each trajectory stays
on one endpoint so the server's prefix cache is reused; the least busy endpoint gets the next one).
A rerun of the same command skips the (sample, trial) pairs already written; ``--retry-errors``
reruns the ones that ended in ``error`` or ``timeout``. Ctrl-C stops cleanly: every finished pair is
on disk; the ones in flight are dropped and rerun next time. ``--timeout`` bounds one sample.
See ``agent/rundir/`` and ``docs/trajectory.md`` for what is written.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import json
import multiprocessing as mp
import os
import secrets
import shlex
import signal
import sys
import threading
import time
from collections import Counter
from collections import Counter as _C
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from .backends import make_backend
from .backends.base import DEFAULT_TOP_LOGPROBS, BackendError, SamplingParams
from .backends.local import renderer_hints, set_renderer_hints
from .backends.messages import set_image_cache_mb
from .backends.scripted import ScriptedBackend
from .backends.spread import BackendPool
from .backends.tiny_model import ensure_tiny_model
from .benchmarks import load_selection, resolve_benchmark
from .cli import DEFAULT_CONCURRENCY, add_backend_args, done, make_parser
from .http import RetryPolicy, public_url, safe_argv
from .methods import METHODS, VARIANTS, Budgets, MethodSpec, new_trajectory, run_sample
from .methods.common import HISTORY_REASONING, WEBWATCHER_OBSERVATION_IMAGES
from .methods.release import DEFAULT_PATIENCE, DEFAULT_THRESHOLD, SCORING_BACKENDS, ReleasePolicy
from .preflight import PreflightError, check_benchmark_images, local_identity, model_identity
from .rundir import RunDir, RunError, check_run, versions
from .rundir.ledger import format_projection, load_prices, project
from .rundir.shards import shard_record, shard_units
from .tools import MODES, MissingKeyError, make_toolbox
from .tools.live import require_live_tools
from .trajectory import SCHEMA_VERSION

__all__ = ["RunConfig", "run", "main", "EMBEDDED_MAX_TOKENS", "SERVED_MAX_TOKENS", "trial_seeds"]

#: The tiny random model never closes its think block on its own; cap its outputs so the embedded
#: default finishes in seconds.
EMBEDDED_MAX_TOKENS = 48
#: Served models: the paper's release sends ``max_completion_tokens=8192`` (iLearn-Lab/MM26-MMContextFold,
#: mmcontextfold/utils/search_backbone_model.py); 4096 cut Qwen3.5's thinking and forced corrections.
SERVED_MAX_TOKENS = 8192


@dataclass
class RunConfig:
    method: str
    out: str
    benchmark: str = "demo"
    variant: str = ""
    remove_images_from_step: int | None = None
    image_release: str = "keep"            # keep | adaptive (agent/methods/release.py)
    release_signal: str | None = None
    release_threshold: str | float | None = None
    release_patience: int | None = None
    trials: int = 1
    concurrency: int = 8
    limit: int | None = None
    sample_ids: list[str] | None = None
    selection: str | None = None           # a selection file (python -m agent.benchmarks subset --random-per-benchmark)
    backend: str = "local"
    endpoints: list[str] = field(default_factory=list)
    model: str | None = None
    model_dir: str | None = None
    logprob_mode: str = "scaled"
    server: str = "sglang"
    api_key_env: str | None = None
    temperature: float = 0.2
    top_p: float = 0.95
    max_tokens: int | None = None
    top_logprobs: int = DEFAULT_TOP_LOGPROBS
    seed: int | None = None
    thinking: bool = True
    t_max: int = 20
    b_max: int = 5
    history_reasoning: str = "keep"
    observation_images: int = WEBWATCHER_OBSERVATION_IMAGES
    tools: str = "offline"
    world: str | None = None
    tool_cache: str | None = None
    cache_mode: str = "readwrite"
    live_fallback: bool = False
    timeout: float | None = None
    retry_errors: bool = False
    force: bool = False
    progress: bool = True
    token_precision: str = "float32"
    processes: int | str = "auto"
    max_consecutive_errors: int = 10
    allow_missing_images: bool = False
    max_image_mb: float | None = None
    request_timeout: float = 600.0
    part: tuple[int, int] | None = None    # --shard I/N: this run directory holds part I of N (agent/rundir/merge.py)
    shard: tuple[int, int] | None = None   # internal: worker i of n in a --processes run
    job_keys: list | None = None           # internal: the parent's job list ([sample id, trial], in order)

    @property
    def embedded(self) -> bool:
        return self.backend == "local" and not self.model_dir

    def spec(self) -> MethodSpec:
        if self.processes != "auto" and (not isinstance(self.processes, int) or self.processes < 1):
            raise ValueError(f"--processes must be auto or an integer >= 1, not {self.processes!r}")
        if self.concurrency < 1 or self.trials < 1:
            raise ValueError("--processes, --concurrency and --trials must be >= 1")
        release = None
        if self.image_release not in ("keep", "adaptive"):
            raise ValueError(f"--image-release must be keep or adaptive, not {self.image_release!r}")
        if self.image_release == "adaptive":
            if self.backend not in SCORING_BACKENDS:
                raise ValueError(f"--image-release adaptive scores every step without the images (teacher-forced); "
                                 f"--backend {self.backend} cannot score a fixed continuation. Use one that can: "
                                 f"{', '.join(SCORING_BACKENDS)} (sglang = SGLang's native /generate with --model-dir)")
            release = ReleasePolicy.from_args(self.release_signal, self.release_threshold, self.release_patience)
        elif any(v is not None for v in (self.release_signal, self.release_threshold, self.release_patience)):
            raise ValueError("--release-signal / --release-threshold / --release-patience need --image-release adaptive")
        return MethodSpec(self.method, self.variant, self.remove_images_from_step, Budgets(self.t_max, self.b_max),
                          self.history_reasoning, self.observation_images, release)

    def sampling(self, trial: int = 0) -> SamplingParams:
        mt = self.max_tokens or (EMBEDDED_MAX_TOKENS if self.embedded else SERVED_MAX_TOKENS)
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, max_tokens=mt,
                              top_logprobs=self.top_logprobs, seed=None if self.seed is None else self.seed + trial,
                              enable_thinking=self.thinking)


def make_backends(cfg: RunConfig) -> list:

    if cfg.backend == "local":
        return [make_backend("local", model_dir=cfg.model_dir, logprob_mode=cfg.logprob_mode)]
    if cfg.backend == "scripted":
        return [make_backend("scripted")]
    if not cfg.endpoints:
        raise BackendError(f"--backend {cfg.backend} needs --endpoint URL (repeat it for several servers)")

    policy = RetryPolicy(timeout_s=cfg.request_timeout)
    return [make_backend(cfg.backend, endpoint=e, model=cfg.model, model_dir=cfg.model_dir, logprob_mode=cfg.logprob_mode,
                         server=cfg.server, api_key_env=cfg.api_key_env, policy=policy) for e in cfg.endpoints]


def header_for(cfg: RunConfig, manifest, argv, model: dict | None = None) -> dict:
    spec = cfg.spec()
    return {
        "schema_version": SCHEMA_VERSION, "created": time.time(),
        "argv": safe_argv(list(argv) if argv is not None else sys.argv),
        "method": spec.method, "variant": spec.variant_label, "label": spec.label,
        "remove_images_from_step": spec.remove_images_from_step, "budgets": spec.budgets.to_dict(),
        "image_release": spec.release.to_dict() if spec.release is not None else None,
        "history_reasoning": spec.history_reasoning, "observation_images": spec.observation_images,
        "model": model,
        "sampling": cfg.sampling().to_dict() | {"seed": cfg.seed}, "trials": cfg.trials,
        "benchmark": manifest.name, "benchmark_path": str(manifest.path), "n_samples": len(manifest.samples),
        "backend": {"kind": cfg.backend, "endpoints": [public_url(e) for e in cfg.endpoints], "model": cfg.model, "model_dir": cfg.model_dir,
                    "logprob_mode": cfg.logprob_mode, "server": cfg.server, "embedded_tiny_model": cfg.embedded,
                    "api_key_env": cfg.api_key_env},
        "tools": {"provider": cfg.tools, "world": cfg.world, "cache": cfg.tool_cache, "cache_mode": cfg.cache_mode,
                  "live_fallback": cfg.live_fallback},
        "token_precision": cfg.token_precision, "processes": cfg.processes, "versions": versions(),
        "manifest_problems": {p.kind: sum(q.kind == p.kind for q in manifest.problems) for p in manifest.problems},
    }


def _select(manifest, cfg: RunConfig) -> list:
    samples = manifest.samples
    if cfg.selection:

        ids, _ = load_selection(cfg.selection, manifest.name)
        want = set(ids)
        samples = [s for s in samples if s.id in want]
        missing = want - {s.id for s in samples}
        if missing:
            raise RunError(f"{cfg.selection}: {len(missing)} selected ids are not in {manifest.path} (first: "
                           f"{sorted(missing)[:5]}); the selection was drawn from another manifest")
    if cfg.sample_ids:
        want = set(cfg.sample_ids)
        samples = [s for s in samples if s.id in want]
        missing = want - {s.id for s in samples}
        if missing:
            raise RunError(f"{manifest.path}: sample ids not found: {sorted(missing)[:10]}")
    if cfg.limit is not None:
        samples = samples[: cfg.limit]
    return samples


#: Set when SIGTERM stopped the run (the exit status is then 143, else 130 for Ctrl-C).
_TERMINATED = {"by": None}


def _on_sigterm(task) -> None:
    _TERMINATED["by"] = "SIGTERM"
    task.cancel()


#: Samples in flight one runner process keeps at the ideal call rate (ours, scripts/bench_runner.py: one
#: process at 256 in flight, ~1,000-token top-20 replies and photo-sized images: 0.957 of the ideal call rate,
#: 10.4 µs of CPU per generated token all-in; the 165-token load at 256: 0.934 with one process).
PROCESS_CONCURRENCY = 256


def auto_processes(cfg: RunConfig, injected: bool = False) -> int:
    """``--processes auto``: one process per :data:`PROCESS_CONCURRENCY` samples in flight, at most one per CPU;
    one where the model runs in this process (local, scripted) or the caller passed its own backends."""
    if cfg.processes != "auto":
        return int(cfg.processes)
    if injected or cfg.backend in ("local", "scripted") or cfg.shard is not None:
        return 1
    return max(1, min(os.cpu_count() or 1, -(-cfg.concurrency // PROCESS_CONCURRENCY)))


async def run(cfg: RunConfig, argv=None, *, backends: list | None = None, toolbox=None) -> dict:
    """Run (or resume) ``cfg``; returns a summary dict. ``backends``/``toolbox`` override the built ones.

    SIGTERM is handled like Ctrl-C: the units in flight are abandoned (they rerun on resume), every finished
    line is on disk, and the run says how to resume."""

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, _on_sigterm, asyncio.current_task())
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread: the caller handles signals
        pass
    spec = cfg.spec()
    cfg = dataclasses.replace(cfg, processes=auto_processes(cfg, backends is not None))
    manifest = resolve_benchmark(cfg.benchmark)
    rd = RunDir(cfg.out, cfg.token_precision)
    rd.lock(shared_only=cfg.shard is not None)
    try:
        return await _run_locked(cfg, argv, spec, manifest, rd, backends, toolbox)
    finally:
        if cfg.shard is None and rd.results.exists():  # the cost ledger (agent/ledger.py), after every invocation
            try:
                from .rundir.ledger import write_ledger

                write_ledger(rd.path)
            except Exception as e:  # noqa: BLE001 - the ledger is a report: never what fails a run
                print(f"warning: {rd.path}/ledger.json not written ({type(e).__name__}: {e}); "
                      f"python -m agent.ledger {rd.path} writes it", file=sys.stderr)
        rd.unlock()


async def identify_backends(cfg: RunConfig, backends: list | None) -> dict:
    """The one model every backend serves (asking each server); refuses unreachable or mixed endpoints."""
    if backends is None and cfg.backend == "local":

        return local_identity(cfg.model_dir or ensure_tiny_model())
    own = backends is None
    backends = backends if backends is not None else make_backends(cfg)
    try:
        idents = [await model_identity(b) for b in backends]
    finally:
        if own:
            for b in backends:
                await b.aclose()
    names = {i.get("served_model") for i in idents}
    if len(names) > 1:
        where = ", ".join(f"{public_url(e)} -> {i.get('served_model')}"
                          for e, i in zip(cfg.endpoints or ["backend"] * len(idents), idents))
        raise PreflightError(f"the endpoints serve different models ({where}): one run must use one model")
    return idents[0]


def trial_seeds(cfg: RunConfig, rd: RunDir) -> tuple[int | None, str]:
    """The run's base seed (trial t samples with seed + t) and where it came from: ``given`` (--seed), ``drawn``
    (a new run without --seed draws one and records it), or the recorded one of the run being resumed.

    Ours, why: a server started with deterministic inference samples every request that has no seed with seed 42
    (sglang/srt/sampling/sampling_batch_info.py: ``sampling_seed if not None else 42``), so trials 0, 1, 2 would be
    one trial three times and Table 1's std over "independent trials" 0.0."""
    if cfg.seed is not None:
        return cfg.seed, "given"
    if rd.header_path.exists():
        old = rd.read_header()
        seed = (old.get("sampling") or {}).get("seed")
        return seed, old.get("seed_source") or ("legacy" if seed is None else "given")

    return secrets.randbelow(2**31 - 2**20), "drawn"


async def _run_locked(cfg: RunConfig, argv, spec, manifest, rd: RunDir, backends, toolbox) -> dict:
    """Preflight and header, the units to run, then run them (in this process or in --processes workers)."""
    if cfg.shard is None:
        cfg, header, samples, skipped_images = await _preflight(cfg, argv, spec, manifest, rd, backends, toolbox)
    else:  # a --processes worker: the parent checked everything and wrote the header
        header, samples, skipped_images = rd.read_header(), _select(manifest, cfg), []
    jobs, skipped = _pending_jobs(cfg, spec, manifest, rd, samples)
    if not jobs:
        return {"run_dir": str(rd.path), "ran": 0, "skipped": skipped, "counts": {}, "llm_calls": 0,
                "skipped_images": len(skipped_images), "first_error": None}
    if cfg.processes > 1 and cfg.shard is None and backends is None:
        return await _run_processes(cfg, rd, [(s.id, t) for s, t in jobs], skipped, spec.label)
    return await _execute(cfg, spec, rd, header, jobs, skipped, skipped_images, backends, toolbox)


async def _preflight(cfg: RunConfig, argv, spec, manifest, rd: RunDir, backends, toolbox):
    """Every check before any work (nothing is written and nothing runs until all pass: exit 2 otherwise), then the
    header. Returns ``(cfg with the run's seed, header, samples, skipped_images)``."""

    if cfg.part is not None and cfg.seed is None and not rd.header_path.exists():
        raise PreflightError(f"--shard {cfg.part[0]}/{cfg.part[1]} needs --seed S (the same in every shard): without "
                             "it each shard would draw its own base seed, and the merged run would not be one run's "
                             "trials")
    seed, seed_source = trial_seeds(cfg, rd)
    cfg = dataclasses.replace(cfg, seed=seed)
    samples = _select(manifest, cfg)
    # --- preflight: nothing is written and nothing runs until every check passes (exit 2 otherwise)
    if cfg.embedded and backends is None:
        print("NOTE: embedded default: a tiny RANDOMLY INITIALISED Qwen3.5 and the offline demo world; "
              "its answers and numbers are meaningless.", file=sys.stderr)
    if cfg.backend == "scripted" and backends is None:
        print("NOTE: --backend scripted is a FAKE demo model (agent/backends/demo_model.py): its behaviour and "
              "numbers are planted, not measured.", file=sys.stderr)
    if cfg.tools == "live" and spec.method != "direct" and toolbox is None:

        require_live_tools(spec.allowed_tools())
    if manifest.problems:

        kinds = _C(p.kind for p in manifest.problems)
        print(f"{manifest.path}: {len(manifest.problems)} data problem(s) {dict(kinds)}; first: "
              f"line {manifest.problems[0].line}: {manifest.problems[0].detail}. Rows with a refused path, broken "
              f"JSON or non-UTF-8 bytes are skipped; python -m agent.benchmarks stats lists them all", file=sys.stderr)
    samples, skipped_images = check_benchmark_images(manifest, samples, allow_missing=cfg.allow_missing_images)
    if skipped_images:
        print(f"--allow-missing-images: {len(skipped_images)} samples skipped for a missing or unreadable image "
              f"(first: {skipped_images[0][0]}: {skipped_images[0][1]})", file=sys.stderr)
    ident = await identify_backends(cfg, backends)
    selection = {"limit": cfg.limit, "sample_ids": cfg.sample_ids, "n_samples": len(samples),
                 "skipped": [i for i, _ in skipped_images]}
    if cfg.selection:

        selection["selection_file"] = load_selection(cfg.selection, manifest.name)[1]
    if seed_source == "given" and ident.get("deterministic") is False:
        print("WARNING: --seed has no effect on this server: it runs without --enable-deterministic-inference "
              "(serving/launch_qwen35.sh --deterministic); recorded in header.json (model.deterministic)",
              file=sys.stderr)
    if cfg.seed is None and cfg.trials > 1 and ident.get("deterministic"):
        raise PreflightError(f"{rd.path} was recorded without seeds and the server runs deterministic inference: "
                             "every trial would sample with SGLang's default seed 42, so the trials would be one "
                             "trial repeated. Give --seed S (a new --out), or serve without --deterministic")
    resuming = rd.results.exists()
    head = header_for(cfg, manifest, argv, ident)
    if backends is not None:  # backends handed in (a notebook, the tests): record what they are, not cfg's default

        if all(isinstance(b, ScriptedBackend) for b in backends):
            head["backend"] = {**head["backend"], "kind": "scripted", "embedded_tiny_model": False}
    if cfg.part is not None:

        head["shard"] = shard_record(_all_units(cfg, samples), *cfg.part)
    header = rd.write_header({**head, "selection": selection, "seed_source": seed_source}, force=cfg.force)
    if skipped_images:
        rd.note_skipped(skipped_images)
    if resuming:  # the cheap part of python -m agent.rundir check: torn lines, temp files, duplicates

        rep = check_run(rd.path, deep=False)
        if rep.torn or rep.temp_files or rep.duplicates:
            print("\n".join(rep.lines()[:1] + [x for x in rep.lines()[2:] if "tool cache" not in x]), file=sys.stderr)
            print(f"(torn lines are ignored and their units rerun; python -m agent.rundir check {rd.path} --repair "
                  "quarantines them)", file=sys.stderr)
    return cfg, header, samples, skipped_images


def _pending_jobs(cfg: RunConfig, spec, manifest, rd: RunDir, samples: list) -> tuple[list, int]:
    """The (sample, trial) units still to run (a --processes worker: the parent's list), and how many are done."""
    done = rd.done_keys(retry_errors=cfg.retry_errors)
    units = _all_units(cfg, samples)
    if cfg.part is not None:  # --shard I/N: this directory's part of the units (agent/rundir/merge.py)

        mine = set(shard_units([(s.id, t) for s, t in units], *cfg.part))
        units = [(s, t) for s, t in units if (s.id, t) in mine]
    jobs = [(s, t) for s, t in units if (s.id, t) not in done]
    skipped = len(units) - len(jobs)
    if cfg.shard is not None:  # a --processes worker: the parent's list; jobs are claimed from a shared counter
        by_id = {s.id: s for s in samples}
        jobs = [(by_id[sid], int(t)) for sid, t in (cfg.job_keys or []) if sid in by_id]
    else:
        part = f" (shard {cfg.part[0]}/{cfg.part[1]}: {len(units)} units)" if cfg.part is not None else ""
        print(f"{spec.label} on {manifest.name}: {len(samples)} samples x {cfg.trials} trials{part}; "
              f"{skipped} already done, {len(jobs)} to run -> {rd.path}", file=sys.stderr)
    return jobs, skipped


def _retrieved(fut) -> None:
    """Mark a finished future's exception as seen (the worker that awaited it reports it, if still running)."""
    if not fut.cancelled():
        fut.exception()


def _all_units(cfg: RunConfig, samples: list) -> list:
    """Every (sample, trial) unit of the run, in the runner's order (trial by trial, samples in manifest order)."""
    return [(s, t) for t in range(cfg.trials) for s in samples]


async def _execute(cfg: RunConfig, spec, rd: RunDir, header: dict, jobs: list, skipped: int, skipped_images: list,
                   backends, toolbox) -> dict:
    """Run ``jobs`` with ``--concurrency`` asyncio workers over the backends; every finished unit is written as it
    ends; returns the summary (raises KeyboardInterrupt after writing what finished, on Ctrl-C / SIGTERM)."""
    cache_path = cfg.tool_cache or str(rd.path / "tools.sqlite")
    counts: Counter = Counter()
    stats = UnitStats()
    own_backends = backends is None
    backends = backends if backends is not None else make_backends(cfg)
    if own_backends and cfg.backend == "sglang":
        for b in backends:  # records name the served model (the preflight asked a fresh client)
            b.model = (header.get("model") or {}).get("served_model") or b.model
    own_toolbox = toolbox is None
    if toolbox is None:
        toolbox = make_toolbox(cfg.tools, world_dir=cfg.world, cache_path=cache_path, mode=cfg.cache_mode,
                               live_fallback=cfg.live_fallback)
    pool = BackendPool(backends)  # each trajectory keeps the backend it is given
    # the model every reply must name (OpenAI-compatible replies carry ``model``; SGLang's native replies do not)
    served_model = (header.get("model") or {}).get("served_model") if cfg.backend == "openai" and own_backends else None
    claim = _claimer(jobs, _SHARED.get("counter"))
    bar = _progress(len(jobs), cfg.progress, spec.label)
    t0 = time.perf_counter()
    n_calls = n_tokens = 0
    first_error: list[str] = []
    streak = {"n": 0, "last": ""}
    stop = asyncio.Event()
    writes: set = set()
    flying: set = set()  # the units whose trajectories are being made (what an interrupt abandons)
    count_lock = threading.Lock()

    def _write(line: dict, traj) -> None:
        rd.append(traj, line)
        with count_lock:
            counts[line["status"]] += 1

    async def worker():
        nonlocal n_calls, n_tokens
        while not stop.is_set():
            job = claim()
            if job is None:
                return
            sample, trial = job
            i = pool.acquire()
            traj = new_trajectory(spec, sample, trial)
            flying.add(traj)
            try:
                coro = run_sample(spec, sample, trial, backend=backends[i], toolbox=toolbox,
                                  sampling=cfg.sampling(trial), traj=traj, served_model=served_model)
                line, _ = await (asyncio.wait_for(coro, cfg.timeout) if cfg.timeout else coro)
            except asyncio.TimeoutError:
                traj.error("Timeout", f"sample exceeded --timeout {cfg.timeout:g}s")
                line = traj.to_line("timeout", "", error=f"sample exceeded --timeout {cfg.timeout:g}s")
            finally:
                pool.release(i)
                flying.discard(traj)
            line["endpoint"] = public_url(cfg.endpoints[i]) if cfg.endpoints else cfg.backend
            # the write finishes even if the run is interrupted meanwhile, and is counted when it lands
            fut = asyncio.get_running_loop().run_in_executor(None, _write, line, traj)
            writes.add(fut)
            fut.add_done_callback(writes.discard)
            fut.add_done_callback(_retrieved)  # a write whose worker was cancelled meanwhile: its error not re-raised
            await asyncio.shield(fut)
            n_calls += line["n_calls"]
            n_tokens += line["generated_tokens"]
            stats.add(line)
            if line["status"] == "error":
                first_error[:0] = [] if first_error else [f"{line['sample_id']}/t{line['trial']}: {line.get('error')}"]
                streak["n"] += 1
                streak["last"] = line.get("error") or ""
                if cfg.max_consecutive_errors and streak["n"] >= cfg.max_consecutive_errors:
                    stop.set()
            else:
                streak["n"] = 0
            bar.update(1)
            bar.set_postfix_str(" ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                                + f" calls/s={n_calls / max(time.perf_counter() - t0, 1e-9):.1f}", refresh=False)

    tasks = [asyncio.create_task(worker()) for _ in range(max(1, min(cfg.concurrency, len(jobs))))]
    interrupted = False
    try:
        await asyncio.gather(*tasks)
    except (asyncio.CancelledError, KeyboardInterrupt):
        interrupted = True
        # what is abandoned, counted before the cancellation unwinds it: units and the calls they had made
        lost_units, lost_calls = len(flying), sum(t.n_calls for t in flying)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if writes:  # lines being written when the interrupt came: let them land (and be counted)
            await asyncio.wait(list(writes))
    finally:
        bar.close()
        if own_toolbox:
            await toolbox.aclose()
        if own_backends:
            for b in backends:
                await b.aclose()
    elapsed = time.perf_counter() - t0
    summary = {"run_dir": str(rd.path), "ran": sum(counts.values()), "skipped": skipped, "counts": dict(counts),
               "llm_calls": n_calls, "generated_tokens": n_tokens, "elapsed_s": round(elapsed, 2),
               "interrupted": interrupted, "tool_stats": dict(toolbox.stats), "skipped_images": len(skipped_images),
               "first_error": first_error[0] if first_error else None,
               "stopped_after_errors": streak["n"] if stop.is_set() else 0, **stats.to_dict()}
    if cfg.shard is None:
        print(f"{'interrupted' if interrupted else 'done'}: {summary['ran']} written ({dict(counts)}), "
              f"{n_calls} LLM calls in {elapsed:.1f}s; tools: {dict(toolbox.stats)}", file=sys.stderr)
        for x in stats.lines(cfg.sampling().max_tokens):
            print(x, file=sys.stderr)
    if interrupted:
        summary["abandoned_units"], summary["abandoned_calls"] = lost_units, lost_calls
        if cfg.shard is None:
            print(f"{lost_units} units were in flight and are dropped ({lost_calls} LLM calls made for them, their "
                  "cost is spent; they rerun from the start on resume)", file=sys.stderr)
            print("rerun the same command to resume; finished samples are kept.", file=sys.stderr)
        raise KeyboardInterrupt(summary)  # a worker process hands it to its parent (_child)
    return summary


class UnitStats:
    """What the run summary reports beyond statuses, gathered from each written line: calls that ended by
    length (per call index = step), and units ended because the reply named another model."""

    def __init__(self):
        self.length_by_step: Counter = Counter()
        self.calls = 0
        self.model_changed = 0

    def add(self, line: dict) -> None:
        for c in line.get("calls") or ():
            self.calls += 1
            if c.get("finish_reason") == "length":
                self.length_by_step[int(c["index"])] += 1
        if line.get("status") == "error" and str(line.get("error") or "").startswith("ServedModelChanged"):
            self.model_changed += 1

    def to_dict(self) -> dict:
        return {"length_ended_calls": sum(self.length_by_step.values()), "calls_seen": self.calls,
                "length_ended_by_step": {str(k): v for k, v in sorted(self.length_by_step.items())},
                "served_model_changed": self.model_changed}

    def lines(self, max_tokens: int) -> list[str]:
        out = []
        n = sum(self.length_by_step.values())
        if n:
            by = ", ".join(f"step {k}: {v}" for k, v in sorted(self.length_by_step.items()))
            out.append(f"{n} of {self.calls} LLM calls ended by length (max_tokens {max_tokens}; {by}): their "
                       "thinking or action was cut (--max-tokens raises the cap)")
        if self.model_changed:
            out.append(f"{self.model_changed} unit(s) ended in error because a reply named another model than the run "
                       "records (a router mixing backends, a redeployed server): check the endpoint, then --retry-errors")
        return out


#: The exit status when the disk is full (ours): not a refusal (2), not failed units (3).
EXIT_DISK_FULL = 5


def disk_full(e: BaseException) -> str | None:
    """None unless ``e`` (or what caused it) is "no space left on device"; then the file it names ('' if none)."""

    while e is not None:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return e.filename or ""
        e = e.__cause__ or e.__context__
    return None


#: A --processes worker's shared job counter (set in the child before it runs).
_SHARED: dict = {}


def _claimer(jobs: list, counter=None):
    """The next job to run: from the list in order, or — in a --processes worker — the next index of the
    counter all workers share, so that every process takes work while there is any, whatever the ids."""
    if counter is None:
        it = iter(jobs)
        return lambda: next(it, None)

    def claim():
        with counter.get_lock():
            i = counter.value
            counter.value = i + 1
        return jobs[i] if i < len(jobs) else None
    return claim


def _child(cfg_fields: dict, i: int, n: int, results, counter=None, hints=None) -> None:
    """One worker of a multi-process run (spawned); reports its summary through ``results``."""


    set_renderer_hints(hints)  # the tokenizer class the parent's AutoTokenizer chose: no torch import here
    cfg = RunConfig(**cfg_fields)
    cfg.shard, cfg.processes, cfg.progress = (i, n), 1, False
    _SHARED["counter"] = counter
    cfg.concurrency = max(1, -(-cfg.concurrency // n))
    parent = os.getppid()

    def orphan_watch():  # the parent was killed: stop like Ctrl-C, so nothing outlives the run
        while os.getppid() == parent:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=orphan_watch, daemon=True).start()
    try:
        results.put(asyncio.run(run(cfg)))
    except KeyboardInterrupt as e:  # what the worker wrote and what it abandoned, for the parent's summary
        part = e.args[0] if e.args and isinstance(e.args[0], dict) else {}
        results.put({**part, "interrupted": True})
    except Exception as e:  # reported by the parent; the lines already written stay
        results.put({"error": f"{type(e).__name__}: {e}"})


async def _run_processes(cfg: RunConfig, rd: RunDir, job_keys: list, skipped: int, label: str) -> dict:
    """``--processes P``: P runner processes taking jobs from one shared counter, appending to one file.

    Each process parses its own replies (top-20 JSON decoding is the runner's main CPU cost), so a
    busy run is not bound to one core; a worker with a free slot takes the next job, so the load stays
    balanced whatever the sample ids (a hash split put >256 jobs on one of two workers in 95% of random id
    draws). The parent shows the progress by watching results.jsonl.
    """

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    n_jobs = len(job_keys)
    fields = dataclasses.asdict(cfg) | {"job_keys": [list(k) for k in job_keys]}
    counter = ctx.Value("l", 0)

    procs = [ctx.Process(target=_child, args=(fields, i, cfg.processes, results, counter, renderer_hints()), daemon=False)
             for i in range(cfg.processes)]
    for p in procs:
        p.start()
    bar = _progress(n_jobs, cfg.progress, f"{label} x{cfg.processes}")
    t0 = time.perf_counter()
    offset = offset0 = rd.results.stat().st_size if rd.results.exists() else 0
    summaries, interrupted = [], False
    try:
        while len(summaries) < len(procs):
            # 0.1 s: the run's end is seen within 0.1 s of the last worker's (0.5 s cost ~0.4 s per run; ours)
            await asyncio.sleep(0.1)
            if rd.results.exists():
                with open(rd.results, "rb") as f:
                    f.seek(offset)
                    new = f.read()
                done = new.rfind(b"\n") + 1
                offset += done
                bar.update(new[:done].count(b"\n"))
            while not results.empty():
                summaries.append(results.get())
            if not any(p.is_alive() for p in procs) and results.empty() and len(summaries) < len(procs):
                break
    except (asyncio.CancelledError, KeyboardInterrupt):
        interrupted = True
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGINT)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.terminate()
        bar.close()
    while not results.empty():
        summaries.append(results.get())
    # what the workers wrote, read from the file itself (an interrupted worker cannot report it)
    counts: Counter = Counter()
    stats = UnitStats()
    if rd.results.exists():
        with open(rd.results, "rb") as f:
            f.seek(offset0)
            for raw in f.read().split(b"\n"):
                try:
                    ln = json.loads(raw)
                    counts[ln["status"]] += 1
                    stats.add(ln)
                except (ValueError, KeyError, TypeError):
                    continue
    errors = [s["error"] for s in summaries if "error" in s]
    interrupted = interrupted or any(s.get("interrupted") for s in summaries)
    elapsed = time.perf_counter() - t0
    summary = {"run_dir": str(rd.path), "ran": sum(counts.values()), "skipped": skipped, "counts": dict(counts),
               "llm_calls": sum(s.get("llm_calls", 0) for s in summaries),
               "generated_tokens": sum(s.get("generated_tokens", 0) for s in summaries), "elapsed_s": round(elapsed, 2),
               "interrupted": interrupted, "processes": cfg.processes, "errors": errors,
               "first_error": next((s["first_error"] for s in summaries if s.get("first_error")), None),
               "stopped_after_errors": max((s.get("stopped_after_errors") or 0 for s in summaries), default=0),
               **stats.to_dict()}
    state = "interrupted" if interrupted else "stopped" if errors else "done"
    print(f"{state}: {summary['ran']} written ({dict(counts)}) by "
          f"{cfg.processes} processes, {summary['llm_calls']} LLM calls in {elapsed:.1f}s", file=sys.stderr)
    for x in stats.lines(cfg.sampling().max_tokens):
        print(x, file=sys.stderr)
    for e in errors if not any("No space left on device" in x for x in errors) else []:
        print(f"a runner process failed: {e}", file=sys.stderr)
    if interrupted:
        lost_units = sum(s.get("abandoned_units", 0) for s in summaries)
        lost_calls = sum(s.get("abandoned_calls", 0) for s in summaries)
        print(f"{lost_units} units were in flight and are dropped ({lost_calls} LLM calls made for them, their cost "
              "is spent; they rerun from the start on resume)", file=sys.stderr)
        print("rerun the same command to resume; finished samples are kept.", file=sys.stderr)
        raise KeyboardInterrupt
    if errors:
        if any("No space left on device" in e for e in errors):  # said once, with its own exit status

            raise OSError(errno.ENOSPC, "No space left on device", str(rd.path))
        raise RunError(f"{len(errors)} runner process(es) failed; rerun to resume: {errors[0]}")
    return summary


def _progress(total: int, enabled: bool, label: str):

    return tqdm(total=total, desc=label, unit="sample", disable=not enabled, mininterval=1.0, file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:

    ap = make_parser("python -m agent.run", __doc__, [
        "python -m agent.run --method react --out runs/demo-react                       # embedded tiny model, offline world",
        "python -m agent.run --method mmcontextfold --backend scripted --out runs/demo-mmcf   # the scripted FAKE demo model",
        "python -m agent.run --method react --benchmark DATA/mmsearch --backend sglang --endpoint http://gpu:30000 "
        "--model-dir /models/Qwen3.5-27B --tools live --trials 3 --out runs/mmsearch-react-27b"])
    ap.add_argument("--method", required=True, choices=METHODS, help="the agent (README: Agents)")
    ap.add_argument("--variant", default="", choices=VARIANTS, help="MM-ContextFold ablation (paper §4.3)")
    ap.add_argument("--remove-images-from-step", type=int, metavar="K", help="ReAct-Removal@K (paper §3.2.3)")
    g = ap.add_argument_group("adaptive image release (ReAct only; ours, agent/methods/release.py)")
    g.add_argument("--image-release", default="keep", choices=("keep", "adaptive"),
                   help="adaptive: probe each step's thinking without the query images (teacher-forced) and remove "
                        "them once their influence stays below the threshold (needs a scoring backend)")
    g.add_argument("--release-signal", choices=("kl", "dH"),
                   help="kl = mean KL(with || without) over think tokens; dH = how much the images lower the think "
                        "entropy, max(0, -ΔH_t) (default: kl, or the calibration file's)")
    g.add_argument("--release-threshold", metavar="EPS|CALIBRATION.json",
                   help=f"ε in nats, or the calibration.json of python -m probes.calibrate_release "
                        f"(default: {DEFAULT_THRESHOLD['kl']} for kl, {DEFAULT_THRESHOLD['dH']} for dH; ours, uncalibrated)")
    g.add_argument("--release-patience", type=int, metavar="M",
                   help=f"consecutive steps below ε before the release (default: {DEFAULT_PATIENCE}, or the "
                        "calibration file's)")
    ap.add_argument("--benchmark", default="demo", help="'demo' (offline) or a benchmark dir / data_unified.jsonl")
    ap.add_argument("--out", required=True, metavar="RUN_DIR", help="the run directory (created, or resumed)")
    ap.add_argument("--trials", type=int, default=1, help="independent trials per sample (paper: 3)")
    ap.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="samples in flight (over all processes)")
    ap.add_argument("--processes", type=_processes_arg, default="auto",
                    help=f"runner processes sharing the jobs (decoding top-20 replies is CPU-bound); auto (default): "
                         f"one per {PROCESS_CONCURRENCY} samples in flight, at most one per CPU")
    ap.add_argument("--limit", type=int, help="the first N samples only")
    ap.add_argument("--shard", type=_shard_arg, metavar="I/N",
                    help="run part I of N (0 <= I < N) of the (sample, trial) units into --out, a directory of its "
                         "own (its own tool cache); needs --seed. Merge the parts with python -m agent.rundir merge "
                         "(README: Scaling out)")
    ap.add_argument("--sample-ids", help="comma-separated ids to run")
    ap.add_argument("--selection", metavar="FILE",
                    help="run the ids a selection file holds for this benchmark (python -m agent.benchmarks subset "
                         "DATA --random-per-benchmark 100 --seed S: the B_max sweep's 700 samples, D.2); recorded in "
                         "header.json")
    add_backend_args(ap, default="local", repeat_endpoint=True)
    g = ap.add_argument_group("sampling (paper defaults)")
    g.add_argument("--temperature", type=float, default=0.2, help="paper B.1")
    g.add_argument("--top-p", type=float, default=0.95, help="paper B.1")
    g.add_argument("--max-tokens", type=int, help=f"per call (default {SERVED_MAX_TOKENS}, the paper's release; "
                                                  f"{EMBEDDED_MAX_TOKENS} on the tiny model)")
    g.add_argument("--top-logprobs", type=int, default=DEFAULT_TOP_LOGPROBS, help="alternatives per token (paper: 20)")
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
    g = ap.add_argument_group("tools")
    g.add_argument("--tools", default="offline", choices=("offline", "live"),
                   help="offline = the shipped demo world; live = Serper / Jina (keys from the environment)")
    g.add_argument("--world", help="offline world dir (default: the shipped demo world)")
    g.add_argument("--tool-cache", help="SQLite cache path (default RUN_DIR/tools.sqlite)")
    g.add_argument("--cache-mode", default="readwrite", choices=MODES, help="replay = exact replays (a miss is an error)")
    g.add_argument("--live-fallback", action="store_true", help="replay mode: call the tool on a cache miss")
    g = ap.add_argument_group("run control")
    g.add_argument("--timeout", type=float, help="seconds per sample (ends it as status=timeout)")
    g.add_argument("--retry-errors", action="store_true", help="rerun pairs that ended in error/timeout")
    g.add_argument("--max-consecutive-errors", type=int, default=10, metavar="N",
                   help="stop the run after N harness errors in a row (0 = never)")
    g.add_argument("--allow-missing-images", action="store_true",
                   help="run the samples whose images load, skip (and list) the others")
    g.add_argument("--max-image-mb", type=float, help="image size limit in MB (default 20; MMCF_MAX_IMAGE_MB)")
    g.add_argument("--image-cache-mb", type=float,
                   help="memory for read and encoded images, per process, least recently used out first (default "
                        "512; MMCF_IMAGE_CACHE_MB; 0: no cache)")
    g.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                   help="seconds one model-server request may take before it is retried (default 600)")
    g.add_argument("--force", action="store_true", help="write into a run dir whose header differs")
    g.add_argument("--dry-run", action="store_true",
                   help="project what the planned units cost (tokens, GPU time, tool calls, money) and stop: from "
                        "--pilot's ledger, else from the paper's Table 4; nothing runs or is written (agent/ledger.py)")
    g.add_argument("--pilot", metavar="RUN_DIR", help="--dry-run: a finished run of the same method to project from")
    g.add_argument("--prices", metavar="FILE", help="--dry-run: a price table (agent/ledger.py DEFAULT_PRICES' layout)")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    g.add_argument("--token-precision", default="float32", choices=("float32", "float16"),
                   help="storage of the top-k logprobs in the token sidecar (float16: ~35%% smaller, lossy)")
    return ap


def config_from_args(a) -> RunConfig:
    return RunConfig(
        method=a.method, out=a.out, benchmark=a.benchmark, variant=a.variant,
        remove_images_from_step=a.remove_images_from_step, image_release=a.image_release,
        release_signal=a.release_signal, release_threshold=a.release_threshold, release_patience=a.release_patience,
        trials=a.trials, concurrency=a.concurrency, limit=a.limit,
        sample_ids=[x for x in (a.sample_ids or "").split(",") if x] or None, selection=a.selection,
        backend=a.backend, endpoints=a.endpoint,
        model=a.model, model_dir=a.model_dir, logprob_mode=a.logprob_mode, server=a.server, api_key_env=a.api_key_env,
        temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens, top_logprobs=a.top_logprobs, seed=a.seed,
        thinking=a.thinking, t_max=a.t_max, b_max=a.b_max, history_reasoning=a.history_reasoning,
        observation_images=a.observation_images, max_consecutive_errors=a.max_consecutive_errors,
        allow_missing_images=a.allow_missing_images, max_image_mb=a.max_image_mb, request_timeout=a.request_timeout,
        tools=a.tools, world=a.world, tool_cache=a.tool_cache,
        cache_mode=a.cache_mode, live_fallback=a.live_fallback, timeout=a.timeout, retry_errors=a.retry_errors,
        force=a.force, progress=a.progress, token_precision=a.token_precision, processes=a.processes, part=a.shard)


def _dry_run(cfg: RunConfig, a) -> int:
    """--dry-run: the planned units and what they are expected to cost; nothing runs, nothing is written."""


    manifest = resolve_benchmark(cfg.benchmark)
    samples = _select(manifest, cfg)
    units = _all_units(cfg, samples)
    if cfg.part is not None:

        units = shard_units(units, *cfg.part)
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
    return n


def main(argv=None) -> int:
    """Exit status: 0 all units finished; 2 refused before any work (a preflight check, a bad argument);
    3 finished, but some units ended in ``error``/``timeout`` (rerun with ``--retry-errors``); 4 stopped
    after ``--max-consecutive-errors`` harness errors in a row; 5 the disk is full (finished units kept; free
    space and rerun); 130 interrupted (rerun to resume)."""

    a = build_parser().parse_args(argv)
    if a.max_image_mb:
        os.environ["MMCF_MAX_IMAGE_MB"] = str(a.max_image_mb)  # read by every image load, children included
    if a.image_cache_mb is not None:
        if a.image_cache_mb < 0:
            print("error: --image-cache-mb must be >= 0", file=sys.stderr)
            return 2

        set_image_cache_mb(a.image_cache_mb)  # and the environment, which worker processes inherit
    try:
        cfg = config_from_args(a)
        cfg.spec()  # validate method/variant/removal before touching anything
        if a.dry_run:
            return _dry_run(cfg, a)
        summary = asyncio.run(run(cfg, argv))
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 143 if _TERMINATED["by"] else 130
    except (ValueError, RunError, BackendError, OSError, MissingKeyError, PreflightError) as e:
        full = disk_full(e)
        if full is not None:
            from pathlib import Path

            inside = bool(full) and Path(a.out).resolve() in Path(full).resolve().parents
            print(f"error: {full if inside else a.out}: the disk is full (No space left on device). Finished units are kept; free "
                  f"space where {a.out} lives (df -h {a.out}), then rerun the same command to resume", file=sys.stderr)
            return EXIT_DISK_FULL
        print(f"error: {e}", file=sys.stderr)
        return 2
    bad = sum(summary.get("counts", {}).get(k, 0) for k in ("error", "timeout"))
    # printed: never the URL's credentials nor a key's value (safe_argv)
    retry = shlex.join(["python", "-m", "agent.run", *safe_argv(sys.argv[1:] if argv is None else argv)]
                       + ([] if a.retry_errors else ["--retry-errors"]))
    if summary.get("stopped_after_errors"):
        print(f"stopped after {summary['stopped_after_errors']} harness errors in a row; first error: "
              f"{summary.get('first_error')}\nfix the cause, then rerun: {retry}", file=sys.stderr)
        return 4
    if bad:
        if summary.get("served_model_changed"):
            print(f"{summary['served_model_changed']} of them because the served model changed under the run",
                  file=sys.stderr)
        print(f"{bad} unit(s) ended in error or timeout; first error: {summary.get('first_error')}\n"
              f"rerun them with: {retry}", file=sys.stderr)
        return 3

    judge = "--judge exact" if cfg.embedded or cfg.backend == "scripted" else "(LLM judge: $OPENROUTER_API_KEY)"
    done([f"{cfg.out}/ (results.jsonl, tokens/, images/, header.json)"],
         f"python -m agent.judge {cfg.out} {judge}   |   look at it: python -m agent.show {cfg.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
