"""MM-ContextFold as the authors' release runs it (``--protocol release``), call for call.

    python -m agent.run --method mmcontextfold --protocol release --backend openai --endpoint URL ...

The release (iLearn-Lab/MM26-MMContextFold @16fa474; ``../shared/release-protocol.md``) departs from the paper
(B of that page): no call budget but 15 main rounds (``pipelines/base_pipeline.py:26``), at most 5 branches
(``pipelines/pipeline_mmcontextfold.py:39``) of up to 10 turns (``:40``), content-only history
(``utils/search_backbone_model.py:124-125``), lenient parsing, the force answer as its own turn and the reply's
first 500 characters as the answer when no ``<answer>`` comes (``pipelines/pipeline_mmcontextfold.py:522-529``).
Its texts are in :mod:`agent.prompts_release`; what it sends is asserted, call by call, by
``tests/test_protocol_release.py``.

Its tools run under the release's tool policy (:data:`agent.tools.policy.RELEASE_TOOLS`: arguments as given, no
cache, its retries, texts and thumbnails). A call whose request the server refuses (:data:`REFUSED`: an image it
cannot decode) is the release's failed call, as is a reply whose content is null or starts with ``Error:``. Ours
(docs/fidelity.md): a call that gets no answer at all (the server down, retries spent) ends the unit ``error``, to be
rerun, where the release carries on with a placeholder.
"""
from __future__ import annotations

import json
import re

from ..backends.base import RequestRefused
from ..images import NotAnImage
from ..prompts_release import (
    AFTER_FAILED_CALL,
    BRANCH,
    BRANCH_CORRECTION,
    BRANCH_LIMIT,
    BRANCH_NO_RETURN,
    CALL_IN_RETURN,
    CONTINUE,
    EMPTY_RETURN,
    FORCE_ANSWER,
    INIT,
    INIT_SYSTEM,
    LAST_TURN,
    MAIN,
    MAIN_CORRECTION,
    NO_ANSWER,
    NOT_PARSED,
    PERCEPTION_FAILED,
    SYSTEM,
    TWO_TURNS_LEFT,
    UNKNOWN_TOOL,
    fill,
    images_note,
    invalid_image,
)
from ..tools.formatting import LENS_BRANCH_EMPTY
from ..tools.toolbox import ToolResult
from ..trajectory import EventView
from .common import Episode

__all__ = ["run_release_protocol", "ReleaseCrash", "MAX_ROUNDS", "MAX_BRANCHES", "MAX_BRANCH_TURNS", "CALL_CAP"]

MAX_ROUNDS = 15          # pipelines/base_pipeline.py:26
MAX_BRANCHES = 5         # pipelines/pipeline_mmcontextfold.py:39
MAX_BRANCH_TURNS = 10    # pipelines/pipeline_mmcontextfold.py:40
#: No call budget in the release; its loops bound a unit's calls (init + 15 rounds of at most 12 calls + force).
CALL_CAP = 1024


class ReleaseCrash(ValueError):
    """What a model's output makes the release's own code raise. Its ``MMContextFoldAgent.run`` catches every
    exception and the sample's answer is ``f"Error: {e}"`` (``pipelines/pipeline_mmcontextfold.py``, the handler
    at the end of ``run``); the same text is the answer here, the exception an ``error`` event of the record."""


def _loads(text: str):
    """``json.loads`` as the release calls it: a value nested past Python's parser raises its RecursionError,
    which none of the release's parsers catch."""
    try:
        return json.loads(text)
    except RecursionError as e:
        raise ReleaseCrash(str(e)) from None


def _iterated(value) -> list:
    """What ``for img_id in value`` walks in the release (``pipeline_mmcontextfold.py:184-191``): a list, a
    string's characters, a mapping's keys; anything else is the TypeError that ends the sample."""
    if isinstance(value, (list, str, dict)):
        return list(value)
    raise ReleaseCrash(f"'{type(value).__name__}' object is not iterable")


