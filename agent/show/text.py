"""The terminal view of one trajectory: each LLM call with its state, images, reasoning, action and tools."""
from __future__ import annotations

import json

from ..record import ResultLine
from ..record.events import (
    AnswerAction,
    BranchBegin,
    BranchEnd,
    Error,
    FinalAnswer,
    InitEnd,
    LlmCall,
    SubtaskAction,
    ToolCall,
    ToolCallAction,
    UnloadProbe,
)
from ..rundir import Run
from .data import grades_of_run, short

__all__ = ["render_text"]


def _llm_call(ev: LlmCall, pad: str, t_max, reasoning: bool) -> list[str]:
    """One LLM call: its state and branch, images and tokens, reasoning, visible text and parsed action."""
    out = []
    imgs = ev.image_hashes
    flags = "".join(f" [{f}]" for f, on in (("correction", ev.correction), ("forced", ev.forced)) if on)
    out.append(f"{pad}#{ev.index}/{t_max} {ev.state}{' ' + ev.branch if ev.branch else ''}{flags}"
               f"  images {len(imgs)} (query {ev.n_query_images}: "
               f"{', '.join((x or '')[:8] for x in imgs) or '-'})  prompt {ev.usage.prompt_tokens} tok, "
               f"out {ev.n_tokens} ({ev.think_tokens} think)")
    r = (ev.reasoning or "").strip()
    if r:
        out.append(f"{pad}  reasoning: {r if reasoning else short(r.splitlines()[0], 160) + (' …' if len(r.splitlines()) > 1 else '')}")
    if (ev.text or "").strip():
        out.append(f"{pad}  text: {short(ev.text, 400)}")
    act = ev.action
    if ev.action_error:
        out.append(f"{pad}  REJECTED: {ev.action_error}")
    elif act is not None:
        desc: str = act.kind
        if isinstance(act, ToolCallAction):
            desc += f" {act.name or ''}"
        elif isinstance(act, AnswerAction):
            desc += f": {act.answer}"
        elif isinstance(act, SubtaskAction):
            desc += f" [{act.subtask.get('description')}] images {act.subtask.get('assigned_images')}"
        if act.fold:
            f = act.fold
            desc += f"  fold {f['range']} removed {f['removed']}" + (f" anomaly {f['anomaly']}" if f["anomaly"] else "")
        out.append(f"{pad}  action: {desc}")
    return out


def _event(ev, pad: str, observation_chars: int) -> list[str]:
    """Every event but an LLM call, as one or two lines."""
    if isinstance(ev, ToolCall):
        res = ("ok" if ev.ok else "FAILED") + (", cached" if ev.cache_hit else "")
        imgs = ev.result_images
        return [f"{pad}  -> {ev.name}({short(json.dumps(ev.args, ensure_ascii=False), 160)}) {res}"
                + (f", {len(imgs)} result images" if imgs else ""),
                f"{pad}     {short(ev.observation, observation_chars)}"]
    if isinstance(ev, BranchBegin):
        return [f"{pad}┌ branch {ev.branch}: {ev.description}  assigned {ev.assigned_images}"]
    if isinstance(ev, BranchEnd):
        return [f"{pad}└ {ev.branch} ends ({ev.reason}, {ev.steps} steps): {short(ev.message, 300)}"]
    if isinstance(ev, InitEnd):
        return [f"{pad}init {k}: {short(v, 200)}" for k, v in ev.descriptions.items()]
    if isinstance(ev, UnloadProbe):
        v = ev.influence
        return [f"{pad}  unload probe ({ev.signal}): influence {'n/a' if v is None else f'{v:.4g}'} "
                f"{'<' if ev.below else '>='} ε={ev.threshold:g}, streak {ev.streak}"
                + (f" -> UNLOAD: no query images from step {ev.unload_step} on" if ev.decision == "unload"
                   else " -> keep")]
    if isinstance(ev, FinalAnswer):
        return [f"{pad}ANSWER{' (forced)' if ev.forced else ''}: {ev.answer}"]
    if isinstance(ev, Error):
        return [f"{pad}ERROR {ev.kind}: {ev.message}"]
    return []


def render_text(run: Run, line: ResultLine, *, reasoning: bool = False, observation_chars: int = 400) -> str:
    """A readable rendering of one trajectory (plain text)."""
    t_max = run.header.budgets.t_max
    grades, judge = grades_of_run(run)
    out = [f"{line.sample_id} / trial {line.trial}  [{line.method}{'/' + line.variant if line.variant else ''}]"
           f"  model {line.model}  status {line.status}"
           + (f"  grade {grades.get(line.key)} ({judge})" if grades else ""),
           f"question: {short(line.question, 300)}",
           f"gold: {line.gold}   answer: {line.answer or '-'}" + (f"   error: {line.error}" if line.error else ""),
           "query images: " + (", ".join(f"{k}={v[:12]}" for k, v in line.query_images.items()) or "none"), ""]
    depth = 0
    for ev in line.events:
        if isinstance(ev, BranchEnd):
            depth = max(0, depth - 1)
        pad = "  " * depth
        out += _llm_call(ev, pad, t_max, reasoning) if isinstance(ev, LlmCall) else _event(ev, pad, observation_chars)
        if isinstance(ev, BranchBegin):
            depth += 1
    out.append(f"\n{line.n_calls} LLM calls of {t_max}; tools {line.tool_calls}; "
               f"{line.generated_tokens} tokens generated ({line.think_tokens} think)")
    ir = line.image_unload
    if ir:
        out.append(f"adaptive image unloading ({ir.signal} < {ir.threshold:g} for {ir.patience} steps; "
                   f"{ir.threshold_source}): " + (f"detected at step {ir.detect_step}, images removed from step "
                   f"{ir.unload_step} on" if ir.unload_step else "never unloaded")
                   + f"; {ir.probes} probes, {ir.scoring_calls} scoring calls, {ir.probe_seconds} s "
                   "(not counted in T_max)")
    return "\n".join(out)
