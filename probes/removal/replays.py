"""The work of ``python -m probes.removal`` once its arguments parse: probes/removal/cli.py holds the flags, the
package's docstring says what it does and writes."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from pathlib import Path as _P

from tqdm import tqdm

from agent.backends.base import SamplingParams
from agent.backends.messages import ImageUsers, record_messages
from agent.backends.spread import pin
from agent.benchmarks import Sample
from agent.cli import done
from agent.errors import gather_all
from agent.judge import Grader
from agent.lazy import lazy_module
from agent.methods import HARNESS_ERRORS, Budgets, Episode, MethodSpec
from agent.methods.common import Turn, tool_reply
from agent.methods.react import react_messages, run_react
from agent.prompts import CORRECTION, fill
from agent.record import LineSummary, LlmCall, ResultLine, RunHeader, ToolCall, validate
from agent.redact import is_host
from agent.rundir import Run, RunDir, RunError, load_run, output_lock, write_json
from agent.rundir.probe_outputs import sweep_outputs, write_outputs
from agent.tools import make_toolbox
from agent.tools.policy import POLICY_NAMED
from agent.trajectory import Trajectory
from analysis.estimators.stats import removal_summary
from analysis.figures import fig2c_removal, provenance_mark
from probes.session import (
    RecordedPrompts,
    backend_for,
    probe_concurrency,
    probe_model_check,
    record_session,
    run_async,
    serving_hardware,
)

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

log = logging.getLogger(__name__)

__all__ = ["replay_prefix_turns", "replay_one", "removal_probe", "parse_steps", "removal_command"]


def parse_steps(spec: str) -> list[int]:
    """``"1..5"``, ``"1,2,4"`` or ``"3"`` -> sorted step numbers (>= 1)."""
    out = set()
    for part in str(spec).split(","):
        part = part.strip()
        if ".." in part:
            a, b = part.split("..", 1)
            if int(b) < int(a):
                raise ValueError(f"--steps {spec!r}: the range {part} runs backwards; write it low..high, like "
                                 f"{b}..{a}")
            out.update(range(int(a), int(b) + 1))
        elif part:
            out.add(int(part))
    if not out or min(out) < 1:
        raise ValueError(f"--steps {spec!r}: give steps >= 1 like 1..5 or 1,3,5")
    return sorted(out)


def replay_prefix_turns(run: Run, line: ResultLine, upto: int) -> tuple[list[Turn], bool]:
    """The ReAct turns of calls 1..upto exactly as recorded (output, reasoning, and the reply that followed).

    Observations are rebuilt from the record, with their result images from the run's image store: no
    tool is called. Returns (turns, correction): whether call upto+1 answers a correction re-prompt.
    """
    tools = {e.call_index: e for e in line.events if isinstance(e, ToolCall)}
    turns, correction = [], False
    for ev in line.events:
        if not isinstance(ev, LlmCall) or ev.index > upto:
            continue
        if ev.action_error:
            turns.append(Turn(ev.text, ev.reasoning or "", fill(CORRECTION, error=ev.action_error)))
            correction = True
        elif ev.index in tools:
            t = tools[ev.index]
            images = []
            for sha in t.result_images:
                p = run.image_path(sha)
                if p is None:
                    raise RunError(f"{run.path}/images: result image {sha[:12]}… of {line.sample_id} "
                                   f"(call {ev.index}) is not stored")
                images.append(str(p))
            turns.append(Turn(ev.text, ev.reasoning or "", tool_reply(t.observation, images)))
            correction = False
        else:
            raise RunError(f"{line.sample_id}: call {ev.index} ended the trajectory; it cannot be a replay prefix")
    return turns, correction


def _sample_of(run: Run, line: LineSummary) -> Sample:
    """The sample as the agent saw it, with the query images from the run's image store."""
    paths = []
    for ident, sha in sorted(line.query_images.items(), key=lambda kv: int(kv[0][7:-1])):
        p = run.image_path(sha)
        if p is None:
            raise RunError(f"{run.path}/images: query image {ident} of {line.sample_id} is not stored")
        paths.append(str(p))
    return Sample(id=line.sample_id, query=line.question, query_images=paths, answer=line.gold,
                  benchmark=line.benchmark, line=0, image_dir="", category=line.category,
                  paper_category=line.paper_category)


def _sent(messages: list[dict]) -> str:
    """What reaches the model: the messages with each image's local path (``source``) left out."""

    def strip(p):
        return {k: v for k, v in p.items() if k != "source"} if isinstance(p, dict) else p
    return json.dumps([{**m, "content": [strip(p) for p in m["content"]] if isinstance(m.get("content"), list)
                        else m.get("content")} for m in messages], sort_keys=True, ensure_ascii=False)