# ------------------------------------------------------------------ the release's parsers (prompts_mmcontextfold.py:176-215)
def extract_subtask(text: str) -> dict | None:
    """The first ``<subtask>`` JSON object with a non-empty ``prompt``; other fields are optional."""
    m = re.search(r"<subtask>\s*(.*?)\s*</subtask>", text or "", re.S)
    try:
        data = _loads(m.group(1)) if m else None
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) and data.get("prompt") else None


def extract_answer(text: str) -> str | None:
    m = re.search(r"<answer>(.*?)</answer>", text or "", re.S)
    return m.group(1).strip() if m else None


def extract_tool_call(text: str):
    """The *last* ``<tool_call>`` block, parsed, whatever JSON it holds (the release runs the last of several, and
    returns ``json.loads``' value as it is: an array, a number or a string too; ``null`` reads as no call)."""
    found = list(re.finditer(r"<tool_call>\s*(.*?)\s*</tool_call>", text or "", re.S))
    try:
        return _loads(found[-1].group(1)) if found else None
    except json.JSONDecodeError:
        return None


def _get(value, key: str, default=None):
    """``value.get(key, default)`` as the release calls it on a model's JSON: anything but an object is the
    AttributeError that ends the sample (:class:`ReleaseCrash`)."""
    if not isinstance(value, dict):
        raise ReleaseCrash(f"'{type(value).__name__}' object has no attribute 'get'")
    return value.get(key, default)


def return_text(params) -> str:
    """A ``return``'s message as the release reads it (``pipelines/pipeline_mmcontextfold.py:234``):
    ``(params.get("message") or "").strip()``: parameters that are no object, or a message that is a number or a
    list, are the AttributeError that ends the sample."""
    message = _get(params, "message") or ""
    if not isinstance(message, str):
        raise ReleaseCrash(f"'{type(message).__name__}' object has no attribute 'strip'")
    return message.strip()


def without_answer_tags(msg: str) -> str:
    """A return message with an ``<answer>`` in it: the first answer's text, else the text without answer tags
    (``:254-259``); a stray ``</answer>`` alone stays, as it does there."""
    if "<answer>" in msg:
        m = re.search(r"<answer>(.*?)</answer>", msg, re.S)
        return m.group(1).strip() if m else re.sub(r"</?answer>", "", msg).strip()
    return msg


# ------------------------------------------------------------------ messages as the release builds them
def user(text: str, images=()) -> dict:
    """A user turn: always a list, the text first (when it is not blank), then each image with ``detail: high``, no
    identifier part (``utils/search_backbone_model.py:83-106``)."""
    parts = [{"type": "text", "text": text}] if text.strip() else []
    parts += [{"type": "image_url", "image_url": {"url": str(p), "detail": "high"}} for p in images]
    return {"role": "user", "content": parts or [{"type": "text", "text": ""}]}


#: What the release's ``send_message`` and ``send_single_message`` catch (``except Exception``) and return as
#: ``f"Error: {e}"``, taking the user turn back (``utils/search_backbone_model.py``), that belongs to the request:
#: the server refused it (an empty or undecodable image: vLLM and SGLang answer 400), or this client could not
#: decode an image it must expand itself (the local and SGLang-native backends), which no server could either.
REFUSED = (RequestRefused, NotAnImage)


def refused(ep: Episode, e: Exception, state: str, branch: str | None = None) -> str:
    """Record a refused call (an ``error`` event ``RequestRefused``; no ``llm_call``: nothing was answered) and
    return the release's text for it."""
    where = f"{state} call" + (f" in branch {branch}" if branch else "")
    ep.traj.error("RequestRefused", f"{where}: {e} (the release's failed call)")
    return f"Error: {e}"


def failed(reply: str | None) -> bool:
    """A call the release treats as failed: null content, or content starting with ``Error:`` (how its client
    reports an API error, and so how it reads a model that writes one; ``pipelines/pipeline_mmcontextfold.py:155-163``).
    An empty reply is not failed there."""
    return reply is None or reply.startswith("Error:")


