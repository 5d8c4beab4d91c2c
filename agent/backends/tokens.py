"""Typed records of a generated token's logprob and its top-k alternatives, and the flat arrays a reply's tokens are
kept as (``TokenArrays``: ids, logprobs and the top-k matrices, one row per token).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: SGLang's temperature-scaled logprobs clamp an underflowed top-k logprob to float32's lowest value
#: (-3.4e38); -inf means the same. Both are stored as this known floor and every entropy / KL path reads them
#: as probability 0 (exp underflows to exactly 0).
LOGPROB_FLOOR = float(np.finfo(np.float32).min)


@dataclass(slots=True)  # not frozen: a frozen dataclass is slower to build, and replies hold thousands
class TopLogprob:
    """One alternative at a position: token id (None when the server does not say), text, logprob."""

    id: int | None
    text: str
    logprob: float


class TopList(Sequence):
    """A token's top-k alternatives (best first) held as parallel lists; items are built on access.

    Wire parsers return these instead of lists of :class:`TopLogprob`: a top-20 reply of a thousand
    tokens holds 20,000 alternatives, and building an object for each costs more than the HTTP call's
    JSON decoding. ``ids``/``logprobs`` feed the record's arrays directly; indexing, iteration, ``len``
    and ``==`` behave like the list of :class:`TopLogprob` it stands for (texts decoded on demand).
    """

    __slots__ = ("ids", "logprobs", "texts", "_decode", "_items")

    def __init__(self, ids: list, logprobs: list[float], texts: list | None = None, decode=None):
        self.ids, self.logprobs, self.texts, self._decode = ids, logprobs, texts, decode
        self._items: list[TopLogprob] | None = None

    def _materialise(self) -> list[TopLogprob]:
        if self._items is None:
            texts = self.texts or [None] * len(self.logprobs)
            dec = self._decode
            items = [TopLogprob(i, t if t is not None else (dec(i) if dec is not None and i is not None else ""), lp)
                     for i, t, lp in zip(self.ids, texts, self.logprobs)]
            self._items = items
            return items
        return self._items

    def __len__(self) -> int:
        return len(self.logprobs)

    def __getitem__(self, i):
        return self._materialise()[i]

    def __iter__(self):
        return iter(self._materialise())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"TopList({self._materialise()!r})"


@dataclass(slots=True)
class TokenLogprob:
    """One generated (or scored) token with its top-k alternatives, sorted best first."""

    id: int | None
    text: str
    logprob: float
    top: "list[TopLogprob] | TopList"
    think: bool = False

    def top_logprobs(self) -> list[float]:
        return list(self.top.logprobs) if isinstance(self.top, TopList) else [t.logprob for t in self.top]

    def top_ids(self) -> list:
        return list(self.top.ids) if isinstance(self.top, TopList) else [t.id for t in self.top]


def _rows(a: np.ndarray, n: int) -> np.ndarray:
    if a.ndim == 2 and a.shape[0] == n:
        return a
    return a.reshape(n, -1) if n else np.zeros((0, a.shape[-1] if a.ndim == 2 else 0), dtype=a.dtype)


class TokenArrays(Sequence):
    """A generation's (or a scoring's) tokens held as arrays: no Python object per token on the hot path.

    ``ids`` (n,) int64 (-1: unknown), ``texts`` (list of n str), ``logprobs`` (n,) float64, ``top_ids`` (n, k)
    int64 (-1: absent), ``top_logprobs`` (n, k) float64 (NaN: absent; each row sorted best first), ``think``
    (n,) bool (set by :func:`agent.backends.think.mark_think`), ``counts`` (n,) alternatives per token,
    ``top_texts`` the alternatives' texts where the wire gave texts but no ids (an OpenAI chat reply), else None.
    Indexing and iteration build :class:`TokenLogprob` objects on demand (for code that wants them);
    the record, the entropy math and the probes read the arrays directly.
    """

    __slots__ = ("ids", "texts", "logprobs", "top_ids", "top_logprobs", "think", "counts", "_decode", "top_texts")

    def __init__(self, ids, texts, logprobs, top_ids, top_logprobs, think=None, counts=None, decode=None,
                 top_texts=None):
        n = len(ids)
        self.ids = np.asarray(ids, dtype=np.int64)
        self.texts = list(texts)
        self.logprobs = np.asarray(logprobs, dtype=np.float64)
        self.top_ids = _rows(np.asarray(top_ids, dtype=np.int64), n)
        self.top_logprobs = _rows(np.asarray(top_logprobs, dtype=np.float64), n)
        self.think = np.zeros(n, dtype=bool) if think is None else np.asarray(think, dtype=bool)
        self.counts = (np.full(n, self.top_logprobs.shape[1], dtype=np.int64) if counts is None
                       else np.asarray(counts, dtype=np.int64))
        self._decode = decode
        self.top_texts = top_texts
        if not (len(self.texts) == len(self.logprobs) == len(self.top_logprobs) == len(self.think) == n):
            raise ValueError("TokenArrays: columns of different lengths")

    def __len__(self) -> int:
        return len(self.ids)

    def _token(self, i: int) -> TokenLogprob:
        c = int(self.counts[i])
        ids = [None if x < 0 else int(x) for x in self.top_ids[i, :c]]
        top = TopList(ids, [float(x) for x in self.top_logprobs[i, :c]],
                      None if self.top_texts is None else self.top_texts[i][:c], self._decode)
        tid = int(self.ids[i])
        return TokenLogprob(None if tid < 0 else tid, self.texts[i], float(self.logprobs[i]), top, bool(self.think[i]))

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._token(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._token(i)

    def __iter__(self):
        return (self._token(i) for i in range(len(self)))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    @classmethod
    def empty(cls) -> "TokenArrays":
        """No tokens (a reply that carries no logprobs)."""
        return cls([], [], [], np.zeros((0, 0)), np.zeros((0, 0)))

    @classmethod
    def from_tokens(cls, tokens: "list[TokenLogprob]", k: int | None = None, decode=None) -> "TokenArrays":
        """The arrays of per-token records (a wire's irregular reply, built token by token): the one representation
        a backend returns. ``k``: the width of the top matrices (default: the longest list); ``decode``: an id's
        text, for the alternatives (their texts are not kept as arrays)."""
        k = max((len(t.top) for t in tokens), default=0) if k is None else k
        tl = np.full((len(tokens), k), np.nan)
        ti = np.full((len(tokens), k), -1, dtype=np.int64)
        for i, t in enumerate(tokens):
            top = list(t.top)[:k]
            tl[i, :len(top)] = [a.logprob for a in top]
            ti[i, :len(top)] = [-1 if a.id is None else a.id for a in top]
        return cls([-1 if t.id is None else t.id for t in tokens], [t.text for t in tokens],
                   [t.logprob for t in tokens], ti, tl, [t.think for t in tokens],
                   [min(len(t.top), k) for t in tokens], decode=decode)


def _fit(a: np.ndarray, k: int, fill, dtype, copy: bool = True) -> np.ndarray:
    """``a`` (n, m) cut or padded to (n, k) (``copy=False``: ``a`` itself when it already is)."""
    if a.shape[1] == k:
        return a.astype(dtype, copy=copy)
    out = np.full((a.shape[0], k), fill, dtype=dtype)
    w = min(k, a.shape[1])
    out[:, :w] = a[:, :w]
    return out


def top_matrix(tokens: TokenArrays, k: int, dtype=np.float64, copy: bool = True) -> np.ndarray:
    """(n, k) top logprobs, NaN-padded where fewer than k came back (``copy=False``: read-only use, the
    arrays' own matrix when it already has that shape and dtype)."""
    return _fit(tokens.top_logprobs, k, np.nan, dtype, copy)


def top_id_matrix(tokens: TokenArrays, k: int) -> np.ndarray:
    """(n, k) top token ids, -1 where absent or unknown (chat servers give no ids)."""
    return _fit(tokens.top_ids, k, -1, np.int32)
