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

from .base import TokenArrays

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"


def think_mask_of(texts: list[str], starts_in_think: bool) -> np.ndarray:
    """The think mask of tokens with these texts (the rules above, at token level).

    Only a token equal to ``</think>`` (spaces aside) or, without any ``</think>``, one holding ``<tool_call>``
    ends the segment, and nothing reopens it, so the mask is one run: from the first token after the leading
    ``<think>`` tags to the first such token. That token is found by searching the joined text and mapping each
    hit to its token (ours: one pass in C instead of a Python loop over every token, a measurable share of a 1,000-token
    reply; tests/test_think.py checks it against the token-by-token rules and SGLang's parser)."""
    n = len(texts)
    out = np.zeros(n, dtype=bool)
    full = "".join(texts)
    if not (starts_in_think or THINK_OPEN in full):
        return out
    i0 = 0
    while i0 < n and texts[i0].strip() == THINK_OPEN:  # the leading tags are tags, not reasoning
        i0 += 1
    if i0 == n:
        return out
    ends = None
    end = n
    for tag, holds in ((THINK_CLOSE, lambda t: t.strip() == THINK_CLOSE), (TOOL_CALL_OPEN, lambda t: TOOL_CALL_OPEN in t)):
        if tag == TOOL_CALL_OPEN and THINK_CLOSE in full:
            break  # a <tool_call> ends the reasoning only when nothing closes it (implicit close)
        p = full.find(tag)
        while p >= 0:
            if ends is None:
                ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=n))
            j = int(np.searchsorted(ends, p, side="right"))  # the token holding the hit's first character
            if j >= end:
                break
            if j >= i0 and holds(texts[j]):
                end = j
                break
            p = full.find(tag, p + 1)
    out[i0:end] = True
    return out


def mark_think(tokens: TokenArrays, starts_in_think: bool) -> TokenArrays:
    """Set the think flags in place (the rules above, at token level) and return the tokens."""
    tokens.think = think_mask_of(tokens.texts, starts_in_think)
    return tokens


def mark_think_by_text(tokens: TokenArrays, reasoning: str) -> TokenArrays:
    """Mark the leading tokens whose text makes up ``reasoning`` as think.

    For chat servers that split reasoning from content but whose logprob list has no tag tokens.
    """
    target = len(reasoning.strip())
    seen = 0
    mask = np.zeros(len(tokens.texts), dtype=bool)
    for i, text in enumerate(tokens.texts):
        if seen >= target:
            break
        mask[i] = True
        seen += len(text.strip()) + (1 if text[:1].isspace() else 0)
    tokens.think = mask
    return tokens


def split_think(text: str, starts_in_think: bool) -> tuple[str, str]:
    """(reasoning, answer) of a raw output text, as SGLang's qwen3 reasoning parser splits it: the rules above, and
    nothing stripped (``Qwen3Detector``, srt/parser/reasoning_parser.py ``_detect_and_parse_impl``; its chat
    replies keep the "\n\n" after ``</think>`` too)."""
    if not (starts_in_think or THINK_OPEN in text):
        return "", text
    body = text
    while body.startswith(THINK_OPEN):
        body = body[len(THINK_OPEN):]
    if THINK_CLOSE in body:
        reasoning, answer = body.split(THINK_CLOSE, 1)
        return reasoning, answer
    i = body.find(TOOL_CALL_OPEN)
    if i != -1:
        return body[:i], body[i:]
    return body, ""