async def replay_one(run: Run, line: ResultLine, tokens: dict, k: int, *, backend, toolbox, spec: MethodSpec,
                     sampling: SamplingParams) -> tuple[dict, Trajectory]:
    """Replay ``line`` from step k with the query images removed; returns the replay's result line."""
    sample = _sample_of(run, line)
    traj = Trajectory(sample, line.trial, "react", f"replay-removal@{k}")
    try:
        turns, correction = replay_prefix_turns(run, line, k - 1)
        traj.seed_prefix(run.recorded(line), tokens, k - 1)  # the prefix's events and messages as recorded
        for e in traj.events:  # the prefix's retrieved images are stored with the replay too
            for sha in e.get("result_images") or []:
                traj.image_files.setdefault(sha, str(run.image_path(sha)))
        if sampling.seed is not None:  # the trial's own seed, as the run sampled it (agent.run: seed + trial)

            sampling = dataclasses.replace(sampling, seed=sampling.seed + line.trial)
        ep = Episode(sample, line.trial, backend=backend, toolbox=toolbox, sampling=sampling, traj=traj,
                     budgets=spec.budgets, history_reasoning=spec.history_reasoning,
                     observation_images=spec.observation_images)
        # the prefix must reproduce the original context of step k exactly (before the images go)
        ev_k = run.call_event(line, k)
        rebuilt = record_messages(react_messages(ep, turns, step=k, remove_from=None, force=ev_k.forced))
        recorded = [m.model_dump(exclude_unset=True) for m in run.call_messages(line, ev_k)]
        if _sent(rebuilt) != _sent(recorded):
            raise RunError(f"{line.sample_id}/t{line.trial}: the recorded prefix does not rebuild step {k}'s "
                           "context byte for byte (was the run made by another version of the agent?)")
        status, answer = await run_react(ep, remove_from=k, turns=turns, correction=correction)
        out = traj.to_line(status, answer)
    except (*HARNESS_ERRORS, RunError) as e:  # recorded on this replay (a missing pair); the others go on
        traj.error(type(e).__name__, f"{type(e).__name__}: {e}")
        out = traj.to_line("error", "", error=f"{type(e).__name__}: {e}")
    out.update(replay_of={"sample_id": line.sample_id, "trial": line.trial, "k": k})
    return out, traj


def replay_spec(header: RunHeader) -> MethodSpec:
    """The method settings of the run being replayed (budgets, history, observation images)."""
    return MethodSpec("react", budgets=Budgets(t_max=header.budgets.t_max, b_max=header.budgets.b_max),
                      history_reasoning=header.history_reasoning, observation_images=header.observation_images)


def replay_toolbox(run: Run):
    """Tools for the live part of the replays: the run's cache in readwrite mode over the run's provider.

    A call the original run made is answered from the cache; a new one goes to the live tools (their
    keys are checked here, before any work) or to the offline world, and is written back to the cache.
    """
    tools_h = run.header.tools
    provider = tools_h.provider or "offline"
    toolbox = make_toolbox(provider, world_dir=tools_h.world, cache_path=tools_h.cache or str(run.path / "tools.sqlite"),
                           mode="readwrite", tools=POLICY_NAMED[tools_h.policy])
    if provider == "live":
        toolbox.require()
    return toolbox


async def removal_probe(run_dir, steps: list[int], *, out_dir=None, **kw) -> dict:
    """The step-k replays; one probe per output directory at a time (a second is refused)."""

    out = _P(out_dir) if out_dir else _P(run_dir) / "probes" / "removal"
    with output_lock(out, "removal probe"):
        sweep_outputs(out)
        return await _removal_probe(run_dir, steps, out_dir=out, **kw)


def _replay_dirs(out: Path, h: dict, ident: dict, steps: list[int], run_path: Path) -> dict:
    """One run directory per k (``OUT/k<k>``), its header saying what it replays."""
    dirs = {k: RunDir(out / f"k{k}") for k in steps}
    for k, rd in dirs.items():
        rd.write_header({**{x: h.get(x) for x in ("benchmark", "budgets", "sampling", "schema_version", "backend",
                                                  "tools", "benchmark_path", "versions", "history_reasoning",
                                                  "observation_images")},
                         "model": ident, "method": "react", "variant": f"replay-removal@{k}",
                         "label": f"react replay, images removed from step {k}",
                         "remove_images_from_step": k, "replay_of": str(run_path), "trials": h.get("trials")},
                        force=True)
    return dirs


