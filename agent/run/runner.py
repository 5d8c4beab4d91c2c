"""Run (or resume) a configured run: the preflight, the header, the units still to run, then their execution."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import threading
import time
from collections import Counter as _C

from ..backends.base import model_vocab_size
from ..backends.local import set_renderer_hints
from ..backends.scripted import ScriptedBackend
from ..backends.tiny_model import default_tiny_dir, ensure_tiny_model
from ..benchmarks import incomplete_subset, load_selection, resolve_benchmark
from ..cli import setup_logging
from ..identity import deterministic_cost, local_identity, server_differences
from ..preflight import PreflightError, check_benchmark_images, check_output_room, model_identity
from ..redact import exempt, public_url
from ..rundir import RunDir, check_run
from ..rundir.ledger import write_ledger
from ..rundir.shards import shard_record, shard_units
from ..tools.live import require_live_tools
from .config import (
    RunConfig,
    all_units,
    auto_processes,
    header_for,
    make_backends,
    resolve_logprob_mode,
    select_samples,
    trial_seeds,
)
from .execute import SHARED, execute
from .journal import prune
from .processes import run_processes

log = logging.getLogger(__name__)

__all__ = ["run", "identify_backends"]


#: Set when SIGTERM stopped the run (the exit status is then 143, else 130 for Ctrl-C).
TERMINATED = {"by": None}


def _on_sigterm(task) -> None:
    TERMINATED["by"] = "SIGTERM"
    task.cancel()


async def run(cfg: RunConfig, argv=None, *, backends: list | None = None, toolbox=None) -> dict:
    """Run (or resume) ``cfg``; returns a summary dict. ``backends``/``toolbox`` override the built ones.

    SIGTERM is handled like Ctrl-C: the units in flight are abandoned (they rerun on resume), every finished
    line is on disk, and the run says how to resume."""

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, _on_sigterm, asyncio.current_task())
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread: the caller handles signals
        pass
    spec = cfg.spec()
    cfg = dataclasses.replace(resolve_logprob_mode(cfg), processes=auto_processes(cfg, backends is not None))
    manifest = resolve_benchmark(cfg.benchmark, keep_duplicates=cfg.protocol == "release")  # the release runs every row
    rd = RunDir(cfg.out, cfg.token_precision)
    fresh = not rd.path.exists()
    rd.lock(shared_only=cfg.worker is not None)
    try:
        return await _run_locked(cfg, argv, spec, manifest, rd, backends, toolbox)
    except BaseException:
        if fresh:  # refused before its header was written: nothing of this run is left behind, not even its lock
            rd.discard_if_unused()
        raise
    finally:
        if cfg.worker is None and rd.results.exists():  # the cost ledger (agent/rundir/ledger.py), after every invocation
            try:
                write_ledger(rd.path)
            except Exception as e:  # noqa: BLE001 - the ledger is a report: never what fails a run
                log.warning(f"warning: {rd.path}/ledger.json not written ({type(e).__name__}: {e}); "
                            f"python -m agent.ledger {rd.path} writes it")
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
    for e, i in zip((cfg.endpoints or [])[1:], idents[1:]):
        why = server_differences(idents[0], i)
        if why:  # the run's lines would be pooled in every table
            raise PreflightError(f"{public_url(cfg.endpoints[0])} and {public_url(e)}: {why}; one run, one configuration")
    cost = deterministic_cost(idents[0].get("server"))
    if cost:
        log.warning(f"WARNING: {cost}")
    return idents[0]


async def _run_locked(cfg: RunConfig, argv, spec, manifest, rd: RunDir, backends, toolbox) -> dict:
    """Preflight and header, the units to run, then run them (in this process or in --processes workers)."""
    if cfg.worker is None:
        cfg, header, samples, skipped_images = await _preflight(cfg, argv, spec, manifest, rd, backends, toolbox)
    else:  # a --processes worker: the parent checked everything and wrote the header
        header, samples, skipped_images = rd.read_header(), select_samples(manifest, cfg), []
    jobs, skipped = _pending_jobs(cfg, spec, manifest, rd, samples)
    if cfg.worker is None:  # the journals of units already written go; the others resume where they stopped
        prune(rd.path, {(s.id, int(t)) for s, t in jobs})
    if not jobs:
        return {"run_dir": str(rd.path), "ran": 0, "skipped": skipped, "counts": {}, "llm_calls": 0,
                "skipped_images": len(skipped_images), "first_error": None}
    if cfg.processes > 1 and cfg.worker is None and backends is None:
        return await run_processes(cfg, rd, [(s.id, t) for s, t in jobs], skipped, spec.label, child=_child)
    return await execute(cfg, spec, rd, header, jobs, skipped, skipped_images, backends, toolbox)


def _say_images(samples, skipped_images) -> None:
    """One line each for the samples run without an image, with a file that is no image, and skipped."""
    dropped = [s for s in samples if s.extra.get("dropped_images")]
    if dropped:
        log.info(f"--protocol release: {len(dropped)} samples run without a query image whose file is missing, as the "
                 f"release does (first: {dropped[0].id}: {', '.join(dropped[0].extra['dropped_images'])}); each "
                 "line lists them (dropped_images)")
    sent = [s for s in samples if s.extra.get("undecodable_images")]
    if sent:
        log.info(f"--protocol release: {len(sent)} samples run with a query file that is no image, sent as the release "
                 f"sends it; each call carrying it fails there as here (first: {sent[0].id}: "
                 f"{', '.join(sent[0].extra['undecodable_images'])}); each line lists them (undecodable_images)")
    if skipped_images:
        log.info(f"--allow-missing-images: {len(skipped_images)} samples skipped for a missing or unreadable image "
                 f"(first: {skipped_images[0][0]}: {skipped_images[0][1]})")


async def _preflight(cfg: RunConfig, argv, spec, manifest, rd: RunDir, backends, toolbox):
    """Every check before any work (nothing is written and nothing runs until all pass: exit 2 otherwise), then the
    header. Returns ``(cfg with the run's seed, header, samples, skipped_images)``."""

    if cfg.shard is not None and cfg.seed is None and not rd.header_path.exists():
        raise PreflightError(f"--shard {cfg.shard[0]}/{cfg.shard[1]} needs --seed S (the same in every shard): without "
                             "it each shard would draw its own base seed, and the merged run would not be one run's "
                             "trials")
    seed, seed_source = trial_seeds(cfg, rd)
    cfg = dataclasses.replace(cfg, seed=seed)
    samples = select_samples(manifest, cfg)
    # --- preflight: nothing is written and nothing runs until every check passes (exit 2 otherwise)
    if cfg.embedded and backends is None:
        log.info("NOTE: embedded default: a tiny RANDOMLY INITIALISED Qwen3.5 and the offline demo world; "
                 "its answers and numbers are meaningless.")
    if cfg.backend == "scripted" and backends is None:
        log.info("NOTE: --backend scripted is a FAKE demo model (agent/backends/demo_model.py): its behaviour and "
                 "numbers are planted, not measured.")
    if cfg.tools == "live" and spec.method != "direct" and toolbox is None:
        require_live_tools(spec.allowed_tools())
    partial = incomplete_subset(manifest)
    if partial:
        raise PreflightError(partial)
    skipping = [p for p in manifest.problems if p.skips_a_row]
    if skipping and not cfg.skip_bad_rows:  # the paper's denominators: a row left out is refused, as a missing image is
        kinds = _C(p.kind for p in skipping)
        raise PreflightError(f"{manifest.path}: {len(skipping)} row(s) cannot be run {dict(kinds)}; first: line "
                             f"{skipping[0].line}: {skipping[0].detail}. A run over the others has another "
                             "denominator: fix them (python -m agent.benchmarks stats lists them all), or pass "
                             "--skip-bad-rows to run the others (recorded in header.json, manifest_problems)")
    if manifest.problems:
        kinds = _C(p.kind for p in manifest.problems)
        log.info(f"{manifest.path}: {len(manifest.problems)} data problem(s) {dict(kinds)}; first: "
                 f"line {manifest.problems[0].line}: {manifest.problems[0].detail}"
                 + (f"; {len(skipping)} row(s) skipped (--skip-bad-rows)" if skipping else "")
                 + "; python -m agent.benchmarks stats lists them all")
    samples, skipped_images = check_benchmark_images(manifest, samples, allow_missing=cfg.allow_missing_images,
                                                     drop_missing=cfg.protocol == "release")
    _say_images(samples, skipped_images)
    ident = await identify_backends(cfg, backends)
    exempt(ident.get("served_model"), ident.get("weights"), cfg.model_dir)  # recorded as names: never "secrets"
    check_output_room(ident, cfg.sampling().max_tokens)
    selection = {"limit": cfg.limit, "sample_ids": cfg.sample_ids, "n_samples": len(samples),
                 "skipped": [i for i, _ in skipped_images]}
    if cfg.selection:
        selection["selection_file"] = load_selection(cfg.selection, manifest.name)[1]
    if seed_source == "given" and ident.get("deterministic") is False:
        log.warning("WARNING: --seed has no effect on this server: it runs without --enable-deterministic-inference "
                    "(serving/launch_qwen35.sh --deterministic); recorded in header.json (model.deterministic)")
    if cfg.seed is None and cfg.trials > 1 and ident.get("deterministic"):
        raise PreflightError(f"{rd.path} was recorded without seeds and the server runs deterministic inference: "
                             "every trial would sample with SGLang's default seed 42, so the trials would be one "
                             "trial repeated. Give --seed S (a new --out), or serve without --deterministic")
    resuming = rd.results.exists()
    head = header_for(cfg, manifest, argv, ident)
    head["backend"] = _backend_record(head["backend"], cfg, backends)
    if cfg.shard is not None:
        head["shard"] = shard_record(all_units(cfg, samples), *cfg.shard)
    header = rd.write_header({**head, "selection": selection, "seed_source": seed_source}, force=cfg.force,
                             allow_unverified=cfg.allow_unverified_server)
    if skipped_images:
        rd.note_skipped(skipped_images)
    if resuming:  # the cheap part of python -m agent.rundir check; a torn line (a kill, a full disk) is set aside
        rd.sweep_temporaries()  # what a killed writer left half-written (the run lock is ours)
        rep = check_run(rd.path, deep=False, heal_torn=True)
        for x in rep.repaired:
            log.warning(f"warning: {rd.path}: {x}; their units run again")
        if rep.temp_files or rep.duplicates:
            log.info("\n".join(rep.lines()[:1] + [x for x in rep.lines()[2:] if "tool cache" not in x]))
    return cfg, header, samples, skipped_images


def _pending_jobs(cfg: RunConfig, spec, manifest, rd: RunDir, samples: list) -> tuple[list, int]:
    """The (sample, trial) units still to run (a --processes worker: the parent's list), and how many are done."""
    done = rd.done_keys(retry_errors=cfg.retry_errors)
    units = all_units(cfg, samples)
    if cfg.shard is not None:  # --shard I/N: this directory's part of the units (agent/rundir/merge.py)

        mine = set(shard_units([(s.id, t) for s, t in units], *cfg.shard))
        units = [(s, t) for s, t in units if (s.id, t) in mine]
    jobs = [(s, t) for s, t in units if (s.id, t) not in done]
    skipped = len(units) - len(jobs)
    if cfg.worker is not None:  # a --processes worker: the parent's list; jobs are claimed from a shared counter
        by_id = {s.id: s for s in samples}
        jobs = [(by_id[sid], int(t)) for sid, t in (cfg.job_keys or []) if sid in by_id]
    else:
        part = f" (shard {cfg.shard[0]}/{cfg.shard[1]}: {len(units)} units)" if cfg.shard is not None else ""
        log.info(f"{spec.label} on {manifest.name}: {len(samples)} samples x {cfg.trials} trials{part}; "
                 f"{skipped} already done, {len(jobs)} to run -> {rd.path}")
    return jobs, skipped


def _child(cfg_fields: dict, i: int, n: int, results, counter=None, hints=None) -> None:
    """One worker of a multi-process run (spawned); reports its summary through ``results``."""


    setup_logging()  # what the worker says goes to stderr as the parent's does
    set_renderer_hints(hints)  # the tokenizer class the parent's AutoTokenizer chose: no torch import here
    cfg = RunConfig(**cfg_fields)
    cfg.worker, cfg.processes, cfg.progress = (i, n), 1, False
    SHARED["counter"] = counter
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


def _backend_record(record: dict, cfg: RunConfig, backends) -> dict:
    """The header's backend with what the backends are: those handed in (a notebook, the tests) as they are, not
    cfg's default; ``vocab_size`` as the backends know it (one size, or None), else the model directory's."""
    if backends is not None and all(isinstance(b, ScriptedBackend) for b in backends):
        record = {**record, "kind": "scripted", "embedded_tiny_model": False}
    if backends:
        sizes = {getattr(b, "vocab", None) for b in backends}
        vocab = sizes.pop() if len(sizes) == 1 else None
    elif cfg.backend == "scripted":
        vocab = ScriptedBackend.vocab
    else:
        md = cfg.model_dir or (default_tiny_dir() if cfg.embedded else None)
        vocab = model_vocab_size(md) if md else None
    return {**record, "vocab_size": vocab}
