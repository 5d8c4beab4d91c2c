"""The one model-backend interface and its typed records.

Every backend (OpenAI-compatible HTTP, SGLang native ``/generate``, in-process transformers, the
scripted fake for tests) implements :class:`Backend`:

    out = await backend.generate(messages, SamplingParams())          # -> ModelOutput
    sc  = await backend.score(messages, Continuation(ids, text))       # -> ScoredTokens

``messages`` follow the OpenAI chat format; image parts may be a local path, a ``file://`` URL,
a ``data:`` URI or an http(s) URL (see :mod:`agent.backends.messages`).

Which distribution a logprob describes is part of every record (:class:`LogprobSemantics`):
``raw`` = log_softmax(logits); ``scaled`` = log_softmax(logits / T). SGLang returns *scaled*
output logprobs by default and raw ones under ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``; vLLM returns
raw ones by default; prompt (teacher-forced) logprobs are raw everywhere. A server's mode is not
visible in its replies, so each backend is *told* (``logprob_mode=``) and stamps it on its outputs.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "BackendError",
    "TopLogprob",
    "TopList",
    "TokenLogprob",
    "Usage",
    "LogprobSemantics",
    "SamplingParams",
    "ModelOutput",
    "Continuation",
    "ScoredTokens",
    "Backend",
    "DEFAULT_TOP_LOGPROBS",
]

#: The paper asks every backend for the top-20 alternatives of each token (B.1).
DEFAULT_TOP_LOGPROBS = 20


class BackendError(RuntimeError):
    """A harness-level failure talking to a model: bad endpoint, malformed reply, drifted ids.

    Raised (never swallowed): the runner records it as the sample's error and moves on.
    """


class BadReply(BackendError):
    """A well-formed reply whose values cannot be true (a NaN / +inf / positive logprob, a token id outside the
    vocabulary, a top list shorter than asked): never stored; the request is sent again a bounded number of
    times (:data:`BAD_REPLY_ATTEMPTS`), then the unit ends ``error`` naming the field."""


#: How many times a request whose reply had impossible values is sent in all (ours: a server bug or a flipped
#: bit is rarely repeated; three tries bound the cost).
BAD_REPLY_ATTEMPTS = 3

def model_vocab_size(model_dir) -> int | None:
    """The model's vocabulary (its logits' width, padded rows included) from ``config.json``; None if unknown."""

    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return None
    v = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return int(v) if isinstance(v, int) and v > 0 else None


async def retry_bad_replies(attempt, what: str):
    """``await attempt()`` again while it raises :class:`BadReply`, at most :data:`BAD_REPLY_ATTEMPTS` times in
    all; then the last error, saying how many replies were refused."""
    for i in range(BAD_REPLY_ATTEMPTS):
        try:
            return await attempt()
        except BadReply as e:
            last = e
    raise BadReply(f"{what}: {BAD_REPLY_ATTEMPTS} replies in a row refused; last: {last}") from None


#: SGLang's temperature-scaled logprobs clamp an underflowed top-k logprob to float32's lowest value
#: (-3.4e38); -inf means the same. Both are stored as this known floor and every entropy / KL path reads them
#: as probability 0 (exp underflows to exactly 0).
LOGPROB_FLOOR = float(np.finfo(np.float32).min)


@dataclass(slots=True)  # not frozen: a frozen dataclass is 3x slower to build, and replies hold thousands
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
        self.ids, self.logprobs, self.texts, self._decode, self._items = ids, logprobs, texts, decode, None

    def _materialise(self) -> list[TopLogprob]:
        if self._items is None:
            texts = self.texts or [None] * len(self.logprobs)
            dec = self._decode
            self._items = [TopLogprob(i, t if t is not None else (dec(i) if dec is not None and i is not None else ""), lp)
                           for i, t, lp in zip(self.ids, texts, self.logprobs)]
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
    (n,) bool (set by :func:`agent.backends.think.mark_think`), ``counts`` (n,) alternatives per token.
    Indexing and iteration build :class:`TokenLogprob` objects on demand (for code that wants them);
    the record, the entropy math and the probes read the arrays directly.
    """

    __slots__ = ("ids", "texts", "logprobs", "top_ids", "top_logprobs", "think", "counts", "_decode")

    def __init__(self, ids, texts, logprobs, top_ids, top_logprobs, think=None, counts=None, decode=None):
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
        if not (len(self.texts) == len(self.logprobs) == len(self.top_logprobs) == len(self.think) == n):
            raise ValueError("TokenArrays: columns of different lengths")

    def __len__(self) -> int:
        return len(self.ids)

    def _token(self, i: int) -> TokenLogprob:
        c = int(self.counts[i])
        ids = [None if x < 0 else int(x) for x in self.top_ids[i, :c]]
        top = TopList(ids, [float(x) for x in self.top_logprobs[i, :c]], None, self._decode)
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
    def from_tokens(cls, tokens: "list[TokenLogprob]", k: int) -> "TokenArrays":
        """The arrays of a list of :class:`TokenLogprob` (the object path: scripted and chat backends)."""
        if isinstance(tokens, TokenArrays):
            return tokens
        return cls([-1 if t.id is None else t.id for t in tokens], [t.text for t in tokens],
                   [t.logprob for t in tokens], top_id_matrix(tokens, k), top_matrix(tokens, k),
                   [t.think for t in tokens], [len(t.top) for t in tokens])


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class LogprobSemantics:
    """Which distribution the logprobs of a record describe.

    ``kind="raw"``: log_softmax(logits). ``kind="scaled"``: log_softmax(logits / temperature).
    Neither is top-p filtered.
    """

    kind: Literal["raw", "scaled"]
    temperature: float | None = None

    def __post_init__(self):
        if self.kind not in ("raw", "scaled"):
            raise ValueError(f"logprob kind must be 'raw' or 'scaled', got {self.kind!r}")
        if self.kind == "scaled" and (self.temperature is None or self.temperature <= 0):
            raise ValueError("scaled logprobs need the sampling temperature (> 0)")

    @classmethod
    def for_generation(cls, mode: str, temperature: float) -> "LogprobSemantics":
        """Semantics of *output* logprobs of a server in ``mode`` ('raw'|'scaled') at temperature T.

        At T == 0 (greedy) SGLang's scaled logprobs fall back to the raw distribution.
        """
        if mode == "raw" or temperature <= 0:
            return cls("raw")
        return cls("scaled", float(temperature))

    def label(self) -> str:
        return "raw" if self.kind == "raw" else f"scaled(T={self.temperature:g})"


