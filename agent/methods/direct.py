"""Direct inference (paper §4.1): one call, the images and the question, no tools.

    python -m agent.run --method direct --benchmark demo --out runs/direct

The answer is the ``<answer>`` block, or the whole visible text when the model does not use the tag
(recorded as ``tagged: false``); an empty answer ends as ``no_answer``.
"""
from __future__ import annotations

from ..parsing import ActionError, parse_action
from ..prompts import DIRECT_SYSTEM, REACT_USER, fill
from .common import Episode, chat, image_parts

__all__ = ["run_direct"]


async def run_direct(ep: Episode) -> tuple[str, str]:
    user = [*image_parts(ep.registry.images), {"type": "text", "text": fill(REACT_USER, question=ep.sample.question)}]
    out, ev = await ep.llm([chat("system", DIRECT_SYSTEM), chat("user", user)], state="direct")
    error = None
    try:
        act = parse_action(out.text, ("answer",))
        answer, tagged = act.answer, True
    except ActionError as e:
        answer, tagged, error = out.visible, False, str(e)
    ep.traj.settle(ev, action={"kind": "answer", "answer": answer, "tagged": tagged}, error=error)
    if not answer:
        return "no_answer", ""
    ep.traj.final_answer(ev, answer)
    return "ok", answer
