"""ReAct (the WebWatcher-style baseline, paper C.1 / B.2) and ReAct-Removal@k (paper §3.2.3).

    python -m agent.run --method react --benchmark demo --out runs/react
    python -m agent.run --method react --remove-images-from-step 3 --benchmark demo --out runs/react-rm3

All query images sit in the first user turn (each after its ``<image_k>`` identifier) and stay for
the whole trajectory; every tool observation is appended as a ``<tool_response>`` user turn. One
JSON ``<tool_call>`` or one ``<answer>`` per response; a malformed response gets the correction
re-prompt (counts toward T_max). The T_max-th call carries the force-answer prompt (E.2).

Removal@k: calls with index >= k get the same messages with the *query* image parts dropped
(:func:`react_messages` then ``strip_query_images``: the image parts that sit right after their ``<image_k>``
identifier, never matched by content, so a retrieved copy of a query image in an observation stays, paper B.5); the ``<image_k>`` identifiers stay.

ReAct-Adaptive (``--image-unload adaptive``, ours; :mod:`agent.methods.unload`): the unload step is decided
online from the images' measured influence on each step's thinking instead of being fixed.

Each step's reasoning stays in the history (``reasoning_content`` on the assistant turn; the chat
template decides what it renders), unless the run says ``--history-reasoning drop``.
"""
from __future__ import annotations

from ..backends.messages import strip_query_images
from ..parsing import ActionError
from ..prompts import FORCE_ANSWER, REACT_SYSTEM, REACT_USER, fill
from .common import Episode, Turn, chat, correction_text, image_parts, with_suffix

__all__ = ["run_react", "react_messages"]


def react_messages(ep: Episode, turns: list[Turn], *, step: int, remove_from: int | None,
                   force: bool = False) -> list[dict]:
    """The context of LLM call ``step`` rebuilt from the recorded turns."""
    first = [*image_parts(ep.registry.images), {"type": "text", "text": fill(REACT_USER, question=ep.sample.question)}]
    msgs = ep.turns([chat("system", REACT_SYSTEM), chat("user", first)], turns)
    if force:
        msgs = with_suffix(msgs, FORCE_ANSWER)
    if remove_from is not None and step >= remove_from:
        msgs = strip_query_images(msgs)  # by position: a retrieved copy of a query image stays
    return msgs


async def run_react(ep: Episode, *, remove_from: int | None = None, turns: list | None = None,
                    correction: bool = False, unload=None) -> tuple[str, str]:
    """Run the loop; returns (status, answer). ``turns`` lets a replay start from a recorded prefix.

    ``unload``: an :class:`agent.methods.unload.UnloadTracker` (``--image-unload adaptive``): every step that
    saw the query images and does not end the episode is probed, and once the tracker decides, the images
    are removed from the next step on (the Removal@k projection with k = its unload step)."""
    turns = list(turns or [])
    while ep.remaining > 0:
        step = ep.used + 1
        forced = ep.remaining == 1
        k = remove_from if unload is None else unload.unload_step
        msgs = react_messages(ep, turns, step=step, remove_from=k, force=forced)
        out, ev, act = await ep.act(msgs, ("tool_call", "answer"), state="react", correction=correction, forced=forced)
        # the adaptive unloading probes every step that saw the query images and does not end the episode
        probe = unload is not None and unload.images_at(step) and ev.get("n_query_images") and not forced
        if isinstance(act, ActionError):
            if probe:
                await unload.observe(ep, ev, msgs, out)
            turns.append(Turn(out.text, out.reasoning, correction_text(act)))
            correction = True
            continue
        correction = False
        if act.kind == "answer":
            return "ok", act.answer
        if forced:
            break
        if probe:
            await unload.observe(ep, ev, msgs, out)
        res = await ep.tool(ev, act.name, act.args)
        turns.append(Turn(out.text, out.reasoning, ep.observation(res)))
    return "no_answer", ""