@dataclass(slots=True)
class SamplingParams:
    """Sampling settings; defaults are the paper's (B.1): T=0.2, top-p=0.95, top-20 logprobs; no top-k, min-p
    or repetition penalty (the paper names none; ours: the neutral values, sent explicitly)."""

    temperature: float = 0.2
    top_p: float = 0.95
    # Sent explicitly on every path, so that no server default fills them in (Qwen3.5's
    # generation_config.json sets top_k=20, which SGLang's chat path would otherwise inherit).
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 4096
    top_logprobs: int = DEFAULT_TOP_LOGPROBS
    seed: int | None = None
    stop: list[str] | None = None
    enable_thinking: bool | None = True
    chat_template_kwargs: dict[str, Any] | None = None

    def template_kwargs(self) -> dict[str, Any]:
        kw = dict(self.chat_template_kwargs or {})
        if self.enable_thinking is not None:
            kw.setdefault("enable_thinking", self.enable_thinking)
        return kw

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def server_params(self) -> dict[str, Any]:
        """The sampling set every server gets, in SGLang's names (``max_new_tokens``; ``stop`` when set)."""
        out = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
               "repetition_penalty": self.repetition_penalty, "max_new_tokens": self.max_tokens}
        if self.stop:
            out["stop"] = list(self.stop)
        return out


@dataclass(slots=True)
class ModelOutput:
    """The full record of one generation.

    ``text`` is the visible answer (after the think segment), ``reasoning`` the thinking text;
    ``tokens[i].think`` says which output tokens lie strictly inside ``<think>…</think>``.
    ``request`` is what was sent, with images replaced by their sha256; ``response`` the raw reply.
    ``prompt_pieces``: ``(tokenizer fingerprint, [(digest, int32 ids), ...])``, the prompt's token ids by message
    piece, from a backend that tokenises the prompt itself and sends the ids (SGLang's native one; the run records
    them, agent/backends/pieces.py), else None.
    """

    text: str
    reasoning: str
    tokens: list[TokenLogprob]
    finish_reason: str | None
    usage: Usage
    semantics: LogprobSemantics
    backend: str
    model: str
    latency_s: float = 0.0
    request: dict[str, Any] = field(default_factory=dict)
    response: Any = None
    exact_entropy: list[float] | None = None
    top_k_requested: int = DEFAULT_TOP_LOGPROBS
    prompt_pieces: Any = None

    @property
    def full_text(self) -> str:
        """Reasoning and answer as the model emitted them (for history reconstruction)."""
        if self.reasoning:
            return f"<think>\n{self.reasoning}\n</think>\n\n{self.text}"
        return self.text

    def top_counts(self) -> list[int]:
        """How many alternatives came back per token (deduping chat servers can return < k)."""
        if isinstance(self.tokens, TokenArrays):
            return self.tokens.counts.tolist()
        return [len(t.top) for t in self.tokens]

    def think_mask(self) -> np.ndarray:
        if isinstance(self.tokens, TokenArrays):
            return self.tokens.think.copy()
        return np.array([t.think for t in self.tokens], dtype=bool)

    def top_logprob_matrix(self, k: int | None = None) -> np.ndarray:
        """(n_tokens, k) float array of top logprobs, NaN-padded where fewer came back."""
        return top_matrix(self.tokens, k or self.top_k_requested)


