"""The entropy probe over a run: which steps to probe, each trajectory probed in turn, then the per-step summary.

Resumable: each finished step is one flushed line of ``steps.jsonl``; a rerun probes only the missing steps.
One probe per output directory at a time (a second is refused: both would append the same steps).
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from agent.backends.base import BackendError, ModelServerDown
from agent.backends.messages import ImageUsers
from agent.backends.spread import pin
from agent.errors import gather_all
from agent.lazy import lazy_module
from agent.record import EntropyStep, LlmCall, ResultLine
from agent.rundir import RunError, close_fragment, load_run, output_lock, token_key, write_json
from agent.rundir.lines import SOURCE_KEY, RowWriter
from agent.rundir.probe_outputs import resume_rows, sweep_outputs, write_outputs
from analysis.estimators.selection import select_trajectories
from analysis.estimators.stats import summarise_by
from probes.cli import ENTROPY_MODES as MODES
from probes.session import RecordedPrompts, probe_model_check, record_session, serving_hardware

from .step import StepContext, bounds_by_step, bounds_calibration, probe_step, vocab_of
from .store import TokenStore
from .table import read_step_table, serving

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

log = logging.getLogger(__name__)

__all__ = ["probe_run", "MODES", "SUPPORTED_METHODS"]

#: Methods whose trajectories the entropy probe reads (the paper probes ReAct; Removal@k runs have steps
#: without query images by design, which the selection rule handles).
SUPPORTED_METHODS = ("react",)
#: Step columns that are numbers (a null in JSON, a non-finite value, is NaN).
NUMERIC = ("H_with", "H_without", "dH", "H_exact_with", "H_exact_without", "kl_with_without", "dH_exact", "gap_with",
           "H_high_with", "H_high_without", "dH_low", "dH_high")


async def probe_run(run_dir, *, mode: str = "regenerate", out_dir=None, **kw) -> dict:
    """Probe every image-bearing step of the run; returns {"steps": DataFrame, "summary": DataFrame, "out": Path}.
    One probe per output directory at a time (a second is refused: both would append the same steps)."""
    out = Path(out_dir) if out_dir else Path(run_dir) / "probes" / f"entropy-{mode}"
    with output_lock(out, "entropy probe"):
        sweep_outputs(out)
        return await _probe_run(run_dir, mode=mode, out_dir=out, **kw)


def _done_steps(steps_path: Path, sources: dict) -> set:
    """The (sample, trial, step) rows already written of the run's lines; a torn or changed row is set aside and
    its step probed again, as is a step of a line rerun since."""
    close_fragment(steps_path)  # an interrupted append left a fragment: new rows start on a line of their own
    return {(r.sample_id, r.trial, r.step) for r in resume_rows(steps_path, EntropyStep, sources)}


def _plan(run, out: Path, done: set, limit, include_unparsed: bool) -> tuple[list, list]:
    """The selected trajectories (paper B.1 rule, exclusions written) and ``[(line summary, steps to probe)]``."""
    # the run's index (line summaries) decides what to probe; each trajectory's whole line and token columns
    # are read when its turn comes and dropped when its steps are done: memory stays bounded at any run size
    index = sorted(run.index, key=lambda ln: ln.key)[: limit or None]
    lines, exclusions = select_trajectories(index, include_unparsed=include_unparsed)
    exclusions.to_csv(out / "exclusions.csv", index=False)
    pending = []
    for line in lines:
        steps = [c.index for c in line.calls if c.n_query_images > 0 and (*line.key, c.index) not in done]
        if steps:
            pending.append((line, steps))
    log.info("trajectories entering the analysis (rule: analysis/estimators/selection.py):\n"
             + exclusions.to_string(index=False))
    return lines, pending


def _what_steps_read(line: ResultLine) -> ResultLine:
    """The line as its steps read it while it is in flight: its messages and its calls without their reply texts
    (the messages hold what was sent); the tool calls and the replies' reasoning are let go (ours: ~half a paper-
    shaped line, for each of the hundreds of trajectories in flight; docs/performance.md)."""
    calls = [e.model_copy(update={"text": None, "reasoning": None}) for e in line.events if isinstance(e, LlmCall)]
    return line.model_copy(update={"events": calls})


class _Prober:
    """Probes trajectories one after another within a bound on those in flight; every finished step is written
    to ``sink`` at once (one whole flushed line) and its tokens to the :class:`TokenStore`."""

    def __init__(self, run, backend, mode: str, out: Path, sink, bar, *, concurrency: int, retokenize: bool):
        self.run, self.backend, self.mode, self.sink, self.bar = run, backend, mode, sink, bar
        self.sem = asyncio.Semaphore(concurrency)
        self.failures: list[str] = []
        self.kept = 0
        self.image_users = ImageUsers()
        self.recorded = RecordedPrompts(backend, off=retokenize)
        self.columns = (["call", "think", "top_logprobs", "exact_entropy"] if mode == "regenerate"
                        else ["call", "think", "id", "text"])
        self.vocab = vocab_of(backend)
        self.store = TokenStore(out / "tokens")

    def _open(self, summary):
        """The trajectory's whole line and token columns, and the lending of its recorded prompt ids."""
        line = self.run.full(summary)
        if not line.tokens_file:
            raise RunError("no token sidecar (the run recorded no tokens)")
        # the token texts only for a backend that scores by text (the scripted fake): the model backends score ids
        want = self.columns if self.mode == "regenerate" else [c for c in self.columns if c != "text"] + (
            ["text"] if getattr(self.backend, "scores_text", False) else [])
        tok = self.run.tokens(line, want)
        # the prompt ids the run sent, lent to the backend while this trajectory is probed (probes/session.py)
        return _what_steps_read(line), tok, self.recorded.lend(self.run, line)

    async def trajectory(self, summary, steps) -> None:
        async with self.sem:  # at most `concurrency` trajectories (and requests) at a time
            pin(self.backend, summary.key)  # one server per trajectory (its prefix cache)
            try:
                line, tok, give_back = self._open(summary)
            except RunError as e:
                self.failures.append(f"{summary.sample_id}/t{summary.trial}: {e}")
                self.bar.update(len(steps))
                return
            try:
                await self._steps(line, tok, steps)
            finally:
                give_back()

    async def _steps(self, line: dict, tok: dict, steps: list) -> None:
        # what its steps share; the images its steps send, counted for the probe's image cache
        ctx = StepContext(self.run, line, tok, self.backend, self.mode, self.vocab, images=(self.image_users, set()))
        events = {e.index: e for e in line.events if isinstance(e, LlmCall)}
        key, kept_any = token_key(line.sample_id, line.trial), False
        try:
            for step in steps:
                ev = events.get(step)
                try:
                    if ev is None:
                        raise RunError(f"no llm_call event for step {step}")
                    row, t = await probe_step(ctx, ev)
                except ModelServerDown:  # the command ends here, every finished step kept
                    raise
                except (BackendError, RunError) as e:
                    self.failures.append(f"{line.sample_id}/t{line.trial} step {step}: {e}")
                    row = None
                if row is not None:
                    if t is not None:  # the step's tokens first (its partial file), then its row; not held here
                        self.store.append(key, step, t)
                        kept_any = True
                    # one whole line, flushed: an interrupt keeps every finished step, the rerun probes the rest
                    row[SOURCE_KEY] = line.line_sha256  # the line (and so the sidecar) it was computed from
                    self.sink.append(row, f"{line.sample_id}/t{line.trial} step {step}")
                    self.kept += 1
                self.bar.update(1)
        finally:
            self.image_users.done(ctx.images[1])
        if kept_any:  # the trajectory is done: its partial file folded into its Parquet file (an interrupt leaves it)
            self.store.commit(key)


