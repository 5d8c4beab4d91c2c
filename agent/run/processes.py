"""``--processes P``: P runner processes taking units from one shared counter, appending to one file."""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import multiprocessing as mp
import os
import signal
import time
from collections import Counter

from ..backends.local import renderer_hints
from ..rundir import RunDir, RunError
from ..rundir.lines import read_line
from .config import RunConfig
from .execute import UnitStats, in_flight_note, progress_bar

log = logging.getLogger(__name__)

__all__ = ["run_processes"]

#: Seconds the workers have, all together, to stop after Ctrl-C or SIGTERM before they are terminated.
STOP_GRACE_S = 20


async def _watch(procs, results, rd: RunDir, bar) -> tuple[list, bool]:
    """Until every worker has reported (or died): the progress bar follows results.jsonl. ``(summaries,
    interrupted)``; on Ctrl-C / SIGTERM every worker gets SIGINT (each stops like Ctrl-C) and is waited for."""
    offset = rd.results.stat().st_size if rd.results.exists() else 0
    summaries, interrupted = [], False
    try:
        while len(summaries) < len(procs):
            await asyncio.sleep(0.1)  # the run's end is seen within 0.1 s of the last worker's
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
        # every worker within one deadline (not one per worker: 40 of them must not take 40 minutes), then
        # SIGTERM, then SIGKILL for any that still hangs
        deadline = time.monotonic() + (STOP_GRACE_S if interrupted else 60)
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    while not results.empty():
        summaries.append(results.get())
    return summaries, interrupted


def _written(rd: RunDir, offset0: int) -> tuple[Counter, UnitStats]:
    """What the workers wrote, read from the file itself (an interrupted worker cannot report it)."""
    counts: Counter = Counter()
    stats = UnitStats()
    if rd.results.exists():
        with open(rd.results, "rb") as f:
            f.seek(offset0)
            for raw in f:  # one line at a time; a torn or changed one is not counted
                ln, state = read_line(raw)
                if state == "ok":
                    counts[ln.get("status")] += 1
                    stats.add(ln)
    return counts, stats


def _finish(cfg: RunConfig, rd: RunDir, summary: dict, stats: UnitStats, summaries: list) -> dict:
    """Say how the run ended; raise KeyboardInterrupt (interrupted) or the workers' failure, else the summary."""
    errors, interrupted = summary["errors"], summary["interrupted"]
    state = "interrupted" if interrupted else "stopped" if errors else "done"
    log.info(f"{state}: {summary['ran']} written ({summary['counts']}) by {cfg.processes} processes, "
             f"{summary['llm_calls']} LLM calls in {summary['elapsed_s']:.1f}s")
    for x in stats.lines(cfg.sampling().max_tokens):
        log.info(x)
    full = any("No space left on device" in x for x in errors)
    for e in errors if not full else []:
        log.info(f"a runner process failed: {e}")
    if interrupted:
        lost_units = sum(s.get("abandoned_units", 0) for s in summaries)
        lost_calls = sum(s.get("abandoned_calls", 0) for s in summaries)
        log.info(in_flight_note(lost_units, lost_calls, cfg.out))
        log.info("rerun the same command to resume; finished samples are kept.")
        raise KeyboardInterrupt
    if errors:
        if full:  # said once, with its own exit status
            raise OSError(errno.ENOSPC, "No space left on device", str(rd.path))
        raise RunError(f"{len(errors)} runner process(es) failed; rerun to resume: {errors[0]}")
    return summary


async def run_processes(cfg: RunConfig, rd: RunDir, job_keys: list, skipped: int, label: str, *, child) -> dict:
    """``--processes P``: P runner processes taking jobs from one shared counter, appending to one file.

    Each process parses its own replies (top-20 JSON decoding is the runner's main CPU cost), so a
    busy run is not bound to one core; a worker with a free slot takes the next job, so the load stays
    balanced whatever the sample ids (a hash split put >256 jobs on one of two workers in 95% of random id
    draws). The parent shows the progress by watching results.jsonl. ``child``: the worker's entry point
    (``agent.run.runner._child``: it runs the same :func:`run` with its part of the units).
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    fields = dataclasses.asdict(cfg) | {"job_keys": [list(k) for k in job_keys]}
    counter = ctx.Value("l", 0)
    procs = [ctx.Process(target=child, args=(fields, i, cfg.processes, results, counter, renderer_hints()),
                         daemon=False) for i in range(cfg.processes)]
    for p in procs:
        p.start()
    bar = progress_bar(len(job_keys), cfg.progress, f"{label} x{cfg.processes}")
    t0 = time.perf_counter()
    offset0 = rd.results.stat().st_size if rd.results.exists() else 0
    try:
        summaries, interrupted = await _watch(procs, results, rd, bar)
    finally:
        bar.close()
    counts, stats = _written(rd, offset0)
    summary = {"run_dir": str(rd.path), "ran": sum(counts.values()), "skipped": skipped, "counts": dict(counts),
               "llm_calls": sum(s.get("llm_calls", 0) for s in summaries),
               "generated_tokens": sum(s.get("generated_tokens", 0) for s in summaries),
               "elapsed_s": round(time.perf_counter() - t0, 2),
               "interrupted": interrupted or any(s.get("interrupted") for s in summaries),
               "processes": cfg.processes, "errors": [s["error"] for s in summaries if "error" in s],
               "first_error": next((s["first_error"] for s in summaries if s.get("first_error")), None),
               "stopped_after_errors": max((s.get("stopped_after_errors") or 0 for s in summaries), default=0),
               **stats.to_dict()}
    return _finish(cfg, rd, summary, stats, summaries)
