"""Running units in this process: asyncio workers over the backends, each finished unit written as it ends."""
from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections import Counter

from tqdm import tqdm

from ..backends import BackendError
from ..backends.base import ModelServerDown, route
from ..backends.spread import BackendPool
from ..methods import new_trajectory, run_sample
from ..redact import public_url
from ..rundir import RunDir
from ..tools import TOOL_POLICIES, make_toolbox
from .config import RunConfig, make_backends
from .journal import Journal, JournaledBackend

log = logging.getLogger(__name__)

__all__ = ["execute", "UnitStats", "EXIT_SERVER_DOWN", "SHARED", "claimer", "progress_bar"]


def retrieved(fut) -> None:
    """Mark a finished future's exception as seen (the worker that awaited it reports it, if still running)."""
    if not fut.cancelled():
        fut.exception()


class _Workers:
    """The asyncio workers of one process: each claims a unit, runs it on the backend it is given, and writes its
    line as soon as it ends (in a thread, shielded: an interrupt lets the write finish and be counted)."""

    def __init__(self, cfg: RunConfig, spec, rd: RunDir, claim, backends, toolbox, served_model, bar):
        self.cfg, self.spec, self.rd, self.claim = cfg, spec, rd, claim
        self.backends, self.toolbox, self.served_model, self.bar = backends, toolbox, served_model, bar
        self.weights = None  # the weights the run records (set by execute for a native SGLang run)
        self.down: str | None = None  # why the run stopped: the model server stopped answering
        self.pool = BackendPool(backends)  # each trajectory keeps the backend it is given
        self.counts: Counter = Counter()
        self.stats = UnitStats()
        self.n_calls = self.n_tokens = 0
        self.resumed = self.replayed = 0  # units resumed inside their trajectory; calls answered from journals
        self.first_error: list[str] = []
        self.streak = {"n": 0, "last": ""}
        self.stop = asyncio.Event()
        self.writes: set = set()
        self.flying: set = set()  # the units whose trajectories are being made
        self.abandoned: list[int] = []  # per unit an interrupt stopped: the calls its journal keeps (RUN/inflight/)
        self._lock = threading.Lock()
        self.t0 = time.perf_counter()

    def _write(self, line: dict, traj, journal: Journal) -> None:
        self.rd.append(traj, line)
        journal.clear()  # the line is written: its calls need no replay
        with self._lock:
            self.counts[line["status"]] += 1

    async def _unit(self, sample, trial) -> dict:
        """One unit's trajectory, to its line (a timeout ends it as ``timeout``)."""
        cfg, i = self.cfg, self.pool.acquire()
        route((sample.id, trial))  # one worker behind a gateway for the whole trajectory (smg's routing key)
        traj = new_trajectory(self.spec, sample, trial)
        self.flying.add(traj)
        # each completed call recorded as it completes; a unit a kill interrupted replays its recorded calls
        journal = Journal(self.rd.path, sample.id, trial)
        backend = JournaledBackend(self.backends[i], journal)
        try:
            coro = run_sample(self.spec, sample, trial, backend=backend, toolbox=self.toolbox,
                              sampling=cfg.sampling(trial), traj=traj, served_model=self.served_model)
            line, _ = await (asyncio.wait_for(coro, cfg.timeout) if cfg.timeout else coro)
        except asyncio.TimeoutError:
            traj.error("Timeout", f"sample exceeded --timeout {cfg.timeout:g}s")
            line = traj.to_line("timeout", "", error=f"sample exceeded --timeout {cfg.timeout:g}s")
        except BaseException:  # stopped mid-trajectory (an interrupt, the server down): its journal keeps its calls
            self.abandoned.append(traj.n_calls)
            raise
        finally:
            self.pool.release(i)
            self.flying.discard(traj)
        if backend.replayed:
            self.resumed += 1
            self.replayed += backend.replayed
        changed = await self._model_changed(i)
        if changed:  # nothing of this trajectory is kept: which of its calls the other model answered is unknown
            traj = new_trajectory(self.spec, sample, trial)
            traj.error("ServedModelChanged", changed)
            line = traj.to_line("error", "", error=f"ServedModelChanged: {changed}")
        line["endpoint"] = public_url(cfg.endpoints[i]) if cfg.endpoints else cfg.backend
        # the write finishes even if the run is interrupted meanwhile, and is counted when it lands
        fut = asyncio.get_running_loop().run_in_executor(None, self._write, line, traj, journal)
        self.writes.add(fut)
        fut.add_done_callback(self.writes.discard)
        fut.add_done_callback(retrieved)  # a write whose worker was cancelled meanwhile: its error not re-raised
        await asyncio.shield(fut)
        return line

    async def _model_changed(self, i: int) -> str | None:
        """Whether the server behind backend ``i`` now serves other weights than the run's (asked after each
        trajectory of a native SGLang run; one cheap GET)."""
        ask = getattr(self.backends[i], "served_weights", None)
        if ask is None or not self.weights:
            return None
        try:
            now = await ask()
        except BackendError:  # unreachable just now: the next call says so; the line stands
            return None
        if now and str(now).rstrip("/") != str(self.weights).rstrip("/"):
            return (f"the server now serves {now!r}, but this run records {self.weights!r} (a redeployed server?); "
                    "the trajectory is not kept")
        return None

    def _account(self, line: dict) -> None:
        """Counts, and the stop after ``--max-consecutive-errors`` harness errors in a row."""
        self.n_calls += line["n_calls"]
        self.n_tokens += line["generated_tokens"]
        self.stats.add(line)
        if line["status"] == "error":
            if not self.first_error:
                self.first_error.append(f"{line['sample_id']}/t{line['trial']}: {line.get('error')}")
            self.streak["n"] += 1
            self.streak["last"] = line.get("error") or ""
            if self.cfg.max_consecutive_errors and self.streak["n"] >= self.cfg.max_consecutive_errors:
                self.stop.set()
        else:
            self.streak["n"] = 0
        self.bar.update(1)
        rate = self.n_calls / max(time.perf_counter() - self.t0, 1e-9)
        self.bar.set_postfix_str(" ".join(f"{k}={v}" for k, v in sorted(self.counts.items())) + f" calls/s={rate:.1f}",
                                 refresh=False)

    async def worker(self) -> None:
        while not self.stop.is_set():
            job = self.claim()
            if job is None:
                return
            self._account(await self._unit(*job))

    async def run(self, n: int) -> tuple[bool, int, int]:
        """Run ``n`` workers to the end; ``(interrupted, units abandoned, their calls)``. The model server found
        down (:class:`ModelServerDown`) stops the run as an interrupt does (``self.down`` says why)."""
        tasks = [asyncio.create_task(self.worker()) for _ in range(n)]
        try:
            await asyncio.gather(*tasks)
        except BaseException as e:
            # every other worker stops here, before the clients close under it (a full disk, a damaged record: the
            # one error is the command's message, never a worker's traceback at shutdown)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # what is abandoned, counted as each unit unwound (an interrupt cancels the workers before this runs)
            lost_units, lost_calls = len(self.abandoned), sum(self.abandoned)
            if self.writes:  # lines being written when the interrupt came: let them land (and be counted)
                await asyncio.wait(list(self.writes))
            if not isinstance(e, (asyncio.CancelledError, KeyboardInterrupt, ModelServerDown)):
                raise
            if isinstance(e, ModelServerDown):
                self.down = str(e)
            return True, lost_units, lost_calls
        return False, 0, 0


