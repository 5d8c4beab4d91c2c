"""The work of ``python -m probes.grounding`` once its arguments parse: probes/grounding/cli.py holds the flags, the
package's docstring says what it does and writes."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
from pathlib import Path

from tqdm import tqdm

from agent.backends import make_backend
from agent.backends.base import BackendError, ModelServerDown, SamplingParams
from agent.backends.messages import ImageUsers
from agent.backends.openai_compat import OpenAIBackend
from agent.backends.spread import Spread
from agent.cli import DEFAULT_CONCURRENCY, JUDGE_ENDPOINT, done
from agent.errors import gather_all
from agent.judge import judge_key_env
from agent.lazy import lazy_module
from agent.parsing import load_json
from agent.prompts import GROUNDING_PASS1, GROUNDING_PASS2, fill
from agent.record import GroundingLabel, LlmCall, ResultLine, ToolCall
from agent.redact import is_host
from agent.rundir import RunError, close_fragment, load_run, output_lock
from agent.rundir.lines import SOURCE_KEY, RowWriter
from agent.rundir.probe_outputs import resume_rows, sweep_outputs, write_outputs
from analysis.estimators.selection import select_trajectories
from analysis.figures import fig2a_grounding, provenance_mark
from probes.session import keeps_unparsed, run_async

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

log = logging.getLogger(__name__)

__all__ = ["steps_of", "steps_text", "parse_labels", "LabelError", "annotate_run", "CATEGORIES", "grounding_command"]

CATEGORIES = ("Image Needed", "Image-Derived", "Text Only")


class LabelError(ValueError):
    """The annotator's reply cannot be used as labels (it is asked again, then reported)."""


def steps_of(line: ResultLine) -> list[dict]:
    """The trajectory's steps: one per LLM call, with its tool and the observation that followed."""
    tools = {e.call_index: e for e in line.events if isinstance(e, ToolCall)}
    out = []
    for ev in line.events:
        if not isinstance(ev, LlmCall):
            continue
        t = tools.get(ev.index)
        tool = t.name if t else (ev.action.kind if ev.action else "none")
        out.append({"step": ev.index, "tool": tool, "reasoning": ev.reasoning or "", "action": ev.text or "",
                    "observation": t.observation if t else (f"(format error: {ev.action_error})"
                                                            if ev.action_error else "")})
    return out


def steps_text(steps: list[dict], *, observation_chars: int = 1500, labels: list[dict] | None = None) -> str:
    """Render the steps for the annotator (ours: the paper does not print this layout)."""
    parts = []
    for i, s in enumerate(steps):
        obs = s["observation"]
        if len(obs) > observation_chars:
            obs = obs[:observation_chars] + f" …[{len(obs) - observation_chars} more characters]"
        block = [f"### Step {i + 1}", f"Tool: {s['tool']}"]
        if labels is not None:
            block.append(f"image_needed: {'true' if labels[i]['image_needed'] else 'false'}")
        block += [f"Reasoning: {s['reasoning'].strip() or '(none)'}", f"Action: {s['action'].strip() or '(none)'}"]
        if obs:
            block.append(f"Observation: {obs}")
        parts.append("\n".join(block))
    return "\n\n".join(parts)


def _bool(v, key: str, step: int) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise LabelError(f"step {step}: {key} must be true or false, got {v!r}")


def parse_labels(reply: str, n_steps: int, keys: tuple[str, ...]) -> list[dict]:
    """The JSON array of the reply, validated: one object per step 1..n with boolean ``keys``."""
    text = re.sub(r"<think>.*?</think>", "", reply or "", flags=re.S)
    text = re.sub(r"```(?:json)?", "", text)
    start, end = text.find("["), text.rfind("]")
    if start < 0 or end <= start:
        raise LabelError("no JSON array in the reply")
    try:
        arr = load_json(text[start:end + 1])
    except json.JSONDecodeError as e:
        raise LabelError(f"the JSON array does not parse ({e.msg})") from None
    if not isinstance(arr, list) or not all(isinstance(x, dict) for x in arr):
        raise LabelError("the reply is not an array of objects")
    by_step = {}
    for x in arr:
        try:
            st = int(x.get("step"))
        except (TypeError, ValueError):
            raise LabelError(f"an object has no integer step: {str(x)[:80]}") from None
        if st in by_step:
            raise LabelError(f"step {st} labelled twice")
        by_step[st] = x
    if sorted(by_step) != list(range(1, n_steps + 1)):
        raise LabelError(f"expected steps 1..{n_steps}, got {sorted(by_step)[:12]}")
    out = []
    for st in range(1, n_steps + 1):
        x = by_step[st]
        rec = {"step": st, "reason": str(x.get("reason", ""))}
        for k in keys:
            if k not in x:
                raise LabelError(f"step {st}: no {k}")
            rec[k] = _bool(x[k], k, st)
        out.append(rec)
    return out


