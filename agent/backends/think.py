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

import numpy as np

from .base import TokenArrays, TokenLogprob

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"


def think_mask_of(texts: list[str], starts_in_think: bool) -> np.ndarray:
    """The think mask of tokens with these texts (the rules above, at token level)."""
    full = "".join(texts)
    inside = starts_in_think or THINK_OPEN in full
    out = np.zeros(len(texts), dtype=bool)
    if not inside:
        return out
    implicit_close = THINK_CLOSE not in full  # then a <tool_call> ends the reasoning
    leading = True  # only the <think> tags that open the output are tags; a later one is reasoning text
    for i, text in enumerate(texts):
        t = text.strip()
        if t == THINK_OPEN and leading:
            inside = True
            continue
        leading = False
        if t == THINK_CLOSE and inside:
            inside = False
        elif inside and implicit_close and TOOL_CALL_OPEN in text:
            inside = False
        else:
            out[i] = inside
            if not inside:  # after the segment closed nothing is think again
                break
    return out


def mark_think(tokens: list[TokenLogprob], starts_in_think: bool) -> list[TokenLogprob]:
    """Set the think flags in place (the rules above, at token level) and return the tokens."""
    if isinstance(tokens, TokenArrays):
        tokens.think = think_mask_of(tokens.texts, starts_in_think)
        return tokens
    mask = think_mask_of([t.text for t in tokens], starts_in_think)
    for tok, m in zip(tokens, mask):
        tok.think = bool(m)
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
