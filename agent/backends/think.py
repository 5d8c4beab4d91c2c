"""Think-segment bookkeeping shared by every backend, mirroring SGLang's ``qwen3`` reasoning parser.

The think segment of a call is the output tokens *strictly inside* ``<think>…</think>``. Qwen3.5's
chat template pre-fills ``<think>\\n``, so generation usually *starts* inside the segment; the tags
themselves are never think tokens. The rules follow SGLang's ``ReasoningParser("qwen3")``
(``Qwen3Detector`` in sglang/srt/parser/reasoning_parser.py, 0.5.23), so that the local, native and
chat backends split an output exactly as a server running ``--reasoning-parser qwen3`` does
(``tests/conformance/test_sglang_reasoning.py`` checks it against SGLang's own parser):

- the output is in reasoning when the prompt pre-filled ``<think>`` (SGLang: ``force_reasoning``) or the
  text contains ``<think>``; leading ``<think>`` tags are dropped;
- the first ``</think>`` ends the reasoning;
- with no ``</think>`` at all, the first ``<tool_call>`` ends it (Qwen3.5 sometimes opens a tool call
  without closing its thinking; SGLang treats the tag as an implicit close and keeps it in the answer);
- otherwise the whole output is reasoning (truncated).
"""
from __future__ import annotations

from .base import TokenLogprob

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"


def mark_think(tokens: list[TokenLogprob], starts_in_think: bool) -> list[TokenLogprob]:
    """Set ``token.think`` in place (the rules above, at token level) and return the list."""
    full = "".join(t.text for t in tokens)
    inside = starts_in_think or THINK_OPEN in full
    implicit_close = THINK_CLOSE not in full  # then a <tool_call> ends the reasoning
    leading = True  # only the <think> tags that open the output are tags; a later one is reasoning text
    for tok in tokens:
        t = tok.text.strip()
        if t == THINK_OPEN and leading:
            inside, tok.think = True, False
            continue
        leading = False
        if t == THINK_CLOSE and inside:
            inside, tok.think = False, False
        elif inside and implicit_close and TOOL_CALL_OPEN in tok.text:
            inside, tok.think = False, False
        else:
            tok.think = inside
    return tokens


def mark_think_by_text(tokens: list[TokenLogprob], reasoning: str) -> list[TokenLogprob]:
    """Mark the leading tokens whose text makes up ``reasoning`` as think.

    For chat servers that split reasoning from content but whose logprob list has no tag tokens.
    """
    target = len(reasoning.strip())
    seen = 0
    for tok in tokens:
        if seen < target:
            tok.think = True
            seen += len(tok.text.strip()) + (1 if tok.text[:1].isspace() else 0)
        else:
            tok.think = False
    return tokens


def split_think(text: str, starts_in_think: bool) -> tuple[str, str]:
    """(reasoning, answer) of a raw output text, both stripped (the rules above)."""
    if not (starts_in_think or THINK_OPEN in text):
        return "", text.strip()
    body = text
    while body.startswith(THINK_OPEN):
        body = body[len(THINK_OPEN):]
    if THINK_CLOSE in body:
        reasoning, answer = body.split(THINK_CLOSE, 1)
        return reasoning.strip(), answer.strip()
    i = body.find(TOOL_CALL_OPEN)
    if i != -1:
        return body[:i].strip(), body[i:].strip()
    return body.strip(), ""