def category(image_needed: bool, image_info_used: bool) -> str:
    if image_needed:
        return "Image Needed"
    return "Image-Derived" if image_info_used else "Text Only"


class Annotator:
    def __init__(self, backend, *, retries: int = 2, observation_chars: int = 1500, max_tokens: int = 8192):
        self.backend = backend
        self.retries = retries
        self.observation_chars = observation_chars
        self.sp = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=max_tokens, top_logprobs=0, enable_thinking=None)

    async def _ask(self, content: list, n: int, keys: tuple[str, ...], check=None) -> tuple[list[dict] | None, list[str]]:
        errors = []
        for _ in range(self.retries + 1):
            out = await self.backend.generate([{"role": "user", "content": content}], self.sp)
            try:
                labels = parse_labels(out.visible or out.reasoning, n, keys)
                if check:
                    check(labels)
                return labels, errors
            except LabelError as e:
                errors.append(str(e))
        return None, errors

    async def annotate(self, run, line: ResultLine) -> dict:
        steps = steps_of(line)
        n = len(steps)
        rec = {"sample_id": line.sample_id, "trial": line.trial, "benchmark": line.benchmark,
               "paper_category": line.paper_category, "n_steps": n}
        if n == 0:
            return {**rec, "status": "invalid", "errors": ["no steps"], "steps": []}
        images = []
        for ident, sha in line.query_images.items():
            p = run.image_path(sha)
            if p is None:
                raise RunError(f"{run.path}/images: query image {ident} of {line.sample_id} is not stored")
            images += [{"type": "text", "text": ident}, {"type": "image_url", "image_url": {"url": str(p)}}]
        text1 = fill(GROUNDING_PASS1, question=line.question, steps_text=steps_text(steps, observation_chars=self.observation_chars))
        p1, err1 = await self._ask([*images, {"type": "text", "text": text1}], n, ("image_needed",))
        if p1 is None:
            return {**rec, "status": "invalid", "pass": 1, "errors": err1, "steps": []}
        text2 = fill(GROUNDING_PASS2, question=line.question,
                     steps_text=steps_text(steps, observation_chars=self.observation_chars, labels=p1))

        def consistent(labels):
            bad = [x["step"] for x, y in zip(labels, p1) if y["image_needed"] and not x["image_info_used"]]
            if bad:
                raise LabelError(f"steps {bad}: image_needed=true requires image_info_used=true")

        p2, err2 = await self._ask([*images, {"type": "text", "text": text2}], n, ("image_info_used",), consistent)
        if p2 is None:
            return {**rec, "status": "invalid", "pass": 2, "errors": err1 + err2, "steps": []}
        rows = [{"step": s["step"], "tool": s["tool"], "image_needed": a["image_needed"],
                 "image_info_used": b["image_info_used"], "category": category(a["image_needed"], b["image_info_used"]),
                 "reason_1": a["reason"], "reason_2": b["reason"]} for s, a, b in zip(steps, p1, p2)]
        return {**rec, "status": "ok", "retried": len(err1) + len(err2), "errors": err1 + err2, "steps": rows}


def _done_labels(path: Path, sources: dict) -> dict:
    """The trajectories of the run's lines already annotated; a torn or changed label is set aside and its
    trajectory annotated again, as is one rerun since."""
    close_fragment(path)  # an interrupted append left a fragment: new labels start on a line of their own
    return {(r.sample_id, r.trial): r for r in resume_rows(path, GroundingLabel, sources)}


