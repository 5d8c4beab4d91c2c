"""AgentFold, adapted to multimodal retrieval as the paper does (§4.1, C.1, B.2, Table 11).

    python -m agent.run --method agentfold --benchmark demo --out runs/agentfold

Every call is a re-rendered single-turn prompt, [system, user]: the question and the "previous steps"
memory, in which folded ranges are compressed summaries and only the latest step is verbatim. The model
emits the fold (``<compress>{"compress_range": [i, j], "compress_text": …}</compress>``, from the second
turn on), a ``<motivation>``, and one JSON ``<tool_call>`` or ``<answer>``. The fold rule is the release's
exactly (Alibaba-NLP/DeepResearch @f72f75d, WebAgent/AgentFold/infer.py, ``update_and_sort_steps``): every
block whose *start* lies in [i, j] is dropped, one block {i, j, text} is added, blocks are sorted by start
— overlaps and odd ranges included; each anomaly is recorded on the call (``action.fold.anomaly``).

Adaptations (paper C.1; ours where the paper is silent, following ../shared/baselines-spec.md):
- query-image pixels appear in the first turn only; later turns name the ``<image_k>`` ids, so
  lens_search still works and visual facts survive only through the fold texts;
- the shared tools (search, visit, lens_search); a list ``query`` runs each query;
- the whole output is validated before any tool runs (release bug (c)); ``</think>`` is not required;
- an output the release would reject (no action, no valid fold after turn 0) is resampled with the
  identical prompt — up to 5 calls per turn, each counting toward T_max — then the sample ends ``no_answer``;
  invalid tool-call JSON or an unknown tool becomes the step's tool response, as in the release;
- the T_max-th call carries the final-answer instruction; without an ``<answer>`` it ends ``no_answer``
  and no tool runs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..parsing import ActionError, load_json
from ..prompts import AGENTFOLD_FINAL, AGENTFOLD_IMAGE_IDS, AGENTFOLD_SYSTEM, AGENTFOLD_USER, fill
from ..trajectory import EventView
from .common import Episode, chat, image_parts, with_suffix

__all__ = ["run_agentfold", "Block", "fold", "render_memory", "MAX_RESAMPLES"]

#: Calls per turn before the sample is given up (the release retries 5 times, then drops the question).
MAX_RESAMPLES = 5


@dataclass
class Block:
    start: int
    end: int
    text: str


def render_memory(blocks: list[Block]) -> str:
    """The "previous steps" text: ``**[hdr]**\\ncontent\\n\\n`` per block sorted by start; the block with the
    highest start is ``[Step t]`` (verbatim), the others ``[Compressed Step i]`` / ``[Compressed Step i to j]``."""
    if not blocks:
        return "EMPTY"
    blocks = sorted(blocks, key=lambda b: b.start)
    out = []
    for b in blocks:
        if b is blocks[-1]:
            hdr = f"Step {b.start}"
        elif b.start == b.end:
            hdr = f"Compressed Step {b.start}"
        else:
            hdr = f"Compressed Step {b.start} to {b.end}"
        out.append(f"**[{hdr}]**\n{b.text}\n\n")
    return "".join(out).rstrip("\n")


def fold(blocks: list[Block], i: int, j: int, text: str, latest: int) -> tuple[list[Block], dict]:
    """The release's fold: drop the blocks whose start is in [i, j], add {i, j, text}, sort. Returns the new
    blocks and a record of what happened (``removed`` starts, ``anomaly`` list: nothing is validated)."""
    removed = [b for b in blocks if i <= b.start <= j]
    kept = [b for b in blocks if not (i <= b.start <= j)]
    anomaly = []
    if j < i:
        anomaly.append("empty_range: j < i drops nothing and inserts an odd block")
    if any(b.start < i <= b.end for b in kept):
        anomaly.append("overlap: i lies inside an older block, which is kept")
    if any(b.end > j for b in removed):
        anomaly.append("dropped_past_j: a block starting in range reaches past j and is dropped whole")
    if j < latest:
        anomaly.append(f"latest_not_folded: j={j} < latest step {latest}, which stays full but is labelled compressed")
    if j > latest:
        anomaly.append(f"beyond_latest: j={j} > latest step {latest}")
    new = sorted([*kept, Block(i, j, text)], key=lambda b: b.start)
    return new, {"range": [i, j], "removed": [b.start for b in removed], "anomaly": anomaly}


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_TOOL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_COMPRESS = re.compile(r"<compress>(.*?)</compress>", re.S)
_MOTIVATION = re.compile(r"<motivation>(.*?)</motivation>", re.S)


def _parse(text: str, turn: int, final: bool):
    """(kind, payload, fold, motivation): kind is "answer" or "tool"; raises ActionError where the release raises."""
    text = text or ""
    m = _ANSWER.search(text)
    if m and "</answer>" in text:  # the answer wins; the fold is ignored (release)
        return "answer", m.group(1).strip(), None, ""
    if final:
        raise ActionError("the last step must give an <answer>.")
    t = _TOOL.search(text)
    if not t:
        raise ActionError("no <tool_call> or <answer> in the response.")
    fold_ = None
    if turn > 0:
        c = _COMPRESS.search(text)
        if not c:
            raise ActionError("no <compress> block: fold the previous steps.")
        try:
            obj = load_json(c.group(1).strip())
            rng, txt = obj["compress_range"], obj["compress_text"]
            if not isinstance(rng, list) or not rng or not isinstance(txt, str):
                raise ValueError("compress_range must be a non-empty list and compress_text a string")
            fold_ = (int(rng[0]), int(rng[-1]), txt)
        except (ValueError, KeyError, TypeError) as e:
            raise ActionError(f"invalid <compress> ({e}).") from None
    mot = _MOTIVATION.search(text)
    return "tool", t.group(1).strip(), fold_, (mot.group(1).strip() if mot else "")


async def _run_tool(ep: Episode, ev: EventView, raw: str) -> str:
    """The first tool call's response text (invalid JSON / unknown tool: the error text, as in the release)."""
    try:
        obj = load_json(raw)
        # a missing "arguments" is an error text like any exception in the release's execute_tool, never {}
        name, args = obj["name"], obj["arguments"] if "arguments" in obj else obj["parameters"]
        if not isinstance(args, dict):
            raise TypeError("arguments must be an object")
    except (ValueError, KeyError, TypeError) as e:
        return f"[Tool call error] the tool call is not valid JSON with a name and arguments ({e})."
    query = args.get("query")
    if name == "search" and isinstance(query, list):  # the release's list form: run each query
        outs = []
        for q in query:
            res = await ep.tool(ev, "search", {**args, "query": str(q)})
            outs.append(res.observation)
        return "\n\n".join(outs)
    res = await ep.tool(ev, name, args)
    return res.observation


