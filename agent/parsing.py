"""Parsing the agents' action grammars out of a model's visible output.

    act = parse_action(text, allowed=("tool_call", "answer"))
    act.kind in {"tool_call", "answer", "subtask"}; act.name, act.args / act.answer / act.subtask

Grammar (paper B.2, Table 11, and appendix E): ``<tool_call>{"name": ..., "arguments"|"parameters":
{...}}</tool_call>``, ``<subtask>{"description", "prompt", "assigned_images"}</subtask>``,
``<answer>…</answer>``. Only the visible text (after ``</think>``) is parsed. A malformed output
raises :class:`ActionError` with a message written for the model: it goes back in the correction
re-prompt (paper B.3), it is not a harness error.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

__all__ = ["Action", "ActionError", "parse_action", "parse_init_description", "strip_answer_tags", "load_json",
           "MAX_NESTING"]

#: How deep a model's JSON may nest (ours): far beyond any tool call, annotation or subtask, and within what every
#: reader and writer of the record handles (orjson writes at most 255 levels; Python's parser recurses).
MAX_NESTING = 64

_TAG = {k: re.compile(rf"<{k}>(.*?)</{k}>", re.S) for k in ("tool_call", "answer", "subtask")}
_OPEN = {k: re.compile(rf"<{k}>", re.S) for k in ("tool_call", "answer", "subtask")}


class ActionError(ValueError):
    """The output has no usable action; the message is shown to the model."""


@dataclass
class Action:
    kind: str                      # tool_call | answer | subtask
    name: str = ""                 # tool name
    args: dict = field(default_factory=dict)
    answer: str = ""
    subtask: dict = field(default_factory=dict)
    raw: str = ""


def load_json(s: str, *, trailing_ok: bool = False):
    """The JSON value a model wrote (``trailing_ok``: the first value, text after it ignored). Every failure is a
    :class:`json.JSONDecodeError`, nesting deeper than :data:`MAX_NESTING` included (a model's output is never an
    internal error: 50,000 nested brackets overflow Python's parser)."""
    try:
        obj = json.JSONDecoder().raw_decode(s)[0] if trailing_ok else json.loads(s)
    except RecursionError:
        obj = None
    else:
        if _depth(obj) <= MAX_NESTING:
            return obj
    raise json.JSONDecodeError(f"nested deeper than {MAX_NESTING} levels", s, 0)


def _depth(obj) -> int:
    """How deep a parsed JSON value nests (without recursion)."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        x, d = todo.pop()
        if isinstance(x, (dict, list)):
            deepest = max(deepest, d)
            if d > MAX_NESTING:
                break
            todo.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
    return deepest


def _json_obj(body: str, what: str) -> dict:
    s = body.strip()
    s = re.sub(r"^```(?:json)?\s*|\s*```$", "", s)
    try:
        obj = load_json(s)
    except json.JSONDecodeError as e:
        # a common slip: trailing text after the object
        try:
            obj = load_json(s, trailing_ok=True)
        except json.JSONDecodeError:
            raise ActionError(f"the content of <{what}> is not valid JSON ({e.msg} at char {e.pos}).") from None
    if not isinstance(obj, dict):
        raise ActionError(f"the content of <{what}> must be a JSON object, got {type(obj).__name__}.")
    if _has_lone_surrogate(obj):
        raise ActionError(f"the content of <{what}> holds an invalid \\uD800-\\uDFFF escape (a lone surrogate); "
                          "write the text itself.")
    return obj


def _has_lone_surrogate(x) -> bool:
    if isinstance(x, str):
        try:
            x.encode("utf-8")
            return False
        except UnicodeEncodeError:
            return True
    if isinstance(x, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in x.items())
    if isinstance(x, list):
        return any(_has_lone_surrogate(v) for v in x)
    return False


def parse_action(text: str, allowed=("tool_call", "answer")) -> Action:
    """The single action in ``text``; raises :class:`ActionError` (no action, several, bad JSON)."""
    text = text or ""
    found = {k: _TAG[k].findall(text) for k in allowed}
    n = sum(len(v) for v in found.values())
    if n == 0:
        unclosed = [k for k in allowed if _OPEN[k].search(text)]
        if unclosed:
            raise ActionError(f"<{unclosed[0]}> is not closed with </{unclosed[0]}>.")
        tags = " or ".join(f"<{k}>" for k in allowed)
        raise ActionError(f"no action found; the response must contain exactly one {tags} block.")
    if n > 1:
        kinds = ", ".join(f"{len(v)} <{k}>" for k, v in found.items() if v)
        raise ActionError(f"found {kinds}; exactly one action per response is allowed.")
    kind = next(k for k, v in found.items() if v)
    body = found[kind][0]
    if kind == "answer":
        ans = body.strip()
        if not ans:
            raise ActionError("the <answer> block is empty.")
        return Action("answer", answer=ans, raw=body)
    obj = _json_obj(body, kind)
    # B.3: "Malformed model outputs (e.g., missing action fields, batched tool calls) trigger a correction
    # re-prompt": a required field that is missing is never filled in for the model
    if kind == "tool_call":
        name = obj.get("name")
        if "arguments" not in obj and "parameters" not in obj:
            raise ActionError('the tool call has no "arguments" (give {"name": ..., "arguments": {...}}).')
        args = obj["arguments"] if "arguments" in obj else obj["parameters"]
        if isinstance(args, str):  # some models double-encode the arguments
            try:
                args = load_json(args)
            except json.JSONDecodeError:
                raise ActionError("the tool call's arguments are a string that is not JSON.") from None
        if not isinstance(name, str) or not name.strip():
            raise ActionError('the tool call has no "name".')
        if not isinstance(args, dict):
            raise ActionError('the tool call\'s "arguments" must be a JSON object.')
        return Action("tool_call", name=name.strip(), args=args, raw=body)
    # subtask
    missing = [k for k in ("description", "prompt", "assigned_images") if k not in obj]
    if missing:
        raise ActionError(f"the subtask is missing {', '.join(repr(k) for k in missing)}; it needs \"description\", "
                          '"prompt" and "assigned_images" (a list, [] for none).')
    desc, prompt, imgs = obj["description"], obj["prompt"], obj["assigned_images"]
    if not isinstance(desc, str) or not desc.strip():
        raise ActionError('the subtask needs a non-empty "description".')
    if not isinstance(prompt, str) or not prompt.strip():
        raise ActionError('the subtask needs a non-empty "prompt".')
    if not isinstance(imgs, list) or not all(isinstance(x, str) for x in imgs):  # [] is valid: a text-only branch
        raise ActionError('"assigned_images" must be a list of image identifiers such as ["<image_0>"] ([] for none).')
    return Action("subtask", subtask={"description": desc.strip(), "prompt": prompt.strip(), "assigned_images": imgs},
                  raw=body)


def strip_answer_tags(text: str) -> str:
    """A branch's returned findings without ``<answer>`` tags: the first tagged span's content, else the text with
    stray tags removed; stripped (ours: the release keeps a stray ``</answer>`` when no ``<answer>`` comes before it,
    ``pipelines/pipeline_mmcontextfold.py:254-259``; --protocol release does too)."""
    m = re.search(r"<answer>(.*?)</answer>", text, re.S)
    return m.group(1).strip() if m else re.sub(r"</?answer>", "", text).strip()


def parse_init_description(text: str) -> tuple[dict | None, str]:
    """E.4's ``{"summary", "source_hint"}`` if the output holds it, and the text to fold into the main state."""
    m = re.search(r"\{.*\}", text or "", re.S)
    if m:
        try:
            obj = load_json(m.group(0))
            if isinstance(obj, dict) and ("summary" in obj or "source_hint" in obj):
                return obj, json.dumps({"summary": obj.get("summary", ""), "source_hint": obj.get("source_hint", "")},
                                       ensure_ascii=False)
        except json.JSONDecodeError:
            pass
    return None, (text or "").strip()


# ====================================================================== ContextFold's XML grammar (paper Table 11)
@dataclass
class FunctionCall:
    """One ``<function=NAME><parameter=K>V</parameter>…</function>`` call (values stripped)."""

    name: str
    params: dict
    start: int
    end: int
    raw: str = ""


_FN = re.compile(r"<function=([^>\s]+)\s*>(.*?)</function>", re.S)
_PARAM = re.compile(r"<parameter=([^>\s]+)\s*>(.*?)</parameter>", re.S)


def parse_function_calls(text: str) -> list[FunctionCall]:
    """Every complete call in ``text``, in order. A value may span lines; it is stripped (ours: the release
    keeps surrounding whitespace, which only differs for values the tools would strip anyway)."""
    out = []
    for m in _FN.finditer(text or ""):
        params = {k: v.strip() for k, v in _PARAM.findall(m.group(2))}
        out.append(FunctionCall(m.group(1).strip(), params, m.start(), m.end(), m.group(0)))
    return out


def trailing_group(text: str, calls: list[FunctionCall]) -> list[FunctionCall]:
    """The last group of calls: consecutive calls fewer than 4 newlines apart (FoldAgent runs that group, in
    order, so a model can issue parallel searches)."""
    if not calls:
        return []
    group = [calls[-1]]
    for prev in reversed(calls[:-1]):
        if text[prev.end: group[0].start].count("\n") >= 4:
            break
        group.insert(0, prev)
    return group