def _steps_frame(steps: pd.DataFrame, lines: list, run, failures: list) -> pd.DataFrame:
    steps = steps.copy()
    for c in NUMERIC:
        if c in steps:
            steps[c] = pd.to_numeric(steps[c], errors="coerce").astype(float)
    if steps.empty:
        raise RunError(f"{run.path}: no step with query images was probed ({len(failures)} failed"
                       + (f"; first: {failures[0]}" if failures else "") + ")")
    keep = {ln.key for ln in lines}  # a rerun after a selection change drops stale rows
    steps = steps[[(a, b) in keep for a, b in zip(steps["sample_id"], steps["trial"])]]
    steps = steps.sort_values(["sample_id", "trial", "step"]).reset_index(drop=True)
    if "dH_low" in steps:  # +1 / -1: the interval holds only positive / negative ΔH; 0: it holds 0
        steps["sign_robust"] = np.select([steps["dH_low"] > 0, steps["dH_high"] < 0], [1, -1], 0)
    return steps


def _summary(steps: pd.DataFrame, out: Path) -> pd.DataFrame:
    """Per step: n, mean ΔH, 95% CI, Wilcoxon p (calls without think tokens excluded and counted), KL and bounds."""
    if not np.isfinite(steps["dH"]).any():  # every step without think tokens: ΔH is undefined, not 0
        raise RunError(f"{out}: none of the {len(steps)} probed steps has think tokens on both sides (ΔH is the "
                       "thinking's entropy: the model or path gave no reasoning tokens); steps.csv lists them")
    summary = summarise_by(steps[np.isfinite(steps["dH"])], "step", "dH")
    counts = steps.groupby("step").agg(n_steps=("dH", "size"),
                                       excluded_no_think=("dH", lambda x: int((~np.isfinite(x)).sum())),
                                       H_with=("H_with", "mean"), H_without=("H_without", "mean"))
    summary = summary.merge(counts.reset_index(), on="step", how="right")
    if "kl_with_without" in steps:
        kl = summarise_by(steps[np.isfinite(steps["kl_with_without"])], "step", "kl_with_without")
        kl = kl.rename(columns={"mean": "kl_with_without", "ci_low": "kl_ci_low", "ci_high": "kl_ci_high", "n": "kl_n"})
        summary = summary.merge(kl[["step", "kl_with_without", "kl_ci_low", "kl_ci_high", "kl_n"]], on="step",
                                how="left")
    if "dH_exact" in steps:
        summary = summary.merge(steps.groupby("step")[["dH_exact", "gap_with"]].mean().reset_index(), on="step",
                                how="left")
    if "dH_low" in steps:
        summary = summary.merge(bounds_by_step(steps), on="step", how="left")
        cal = bounds_calibration(steps)
        if cal is not None:
            cal.to_csv(out / "bounds_calibration.csv", index=False)
            bad = cal[cal["covered"] < 1.0]
            if len(bad):  # cannot happen for a correct bound: said loudly, never hidden
                log.warning(f"warning: the entropy bounds missed the exact value at {int(bad['n_missed'].sum())} step(s) "
                            f"(bounds_calibration.csv); please report it")
    return summary


