"""ContextFold (FoldAgent, ``workflow=search_branch``), adapted to multimodal retrieval as the paper does (§4.1, C.1, B.2).

    python -m agent.run --method contextfold --benchmark demo --out runs/contextfold

The controller of the release (sunnweiwei/FoldAgent @cc09646, agents/fold_agent.py): a multi-turn,
append-only MAIN context whose observations come back as user messages, and BRANCH contexts created by
``branch(description, prompt)`` as a **full copy of every main message** — the query images included
(modality-symmetric inheritance, the contrast with MM-ContextFold) — plus a branch instruction. A branch
cannot branch or finish (refusal, one step used); ``return(message)`` ends it and main receives exactly one
user message with the returned text. The XML grammar ``<function=NAME><parameter=K>V</parameter></function>``
(Table 11) is parsed by one parser: over all complete calls, if the last is ``branch``, ``return`` or
``finish`` it controls the turn; otherwise the trailing group of calls runs in order (parallel searches).

Adaptations (paper C.1; ours where the paper is silent, following ../shared/baselines-spec.md):
- the shared tools (search, visit, lens_search on ``<image_k>``) plus branch / return / finish; result
  images of a lens_search come back with its observation, as in the other methods;
- B_max = 5 calls per branch: the 5th (or any at ``remaining <= 2``) carries the forced-return
  constraint; without a return the branch's last message is folded back (``branch_budget``); at
  ``remaining <= 1`` the branch ends (``global_budget``); at most 10 branches (then refused);
- the T_max-th call is a main call asking for ``finish``; every call (refusals, forced calls) counts.
"""
from __future__ import annotations

import copy

from ..parsing import parse_function_calls, trailing_group
from ..prompts import (
    CONTEXTFOLD_BRANCH,
    CONTEXTFOLD_FORCE_FINISH,
    CONTEXTFOLD_FORCED_RETURN,
    CONTEXTFOLD_NUDGE_BRANCH,
    CONTEXTFOLD_NUDGE_MAIN,
    CONTEXTFOLD_SYSTEM,
    CONTEXTFOLD_USER,
    fill,
)
from ..tools.toolbox import TOOL_NAMES
from ..trajectory import EventView
from .common import Episode, assistant_message, chat, image_parts, with_suffix

__all__ = ["run_contextfold", "MAX_BRANCHES"]

#: The release's cap on branch calls (``max_session``).
MAX_BRANCHES = 10

NO_CALL = "No function call was detected in your response. Call one of the functions in the required format."
EMPTY_ANSWER = "The answer given to finish is empty. Call finish again with the answer."


def _reply(text: str, images: list) -> object:
    """An observation message: text, plus result images (each after a label) when a tool returned some."""
    if not images:
        return text
    parts: list[dict] = []
    for i, path in enumerate(images, 1):
        parts += [{"type": "text", "text": f"[result image {i}]"}, {"type": "image_url", "image_url": {"url": str(path)}}]
    return [*parts, {"type": "text", "text": text}]


async def _run_group(ep: Episode, ev: EventView, group) -> tuple[str, list]:
    """Run the calls in order; the observations concatenated (and the result images shown)."""
    texts, images = [], []
    for call in group:
        if call.name not in TOOL_NAMES:
            texts.append(f"[Error] {call.name} is not a function you can call here.")
            continue
        res = await ep.tool(ev, call.name, call.params)
        texts.append(res.observation)
        images += [p for _, p in res.images[: ep.observation_images]]
    return "\n\n".join(texts), images


def _action(call) -> dict:
    """The recorded action of a function call."""
    if call.name == "branch":
        return {"kind": "subtask", "subtask": {"description": call.params.get("description", ""),
                                               "prompt": call.params.get("prompt", ""), "assigned_images": []}}
    if call.name == "finish":
        return {"kind": "answer", "answer": call.params.get("answer", "").strip()}
    return {"kind": "tool_call", "name": call.name, "args": call.params}