def _steps_and_summary(recs: list[GroundingLabel], failed: list) -> tuple[pd.DataFrame, dict]:
    """One row per labelled step, and the summary: counts, invalid annotations, the shares per step."""
    rows = [{"sample_id": r.sample_id, "trial": r.trial, "benchmark": r.benchmark,
             "paper_category": r.paper_category, SOURCE_KEY: r.source_sha256, **s.model_dump()}
            for r in recs if r.status == "ok" for s in r.steps]
    steps = pd.DataFrame(rows)
    invalid = [{"sample_id": r.sample_id, "trial": r.trial, "errors": r.errors} for r in recs if r.status != "ok"]
    summary = {"trajectories": len(recs), "annotated": len(recs) - len(invalid), "invalid": len(invalid),
               "invalid_examples": invalid[:20], "endpoint_failures": failed}
    if not steps.empty:
        shares = (steps.groupby("step")["category"].value_counts(normalize=True).unstack(fill_value=0.0)
                  .reindex(columns=list(CATEGORIES), fill_value=0.0))
        needed = steps[steps["category"] == "Image Needed"]
        summary.update({
            "share_per_step": {int(k): {c: float(v) for c, v in row.items()} for k, row in shares.iterrows()},
            "steps_per_step": {int(k): int(v) for k, v in steps.groupby("step").size().items()},
            "image_needed_within_first_5": float((needed["step"] <= 5).mean()) if len(needed) else float("nan"),
            "image_needed_steps": int(len(needed)),
        })
    return steps, summary


async def annotate_run(run_dir, *, out_dir=None, **kw) -> dict:
    """The grounding annotation of a ReAct run; one annotator per output directory at a time (a second is refused
    before it asks anything)."""
    out = Path(out_dir) if out_dir else Path(run_dir) / "probes" / "grounding"
    with output_lock(out, "grounding annotator"):
        return await _annotate_run(run_dir, out=out, **kw)


async def _annotate_run(run_dir, *, out: Path, backend, retries: int = 2, concurrency: int = 8,
                        limit: int | None = None, observation_chars: int = 1500, max_tokens: int = 8192,
                        progress: bool = True, include_unparsed: bool = False) -> dict:
    run = load_run(run_dir)
    sweep_outputs(out)
    path = out / "labels.jsonl"
    done = _done_labels(path, run.seals())
    if run.header.method != "react":
        raise RunError(f"{run.path}: the grounding annotator reads ReAct runs (paper §3.2.1); this run is "
                       f"{run.header.label or run.header.method}")
    lines = sorted(run.index, key=lambda ln: ln.key)[: limit or None]  # summaries
    include_unparsed = keeps_unparsed(include_unparsed, run.header)
    lines, exclusions = select_trajectories(lines, include_unparsed=include_unparsed)  # the same rule as the entropy probe (analysis/estimators/selection.py)
    exclusions.to_csv(out / "exclusions.csv", index=False)
    pending = [ln for ln in lines if ln.key not in done]
    log.info(f"grounding annotation: {len(lines)} trajectories, {len(pending)} to annotate -> {out}")
    ann = Annotator(backend, retries=retries, observation_chars=observation_chars, max_tokens=max_tokens)
    sem = asyncio.Semaphore(concurrency)

    bar = tqdm(total=len(pending), desc="grounding", unit="traj", disable=not progress, file=sys.stderr, mininterval=1.0)
    failed = []
    image_users = ImageUsers()

    async def one(line):
        async with sem:
            mine = set()  # its query images leave the image caches when it (and its twins in flight) are done
            image_users.use(mine, line.query_images.values())
            try:
                rec = await ann.annotate(run, run.full(line))  # the whole line, read now
                rec[SOURCE_KEY] = line.line_sha256  # the line it was computed from
            except ModelServerDown:  # the command ends here, every finished label kept
                raise
            except BackendError as e:  # the annotator endpoint failed: not written, retried on the next run
                failed.append(f"{line.sample_id}/t{line.trial}: {e}")
                rec = None
            finally:
                image_users.done(mine)
        if rec is not None:  # sealed and redacted (an annotator's echoed key: not kept)
            done[(rec["sample_id"], rec["trial"])] = sink.append(rec, f"{path} ({rec['sample_id']} trial {rec['trial']})")
        bar.update(1)

    try:
        with RowWriter(path, "grounding_label") as sink:
            await gather_all([one(ln) for ln in pending])
    finally:
        bar.close()
    keep = {ln.key for ln in lines}
    steps, summary = _steps_and_summary([r for k, r in done.items() if k in keep], failed)
    tables = {"steps.csv": steps, "steps.parquet": steps} if not steps.empty else {}
    write_outputs(out, {**tables, "summary.json": summary}, rows="labels.jsonl",
                  files=[f for f in (out / "exclusions.csv",) if f.is_file()])
    return {"steps": steps, "summary": summary, "out": out, "header": run.header,
            "annotator": getattr(backend, "model", ""), "scripted": getattr(backend, "name", "") == "scripted"}