async def _probe_pending(prober: _Prober, pending: list, steps_path: Path, n_done: int, n_steps: int) -> None:
    try:
        await gather_all(prober.trajectory(line, steps) for line, steps in pending)
    except BaseException:
        log.info(f"entropy probe stopped: {prober.kept} steps finished in this session are kept in {steps_path} "
                 f"({n_done + prober.kept} in all); the rerun probes the {n_steps - prober.kept} others")
        raise


def check_probeable(run) -> None:
    """Refuse, before any server is asked, a run the entropy probe cannot read: not ReAct, or without logprobs."""
    if run.header.method not in SUPPORTED_METHODS:
        raise RunError(f"{run.path}: the entropy probe reads ReAct runs (paper §3.2.2); this run is "
                       f"{run.header.label or run.header.method}")
    if run.header.logprobs == "absent" or run.header.sampling.top_logprobs == 0:
        raise RunError(f"{run.path}: this run recorded no logprobs (it asked for none: --server openrouter sends no "
                       "logprob fields unless --top-logprobs is given), so it has no token ids to probe; the entropy "
                       "probe needs a run with the paper's top-20 logprobs (B.4)")


async def _probe_run(run_dir, *, mode: str = "regenerate", backend=None, out_dir=None, concurrency: int = 8,
                     limit: int | None = None, progress: bool = True, force: bool = False,
                     include_unparsed: bool = False, hardware: dict | None = None, fidelity: dict | None = None,
                     retokenize: bool = False) -> dict:
    if mode not in MODES:
        raise ValueError(f"--mode must be one of {MODES}")
    run = load_run(run_dir)
    check_probeable(run)
    ident = await probe_model_check(run, backend, force=force)
    out = Path(out_dir) if out_dir else run.path / "probes" / f"entropy-{mode}"
    out.mkdir(parents=True, exist_ok=True)
    steps_path = out / "steps.jsonl"
    sources = run.seals()
    done = _done_steps(steps_path, sources)
    lines, pending = _plan(run, out, done, limit, include_unparsed)
    n_steps = sum(len(st) for _, st in pending)
    log.info(f"entropy probe ({mode}): {len(lines)} trajectories, {n_steps} image-bearing steps to probe, "
             f"{len(done)} already done -> {out}")
    getattr(backend, "prepare", lambda m: None)(mode)  # what the requests will need, loaded once
    bar = tqdm(total=n_steps, desc=f"entropy/{mode}", unit="step", disable=not progress, file=sys.stderr,
               mininterval=1.0)
    started, t0 = time.time(), time.perf_counter()
    with RowWriter(steps_path, "entropy_step") as sink:
        prober = _Prober(run, backend, mode, out, sink, bar, concurrency=concurrency, retokenize=retokenize)
        prober.failures += [f"{sid}/t{t}: its line changed since it was written (left out)" for sid, t, _ in run.changed]
        if not prober.vocab:
            log.info("entropy bounds: the model's vocabulary size is unknown (no config.json): steps carry the grouped "
                     "lower bound only, no upper bound or ΔH interval")
        if prober.store.recover():  # an interrupted probe's finished steps, folded into their trajectories' files
            log.info(f"{out / 'tokens'}: folded the token results of an interrupted probe into their trajectories' "
                     "files")
        try:
            await _probe_pending(prober, pending, steps_path, len(done), n_steps)
        finally:
            bar.close()
    read, table = read_step_table(steps_path, sources, mode)
    cost = record_session(out / "probe.json", hardware or serving_hardware(backend), started,
                          time.perf_counter() - t0, prober.kept)
    write_json(out / "probe.json", {
        "run_dir": str(run.path), "mode": mode, "finished": time.time(), "serving": serving(read),
        "cost": cost, "fidelity": fidelity or {"skipped": "not run (probe_run called directly)"}, "model": ident,
        "forced_model_mismatch": force, "include_unparsed": include_unparsed, "prompt_ids": prober.recorded.summary(),
        "failures": prober.failures}, indent=2)
    fork_summary = table.forking(read)
    steps = _steps_frame(read, lines, run, prober.failures)
    del read, table
    summary = _summary(steps, out)
    tables = {"steps.parquet": steps, "steps.csv": steps, "summary.csv": summary}
    if fork_summary is not None:
        tables["forking.csv"] = fork_summary
    written = [out / "exclusions.csv", out / "bounds_calibration.csv", *sorted((out / "tokens").glob("*.parquet"))]
    write_outputs(out, tables, rows="steps.jsonl", files=[f for f in written if f.is_file()])
    for f in prober.failures[:10]:
        log.info(f"failed: {f}")
    model = (ident or {}).get("served_model") or (run.index[0].model if run.index else None) or "model"
    return {"steps": steps, "summary": summary, "forking": fork_summary, "out": out, "failures": prober.failures,
            "mode": mode, "model": model, "header": run.header}