class _Chat:
    """The release's one conversation (``ChatClient_OpenRouter``): each call appends the user turn and the
    reply's content (no reasoning) to the history; a branch works on the main history and is cut off after."""

    def __init__(self, ep: Episode):
        self.ep = ep
        self.history: list[dict] = [{"role": "system", "content": SYSTEM}]

    async def send(self, text: str, images=(), **record) -> tuple[str | None, EventView | None]:
        """The reply's content as it arrived (unstripped; None when null), appended as it is
        (``utils/search_backbone_model.py:124-125``); a refused request: the release's ``Error: ...`` text, the
        turn taken back, and no event."""
        self.history.append(user(text, images))
        try:
            out, ev = await self.ep.llm(list(self.history), **record)
        except REFUSED as e:
            self.history.pop()
            return refused(self.ep, e, record["state"], record.get("branch")), None
        reply = None if out.content_null else out.text
        self.history.append({"role": "assistant", "content": reply})
        return reply, ev


def _resolve(ep: Episode, image_id):
    """The release's id lookup (``pipelines/pipeline_mmcontextfold.py:85-99``): the id exactly as written, else
    ``<image_DIGITS>`` with the digits as written after an ``image``/``img`` prefix (``<image_01>`` is no image).
    An id that is no string fails as the release's dict lookup and ``.strip()`` do."""
    if isinstance(image_id, (list, dict)):
        raise ReleaseCrash(f"unhashable type: '{type(image_id).__name__}'")
    if not isinstance(image_id, str):
        raise ReleaseCrash(f"'{type(image_id).__name__}' object has no attribute 'strip'")
    r = ep.registry.exact(image_id)
    if r is not None:
        return r
    cleaned = image_id.strip().strip("<>").strip()
    for prefix in ("image_", "image", "img_", "img", "image #", "image#"):
        if cleaned.lower().startswith(prefix):
            cleaned = cleaned[len(prefix):]
            break
    digits = re.search(r"(\d+)", cleaned)
    return ep.registry.exact(f"<image_{digits.group(1)}>") if digits else None


# ------------------------------------------------------------------ the protocol
async def _init(ep: Episode) -> str:
    """One perception call per image, on its own (``pipelines/pipeline_mmcontextfold.py:101-151``)."""
    blocks, parsed = [], {}
    for img in ep.registry.images:
        msgs = [{"role": "system", "content": INIT_SYSTEM}, user(INIT, [img.path])]
        try:
            out, ev = await ep.llm(msgs, state="init", parent="init")
            text = None if out.content_null else out.text
        except REFUSED as e:  # send_single_message's Error: text
            text, ev = refused(ep, e, f"init ({img.image_id})"), None
        if not text or failed(text):  # pipelines/pipeline_mmcontextfold.py:113-115
            if ev is not None:
                ep.traj.settle(ev, error="perception failed (the reply is empty, null or starts with 'Error:')")
            parsed[img.image_id] = False
            blocks.append(fill(PERCEPTION_FAILED, image_id=img.image_id))
            continue
        m = re.search(r"\{.*\}", text, re.S)
        try:
            data = _loads(m.group()) if m else None
        except json.JSONDecodeError:
            data = None
        ep.traj.settle(ev, action={"kind": "describe", "image_id": img.image_id, "parsed": isinstance(data, dict)})
        parsed[img.image_id] = isinstance(data, dict)
        if isinstance(data, dict):
            blocks.append(f"{img.image_id}: [Query Image]\n  Content: {data.get('summary', '')}\n"
                          f"  Source: {data.get('source_hint', '')}")
        else:
            blocks.append(f"{img.image_id}: [Query Image] {text[:200]}")
    ep.traj.init_end({r.image_id: b for r, b in zip(ep.registry.images, blocks)}, parsed)
    return "\n\n".join(blocks) if blocks else "No images provided."


async def run_release_protocol(ep: Episode) -> tuple[str, str]:
    """The release's run of one sample: ``(status, answer)``; an exception the model's output makes the release's
    code raise ends it with the release's answer for it (:class:`ReleaseCrash`)."""
    try:
        return await _run(ep)
    except ReleaseCrash as e:
        ep.traj.error("ReleaseCrash", f"the release's code raised here; its answer is the exception: {e}")
        answer = f"Error: {e}"
        ep.traj.final_answer(None, answer)
        return "ok", answer