async def run_contextfold(ep: Episode) -> tuple[str, str]:
    first = [*image_parts(ep.registry.images), {"type": "text", "text": fill(CONTEXTFOLD_USER, question=ep.sample.question)}]
    main: list[dict] = [chat("system", CONTEXTFOLD_SYSTEM), chat("user", first)]  # append-only
    n_branch = 0
    correction = False
    while ep.remaining > 0:
        final = ep.remaining == 1
        msgs = with_suffix(main, CONTEXTFOLD_FORCE_FINISH) if final else list(main)
        out, ev = await ep.llm(msgs, state="main", correction=correction, forced=final)
        correction = False
        main.append(assistant_message(out.text, out.reasoning, ep.history_reasoning))
        calls = parse_function_calls(out.text)
        last = calls[-1] if calls else None
        if last is not None and last.name == "finish":
            answer = last.params.get("answer", "").strip()
            ep.traj.settle(ev, action=_action(last), error=None if answer else "finish with an empty answer")
            if answer:
                ep.traj.final_answer(ev, answer, forced=final)
                return "ok", answer
            main.append(chat("user", EMPTY_ANSWER))
            correction = True
            continue
        if final:  # the last call did not finish: no answer, nothing runs
            ep.reject(ev, ValueError("the forced last call did not call finish"))
            break
        if last is None:
            ep.reject(ev, ValueError("no function call"))
            main.append(chat("user", NO_CALL))
            correction = True
            continue
        if last.name == "branch":
            ep.traj.settle(ev, action=_action(last))
            missing = [k for k in ("description", "prompt") if not last.params.get(k)]
            if missing:
                main.append(chat("user", f"[Error] branch needs {' and '.join(missing)}. {CONTEXTFOLD_NUDGE_MAIN}"))
                continue
            if n_branch >= MAX_BRANCHES:
                main.append(chat("user", f"You have reached the limit of {MAX_BRANCHES} branch calls. Continue the "
                                         "work yourself or finish."))
                continue
            n_branch += 1
            message = await _branch(ep, f"b{n_branch}", last.params, main, ev)
            main.append(chat("user", message))
            continue
        if last.name == "return":
            ep.traj.settle(ev, action=_action(last))
            main.append(chat("user", f"[Error] return can only be called in a branch. {CONTEXTFOLD_NUDGE_MAIN}"))
            continue
        group = trailing_group(out.text, calls)
        ep.traj.settle(ev, action=_action(group[-1]))
        text, images = await _run_group(ep, ev, group)
        main.append(chat("user", _reply(f"{text}\n\n{CONTEXTFOLD_NUDGE_MAIN}", images)))
    return "no_answer", ""


async def _branch(ep: Episode, bid: str, params: dict, main: list[dict], main_ev: EventView) -> str:
    """Run a branch on a full copy of the main messages; returns the one message main receives."""
    ep.traj.branch_begin(bid, description=params["description"], prompt=params["prompt"], assigned_images=[],
                         assigned_hashes=[], main_call_index=main_ev["index"])
    msgs = copy.deepcopy(main) + [chat("user", CONTEXTFOLD_BRANCH)]  # inherited: every message, images included
    nudge = fill(CONTEXTFOLD_NUDGE_BRANCH, description=params["description"])
    steps, last_text = 0, ""
    while True:
        if ep.remaining <= 1:  # the final call belongs to main
            ep.traj.branch_end(bid, message=last_text or "(no progress)", reason="global_budget", steps=steps)
            return _fallback(last_text)
        steps += 1
        forced = steps >= ep.budgets.b_max or ep.remaining <= 2
        sent = with_suffix(msgs, CONTEXTFOLD_FORCED_RETURN) if forced else msgs
        out, ev = await ep.llm(sent, state="branch", branch=bid, forced=forced)
        msgs.append(assistant_message(out.text, out.reasoning, ep.history_reasoning))
        last_text = out.visible
        calls = parse_function_calls(out.text)
        last = calls[-1] if calls else None
        if last is not None and last.name == "return":
            ep.traj.settle(ev, action=_action(last))
            message = last.params.get("message", "").strip()
            ep.traj.branch_end(bid, message=message, reason="return", steps=steps)
            return f"Branch has finished its task, the returned message is:\n\n{message}"
        if forced:
            ep.reject(ev, ValueError("the forced call did not return"))
            reason = "branch_budget" if steps >= ep.budgets.b_max else "global_budget"
            ep.traj.branch_end(bid, message=out.visible, reason=reason, steps=steps)
            return _fallback(out.visible)
        if last is not None and last.name in ("branch", "finish"):
            ep.traj.settle(ev, action=_action(last))
            msgs.append(chat("user", f"You are in branch mode and cannot branch a task or finish. Use the `return` "
                                     f"function to report your findings to MAIN. {nudge}"))
            continue
        if last is None:
            ep.reject(ev, ValueError("no function call"))
            msgs.append(chat("user", f"{NO_CALL} {nudge}"))
            continue
        group = trailing_group(out.text, calls)
        ep.traj.settle(ev, action=_action(group[-1]))
        text, images = await _run_group(ep, ev, group)
        msgs.append(chat("user", _reply(f"{text}\n\n{nudge}", images)))


def _fallback(text: str) -> str:
    """What main receives when a branch ends without a return: its last message (after a stray return tag)."""
    tail = text.rsplit("<function=return>", 1)[-1] if "<function=return>" in (text or "") else (text or "")
    return f"Branch has finished its task. The last message was:\n\n{tail.strip()}"
