"""SGLang native ``/generate`` backend: generation and teacher-forced scoring with token ids.

    b = SGLangBackend("http://localhost:30000", model_dir="/models/Qwen3.5-27B", logprob_mode="scaled")
    out = await b.generate(messages)                          # return_logprob, top_logprobs_num=20
    sc  = await b.score(messages, Continuation(ids=...))      # max_new_tokens=0, input top logprobs

The prompt is rendered here with the model's own chat template from the local model directory
(only the tokenizer files are needed) and sent as token ids, tokenised here one message piece at a time
(``prompt_pieces``; the run records them, agent/backends/pieces.py); images go in ``image_data`` as data URIs.
Wire format: each logprob is ``[logprob, token_id, text_or_null]``; ``input_token_logprobs[0]`` is
``[null, id, …]`` and ``input_top_logprobs[0]`` is ``null``. Every request carries the full sampling
set (temperature, top_p, top_k -1, min_p 0, repetition_penalty 1), so no server-side default
(``--preferred-sampling-params``, the model's generation config) changes what is sampled.

Scoring (``max_new_tokens: 0``, prompt logprobs):

- **without images** the request is token ids: ``input_ids = prompt_ids + continuation_ids`` with
  ``logprob_start_len = len(prompt_ids) - 1``: nothing is re-tokenised, so a continuation whose first
  token would merge with the prompt's last (``\n`` after the ``<think>\n`` pre-fill) scores exactly;
- **with images** the request is token ids too, with ``image_data`` (SGLang 0.5.23's TokenizerManager expands
  each image placeholder itself), and ``logprob_start_len`` is the *expanded* prompt length - 1, computed here
  from the processor's resize rule (each image placeholder becomes ``prod(image_grid_thw) / merge_size²``
  tokens), so the server returns logprobs for the continuation only, not for thousands of image tokens.

Either way the last len(continuation) entries are taken and their **token ids verified** against the
continuation; a mismatch is an error, never a silently wrong number.

Token texts are not requested (``return_text_in_logprobs`` would double the reply); they are decoded
here from the ids with the same tokenizer, the chosen tokens at once, the alternatives only when
something reads them.
"""
from __future__ import annotations

import logging
import time
from operator import itemgetter

import numpy as np

from ..http import HTTPError, RetryPolicy, reply_cap, request_json
from ..jsonio import scrub
from ..model_http import ModelClient
from ..redact import public_url, redact, register_url
from .base import (
    DEFAULT_TOP_LOGPROBS,
    BackendError,
    BadReply,
    Continuation,
    LogprobSemantics,
    ModelOutput,
    SamplingParams,
    ScoredTokens,
    Usage,
    backend_error,
    reported_count,
    retry_bad_replies,
    routing_headers,
)
from .hub import resolve_model_dir
from .messages import record_messages, split_text_and_images
from .prompt_tokens import JsonIds, PromptTokens
from .think import THINK_OPEN, mark_think, split_think
from .wire import (
    arrays_from_flat,
    check_values,
    decode_generate_reply,
    finish_reason_of,
    flat_top_arrays,
    tokens_from_triples,
)

log = logging.getLogger(__name__)

__all__ = ["SGLangBackend"]

_TRAILING_SPECIALS = ("<|im_end|>", "<|endoftext|>")
_second = itemgetter(1)


def check_expansion(meta: dict, expected: int, where: str) -> None:
    """A scored prompt with images must be as long as the model's processor expands it (each placeholder becomes
    ``prod(image_grid_thw) / merge_size²`` tokens): SGLang #39831 reduced images to one token while the server still
    reported image support; a shorter prompt scores text that never saw the images, refused."""
    got = meta.get("prompt_tokens")
    if not isinstance(got, int) or isinstance(got, bool) or got != expected:
        raise BackendError(f"{where} meta_info.prompt_tokens: the server's prompt is {got} tokens where the model's "
                           f"processor expands this prompt and its images to {expected}: the images did not arrive as "
                           "the model sees them (reduced or dropped); refusing the score")


def _without_logprobs(resp: dict) -> dict:
    """The reply as kept beside the parsed tokens: its meta fields without the logprob lists (those live on as
    arrays): the lists would hold ~100k small objects per reply alive, twice, for as long as the reply is kept."""
    meta = {k: v for k, v in resp["meta_info"].items() if not (k.endswith("_logprobs") or "_top_logprobs_" in k)}
    return {**{k: v for k, v in resp.items() if k != "meta_info"}, "meta_info": meta}


