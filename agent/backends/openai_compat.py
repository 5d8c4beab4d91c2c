"""OpenAI-compatible chat backend: SGLang ``/v1/chat/completions``, vLLM, OpenRouter.

    b = OpenAIBackend("http://localhost:30000", model="qwen3.5-27b", server="sglang", logprob_mode="scaled")
    out = await b.generate(messages)

Images are sent as data URIs (each file encoded once per process); ``logprobs: true,
top_logprobs: 20``; the paper's sampling defaults; ``chat_template_kwargs`` passed through (e.g.
``enable_thinking``); ``reasoning_content`` kept. With ``server="sglang"`` the request also sets
``return_meta_info`` so SGLang's raw triples (with token ids, all output tokens, thinking included)
come back in ``choices[0].meta_info``; otherwise the OpenAI ``logprobs.content`` list is parsed
(no ids; SGLang dedupes its alternatives by text, so fewer than 20 may come back).
Teacher-forced scoring is not available over the chat API: use :class:`SGLangBackend` or the
local backend for it.
"""
from __future__ import annotations

import os
import time

from ..http import HTTPError, RetryPolicy, reply_cap, request_json
from ..jsonio import scrub
from ..model_http import ModelClient
from ..redact import has_credentials, public_url, redact, register_key_var, register_secret, register_url
from .base import (
    DEFAULT_TOP_LOGPROBS,
    BackendError,
    BadReply,
    Continuation,
    LogprobSemantics,
    ModelOutput,
    SamplingParams,
    ScoredTokens,
    TokenArrays,
    Usage,
    backend_error,
    reported_count,
    retry_bad_replies,
    routing_headers,
)
from .messages import record_messages, to_openai_messages
from .think import THINK_CLOSE, mark_think, mark_think_by_text
from .wire import finish_reason_of, tokens_from_chat_logprobs, tokens_from_triples

__all__ = ["OpenAIBackend", "base_url"]


def base_url(endpoint: str) -> str:
    """``http://h:p``, ``http://h:p/``, ``http://h:p/v1`` -> ``http://h:p/v1``."""
    e = endpoint.rstrip("/")
    if not e.startswith(("http://", "https://")):
        raise BackendError(f"endpoint {endpoint!r} is not an http(s) URL")
    return e if e.endswith("/v1") else e + "/v1"


#: The most a provider's reported cost of one call may be (ours): no LLM call costs a thousand dollars; a larger
#: number (1e308 was seen in a review) is a garbled field, and summed it would make every bill infinite.
MAX_CALL_COST = 1000.0


