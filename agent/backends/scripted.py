"""A scripted backend for tests: real interface, scripted text, planted distributions.

    b = ScriptedBackend(["<think>look</think><answer>Paris</answer>"], k=20,
                        top_fn=lambda has_images, pos: [-0.1] + [-3.0] * 19)
    out = await b.generate(messages)

Each ``generate`` returns the next scripted response (a string, or a callable of the messages);
responses are split into one token per character run of word/non-word so that ``<think>`` and
``</think>`` are tokens of their own. ``top_fn(has_images, position)`` gives each token's top-k
logprobs (best first), so a test can plant the entropy with and without images and check that a
probe recovers the difference; ``score`` uses the same function. ``has_images`` means *query* images:
an image part that follows its ``<image_k>`` identifier (how the agents place query images), so lens
result images in observations do not count. Every call is kept in ``calls``.
"""
from __future__ import annotations

import asyncio
import inspect
import math
import re
import zlib
from typing import Callable

from .base import (
    DEFAULT_TOP_LOGPROBS,
    BackendError,
    Continuation,
    LogprobSemantics,
    ModelOutput,
    SamplingParams,
    ScoredTokens,
    TokenArrays,
    Usage,
)
from .messages import query_image_flags, record_messages
from .think import mark_think, split_think

__all__ = ["ScriptedBackend", "uniform_top", "ALT_ID0", "has_query_images"]

#: The j-th alternative of every position has id ALT_ID0 + j (the chosen token's id comes first).
ALT_ID0 = 10_000_000

_TOKEN_RE = re.compile(r"</?think>|<[^>\s]{1,20}>|\w+|\s+|[^\w\s]")




def has_query_images(messages: list[dict]) -> bool:
    """Whether a query image is in the context: an image part right after an ``<image_k>`` identifier."""
    return any(any(query_image_flags(m.get("content"))) for m in messages)


def uniform_top(n: int, k: int = DEFAULT_TOP_LOGPROBS):
    """top_fn giving a uniform distribution over ``n`` tokens (k listed, the rest in the tail)."""

    def fn(has_images: bool, pos: int) -> list[float]:
        return [math.log(1.0 / n)] * min(k, n)
    return fn


class ScriptedBackend:
    name = "scripted"
    #: The fake vocabulary's size (for the entropy bounds): Qwen3.5's 248,320 output rows, so a scripted demo's
    #: ΔH interval is as wide as a real model's would be for the same top-20 lists (ids are not checked here).
    vocab = 248_320
    #: Scoring another process's continuation needs its text (the ids are this process's hashes): a probe reads the
    #: token texts for it. The model backends score by ids alone and skip that column (probes/entropy/).
    scores_text = True

    def __init__(self, script: list, *, model: str = "scripted", k: int = DEFAULT_TOP_LOGPROBS,
                 top_fn: Callable | None = None, semantics: LogprobSemantics | None = None,
                 policy: Callable | None = None):
        self.script = list(script)
        self.policy = policy  # answers every generation once the script is used up (None: the script only)
        self.model = model
        self.k = k
        self.top_fn = top_fn or uniform_top(4, k)
        # a top_fn may take (has_images, pos) or (has_images, pos, messages): the latter can plant per step

        self._top_ctx = len(inspect.signature(self.top_fn).parameters) >= 3
        self.semantics = semantics or LogprobSemantics("raw")
        self.calls: list[dict] = []
        self._vocab: dict[str, int] = {}
        self._texts: dict[int, str] = {}

    def _id(self, text: str) -> int:
        # stable across processes (a probe scores ids a run recorded earlier): a hash of the piece (ours)
        i = self._vocab.get(text)
        if i is None:
            i = self._vocab[text] = zlib.crc32(text.encode("utf-8", "surrogatepass")) % (ALT_ID0 - 1) + 1
            self._texts[i] = text
        return i

    def _tokens(self, text: str, has_images: bool, messages=None) -> TokenArrays:
        return self._pieces(_TOKEN_RE.findall(text), has_images, messages)

    def _text_of(self, i: int) -> str:
        """An id's text: a piece this backend emitted, or an alternative's ``<altJ>``."""
        return f"<alt{i - ALT_ID0}>" if i > ALT_ID0 else self._texts.get(i, "")

    def _pieces(self, pieces: list[str], has_images: bool, messages=None) -> TokenArrays:
        ids, lps, top_ids, top_lps = [], [], [], []
        for pos, piece in enumerate(pieces):
            row = list(self.top_fn(has_images, pos, messages) if self._top_ctx else self.top_fn(has_images, pos))
            ids.append(self._id(piece))
            lps.append(row[0])
            top_ids.append([ids[-1], *(ALT_ID0 + j for j in range(1, len(row)))])
            top_lps.append(row)
        k = max(map(len, top_lps), default=0)
        return TokenArrays(ids, pieces, lps, [r + [-1] * (k - len(r)) for r in top_ids],
                           [r + [float("nan")] * (k - len(r)) for r in top_lps], counts=[len(r) for r in top_lps],
                           decode=self._text_of)

    async def generate(self, messages: list[dict], sampling: SamplingParams | None = None) -> ModelOutput:
        sp = sampling or SamplingParams()
        await asyncio.sleep(0)  # yield like a real backend does
        if not self.script and self.policy is None:
            raise BackendError("scripted backend: the script ran out of responses")
        item = self.script.pop(0) if self.script else self.policy
        text = str(item(messages) if callable(item) else item)
        has_images = has_query_images(messages)
        tokens = mark_think(self._tokens(text, has_images, messages), starts_in_think=False)
        reasoning, answer = split_think(text, starts_in_think=False)
        self.calls.append({"kind": "generate", "messages": record_messages(messages), "has_images": has_images})
        return ModelOutput(text=answer, reasoning=reasoning, tokens=tokens, finish_reason="stop",
                           usage=Usage(prompt_tokens=sum(len(str(m.get("content"))) for m in messages) // 4,
                                       completion_tokens=len(tokens), reasoning_tokens=int(tokens.think.sum())),
                           semantics=self.semantics, backend=self.name, model=self.model,
                           request={"messages": record_messages(messages), "sampling": sp.to_dict()},
                           response={"text": text}, top_k_requested=self.k)

    async def score(self, messages: list[dict], continuation: Continuation, *, top_logprobs: int = DEFAULT_TOP_LOGPROBS,
                    enable_thinking: bool | None = True, temperature: float | None = None) -> ScoredTokens:
        has_images = has_query_images(messages)
        if continuation.ids:  # ids of this backend's own earlier outputs
            inv = {v: k for k, v in self._vocab.items()}
            missing = [i for i in continuation.ids if i not in inv]
            if missing and continuation.text is not None:
                # another process generated them: re-split the text; its pieces must hash to the same ids
                pieces = _TOKEN_RE.findall(continuation.text)
                if [self._id(p) for p in pieces] != list(continuation.ids):
                    raise BackendError("scripted backend: the continuation's ids do not match its text")
            elif missing:
                raise BackendError(f"scripted backend: unknown token ids {missing[:5]} (not generated by this backend)")
            else:
                pieces = [inv[i] for i in continuation.ids]
        else:
            pieces = _TOKEN_RE.findall(continuation.text or "")
        tokens = mark_think(self._pieces(pieces, has_images, messages), starts_in_think=False)
        self.calls.append({"kind": "score", "messages": record_messages(messages), "has_images": has_images})
        return ScoredTokens(tokens=tokens, semantics=LogprobSemantics("raw"), backend=self.name, model=self.model,
                            request={"messages": record_messages(messages)}, top_k_requested=self.k)

    async def aclose(self) -> None:
        return None