#: The request fields for SGLang's flat top-logprob arrays, base64 (prompt side; SGLang 0.5.23's GenerateReqInput).
FLAT_REQUEST = {"return_flat_raw_top_logprobs": True, "return_flat_raw_top_logprobs_b64": True}


def _refuses_flat(e: Exception) -> bool:
    """A 4xx whose message names the flat format's fields: the server does not take them."""
    m = str(e)
    return "flat_raw" in m and ("answered HTTP 400" in m or "answered HTTP 422" in m)


def _entries_match_output(tokens, resp: dict, where: str) -> None:
    """One logprob entry per generated token, each naming that token (F1, F3): the reply's ``output_ids`` (or, where
    a server leaves them out, its ``completion_tokens``) against the entries; anything else is refused."""
    out_ids = resp.get("output_ids")
    n = len(tokens)
    if isinstance(out_ids, list) and out_ids:
        if n != len(out_ids):
            raise BadReply(f"{where}: {n} logprob entries for {len(out_ids)} output tokens; refusing the reply")
        got = np.asarray(tokens.ids, dtype=np.int64)
        want = np.asarray(out_ids, dtype=np.int64)
        if not np.array_equal(got, want):
            i = int(np.argmax(got != want))
            raise BadReply(f"{where}: the logprob entry at position {i} names token {int(got[i])} but the output token "
                           f"there is {int(want[i])}; refusing the reply")
        return
    meta_n = (resp.get("meta_info") or {}).get("completion_tokens")
    if type(meta_n) is int and meta_n > 0 and n != meta_n:
        raise BadReply(f"{where}: {n} logprob entries for {meta_n} completion tokens; refusing the reply")


def _same_ids(tail: list, ids: list) -> bool:
    """Whether the reply's scored positions carry exactly the recorded ids (``[logprob, id, text]`` triples): the
    ids taken and compared by C-level iteration in the common case (ours: the Python comprehension cost more a
    1,000-token reply); a malformed triple takes the element-wise path. Same equality as before (Python's ==)."""
    try:
        return list(map(_second, tail)) == ids
    except (TypeError, IndexError, KeyError):
        return [t[1] if isinstance(t, (list, tuple)) and len(t) > 1 else None for t in tail] == ids