async def _run(ep: Episode) -> tuple[str, str]:
    chat = _Chat(ep)
    question = ep.sample.question
    response, ev = await chat.send(fill(MAIN, image_context=await _init(ep), question=question), state="main")
    branches = 0
    for _ in range(MAX_ROUNDS):
        if failed(response):  # pipelines/pipeline_mmcontextfold.py:463-466: a round spent asking again
            if ev is not None:
                ep.traj.settle(ev, error="failed call (null content or 'Error:')")
            response, ev = await chat.send(AFTER_FAILED_CALL, state="main", correction=True)
            continue
        assert response is not None
        answer = extract_answer(response)
        if answer:  # an <answer> wins over a <subtask> in the same reply
            ep.traj.final_answer(ev, answer)
            return "ok", answer
        subtask = extract_subtask(response)
        if subtask is None:
            ep.traj.settle(ev, error="no <answer> and no <subtask> with a prompt")
            response, ev = await chat.send(MAIN_CORRECTION, state="main", correction=True)
            continue
        if branches >= MAX_BRANCHES:
            response, ev = await chat.send(BRANCH_LIMIT, state="main")
            continue
        description = subtask.get("description", "subtask")
        if not isinstance(description, str):  # the branch's name: description.replace(' ', '_') (:508)
            raise ReleaseCrash(f"'{type(description).__name__}' object has no attribute 'replace'")
        if isinstance(subtask["prompt"], (int, float)):  # logged as subtask['prompt'][:100] (:512)
            raise ReleaseCrash(f"'{type(subtask['prompt']).__name__}' object is not subscriptable")
        branches += 1
        ep.traj.settle(ev, action={"kind": "subtask", "subtask": subtask})
        message = await _branch(ep, chat, f"b{branches}", subtask, ev)
        response, ev = await chat.send(fill(CONTINUE, description=description, return_message=message), state="main")
    response, ev = await chat.send(FORCE_ANSWER, state="main", forced=True)
    if failed(response) or not response:  # pipelines/pipeline_mmcontextfold.py:525-531
        answer = NO_ANSWER
    else:
        answer = extract_answer(response) or response[:500]
    ep.traj.final_answer(ev, answer, forced=True)
    return "ok", answer


async def _branch(ep: Episode, chat: _Chat, bid: str, subtask: dict, main_ev: dict) -> str:
    """``pipelines/pipeline_mmcontextfold.py:160-330``: the branch continues the main conversation, then is cut off."""
    saved = list(chat.history)
    loaded = []
    for x in _iterated(subtask.get("assigned_images", [])):
        r = _resolve(ep, x)
        if r is not None:
            loaded.append((str(x), r))
    note = images_note([x for x, _ in loaded]) if loaded else ""
    ep.traj.branch_begin(bid, description=str(subtask.get("description", "subtask")), prompt=str(subtask["prompt"]),
                         assigned_images=[r.image_id for _, r in loaded], assigned_hashes=[r.sha256 for _, r in loaded],
                         main_call_index=main_ev["index"])
    paths = [r.path for _, r in loaded]
    response, ev = await chat.send(BRANCH.replace("{task_prompt}", str(subtask["prompt"]) + note), paths,
                                   state="branch", branch=bid)
    message, reason, failures = None, "budget", 0
    for turn in range(MAX_BRANCH_TURNS):
        if failed(response):  # pipelines/pipeline_mmcontextfold.py:209, :218-219
            if ev is not None:
                ep.traj.settle(ev, error="failed call (null content or 'Error:')")
            message, reason = BRANCH_NO_RETURN, "failed_call"
            break
        assert response is not None
        call = extract_tool_call(response)
        if call is None:
            message, failures = _answer_in(response), failures + 1
            if message:
                reason = "answer"
                break
            if failures >= 2:
                message, reason = (response[:1000] if response.strip() else NOT_PARSED), "unparsed"
                break
            response, ev = await chat.send(BRANCH_CORRECTION, state="branch", branch=bid, correction=True)
            continue
        failures = 0
        name, params = _get(call, "name", ""), call.get("parameters", {})
        if name in ("return", "finish"):
            text = return_text(params)
            if not text or "<tool_call>" in text:
                response, ev = await chat.send(CALL_IN_RETURN if text else EMPTY_RETURN, state="branch", branch=bid,
                                               correction=True)
                continue
            message, reason = without_answer_tags(text), "return"
            break
        # the record's args are an object; parameters that are none are in the reply's text, as it arrived
        ep.traj.settle(ev, action={"kind": "tool_call", "name": name, "args": params if isinstance(params, dict) else {}})
        left = MAX_BRANCH_TURNS - 1 - turn
        warning = LAST_TURN if left <= 1 else (TWO_TURNS_LEFT if left == 2 else "")
        observation, images = await _tool(ep, ev, name, params, paths)
        response, ev = await chat.send(observation + warning, images, state="branch", branch=bid)
    else:  # pipelines/pipeline_mmcontextfold.py:315-327 (a failed or empty last reply keeps the default text)
        message = BRANCH_NO_RETURN if failed(response) or not response else _after_last_turn(response)
    chat.history = saved
    ep.traj.branch_end(bid, message=message, reason=reason, steps=turn + 1)
    return message