def _cost(x) -> float | None:
    """A provider's reported cost of a call (a number in [0, :data:`MAX_CALL_COST`]), else None: the call counts
    as unpriced, and the cost ledger says how many calls its provider did not bill."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x <= MAX_CALL_COST:
        return None
    return float(x)


def _text_of_content(c, where: str) -> str:
    """A message's content as text: a string, null, or a list of parts whose text parts are joined (some
    servers send ``[{"type": "text", "text": …}]``); anything else is a clear error naming the field."""
    if c is None or isinstance(c, str):
        return c or ""
    if isinstance(c, list) and all(isinstance(p, dict) for p in c):
        return "".join(str(p.get("text") or "") for p in c if p.get("type") in ("text", "output_text", None))
    raise BackendError(f"{where}: content is {type(c).__name__}, neither text nor a list of parts")


class OpenAIBackend:
    name = "openai"

    def __init__(self, endpoint: str, model: str | None = None, *, api_key: str | None = None,
                 api_key_env: str | None = None, server: str = "sglang", logprob_mode: str = "scaled",
                 policy: RetryPolicy = RetryPolicy(), extra_body: dict | None = None,
                 client: ModelClient | None = None, wire: str = "full"):
        if logprob_mode not in ("raw", "scaled"):
            raise ValueError(f"logprob_mode must be 'raw' or 'scaled', got {logprob_mode!r}")
        if wire not in ("full", "release"):
            raise ValueError(f"wire must be 'full' or 'release', got {wire!r}")
        self.wire = wire  # "release": only the fields the authors' release sends (--protocol release)
        self.base = base_url(endpoint)
        self.model = model or ""
        # the credentials this backend sends: redacted from everything written or printed (agent/redact.py)
        register_key_var(api_key_env)
        register_secret(api_key)
        register_url(endpoint)
        if api_key_env and has_credentials(endpoint):
            raise BackendError(f"{public_url(endpoint)}: the URL carries credentials (user:password@) and "
                               f"--api-key-env {api_key_env} names a key: give one of them (the client would send the URL's as "
                               "Basic auth in place of the key)")
        key = api_key or (os.environ.get(api_key_env) if api_key_env else None)
        if api_key_env and not key:
            raise BackendError(f"{api_key_env} is not set in the environment (needed for {public_url(self.base)})")
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.server = server
        # where to ask whether the server is still there when a request gets no reply (agent.http): SGLang's and
        # vLLM's /health (SGLang's answers 503 when its scheduler produced nothing for 20 s), else the model list
        root = self.base.removesuffix("/v1")
        self.liveness = root + "/health" if server in ("sglang", "vllm") else self.base + "/models"
        self.logprob_mode = logprob_mode
        self.policy = policy
        self.extra_body = dict(extra_body or {})
        self._client = client or ModelClient()

    async def resolve_model(self) -> str:
        if not self.model:
            try:
                data = await request_json(self._client, "GET", self.base + "/models", headers=self._headers,
                                          policy=self.policy, what="list models")
            except HTTPError as e:
                raise BackendError(str(e)) from e
            try:
                self.model = data["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                raise BackendError(f"{public_url(self.base)}/models: no model listed ({str(data)[:200]})") from None
        return self.model

    def _payload(self, messages: list[dict], sp: SamplingParams) -> dict:
        if self.wire == "release":  # utils/search_backbone_model.py:116-122: these five fields and nothing else
            body = {"model": self.model, "messages": to_openai_messages(messages, type_by_name=True),
                    "max_completion_tokens": sp.max_tokens,
                    "temperature": sp.temperature, "top_p": sp.top_p}
            if sp.top_logprobs > 0:  # only when the user asked for them (--top-logprobs)
                body.update(logprobs=True, top_logprobs=sp.top_logprobs)
            return body
        body = {
            "model": self.model,
            "messages": to_openai_messages(messages),
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "max_tokens": sp.max_tokens,
        }
        if self.server in ("sglang", "vllm"):
            # the full sampling set, explicitly: an omitted field is filled from the server's defaults (SGLang's
            # chat path: the model's generation_config.json, top_k=20 for Qwen3.5), not the paper's sampling
            body.update(top_k=sp.top_k, min_p=sp.min_p, repetition_penalty=sp.repetition_penalty)
        elif self.server == "openrouter":
            # OpenRouter documents top_k >= 0 (0: off), min_p 0 and repetition_penalty 1 as its defaults: a neutral
            # value is left out rather than sent out of range (our top_k -1 means "off")
            body.update({k: v for k, v, off in (("top_k", sp.top_k, sp.top_k <= 0), ("min_p", sp.min_p, sp.min_p == 0),
                                                ("repetition_penalty", sp.repetition_penalty,
                                                 sp.repetition_penalty == 1.0)) if not off})
        if sp.top_logprobs > 0:  # 0 = plain completion (judges and annotators need no logprobs)
            body["logprobs"] = True
            body["top_logprobs"] = sp.top_logprobs
        if sp.seed is not None:
            body["seed"] = sp.seed  # SGLang honours it only when started with --enable-deterministic-inference
        if sp.stop:
            body["stop"] = list(sp.stop)
        kw = sp.template_kwargs()
        if kw and self.server in ("sglang", "vllm"):
            body["chat_template_kwargs"] = kw
        if self.server == "sglang":
            body["separate_reasoning"] = True
            if sp.top_logprobs > 0:
                body["return_meta_info"] = True
        body.update(self.extra_body)
        return body

    async def generate(self, messages: list[dict], sampling: SamplingParams | None = None) -> ModelOutput:
        sp = sampling or SamplingParams()
        await self.resolve_model()
        body = self._payload(messages, sp)
        t0 = time.perf_counter()

        async def attempt():
            try:
                # SGLang sends its triples beside the OpenAI logprobs: each token's entries twice
                cap = reply_cap(2 * (sp.max_tokens or 0), sp.top_logprobs) if sp.max_tokens else None
                resp = await request_json(self._client, "POST", self.base + "/chat/completions", json_body=body,
                                          headers=routing_headers(self._headers), policy=self.policy,
                                          what="chat completion", liveness=self.liveness, max_bytes=cap)
            except HTTPError as e:
                raise backend_error(e) from e
            return self.parse(resp, sp)

        out = await retry_bad_replies(attempt, f"chat completion @ {public_url(self.base)}")
        out.latency_s = time.perf_counter() - t0
        out.request = {"endpoint": public_url(self.base) + "/chat/completions", "messages": record_messages(messages),
                       **{k: v for k, v in body.items() if k != "messages"}}
        return out

    def parse(self, resp: dict, sp: SamplingParams) -> ModelOutput:
        """A chat-completion body -> :class:`ModelOutput` (public for tests on captured bodies)."""
        where = f"{public_url(self.base)}/chat/completions"
        if isinstance(resp, dict) and (resp.get("object") == "error" or ("error" in resp and "choices" not in resp)):
            # a server error sent with status 200 (some proxies and servers do): asked again like a 5xx
            err = resp.get("error") if isinstance(resp.get("error"), (dict, str)) else resp
            text = err.get("message") if isinstance(err, dict) else err
            raise BadReply(f"{where}: the server answered 200 with an error object: {redact(str(text))[:300]}")
        try:
            choice = resp["choices"][0]
            msg = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{where}: reply has no choices[0].message: {redact(str(resp))[:300]}") from None
        if not isinstance(msg, dict):
            raise BackendError(f"{where}: choices[0].message is {type(msg).__name__}, not an object: "
                               f"{redact(str(msg))[:200]}")
        # as it arrived: unstripped, and null told apart from "" (the release treats them differently)
        content = scrub(_text_of_content(msg.get("content"), f"{where} choices[0].message.content"))
        reasoning = scrub(msg.get("reasoning_content") or msg.get("reasoning") or "")
        meta = choice.get("meta_info") or {}
        if meta.get("output_token_logprobs") is not None:
            tokens = tokens_from_triples(meta["output_token_logprobs"], meta.get("output_top_logprobs"),
                                         where=f"{where} meta_info", k=sp.top_logprobs or None)
            chat = (choice.get("logprobs") or {}).get("content")
            if chat and len(chat) == len(tokens):  # fill texts the triples left null
                tokens.texts = [t or c.get("token", "") for t, c in zip(tokens.texts, chat)]
        elif choice.get("logprobs") and choice["logprobs"].get("content") is not None:
            tokens = tokens_from_chat_logprobs(choice["logprobs"]["content"], where=f"{where} logprobs.content")
        elif sp.top_logprobs == 0 or self.server == "openrouter":
            tokens = TokenArrays.empty()  # OpenRouter: a provider without logprobs answers without them (said)
        else:
            raise BackendError(f"{where}: reply carries no logprobs (does this server support logprobs=true?)")
        # Which tokens are thinking: the generation starts inside <think> (the template pre-fills it) when the
        # server split off reasoning or a </think> token came back; mark_think then applies the qwen3 parser's
        # rules (</think>, else an implicit close at <tool_call>). Logprobs that cover only the answer: none.
        joined = "".join(t.text for t in tokens).strip()
        if any(t.text.strip() == THINK_CLOSE for t in tokens):
            mark_think(tokens, starts_in_think=True)
        elif reasoning and (not content.strip() or joined.startswith(reasoning.strip()[:32])):
            mark_think(tokens, starts_in_think=True)
        elif reasoning and reasoning.strip()[:32] in joined:
            mark_think_by_text(tokens, reasoning)
        else:
            mark_think(tokens, starts_in_think=False)
        u = resp.get("usage") or {}
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or meta.get("cached_tokens")

        def count(name, value, default=0):
            return reported_count(value, name, where, default)
        usage = Usage(prompt_tokens=count("usage.prompt_tokens", u.get("prompt_tokens") or meta.get("prompt_tokens")),
                      completion_tokens=count("usage.completion_tokens", u.get("completion_tokens")
                                              or meta.get("completion_tokens"), len(tokens)),
                      cached_tokens=count("cached_tokens", cached),
                      reasoning_tokens=None if u.get("reasoning_tokens") is None else
                      count("usage.reasoning_tokens", u.get("reasoning_tokens")),
                      cost=_cost(u.get("cost")), provider=resp.get("provider") if isinstance(resp.get("provider"), str) else None)
        return ModelOutput(
            text=content, reasoning=reasoning, tokens=tokens, content_null=msg.get("content") is None,
            finish_reason=finish_reason_of(choice.get("finish_reason")), usage=usage,
            semantics=LogprobSemantics.for_generation(self.logprob_mode, sp.temperature),
            backend=f"{self.name}:{self.server}", model=resp.get("model") or self.model, response=resp,
            top_k_requested=sp.top_logprobs,
        )

    async def score(self, messages: list[dict], continuation: Continuation, *, top_logprobs: int = DEFAULT_TOP_LOGPROBS,
                    enable_thinking: bool | None = True, temperature: float | None = None) -> ScoredTokens:
        raise BackendError("teacher-forced scoring is not available over the chat API; use --backend sglang "
                           "(native /generate with --model-dir) or --backend local")

    async def aclose(self) -> None:
        await self._client.aclose()