@dataclass(slots=True)
class Continuation:
    """A fixed continuation to score: token ids (preferred) and/or text."""

    ids: list[int] | None = None
    text: str | None = None

    def __post_init__(self):
        if not self.ids and not self.text:
            raise ValueError("a continuation needs token ids or text")


@dataclass(slots=True)
class ScoredTokens:
    """Teacher-forced log-probabilities of a continuation under a context (raw unless stated)."""

    tokens: list[TokenLogprob]
    semantics: LogprobSemantics
    backend: str
    model: str
    exact_entropy: list[float] | None = None
    request: dict[str, Any] = field(default_factory=dict)
    response: Any = None
    top_k_requested: int = DEFAULT_TOP_LOGPROBS

    def top_logprob_matrix(self, k: int | None = None) -> np.ndarray:
        return top_matrix(self.tokens, k or self.top_k_requested)


def _fit(a: np.ndarray, k: int, fill, dtype, copy: bool = True) -> np.ndarray:
    """``a`` (n, m) cut or padded to (n, k) (``copy=False``: ``a`` itself when it already is)."""
    if a.shape[1] == k:
        return a.astype(dtype, copy=copy)
    out = np.full((a.shape[0], k), fill, dtype=dtype)
    w = min(k, a.shape[1])
    out[:, :w] = a[:, :w]
    return out


def top_matrix(tokens: list[TokenLogprob], k: int, dtype=np.float64, copy: bool = True) -> np.ndarray:
    """(n, k) top logprobs, NaN-padded where fewer than k came back (``copy=False``: read-only use, the
    arrays' own matrix when it already has that shape and dtype)."""
    if isinstance(tokens, TokenArrays):
        return _fit(tokens.top_logprobs, k, np.nan, dtype, copy)
    if tokens and all(isinstance(t.top, TopList) and len(t.top.logprobs) == k for t in tokens):
        return np.array([t.top.logprobs for t in tokens], dtype=dtype)
    out = np.full((len(tokens), k), np.nan, dtype=dtype)
    for i, t in enumerate(tokens):
        vals = t.top_logprobs()[:k]
        out[i, : len(vals)] = vals
    return out


def top_id_matrix(tokens: list[TokenLogprob], k: int) -> np.ndarray:
    """(n, k) top token ids, -1 where absent or unknown (chat servers give no ids)."""
    if isinstance(tokens, TokenArrays):
        return _fit(tokens.top_ids, k, -1, np.int32)
    if tokens and all(isinstance(t.top, TopList) and len(t.top.ids) == k and None not in t.top.ids for t in tokens):
        return np.array([t.top.ids for t in tokens], dtype=np.int32)
    out = np.full((len(tokens), k), -1, dtype=np.int32)
    for i, t in enumerate(tokens):
        for j, alt in enumerate(t.top[:k]):
            out[i, j] = -1 if alt.id is None else alt.id
    return out


@runtime_checkable
class Backend(Protocol):
    """What every model backend provides."""

    name: str
    model: str

    async def generate(self, messages: list[dict], sampling: SamplingParams | None = None) -> ModelOutput:
        """Sample one response with per-token top-k logprobs."""
        ...

    async def score(
        self,
        messages: list[dict],
        continuation: Continuation,
        *,
        top_logprobs: int = DEFAULT_TOP_LOGPROBS,
        enable_thinking: bool | None = True,
    ) -> ScoredTokens:
        """Teacher-forced logprobs of ``continuation`` placed right after the generation prompt."""
        ...

    async def aclose(self) -> None:
        ...