def _answer_in(response: str) -> str | None:
    """A branch reply with ``<answer>`` instead of a tool call: taken as its return (``:224-231``)."""
    found = extract_answer(response)
    if not found and "<answer>" in response:
        found = re.sub(r"</answer>.*", "", response.split("<answer>", 1)[1], flags=re.S).strip()
    return found or None


def _after_last_turn(response: str) -> str:
    """After the tenth turn, the last reply's return message, else its text without tool calls (``:315-327``)."""
    call = extract_tool_call(response)
    if call and _get(call, "name") in ("return", "finish"):
        text = return_text(call.get("parameters", {}))
        if text:
            return text
    return re.sub(r"<tool_call>.*?</tool_call>", "", response, flags=re.S).strip() or response[:1000]


async def _tool(ep: Episode, ev: dict, name: str, params, paths: list) -> tuple[str, list]:
    """The observation text and result images of one tool call, as the release produces them (``:340-430``)."""
    if name == "lens_search":
        image_id = _get(params, "image_id", "")  # outside any try there (_execute_lens_search): ends the sample
        r = _resolve(ep, image_id)
        if r is None:
            digits = re.search(r"(\d+)", image_id)  # else an index into the branch's own images (:350-357)
            idx = int(digits.group(1)) if digits else -1
            r = next((x for x in ep.registry.images if paths and 0 <= idx < len(paths) and x.path == paths[idx]), None)
        if r is None:
            return invalid_image(image_id, ep.registry.ids), []
        res = await ep.tool(ev, "lens_search", {**params, "image_id": r.image_id}, branch_lens=True, lens_label=image_id)
        if res.ok:
            return res.observation, [p for _, p in res.images]
        # a failure reads as no results there (utils/search_tools.py:_fail_result; :375 of the pipeline), an
        # exception of its code on a result row as "lens_search error: ..." (:371-374)
        raw = res.raw if isinstance(res.raw, dict) else {}
        return raw.get("release_error") or LENS_BRANCH_EMPTY, []
    if name in ("search", "visit", "open_page") and not isinstance(params, dict):
        # params.get(...) inside _execute_tool's try (:410-433): its Tool error, and no request
        res = ToolResult("visit" if name == "open_page" else name, {},
                         f"Tool error: '{type(params).__name__}' object has no attribute 'get'", False, False)
        ep.traj.tool_call(ev, res, 0)
        return res.observation, []
    if name in ("visit", "open_page"):  # the arguments as given, an empty one included (the toolbox's policy)
        return (await ep.tool(ev, "visit", params)).observation, []
    if name == "search":
        return (await ep.tool(ev, "search", params)).observation, []
    return fill(UNKNOWN_TOOL, name=name), []