async def _replay_all(run, lines: list, pending: dict, dirs: dict, *, backend, toolbox, spec, sampling, concurrency: int,
                      bar, retokenize: bool):
    """Every pending replay; a trajectory's k replays back to back on one server (its prefixes). Returns the
    prompt-id record's summary."""
    sem = asyncio.Semaphore(concurrency)
    image_users = ImageUsers()
    recorded = RecordedPrompts(backend, off=retokenize)

    async def trajectory_group(summary: LineSummary):
        ks = pending[summary.key]
        if not ks:
            return
        async with sem:
            pin(backend, summary.key)
            line = run.full(summary)
            tokens = run.tokens(line)
            # the history before step k is the run's: its recorded prompt ids are sent again (probes/session.py)
            give_back = recorded.lend(run, line)
            mine: set = set()  # its query images leave the image caches when its replays (and its twins') are done
            image_users.use(mine, line.query_images.values())
            try:
                for k in ks:
                    rl, traj = await replay_one(run, line, tokens, k, backend=backend, toolbox=toolbox, spec=spec,
                                                sampling=sampling)
                    await asyncio.to_thread(dirs[k].append, traj, rl)
                    bar.update(1)
            finally:
                give_back()
                image_users.done(mine)

    await gather_all(trajectory_group(ln) for ln in lines)
    return recorded.summary()


async def _outcomes(grader: Grader, lines: list, dirs: dict) -> pd.DataFrame:
    """The originals and every replay graded by the same grader: one row per (trajectory, k)."""
    originals = {ln.key: ln for ln in lines}
    orig_grades = dict(zip(originals, await asyncio.gather(*(grader.grade(ln) for ln in originals.values()))))
    rows = []
    for k, rd in dirs.items():
        replays = {ln.key: ln for ln in load_run(rd.path).index if ln.key in originals}
        ok_replays = {key: ln for key, ln in replays.items() if ln.status not in ("error", "timeout")}
        graded = dict(zip(ok_replays, await asyncio.gather(*(grader.grade(ln) for ln in ok_replays.values()))))
        for key, orig in originals.items():
            o = orig_grades[key]["grade"] == "CORRECT"
            base = {"sample_id": key[0], "trial": key[1], "k": k, "benchmark": orig.benchmark,
                    "paper_category": orig.paper_category, "original_correct": o,
                    "source_sha256": orig.line_sha256, "replay_sha256": replays[key].line_sha256 if key in replays else None}
            if orig.n_calls < k:  # ended before step k: keeps its original outcome
                rows.append({**base, "replay_correct": o, "replayed": False, "replay_status": orig.status,
                             "error": None})
            elif key in graded:
                rows.append({**base, "replay_correct": graded[key]["grade"] == "CORRECT", "replayed": True,
                             "replay_status": replays[key].status, "error": None})
            elif key in replays:  # ended in error/timeout: a missing pair, never a wrong answer
                rows.append({**base, "replay_correct": None, "replayed": True, "replay_status": replays[key].status,
                             "error": replays[key].error})
    for r in rows:
        validate("removal_outcome", r, f"removal outcome {r['sample_id']}/t{r['trial']} k={r['k']}")
    return pd.DataFrame(rows)