def agentfold_messages(ep: Episode, blocks: list[Block], *, turn: int, final: bool) -> list[dict]:
    memory = render_memory(blocks)
    text = fill(AGENTFOLD_USER, question=ep.sample.question, memory=memory)
    if turn == 0:
        user = [*image_parts(ep.registry.images), {"type": "text", "text": text}]
    else:
        ids = ", ".join(ep.registry.ids) or "none"
        user = fill(AGENTFOLD_IMAGE_IDS, ids=ids) + "\n\n" + text
    msgs = [chat("system", AGENTFOLD_SYSTEM), chat("user", user)]
    return with_suffix(msgs, AGENTFOLD_FINAL) if final else msgs


async def run_agentfold(ep: Episode) -> tuple[str, str]:
    blocks: list[Block] = []
    turn = 0
    while ep.remaining > 0:
        for attempt in range(MAX_RESAMPLES):
            if ep.remaining <= 0:
                return "no_answer", ""
            final = ep.remaining == 1
            msgs = agentfold_messages(ep, blocks, turn=turn, final=final)
            out, ev = await ep.llm(msgs, state="agentfold", correction=attempt > 0, forced=final)
            try:
                kind, payload, fold_, motivation = _parse(out.text, turn, final)
            except ActionError as e:  # resample the identical prompt (the release has no correction message)
                ep.reject(ev, e)
                if final:
                    return "no_answer", ""
                continue
            break
        else:
            return "no_answer", ""  # 5 unusable outputs in one turn: the release drops the question
        if kind == "answer":
            ep.traj.settle(ev, action={"kind": "answer", "answer": payload})
            ep.traj.final_answer(ev, payload, forced=final)
            return ("ok", payload) if payload else ("no_answer", "")
        action = {"kind": "tool_call", "raw": payload, "step": turn}
        if fold_ is not None:
            blocks, record = fold(blocks, fold_[0], fold_[1], fold_[2], latest=turn - 1)
            action["fold"] = record
        ep.traj.settle(ev, action=action)
        obs = await _run_tool(ep, ev, payload)
        step = (f"**Motivation:** {motivation}\n" if motivation else "") + f"**Tool call:** {payload}\n**Tool response:** {obs}"
        blocks = sorted([*blocks, Block(turn, turn, step)], key=lambda b: b.start)
        turn += 1
    return "no_answer", ""