def in_flight_note(units: int, calls: int, out) -> str:
    """What an interrupt left of the units it stopped: their completed calls, kept, and where."""
    if not units:
        return "no unit was in flight"
    return (f"{units} unit(s) were in flight: the {calls} LLM call(s) they had completed are kept in {out}/inflight/ "
            "and the rerun replays them, continuing each unit from its last completed call")


def _report(cfg: RunConfig, w: _Workers, summary: dict, interrupted: bool) -> None:
    if cfg.worker is not None:
        return
    state = "stopped (the model server stopped answering)" if w.down else "interrupted" if interrupted else "done"
    log.info(f"{state}: {summary['ran']} written ({dict(w.counts)}), "
             f"{w.n_calls} LLM calls in {summary['elapsed_s']:.1f}s; tools: {dict(w.toolbox.stats)}")
    if w.resumed:
        log.info(f"resumed {w.resumed} unit(s) inside their trajectory: {w.replayed} recorded LLM calls replayed from "
                 f"{cfg.out}/inflight, not asked again")
    for x in w.stats.lines(cfg.sampling().max_tokens):
        log.info(x)
    if interrupted:
        log.info(in_flight_note(summary["abandoned_units"], summary["abandoned_calls"], cfg.out))
        if not w.down:
            log.info("rerun the same command to resume; finished samples are kept.")