async def _removal_probe(run_dir, steps: list[int], *, backend, grader: Grader, out_dir=None, concurrency: int = 8,
                         limit: int | None = None, progress: bool = True, force: bool = False,
                         hardware: dict | None = None, retokenize: bool = False) -> dict:
    run = load_run(run_dir)
    h = run.header
    if h.method != "react" or h.remove_images_from_step is not None:
        raise RunError(f"{run.path}: step-k removal replays need a plain ReAct run (this is {h.label})")
    ident = await probe_model_check(run, backend, force=force)
    out = Path(out_dir) if out_dir else run.path / "probes" / "removal"
    sp = h.sampling.as_recorded()
    sampling = SamplingParams(**{k: sp[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                                    "max_tokens", "top_logprobs", "seed", "enable_thinking") if k in sp})
    if grader.judge == "llm":
        grader.client()  # fail early (a missing judge key) before any replay
    toolbox = replay_toolbox(run)
    dirs = _replay_dirs(out, h.as_recorded(), ident, steps, run.path)
    done = {k: rd.done_keys(retry_errors=True) for k, rd in dirs.items()}
    # summaries from the run's index; each trajectory's whole line is read when its replays start
    lines = sorted(run.index, key=lambda ln: ln.key)[: limit or None]
    lines = [ln for ln in lines if ln.status in ("ok", "no_answer")]  # harness failures are not trajectories
    pending = {ln.key: [k for k in steps if ln.n_calls >= k and ln.key not in done[k]] for ln in lines}
    n_jobs = sum(len(v) for v in pending.values())
    log.info(f"removal replays: {len(lines)} trajectories x steps {steps}: {n_jobs} replays to run -> {out}")
    bar = tqdm(total=n_jobs, desc="removal", unit="replay", disable=not progress, file=sys.stderr, mininterval=1.0)
    started, t0 = time.time(), time.perf_counter()
    hardware = hardware or serving_hardware(backend)
    try:
        prompt_ids = await _replay_all(run, lines, pending, dirs, backend=backend, toolbox=toolbox,
                                       spec=replay_spec(h), sampling=sampling, concurrency=concurrency, bar=bar,
                                       retokenize=retokenize)
    except BaseException:  # interrupted: the GPU time of the replays that were answered is recorded all the same
        out.mkdir(parents=True, exist_ok=True)
        cost = record_session(out / "probe.json", hardware, started, time.perf_counter() - t0, bar.n)
        write_json(out / "probe.json", {"run_dir": str(run.path), "steps": steps, "model": ident, "cost": cost,
                                        "interrupted": True}, indent=2)
        raise
    finally:
        bar.close()
        await toolbox.aclose()
    out.mkdir(parents=True, exist_ok=True)
    cost = record_session(out / "probe.json", hardware, started, time.perf_counter() - t0, bar.n)
    outcomes = await _outcomes(grader, lines, dirs)
    await grader.aclose()
    if outcomes.empty:
        raise RunError(f"{run.path}: no replay outcome to report")
    errors = outcomes[outcomes["error"].notna() | outcomes["replay_status"].isin(["error", "timeout"])]
    summary = removal_summary(outcomes)
    write_outputs(out, {"outcomes.csv": outcomes, "errors.csv": errors[["sample_id", "trial", "k", "replay_status",
                                                                        "error"]], "summary.csv": summary})
    write_json(out / "probe.json", {"run_dir": str(run.path), "steps": steps, "model": ident, "cost": cost,
                                                "forced_model_mismatch": force, "judge": grader.label,
                                                "prompt_ids": prompt_ids, "n_error": int(len(errors))}, indent=2)
    return {"outcomes": outcomes, "summary": summary, "out": out, "judge": grader.label, "judge_name": grader.name,
            "errors": errors.to_dict("records"), "header": h, "model": ident.get("served_model")}


def draw_panel(res: dict) -> None:
    """Figure 2(c)'s panel beside the probe's tables (the command's view; :func:`removal_probe` draws nothing)."""
    fig2c_removal(res["summary"], res["out"] / "fig2c_removal", mark=provenance_mark([res["header"]]),
                  title=f"Figure 2(c): step-k image removal ({res['model']}; judge: {res['judge_name']})")


def removal_command(a) -> int:
    """``python -m probes.removal`` once its arguments parse."""

    async def go():
        run = load_run(a.run_dir)
        backend = backend_for(a, run.header)
        server = "openrouter" if is_host(a.judge_endpoint, "openrouter.ai") else "other"
        grader = Grader(a.judge, endpoint=a.judge_endpoint, model=a.judge_model, api_key_env=a.judge_api_key_env,
                        server=server)
        try:
            hw = serving_hardware(backend, gpus_per_server=a.gpus_per_server, serving_dir=a.serving_dir)
            return await removal_probe(a.run_dir, parse_steps(a.steps), backend=backend, grader=grader, out_dir=a.out,
                                       hardware=hw,
                                       concurrency=probe_concurrency(a, backend), limit=a.limit, progress=not a.no_progress,
                                       force=a.force, retokenize=a.retokenize)
        finally:
            await backend.aclose()

    res, code = run_async(go(), "finished replays", a.out or Path(a.run_dir) / "probes" / "removal")
    if code:
        return code
    draw_panel(res)
    print(f"judge: {res['judge']}")
    print(res["summary"].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if res["errors"]:
        ids = sorted({f"{e['sample_id']}/t{e['trial']} (k={e['k']})" for e in res["errors"]})
        log.info(f"{len(res['errors'])} replays ended in error and are left out as missing pairs: {', '.join(ids[:10])}"
                 f"{' …' if len(ids) > 10 else ''}\n(first error: {res['errors'][0]['error']}); see {res['out']}/errors.csv. "
                 f"Rerun the same command to retry them.")
        return 3
    done([f"{res['out']}/ (summary.csv, outcomes.csv, errors.csv, k<K>/ run dirs, fig2c_removal.png/.pdf)"],
         f"python -m probes.grounding {a.run_dir}   |   python -m analysis.report --react {a.run_dir}")
    return 0