class SGLangBackend(PromptTokens):
    name = "sglang"

    def __init__(self, endpoint: str, model_dir: str, *, model: str | None = None, logprob_mode: str = "scaled",
                 policy: RetryPolicy = RetryPolicy(), client: ModelClient | None = None, renderer=None,
                 flat_logprobs: bool = True):
        if logprob_mode not in ("raw", "scaled"):
            raise ValueError(f"logprob_mode must be 'raw' or 'scaled', got {logprob_mode!r}")
        if not str(endpoint).startswith(("http://", "https://")):
            raise BackendError(f"endpoint {endpoint!r} is not an http(s) URL")
        self.url = endpoint.rstrip("/").removesuffix("/v1") + "/generate"
        self.public = public_url(self.url)  # what records and messages may name (no credentials)
        register_url(endpoint)  # a password in the URL is sent (Basic auth): never written or printed
        name = str(model_dir).rstrip("/").split("/")[-1]  # "Qwen3.5-27B" for a path or a hub id
        if renderer is None:
            model_dir = str(resolve_model_dir(model_dir))  # a directory, or a hub id in the local HF cache
        self.setup_prompt_tokens(model_dir, renderer)
        self.model = model or name
        self.model_arg = model   # the served name the user asked for (None: whatever the server serves)
        self.model_dir_name = name
        self.logprob_mode = logprob_mode
        self.policy = policy
        self._client = client or ModelClient()
        # scoring asks for SGLang's flat base64 top-logprob arrays (ours; wire.flat_top_arrays): ~0.25 MB instead of
        # ~0.65 MB of nested triples a 1,000-token reply, and no Python object per alternative. A server that
        # ignores the request answers with the nested lists, which parse as before; one that refuses it turns it off.
        self.flat_logprobs = bool(flat_logprobs)

    def render(self, messages: list[dict], template_kwargs: dict | None = None) -> tuple[str, list]:
        hf, images = split_text_and_images(messages)
        text = self.tok.apply_chat_template(hf, add_generation_prompt=True, tokenize=False, **(template_kwargs or {}))
        return text, images

    async def _post(self, payload: dict, what: str, positions: int) -> dict:
        """One ``/generate`` request whose reply holds logprobs for ``positions`` tokens (its size is capped by them)."""
        try:
            resp = await request_json(self._client, "POST", self.url, json_body=payload, policy=self.policy, what=what,
                                      decode=decode_generate_reply, headers=routing_headers(),
                                      liveness=self.url.removesuffix("/generate") + "/health",
                                      max_bytes=reply_cap(positions, int(payload.get("top_logprobs_num") or 0)))
        except HTTPError as e:
            raise backend_error(e) from e
        if isinstance(resp, dict) and not isinstance(resp.get("meta_info"), dict) and (
                resp.get("object") == "error" or "error" in resp):
            # an SGLang error object sent with status 200: asked again like a 5xx (bounded), then named (F5)
            err = resp.get("error") if isinstance(resp.get("error"), (dict, str)) else resp
            text = err.get("message") if isinstance(err, dict) else err
            raise BadReply(f"{what}: {self.public} answered 200 with an error object: {redact(str(text))[:300]}")
        if not isinstance(resp, dict) or not isinstance(resp.get("meta_info"), dict):
            raise BackendError(f"{what}: {self.public} reply has no meta_info: {redact(str(resp))[:300]}")
        return resp

    def generate_payload(self, messages: list[dict], sp: SamplingParams) -> tuple[dict, str, list]:
        """(the /generate body, the rendered prompt, the images) for a generation."""
        payload, prompt, images, _ = self._generate_request(messages, sp)
        return payload, prompt, images

    def _generate_request(self, messages: list[dict], sp: SamplingParams):
        prompt, images = self.render(messages, sp.template_kwargs())
        params = {**sp.server_params(), "skip_special_tokens": False}
        if sp.seed is not None:
            params["sampling_seed"] = sp.seed  # only honoured by a server started with --enable-deterministic-inference
        # token ids, as scoring sends them (SGLang 0.5.23's TokenizerManager expands each image placeholder in them
        # itself; tests/conformance): what the model is sent is exactly what the run records (ModelOutput.prompt_pieces)
        hits = self.piece_hits(prompt)
        pieces = [(d, ids) for d, ids, _ in hits]
        ids_json = JsonIds([ids for _, ids, _ in hits], [n for *_, n in hits])  # written as sent
        payload = {"input_ids": ids_json, "sampling_params": params, "return_logprob": True,
                   "top_logprobs_num": sp.top_logprobs}
        if images:
            payload["image_data"] = [im.sent_data_uri() for im in images]  # written as sent (agent/http.py)
        return payload, prompt, images, pieces

    async def generate(self, messages: list[dict], sampling: SamplingParams | None = None) -> ModelOutput:
        sp = sampling or SamplingParams()
        payload, prompt, images, pieces = self._generate_request(messages, sp)
        t0 = time.perf_counter()

        async def attempt():
            return self.parse_generate(await self._post(payload, "generate", sp.max_tokens or 0), sp, prompt)

        out = await retry_bad_replies(attempt, f"generate @ {self.public}")
        out.latency_s = time.perf_counter() - t0
        out.request = {"endpoint": self.public, "messages": record_messages(messages), "prompt_text": prompt,
                       "image_sha256": [im.sha256 for im in images],
                       **{k: v for k, v in payload.items() if k not in ("input_ids", "image_data")}}
        if self.fingerprint:  # the run records them (agent/trajectory.py), the probes send them again
            out.prompt_pieces = (self.fingerprint, pieces)
        return out

    def parse_generate(self, resp: dict, sp: SamplingParams, prompt: str) -> ModelOutput:
        meta = resp["meta_info"]
        tokens = tokens_from_triples(meta.get("output_token_logprobs"), meta.get("output_top_logprobs"),
                                     decode=self._decode, decode_many=self._decode_many,
                                     where=f"{self.public} meta_info.output", k=sp.top_logprobs or None,
                                     vocab=self.vocab)
        _entries_match_output(tokens, resp, f"{self.public} meta_info.output")
        starts = prompt.rstrip().endswith(THINK_OPEN)
        mark_think(tokens, starts)
        text = scrub(resp.get("text") or "")
        for s in _TRAILING_SPECIALS:
            text = text.removesuffix(s)
        reasoning, answer = split_think(text, starts)
        return ModelOutput(
            text=answer, reasoning=reasoning, tokens=tokens, finish_reason=finish_reason_of(meta.get("finish_reason")),
            usage=Usage(prompt_tokens=reported_count(meta.get("prompt_tokens"), "meta_info.prompt_tokens", self.public),
                        completion_tokens=reported_count(meta.get("completion_tokens"), "meta_info.completion_tokens",
                                                         self.public, len(tokens)),
                        cached_tokens=reported_count(meta.get("cached_tokens"), "meta_info.cached_tokens", self.public),
                        reasoning_tokens=None if meta.get("reasoning_tokens") is None else reported_count(
                            meta.get("reasoning_tokens"), "meta_info.reasoning_tokens", self.public)),
            semantics=LogprobSemantics.for_generation(self.logprob_mode, sp.temperature),
            backend=self.name, model=self.model, response=_without_logprobs(resp), top_k_requested=sp.top_logprobs,
        )

    def score_payload(self, messages: list[dict], continuation: Continuation, *, top_logprobs: int = DEFAULT_TOP_LOGPROBS,
                      enable_thinking: bool | None = True) -> tuple[dict, list[int], str, list]:
        """(the /generate body, the continuation ids, the prompt, the images) for teacher-forced scoring."""
        kw = {"enable_thinking": enable_thinking} if enable_thinking is not None else {}
        prompt, images = self.render(messages, kw)
        ids = list(continuation.ids) if continuation.ids else self.tok(continuation.text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise BackendError("empty continuation: nothing to score")
        # scoring samples nothing: greedy, the neutral set spelled out so no server default applies
        params = {"max_new_tokens": 0, "temperature": 0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                  "repetition_penalty": 1.0}
        common = {"sampling_params": params, "return_logprob": True, "top_logprobs_num": int(top_logprobs)}
        if self.flat_logprobs and int(top_logprobs) > 0:
            common.update(FLAT_REQUEST)
        input_ids = self.prompt_json(prompt, then=ids)  # written as sent: no joined array or text held
        n_prompt = len(input_ids) - len(ids)
        if not images:
            return ({"input_ids": input_ids, "logprob_start_len": max(n_prompt - 1, 0), **common},
                    ids, prompt, images)
        # token ids with the images too: SGLang 0.5.23's TokenizerManager takes input_ids together with image_data
        # and expands each image placeholder itself (checked against its real front end, tests/conformance/
        # test_sglang_frontend.py), so nothing is re-tokenised and "\n" after the <think>\n pre-fill cannot merge.
        # logprob_start_len indexes the *expanded* prompt: the processor's image_grid_thw says how long it is.
        start = self.expanded_prompt_len(n_prompt, images) - 1
        return ({"input_ids": input_ids, "image_data": [im.sent_data_uri() for im in images],
                 "logprob_start_len": max(start, 0), **common}, ids, prompt, images)

    async def score(self, messages: list[dict], continuation: Continuation, *, top_logprobs: int = DEFAULT_TOP_LOGPROBS,
                    enable_thinking: bool | None = True, temperature: float | None = None) -> ScoredTokens:
        if temperature:
            raise BackendError("SGLang's prompt (input) logprobs are raw; scaled scoring is not available")
        payload, ids, prompt, images = self.score_payload(messages, continuation, top_logprobs=top_logprobs,
                                                          enable_thinking=enable_thinking)
        starts_in_think = prompt.rstrip().endswith(THINK_OPEN)
        del prompt  # not held while the request is in flight (~75 KB a paper-shaped prompt)
        box = {}

        async def attempt():
            try:
                box["resp"] = resp = await self._post(payload, "score", len(ids) + 1)
            except BackendError as e:
                if images and "logprob_start_len" in str(e) and "higher than the number of input tokens" in str(e):
                    # the server's prompt is shorter than the processor's expansion puts the continuation after
                    raise BackendError(f"score: {self.public}: the server's prompt is shorter than the model's processor "
                                       "expands this prompt and its images to: the images did not arrive as the model "
                                       f"sees them (reduced or dropped; the server said: {str(e)[-160:]}); refusing "
                                       "the score") from None
                if not (payload.get("return_flat_raw_top_logprobs") and _refuses_flat(e)):
                    raise
                # a server that refuses the flat format (a version without it, strict about fields): nested from now
                # (said once: requests already in flight were built with the fields and come back here too)
                if self.flat_logprobs:
                    log.info(f"{self.public}: the server refused SGLang's flat top-logprob format ({str(e)[:200]}); "
                             "scoring with the nested lists instead")
                self.flat_logprobs = False
                for key in FLAT_REQUEST:
                    payload.pop(key, None)
                box["resp"] = resp = await self._post(payload, "score", len(ids) + 1)
            box["wire"] = "flat" if "input_top_logprobs_shape" in resp["meta_info"] else "nested"
            if images:
                check_expansion(resp["meta_info"], payload["logprob_start_len"] + 1 + len(ids), self.public)
            return self.parse_score(resp, ids, k=int(top_logprobs) or None)

        tokens = await retry_bad_replies(attempt, f"score @ {self.public}")
        resp = box["resp"]
        mark_think(tokens, starts_in_think)
        # what was asked, as the probes report it (the messages are the caller's: not copied for each scoring)
        return ScoredTokens(tokens=tokens, semantics=LogprobSemantics("raw"), backend=self.name, model=self.model,
                            request={"endpoint": self.public, "continuation_ids": ids,
                                     "image_sha256": [im.sha256 for im in images], "by": "ids",
                                     "logprob_start_len": payload["logprob_start_len"],
                                     "top_logprobs_wire": box.get("wire", "nested")},
                            response=_without_logprobs(resp), top_k_requested=int(top_logprobs))

    def parse_score(self, resp: dict, ids: list[int], k: int | None = None):
        meta = resp["meta_info"]
        entries, tops = meta.get("input_token_logprobs"), meta.get("input_top_logprobs")
        where = f"{self.public} meta_info.input"
        if not isinstance(entries, list) or len(entries) < len(ids):
            got = len(entries) if isinstance(entries, list) else "no"
            raise BackendError(f"{where}: {got} input logprobs for a {len(ids)}-token continuation")
        n = len(ids)
        tail = entries[-n:]
        flat = flat_top_arrays(meta, "input", where)
        tail_tops = tops[-n:] if flat is None and isinstance(tops, list) and len(tops) >= n else None
        if not _same_ids(tail, list(ids)):
            got_ids = [t[1] if isinstance(t, (list, tuple)) and len(t) > 1 else None for t in tail]
            first = next(i for i, (a, b) in enumerate(zip(got_ids, ids)) if a != b)
            raise BackendError(
                f"{where}: token ids drifted when the server re-tokenised prompt+continuation "
                f"(first mismatch at continuation token {first}: server {got_ids[first]} vs recorded {ids[first]}); "
                "refusing to report logprobs of different tokens")
        if tail[0][0] is None:
            raise BackendError(f"{where}: the first continuation token has no logprob (logprob_start_len too late)")
        if flat is not None:
            val, idx, null_prefix = flat
            if null_prefix + len(val) != len(entries):
                raise BackendError(f"{where}: flat top logprobs cover {null_prefix} + {len(val)} positions but there are "
                                   f"{len(entries)} token logprobs; refusing the reply")
            if len(val) < n:
                raise BackendError(f"{where}: the first {n - len(val)} continuation tokens have no top logprobs "
                                   "(logprob_start_len too late)")
            arrays = arrays_from_flat(tail, val[len(val) - n:], idx[len(val) - n:], decode=self._decode,
                                      decode_many=self._decode_many)
            return check_values(arrays, where, k=k, vocab=self.vocab)
        return tokens_from_triples(tail, tail_tops, decode=self._decode, decode_many=self._decode_many, where=where,
                                   k=k, vocab=self.vocab)

    async def served_weights(self, policy: RetryPolicy | None = None) -> str | None:
        """The weights the server serves now: ``/model_info``'s ``model_path`` (SGLang >= 0.5.2x; the deprecated
        ``/get_model_info`` logs on every call there but is all older servers have). The preflight records them;
        the runner asks again after each trajectory whether they are still the run's (F6: SGLang's native replies
        do not name the model)."""
        root = self.url.removesuffix("/generate")
        for path in ("/model_info", "/get_model_info"):
            try:
                info = await request_json(self._client, "GET", root + path, policy=policy or self.policy,
                                          what="model info")
            except HTTPError as e:
                if getattr(e, "status", None) == 404:
                    continue
                raise BackendError(str(e)) from e
            return info.get("model_path") if isinstance(info, dict) else None
        return None

    async def flush_cache(self) -> None:
        """SGLang's ``/flush_cache``: empty the server's prefix (radix) cache, so the next request takes the
        uncached path (probes/fidelity/ compares the two)."""
        url = self.url.removesuffix("/generate") + "/flush_cache"
        try:
            await request_json(self._client, "POST", url, policy=self.policy, what="flush_cache", parse=False)
        except HTTPError as e:
            raise BackendError(str(e)) from e

    async def aclose(self) -> None:
        await self._client.aclose()