async def execute(cfg: RunConfig, spec, rd: RunDir, header: dict, jobs: list, skipped: int, skipped_images: list,
                  backends, toolbox) -> dict:
    """Run ``jobs`` with ``--concurrency`` asyncio workers over the backends; every finished unit is written as it
    ends; returns the summary (raises KeyboardInterrupt after writing what finished, on Ctrl-C / SIGTERM)."""
    own_backends, own_toolbox = backends is None, toolbox is None
    backends = backends if backends is not None else make_backends(cfg)
    if own_backends and cfg.backend == "sglang":
        for b in backends:  # records name the served model (the preflight asked a fresh client)
            b.model = (header.get("model") or {}).get("served_model") or b.model
    if toolbox is None:
        toolbox = make_toolbox(cfg.tools, world_dir=cfg.world, cache_path=cfg.tool_cache or str(rd.path / "tools.sqlite"),
                               mode=cfg.cache_mode, live_fallback=cfg.live_fallback, tools=TOOL_POLICIES[cfg.protocol])
    # the model every reply must name (OpenAI-compatible replies carry ``model``; SGLang's native replies do not)
    served_model = (header.get("model") or {}).get("served_model") if cfg.backend in ("openai", "vllm") and own_backends else None
    bar = progress_bar(len(jobs), cfg.progress, spec.label)
    w = _Workers(cfg, spec, rd, claimer(jobs, SHARED.get("counter")), backends, toolbox, served_model, bar)
    if cfg.backend == "sglang":
        w.weights = (header.get("model") or {}).get("weights")
    try:
        interrupted, lost_units, lost_calls = await w.run(max(1, min(cfg.concurrency, len(jobs))))
    finally:
        bar.close()
        if own_toolbox:
            await toolbox.aclose()
        if own_backends:
            for b in backends:
                await b.aclose()
    summary = {"run_dir": str(rd.path), "ran": sum(w.counts.values()), "skipped": skipped, "counts": dict(w.counts),
               "llm_calls": w.n_calls, "generated_tokens": w.n_tokens, "replayed_calls": w.replayed,
               "elapsed_s": round(time.perf_counter() - w.t0, 2), "interrupted": interrupted,
               "tool_stats": dict(toolbox.stats), "skipped_images": len(skipped_images),
               "first_error": w.first_error[0] if w.first_error else None,
               "stopped_after_errors": w.streak["n"] if w.stop.is_set() else 0, **w.stats.to_dict()}
    if interrupted:
        summary["abandoned_units"], summary["abandoned_calls"] = lost_units, lost_calls
    _report(cfg, w, summary, interrupted)
    if w.down:
        raise ModelServerDown(w.down)
    if interrupted:
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


#: The exit status when the model server stopped answering mid-run (ours): rerun once it is back.
EXIT_SERVER_DOWN = 6


#: A --processes worker's shared job counter (set in the child before it runs).
SHARED: dict = {}


def claimer(jobs: list, counter=None):
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


def progress_bar(total: int, enabled: bool, label: str):
    return tqdm(total=total, desc=label, unit="sample", disable=not enabled, mininterval=1.0, file=sys.stderr)
