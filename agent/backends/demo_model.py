"""``--backend scripted``: a scripted stand-in for a served model, for demos and tests. It is a FAKE.

    python -m agent.run --method react --backend scripted --out runs/demo-scripted
    bash scripts/reproduce_figure2.sh --demo          # the whole Figure 2 chain on it

It plays every agent's grammar (ReAct, MM-ContextFold and its ablations, AgentFold, ContextFold, direct
inference) and the grounding annotator over the offline demo benchmark, with a behaviour planted to mirror
the paper's findings, so that every figure and table of the demo has visible structure:

- each demo question needs its query images for its first ``g`` steps, by category (Atomic factuality 1,
  Dynamic information-seeking 2, Visual deep research 4): a grounding step with the image is a lens_search,
  without it an ungrounded text search; the final answer is right only when every grounding step saw the
  image (so step-k removal costs accuracy only for k <= g);
- the top-20 logprobs are planted per step: while grounding, the images make the think tokens *less*
  uncertain; after grounding, *more* (the paper's ΔH > 0 for redundant images);
- the annotator labels the first g steps Image Needed, the next two Image-Derived, the rest Text Only.

Every number it produces is planted, not measured; figures drawn from it are marked "scripted".
"""
from __future__ import annotations

import json
import math
import re

from ..prompts import (
    AGENTFOLD_SYSTEM,
    CONTEXTFOLD_BRANCH,
    CONTEXTFOLD_FORCE_FINISH,
    CONTEXTFOLD_SYSTEM,
    DIRECT_SYSTEM,
    FORCE_ANSWER,
    INIT,
    REACT_SYSTEM,
    SYSTEM,
)
from ..tools.demo_world import QUESTIONS
from .messages import text_of
from .scripted import ScriptedBackend, has_query_images

__all__ = ["DemoModel", "GROUNDING_STEPS", "grounding_steps_for"]

#: Steps that need the query images, per category (the demo's planted "grounding phase").
GROUNDING_STEPS = {"Atomic factuality": 1, "Dynamic information-seeking": 2, "Visual deep research": 4}

#: Per demo question: the entity a lens search identifies, the fact query and the page holding the answer.
_FACTS = {
    "demo_1": ("Kestrel Observatory", "Kestrel Observatory founded", "https://wiki.example.org/Kestrel_Observatory"),
    "demo_2": ("Valdoria", "Valdoria capital", "https://wiki.example.org/Valdoria"),
    "demo_3": ("Dawn over Tessan Peaks", "Dawn over Tessan Peaks painter museum", "https://wiki.example.org/Dawn_over_Tessan_Peaks"),
    "demo_4": ("Harlow Clock Tower", "Harlow Clock Tower height", "https://wiki.example.org/Harlow_Clock_Tower"),
    "demo_5": ("The Silent Orchard", "The Silent Orchard publisher", "https://wiki.example.org/The_Silent_Orchard"),
    "demo_6": ("Rivermoor FC", "Rivermoor FC Moorside Park moved", "https://wiki.example.org/Rivermoor_FC"),
}


def _question(messages) -> dict:
    """The demo question these messages are about (by its text), or a generic one."""

    blob = json.dumps(messages, ensure_ascii=False, default=str)
    for qid, query, imgs, answer, cat in QUESTIONS:
        if query in blob:
            entity, fact_query, url = _FACTS[qid]
            return {"id": qid, "gold": answer, "category": cat, "n_images": len(imgs), "entity": entity,
                    "fact_query": fact_query, "url": url}
    return {"id": None, "gold": "unknown", "category": "Dynamic information-seeking", "n_images": 1,
            "entity": "the subject of the image", "fact_query": "subject of the image", "url": None}


def grounding_steps_for(messages) -> int:
    return GROUNDING_STEPS.get(_question(messages)["category"], 2)


def _system(messages) -> str:
    return text_of(messages[0]) if messages and messages[0].get("role") == "system" else ""


def _assistants(messages) -> list[str]:
    return [m.get("content") or "" for m in messages if m.get("role") == "assistant"]