def draw_panel(res: dict) -> None:
    """Figure 2(a)'s panel beside the probe's tables (the command's view; :func:`annotate_run` draws nothing)."""
    if res["steps"].empty:
        return
    model = (res["header"].model.served_model if res["header"].model else None) or ""
    mark = provenance_mark([res["header"]]) or ("SCRIPTED FAKE ANNOTATOR: planted labels" if res["scripted"] else None)
    fig2a_grounding(res["steps"], res["out"] / "fig2a_grounding", mark=mark,
                    title=f"Figure 2(a): grounding of each step ({model}; annotator {res['annotator']})")


def annotator_backend(kind: str, *, endpoint, model: str, api_key_env: str | None, model_dir: str | None = None):
    """The annotator: an OpenAI-compatible server (the paper: Gemini-3-Flash on OpenRouter; several URLs: one
    :class:`~agent.backends.spread.Spread` over replicas of one model), an in-process model, or the scripted
    FAKE demo annotator."""


    if kind == "local":
        return make_backend("local", model_dir=model_dir)
    if kind == "scripted":
        return make_backend("scripted")
    if isinstance(endpoint, (list, tuple)):
        urls = list(dict.fromkeys(endpoint)) or [JUDGE_ENDPOINT]
        made = [annotator_backend(kind, endpoint=u, model=model, api_key_env=api_key_env) for u in urls]
        return made[0] if len(made) == 1 else Spread(made)
    key_env = judge_key_env(endpoint, api_key_env)  # a key goes only to the server it belongs to
    if key_env and not os.environ.get(key_env):
        raise BackendError(f"{key_env} is not set: the default annotator is {model} on OpenRouter; set it, or point "
                           "--judge-endpoint/--judge-model at another OpenAI-compatible server")
    server = "openrouter" if is_host(endpoint, "openrouter.ai") else "other"
    return OpenAIBackend(endpoint, model, server=server, api_key_env=key_env)


def grounding_command(a) -> int:
    """``python -m probes.grounding`` once its arguments parse."""

    async def go():
        backend = annotator_backend(a.judge, endpoint=a.judge_endpoint, model=a.judge_model,
                                    api_key_env=a.judge_api_key_env, model_dir=a.judge_model_dir)
        try:
            return await annotate_run(a.run_dir, backend=backend, out_dir=a.out, retries=a.re_asks,
                                      concurrency=a.concurrency or DEFAULT_CONCURRENCY * len(getattr(backend, 'backends', None) or [backend]), limit=a.limit, observation_chars=a.observation_chars,
                                      max_tokens=a.max_tokens, progress=not a.no_progress,
                                      include_unparsed=a.include_unparsed)
        finally:
            await backend.aclose()

    res, code = run_async(go(), "annotated trajectories", a.out or Path(a.run_dir) / "probes" / "grounding")
    if code:
        return code
    draw_panel(res)
    s = res["summary"]
    print(json.dumps({k: v for k, v in s.items() if k not in ("invalid_examples",)}, indent=2))
    done([f"{res['out']}/ (labels.jsonl, steps.csv, summary.json, exclusions.csv, fig2a_grounding.png/.pdf)"],
         f"python -m analysis.report --react {a.run_dir}")
    return 1 if s["endpoint_failures"] else 0


