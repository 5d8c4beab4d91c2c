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

import contextvars
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from ..choices import DEFAULT_TOP_LOGPROBS
from ..errors import HarnessError
from ..http import HTTPError, ServerDown
from .tokens import (  # re-exported
    LOGPROB_FLOOR,
    TokenArrays,
    TokenLogprob,
    TopList,
    TopLogprob,
    top_id_matrix,
    top_matrix,
)

__all__ = [
    "LOGPROB_FLOOR", "TokenArrays", "top_matrix", "top_id_matrix",
    "BackendError",
    "ModelServerDown",
    "BadReply",
    "RequestRefused",
    "reported_count",
    "backend_error",
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
    "route",
    "routing_key",
    "routing_headers",
]



#: The trajectory the current task's requests belong to: sent as smg's routing key, so that a gateway with sticky
#: sessions (``--routing-key-override``, serving/plan.py) keeps a trajectory on one worker and its prefix in one
#: cache. Set per unit by the runner and per trajectory by the probes (:func:`route`).
ROUTING_KEY: contextvars.ContextVar = contextvars.ContextVar("mmcf_routing_key", default=None)
ROUTING_HEADER = "x-smg-routing-key"


def routing_key(key) -> str:
    """The header value for a trajectory's identity ``key`` (a ``(sample id, trial)`` tuple, or any value): a
    digest, so that it is ASCII whatever the sample id (an HTTP header carries no ``样本_1``, no CR/LF) and stable,
    and clear of smg's own rules on keys (one ending ``_t<n>`` or ``_r<n>`` has that suffix stripped, which would
    put two trajectories under one key)."""
    ident = "/".join(map(str, key)) if isinstance(key, tuple) else str(key)
    return "mmcf-" + hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def route(key) -> None:
    """Send the current task's model requests under the routing key of ``key`` (a trajectory's identity)."""
    ROUTING_KEY.set(None if key is None else routing_key(key))


def routing_headers(headers: dict | None = None) -> dict:
    """``headers`` plus the routing key of the current task, when it has one."""
    key = ROUTING_KEY.get()
    return {**(headers or {}), ROUTING_HEADER: key} if key else dict(headers or {})


class BackendError(HarnessError, RuntimeError):
    """A harness-level failure talking to a model: bad endpoint, malformed reply, drifted ids.

    Raised (never swallowed): the runner records it as the sample's error and moves on.
    """


class ModelServerDown(BackendError):
    """The model server stopped answering (agent.http.ServerDown): not one unit's error but the end of the
    command. The runner and the probes stop at once, keep everything finished, and say so in one line."""


class RequestRefused(BackendError):
    """The server answered that it cannot take this request for what it holds (HTTP 400, 413, 422: an image it
    cannot decode, more tokens than its context). Never retried; the unit's error, except under ``--protocol
    release``, where it is the release's failed call (``send_message`` returns ``Error: ...``)."""


#: The statuses that refuse a request for its content, not for the server's state (ours: auth, rate limits and
#: missing routes stay errors of the run in every protocol).
REFUSED_STATUS = frozenset({400, 413, 422})


def backend_error(e: HTTPError) -> BackendError:
    """The backend's error for a request that failed for good: :class:`ModelServerDown` when the server is down,
    :class:`RequestRefused` when it refused the request's content."""
    if isinstance(e, ServerDown):
        return ModelServerDown(str(e))
    return RequestRefused(str(e)) if e.status in REFUSED_STATUS else BackendError(str(e))


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


def reported_count(value, field: str, where: str, default: int = 0) -> int:
    """A token count a server reported (``usage.prompt_tokens``, ``meta_info.cached_tokens``…): a whole number
    >= 0, or ``default`` when it is absent; anything else (-5, 1.5, "many") is a :class:`BadReply` naming it."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
        raise BadReply(f"{where}: {field} is {value!r}, not a token count")
    return int(value)


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int | None = None
    cost: float | None = None       # what the provider says the call cost (OpenRouter's usage.cost), when it says
    provider: str | None = None     # the provider that served it (OpenRouter's top-level "provider")


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
        out: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                               "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
                               "max_new_tokens": self.max_tokens}
        if self.stop:
            out["stop"] = list(self.stop)
        return out


@dataclass(slots=True)
class ModelOutput:
    """The full record of one generation.

    ``text`` is the visible answer (after the think segment) and ``reasoning`` the thinking text, as the server
    sent them (a chat server's ``content`` and ``reasoning_content``, unstripped; ``content_null`` when it sent
    null);
    ``tokens[i].think`` says which output tokens lie strictly inside ``<think>…</think>``.
    ``request`` is what was sent, with images replaced by their sha256; ``response`` the raw reply.
    ``prompt_pieces``: ``(tokenizer fingerprint, [(digest, int32 ids), ...])``, the prompt's token ids by message
    piece, from a backend that tokenises the prompt itself and sends the ids (SGLang's native one; the run records
    them, agent/backends/pieces.py), else None.
    """

    text: str
    reasoning: str
    tokens: TokenArrays
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
    content_null: bool = False  # the server sent ``content: null`` (``text`` is then "")

    @property
    def visible(self) -> str:
        """The visible answer as a prompt or a parser uses it: ``text`` without surrounding whitespace (ours: Qwen3.5's
        chat template trims it too when it renders the history; the record keeps ``text`` as it arrived)."""
        return self.text.strip()

    @property
    def full_text(self) -> str:
        """Reasoning and answer as the model emitted them (for history reconstruction)."""
        if self.reasoning:
            return f"<think>\n{self.reasoning}\n</think>\n\n{self.text}"
        return self.text

    def top_counts(self) -> list[int]:
        """How many alternatives came back per token (deduping chat servers can return < k)."""
        return self.tokens.counts.tolist()

    def think_mask(self) -> np.ndarray:
        return self.tokens.think.copy()

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

    tokens: TokenArrays
    semantics: LogprobSemantics
    backend: str
    model: str
    exact_entropy: list[float] | None = None
    request: dict[str, Any] = field(default_factory=dict)
    response: Any = None
    top_k_requested: int = DEFAULT_TOP_LOGPROBS

    def top_logprob_matrix(self, k: int | None = None) -> np.ndarray:
        return top_matrix(self.tokens, k or self.top_k_requested)


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