def _think(text: str, reasoning: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n{text}"


def _tool(name: str, reasoning: str, **args) -> str:
    return _think("<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>", reasoning)


# ---------------------------------------------------------------------------- agents
def _react(messages) -> str:
    q, g = _question(messages), grounding_steps_for(messages)
    turns = _assistants(messages)
    n = len(turns) + 1
    grounded = len(turns) >= g and all("lens_search" in t for t in turns[:g])
    if FORCE_ANSWER.splitlines()[0] in text_of(messages[-1]) or n >= g + 3:
        ans = q["gold"] if grounded else "unknown"
        return _think(f"<answer>{ans}</answer>", "The evidence is in; I answer." if grounded
                      else "I never made out the image, so I cannot be sure.")
    if n <= g:
        if has_query_images(messages):
            k = (n - 1) % q["n_images"]
            return _tool("lens_search", f"Looking at the image, I examine detail {n} of <image_{k}>.",
                         image_id=f"<image_{k}>", goal=f"identify visual detail {n}")
        return _tool("search", "I cannot see the image; I guess from the question alone.",
                     query=f"{q['fact_query'].split()[0].lower()} picture", goal="guess")
    if n == g + 1:
        return _tool("search", f"The image shows {q['entity']}; now the fact.", query=q["fact_query"], goal="the fact")
    if q["url"]:
        return _tool("visit", f"The page about {q['entity']} should say it.", url=q["url"], goal="the fact")
    return _tool("search", "One more search.", query=q["fact_query"] + " details", goal="the fact")


def _mmcf(messages) -> str:
    q = _question(messages)
    last = text_of(messages[-1])
    if INIT in last:
        return _think(json.dumps({"summary": f"an image related to {q['entity']}", "source_hint": "a web page"}),
                      "I describe the image for the planner.")
    branch_at = next((i for i, m in enumerate(messages) if m.get("role") == "user" and "**STATE: BRANCH**" in text_of(m)), None)
    if branch_at is None:  # main state
        turns = _assistants(messages)
        if FORCE_ANSWER.splitlines()[0] in last or len(turns) >= 2:
            grounded = f"It is {q['entity']}." in json.dumps(messages, ensure_ascii=False)
            ans = q["gold"] if grounded else "unknown"
            return _think(f"<answer>{ans}</answer>", "Both subtasks are done.")
        if not turns:
            imgs = [f"<image_{i}>" for i in range(q["n_images"])]
            return _think("<subtask>\n" + json.dumps({"description": "identify the image", "prompt": "Identify what the "
                          "images show with lens_search and report it.", "assigned_images": imgs}) + "\n</subtask>",
                          "First ground the images.")
        return _think("<subtask>\n" + json.dumps({"description": "find the fact", "prompt": f"Find: {q['fact_query']}.",
                      "assigned_images": []}) + "\n</subtask>", "Now the fact, text only.")
    local = [m.get("content") or "" for m in messages[branch_at + 1:] if m.get("role") == "assistant"]
    task = text_of(messages[branch_at])
    ret = '<tool_call>\n{"name": "return", "parameters": {"message": %s}}\n</tool_call>'
    if "Identify" in task:
        if len(local) < q["n_images"] and has_query_images(messages):
            return _tool("lens_search", "I search the image.", image_id=f"<image_{len(local)}>", goal="identify")
        msg = f"It is {q['entity']}." if local and has_query_images(messages) else "Could not identify the image."
        return _think(ret % json.dumps(msg), "Report back.")
    if not local:
        return _tool("search", "Search the fact.", query=q["fact_query"], goal="fact")
    if len(local) == 1 and q["url"]:
        return _tool("visit", "Read the page.", url=q["url"], goal="fact")
    return _think(ret % json.dumps(f"The answer is {q['gold']}."), "Report back.")


def _agentfold(messages) -> str:
    q, g = _question(messages), grounding_steps_for(messages)
    user = text_of(messages[-1])
    memory = user.split("### Previous Steps", 1)[-1]
    steps = [int(x) for x in re.findall(r"\*\*\[(?:Compressed )?Step (\d+)", memory)]
    t = 0 if "EMPTY" in memory.strip()[:10] else max(steps, default=-1) + 1
    fold = "" if t == 0 else "<compress>" + json.dumps({"compress_range": [t - 1, t - 1], "compress_text":
        (f"step {t - 1}: image shows {q['entity']}" if has_query_images(messages) or t - 1 >= g or t - 1 == 0
         else f"step {t - 1}: visual detail unverified")}) + "</compress>\n"
    if "This is your last step" in user or t >= g + 2:
        ans = q["gold"] if "unverified" not in memory else "unknown"
        return _think(f"<answer>{ans}</answer>", "Answer from the folded record.")
    call = ({"name": "lens_search", "arguments": {"image_id": "<image_0>", "goal": "identify"}} if t < g
            else {"name": "search", "arguments": {"query": q["fact_query"], "goal": "fact"}})
    return _think(f"{fold}<motivation>step {t}</motivation>\n<tool_call>\n{json.dumps(call)}\n</tool_call>", "Next step.")


def _contextfold(messages) -> str:
    q = _question(messages)

    def fn(name, **p):
        return f"<function={name}>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in p.items()) + "</function>"

    at = next((i for i, m in enumerate(messages) if m.get("role") == "user" and text_of(m) == CONTEXTFOLD_BRANCH), None)
    if at is None:
        turns = _assistants(messages)
        if CONTEXTFOLD_FORCE_FINISH in text_of(messages[-1]) or len(turns) >= 2:
            grounded = f"It is {q['entity']}." in json.dumps(messages, ensure_ascii=False)
            return _think(fn("finish", answer=q["gold"] if grounded else "unknown", explanation="from the branches"),
                          "Finish.")
        if not turns:
            return _think(fn("branch", description="identify the image", prompt="Identify the image with lens_search."),
                          "Delegate grounding.")
        return _think(fn("branch", description="find the fact", prompt=f"Find: {q['fact_query']}."), "Delegate the fact.")
    local = _assistants(messages[at + 1:])
    call = _assistants(messages[:at])[-1]
    if "identify" in call:
        if not local:
            return _think(fn("lens_search", image_id="<image_0>", goal="identify"), "Search the image.")
        return _think(fn("return", message=f"It is {q['entity']}."), "Report back.")
    if not local:
        return _think(fn("search", query=q["fact_query"]), "Search.")
    return _think(fn("return", message=f"The answer is {q['gold']}."), "Report back.")


def _direct(messages) -> str:
    q = _question(messages)
    ans = q["gold"] if q["category"] == "Atomic factuality" and has_query_images(messages) else "unknown"
    return _think(f"<answer>{ans}</answer>", "From what I know.")


def _annotator(messages) -> str:
    text = text_of(messages[-1])
    n = len(re.findall(r"^### Step \d+", text, flags=re.M))
    g = grounding_steps_for(messages)
    second = "image_info_used" in text.split("## Output Format")[-1]
    rows = []
    for i in range(1, n + 1):
        row = {"step": i, "image_needed": i <= g, "reason": "scripted"}
        if second:
            row["image_info_used"] = i <= g + 2
        rows.append(row)
    return json.dumps(rows)


def policy(messages) -> str:
    """The demo model's reply to any prompt of the toolkit (see the module docstring)."""

    sysm, last = _system(messages), text_of(messages[-1]) if messages else ""
    if "multi-step reasoning trajectory" in last or "Each step has already been labeled" in last:
        return _annotator(messages)
    if sysm == REACT_SYSTEM:
        return _react(messages)
    if sysm == SYSTEM:
        return _mmcf(messages)
    if sysm == AGENTFOLD_SYSTEM:
        return _agentfold(messages)
    if sysm == CONTEXTFOLD_SYSTEM:
        return _contextfold(messages)
    if sysm == DIRECT_SYSTEM:
        return _direct(messages)
    return _think("<answer>unknown</answer>", "An unfamiliar prompt.")


# ---------------------------------------------------------------------------- planted distributions
def _dist(probs: list[float]) -> list[float]:
    return [math.log(p) for p in probs]


_CONFIDENT = (_dist([0.72, 0.12, 0.05, 0.03, 0.02]), _dist([0.68, 0.14, 0.06, 0.03, 0.02]))
_LOST = (_dist([0.09] * 10), _dist([0.085] * 11))
_CROWDED = (_dist([0.1] * 8), _dist([0.095] * 8))
_CLEAR = (_dist([0.16] * 5), _dist([0.15] * 5))


def planted_top(has_images: bool, pos: int, messages) -> list[float]:
    """Top logprobs of a think token: the images lower the entropy while grounding, raise it after."""
    step = len(_assistants(messages or [])) + 1
    grounding = step <= grounding_steps_for(messages or [])
    table = (_CONFIDENT if has_images else _LOST) if grounding else (_CROWDED if has_images else _CLEAR)
    return table[pos % 2]


class DemoModel(ScriptedBackend):
    """The scripted demo model: :func:`policy` for every prompt, :func:`planted_top` for every token."""

    def __init__(self, model: str = "scripted-demo"):
        super().__init__([], model=model, top_fn=planted_top, policy=policy)
