"""Think-segment bookkeeping shared by every backend.

The think segment of a call is the output tokens *strictly inside* ``<think>…</think>``. Qwen3.5's
chat template pre-fills ``<think>\\n`` in thinking mode, so generation usually *starts* inside the
segment; the tags themselves are never think tokens; with no closing tag the whole output
(after an opening tag, if any) is think.
"""
from __future__ import annotations

from .base import TokenLogprob

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def mark_think(tokens: list[TokenLogprob], starts_in_think: bool) -> list[TokenLogprob]:
    """Set ``token.think`` in place from the tag tokens and return the list."""
    inside = starts_in_think
    for tok in tokens:
        t = tok.text.strip()
        if t == THINK_OPEN:
            inside, tok.think = True, False
        elif t == THINK_CLOSE:
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
    """(reasoning, answer) of a raw output text."""
    body = text
    if body.lstrip().startswith(THINK_OPEN):
        body = body.lstrip()[len(THINK_OPEN):]
        starts_in_think = True
    if THINK_CLOSE in body:
        reasoning, answer = body.split(THINK_CLOSE, 1)
        return reasoning.strip(), answer.strip()
    if starts_in_think:
        return body.strip(), ""
    return "", body.strip()
