"""The terminal view of one trajectory: each LLM call with its state, images, reasoning, action and tools."""
from __future__ import annotations

import json

from ..rundir import Run
from .data import grades_of_run, short

__all__ = ["render_text"]


def _llm_call(ev: dict, pad: str, t_max, reasoning: bool) -> list[str]:
    """One LLM call: its state and branch, images and tokens, reasoning, visible text and parsed action."""
    out = []
    imgs = ev.get("image_hashes") or []
    u = ev.get("usage") or {}
    flags = "".join(f" [{f}]" for f in ("correction", "forced") if ev.get(f))
    out.append(f"{pad}#{ev['index']}/{t_max} {ev['state']}{' ' + ev['branch'] if ev.get('branch') else ''}{flags}"
               f"  images {len(imgs)} (query {ev.get('n_query_images', 0)}: "
               f"{', '.join(x[:8] for x in imgs) or '-'})  prompt {u.get('prompt_tokens')} tok, "
               f"out {ev.get('n_tokens')} ({ev.get('think_tokens')} think)")
    r = (ev.get("reasoning") or "").strip()
    if r:
        out.append(f"{pad}  reasoning: {r if reasoning else short(r.splitlines()[0], 160) + (' …' if len(r.splitlines()) > 1 else '')}")
    if (ev.get("text") or "").strip():
        out.append(f"{pad}  text: {short(ev['text'], 400)}")
    act = ev.get("action") or {}
    if ev.get("action_error"):
        out.append(f"{pad}  REJECTED: {ev['action_error']}")
    elif act:
        desc = act.get("kind")
        if act.get("kind") == "tool_call":
            desc += f" {act.get('name') or ''}"
        if act.get("kind") == "answer":
            desc += f": {act.get('answer')}"
        if act.get("kind") == "subtask":
            st = act.get("subtask") or {}
            desc += f" [{st.get('description')}] images {st.get('assigned_images')}"
        if act.get("fold"):
            f = act["fold"]
            desc += f"  fold {f['range']} removed {f['removed']}" + (f" anomaly {f['anomaly']}" if f["anomaly"] else "")
        out.append(f"{pad}  action: {desc}")
    return out


def render_text(run: Run, line: dict, *, reasoning: bool = False, observation_chars: int = 400) -> str:
    """A readable rendering of one trajectory (plain text)."""
    t_max = run.header.budgets.t_max
    grades, judge = grades_of_run(run)
    out = [f"{line['sample_id']} / trial {line['trial']}  [{line.get('method')}{'/' + line['variant'] if line.get('variant') else ''}]"
           f"  model {line.get('model')}  status {line['status']}"
           + (f"  grade {grades.get((line['sample_id'], line['trial']))} ({judge})" if grades else ""),
           f"question: {short(line.get('question'), 300)}",
           f"gold: {line.get('gold')}   answer: {line.get('answer') or '-'}"
           + (f"   error: {line.get('error')}" if line.get("error") else ""),
           "query images: " + (", ".join(f"{k}={v[:12]}" for k, v in (line.get("query_images") or {}).items()) or "none"), ""]
    depth = 0
    for ev in line.get("events") or []:
        pad = "  " * depth
        t = ev["type"]
        if t == "llm_call":
            out += _llm_call(ev, pad, t_max, reasoning)
        elif t == "tool_call":
            res = ("ok" if ev.get("ok") else "FAILED") + (", cached" if ev.get("cache_hit") else "")
            imgs = ev.get("result_images") or []
            out.append(f"{pad}  -> {ev['name']}({short(json.dumps(ev.get('args'), ensure_ascii=False), 160)}) {res}"
                       + (f", {len(imgs)} result images" if imgs else ""))
            out.append(f"{pad}     {short(ev.get('observation'), observation_chars)}")
        elif t == "branch_begin":
            out.append(f"{pad}┌ branch {ev['branch']}: {ev.get('description')}  assigned {ev.get('assigned_images')}")
            depth += 1
        elif t == "branch_end":
            depth = max(0, depth - 1)
            out.append(f"{'  ' * depth}└ {ev['branch']} ends ({ev.get('reason')}, {ev.get('steps')} steps): "
                       f"{short(ev.get('message'), 300)}")
        elif t == "init_end":
            for k, v in (ev.get("descriptions") or {}).items():
                out.append(f"{pad}init {k}: {short(v, 200)}")
        elif t == "unload_probe":
            v = ev.get("influence")
            out.append(f"{pad}  unload probe ({ev.get('signal')}): influence "
                       f"{'n/a' if v is None else f'{v:.4g}'} {'<' if ev.get('below') else '>='} ε={ev.get('threshold'):g}, "
                       f"streak {ev.get('streak')}"
                       + (f" -> UNLOAD: no query images from step {ev.get('unload_step')} on"
                          if ev.get("decision") == "unload" else " -> keep"))
        elif t == "final_answer":
            out.append(f"{pad}ANSWER{' (forced)' if ev.get('forced') else ''}: {ev.get('answer')}")
        elif t == "error":
            out.append(f"{pad}ERROR {ev.get('kind')}: {ev.get('message')}")
    out.append(f"\n{line.get('n_calls')} LLM calls of {t_max}; tools {line.get('tool_calls')}; "
               f"{line.get('generated_tokens')} tokens generated ({line.get('think_tokens')} think)")
    ir = line.get("image_unload")
    if ir:
        out.append(f"adaptive image unloading ({ir.get('signal')} < {ir.get('threshold'):g} for {ir.get('patience')} steps; "
                   f"{ir.get('threshold_source')}): " + (f"detected at step {ir['detect_step']}, images removed from step "
                   f"{ir['unload_step']} on" if ir.get("unload_step") else "never unloaded")
                   + f"; {ir.get('probes')} probes, {ir.get('scoring_calls')} scoring calls, {ir.get('probe_seconds')} s "
                   "(not counted in T_max)")
    return "\n".join(out)
