"""vLLM's OpenAI-compatible server: generation over ``/v1/chat/completions``, teacher-forced scoring over
``/v1/completions`` with the prompt's token ids.

    b = VLLMBackend("http://localhost:8000", model_dir="/models/Qwen3.5-27B")
    out = await b.generate(messages)                          # the chat API (images as data URIs), top-20 logprobs
    sc  = await b.score(messages, Continuation(ids=...))      # prompt_logprobs=20 over prompt + continuation

Scoring renders the prompt here with the model's own chat template (as :class:`SGLangBackend` does), sends
``prompt = prompt_ids + continuation_ids`` with ``max_tokens: 1`` and ``prompt_logprobs: k``, and takes the last
len(continuation) positions of ``choices[0].prompt_logprobs`` (vLLM 0.33.0 ``CompletionResponseChoice``: one entry
a prompt position, ``null`` at the first; each a map of token id to ``{logprob, rank, decoded_token}`` holding the
position's own token and the top k, so k or k + 1 entries). The position's own token must be in its map (its id
is the continuation's: nothing is re-tokenised); the alternatives are those of rank <= k.

What vLLM's prompt logprobs are (vllm/v1/worker/gpu_model_runner.py, the prompt-logprob pass): log_softmax of the
logits, no temperature, under every ``--logprobs-mode`` but the two logit modes, which return logits (positive
values: refused here as impossible logprobs). Its output logprobs under the default ``raw_logprobs`` are raw too, so
a run through vLLM records ``--logprob-mode raw``; ``processed_logprobs`` are after temperature *and* top-k / top-p
filtering, not the toolkit's "scaled", and are refused (:func:`check_logprobs_mode`).

**With images** the completions API cannot serve (``CompletionRequest.prompt``: text or token ids, no images), so a
scored prompt with images goes to vLLM's token-in route, ``POST /inference/v1/generate`` (vllm/entrypoints/scale_out/
token_in_token_out, vLLM 0.32.0 and 0.33.0; served with ``--enable-scale-out``): the same ``prompt_ids +
continuation_ids`` as ``token_ids``, the images as ``content_parts`` in order, ``sampling_params`` as vLLM's own
``SamplingParams`` fields. The server's processor expands each image placeholder in the ids itself and returns
``prompt_logprobs`` over the expanded prompt and its ``prompt_token_ids`` (``return_token_ids``). Nothing is tokenised
again: the last len(continuation) ids must be the continuation's, and the expanded prompt must be exactly as long as
the processor's resize rule says (each placeholder becomes ``prod(image_grid_thw) / merge_size²`` tokens,
:meth:`PromptTokens.expanded_prompt_len`): a shorter prompt means images that did not arrive whole (SGLang #39831:
images silently reduced to one token), refused. A request with ``prompt_logprobs`` skips vLLM's prefix cache
(sampling_params.py, ``skip_reading_prefix_cache``): every scoring request pays its whole prefill.

Generation asks for the generated tokens' ids (``return_token_ids``): a reply without them, or whose ids do not
spell the tokens its logprobs name (each id decoded alone is the entry's ``token``, as vLLM writes it,
vllm/tokenizers/detokenizer_utils.py ``convert_ids_list_to_tokens``; a token inside a multi-byte character is
written with its neighbours' bytes and not compared alone), is refused, never recorded.
"""
from __future__ import annotations

import time

import numpy as np

from ..http import HTTPError, RetryPolicy, reply_cap, request_json
from ..model_http import ModelClient
from ..redact import public_url, redact
from .base import (
    DEFAULT_TOP_LOGPROBS,
    BackendError,
    BadReply,
    Continuation,
    LogprobSemantics,
    ScoredTokens,
    backend_error,
    retry_bad_replies,
    routing_headers,
)
from .hub import resolve_model_dir
from .messages import split_text_and_images
from .openai_compat import OpenAIBackend
from .prompt_tokens import PromptTokens
from .think import THINK_OPEN, mark_think
from .wire import tokens_from_triples

__all__ = ["VLLMBackend", "check_logprobs_mode", "LOGPROBS_MODE", "TOKEN_ROUTE"]

#: vLLM's token-in route (served with ``--enable-scale-out``): token ids and images in, prompt logprobs out.
TOKEN_ROUTE = "/inference/v1/generate"

#: The ``--logprobs-mode`` the launcher starts vLLM with (its default, said explicitly): output logprobs are
#: log_softmax(logits) before temperature, the toolkit's "raw"; prompt logprobs are the same in this mode.
LOGPROBS_MODE = "raw_logprobs"


def check_logprobs_mode(mode: str | None) -> None:
    """Refuse a vLLM ``--logprobs-mode`` whose numbers the toolkit cannot label: the logit modes return logits,
    ``processed_logprobs`` are temperature-scaled and top-k / top-p filtered (neither raw nor our "scaled")."""
    if mode not in (None, LOGPROBS_MODE):
        raise BackendError(f"vLLM --logprobs-mode {mode}: its logprobs are not log_softmax(logits) (the logit modes "
                           "return logits; processed_logprobs are scaled and top-p filtered); serve with "
                           f"--logprobs-mode {LOGPROBS_MODE} (serving/launch_qwen35.sh --engine vllm does)")


class VLLMBackend(PromptTokens, OpenAIBackend):
    name = "vllm"

    def __init__(self, endpoint: str, model_dir: str, *, model: str | None = None, logprob_mode: str = "raw",
                 policy: RetryPolicy = RetryPolicy(), client: ModelClient | None = None, api_key_env: str | None = None,
                 renderer=None):
        if logprob_mode != "raw":
            raise BackendError(f"--logprob-mode {logprob_mode}: vLLM's logprobs are raw (log_softmax of the logits, "
                               f"--logprobs-mode {LOGPROBS_MODE}); run with --logprob-mode raw")
        super().__init__(endpoint, model, server="vllm", logprob_mode="raw", policy=policy, client=client,
                         api_key_env=api_key_env)
        self.model_dir_name = str(model_dir).rstrip("/").split("/")[-1]  # what the served weights' name must be
        if renderer is None:
            model_dir = str(resolve_model_dir(model_dir))
        self.setup_prompt_tokens(model_dir, renderer)

    def _payload(self, messages: list[dict], sp) -> dict:
        body = super()._payload(messages, sp)
        if sp.top_logprobs > 0:  # the generated tokens' ids (choices[0].token_ids): recorded, and scored back
            body["return_token_ids"] = True
        return body

    def parse(self, resp: dict, sp):
        out = super().parse(resp, sp)
        if sp.top_logprobs > 0:
            out.tokens.ids = self._generated_ids(resp, out.tokens.texts)
        return out

    def _generated_ids(self, resp: dict, texts: list) -> np.ndarray:
        """The generated tokens' ids (``choices[0].token_ids``), each of which must decode to the text its logprob
        entry names; otherwise the reply is refused (the record would name tokens the model did not write)."""
        where = f"{public_url(self.base)}/chat/completions choices[0].token_ids"
        got = (resp.get("choices") or [{}])[0].get("token_ids")
        if not isinstance(got, list):
            raise BackendError(f"{where}: missing (the request asks for them with return_token_ids; vLLM >= 0.10 "
                               "answers it): the generated tokens cannot be recorded by id, nor scored back")
        if len(got) != len(texts) or not all(type(i) is int and 0 <= i < (self.vocab or 1 << 31) for i in got):
            raise BadReply(f"{where}: {len(got)} ids for {len(texts)} tokens with logprobs, or an id outside the "
                           f"vocabulary of {self.vocab}; refusing the reply")
        # a token that is part of a character (its own decoding ends in U+FFFD) is written by vLLM with the bytes
        # before it (vllm/v1/engine/logprobs.py, _correct_decoded_token): only the others are compared one by one
        wrong = next((j for j, (i, t) in enumerate(zip(got, texts))
                      if self._decode(i) != t and "\ufffd" not in self._decode(i)), None)
        if wrong is not None:
            raise BackendError(f"{where}[{wrong}]: id {got[wrong]} is {self._decode(got[wrong])!r} in {self.model_dir}'s "
                               f"tokenizer but the server's logprobs name {texts[wrong]!r}: the ids do not spell the reply "
                               "(another tokenizer?); refusing to record them")
        return np.asarray(got, dtype=np.int64)

    def _continuation_ids(self, continuation: Continuation) -> list[int]:
        ids = list(continuation.ids) if continuation.ids else self.tok(continuation.text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise BackendError("empty continuation: nothing to score")
        return ids

    def score_payload(self, messages: list[dict], continuation: Continuation, *, top_logprobs: int = DEFAULT_TOP_LOGPROBS,
                      enable_thinking: bool | None = True) -> tuple[dict, list[int], str, list, int]:
        """(the request body, the continuation ids, the prompt, the images, the expanded prompt's length) for
        teacher-forced scoring: ``/v1/completions`` without images, :data:`TOKEN_ROUTE` with them (see the module)."""
        hf, images = split_text_and_images(messages)
        kw = {"enable_thinking": enable_thinking} if enable_thinking is not None else {}
        prompt = self.tok.apply_chat_template(hf, add_generation_prompt=True, tokenize=False, **kw)
        ids = self._continuation_ids(continuation)
        token_ids = self.prompt_json(prompt, then=ids)  # written as sent: no joined array or text held
        # scoring samples nothing that is kept: one greedy token, the neutral set spelled out (no server default)
        sampling = {"max_tokens": 1, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                    "repetition_penalty": 1.0, "prompt_logprobs": int(top_logprobs)}
        expected = self.expanded_prompt_len(len(token_ids) - len(ids), images) + len(ids)
        if not images:
            body = {"model": self.model, "prompt": token_ids, **sampling, "add_special_tokens": False}
        else:
            body = {"model": self.model, "token_ids": token_ids, "return_token_ids": True,
                    "content_parts": [{"type": "image_url", "url": im.sent_data_uri()} for im in images],
                    "sampling_params": sampling}
        return body, ids, prompt, images, expected

    async def score(self, messages: list[dict], continuation: Continuation, *, top_logprobs: int = DEFAULT_TOP_LOGPROBS,
                    enable_thinking: bool | None = True, temperature: float | None = None) -> ScoredTokens:
        if temperature:
            raise BackendError("vLLM's prompt logprobs are raw (log_softmax of the logits); scaled scoring is not available")
        await self.resolve_model()
        body, ids, prompt, images, expected = self.score_payload(messages, continuation, top_logprobs=top_logprobs,
                                                                 enable_thinking=enable_thinking)
        url = self.base.removesuffix("/v1") + TOKEN_ROUTE if images else self.base + "/completions"
        box: dict = {}
        t0 = time.perf_counter()

        async def attempt():
            try:
                box["resp"] = resp = await request_json(self._client, "POST", url, json_body=body,
                                                        headers=routing_headers(self._headers), policy=self.policy,
                                                        what="score", liveness=self.liveness,
                                                        max_bytes=reply_cap(expected, int(top_logprobs)))
            except HTTPError as e:
                if images and ("enable-scale-out" in str(e) or getattr(e, "status", None) == 404):
                    raise BackendError(f"{public_url(url)}: this vLLM server does not serve its token-in route, which "
                                       "scoring a prompt with images uses: start it with --enable-scale-out "
                                       "(serving/launch_qwen35.sh --engine vllm does)") from None
                raise backend_error(e) from e
            return self.parse_score(resp, ids, k=int(top_logprobs) or None, expected_len=expected)

        tokens = await retry_bad_replies(attempt, f"score @ {public_url(url)}")
        mark_think(tokens, prompt.rstrip().endswith(THINK_OPEN))
        resp = box["resp"]
        heavy = ("prompt_logprobs", "prompt_token_ids")
        kept = {**{k: v for k, v in resp.items() if k not in heavy},
                "choices": [{k: v for k, v in c.items() if k not in heavy} for c in resp.get("choices") or []]}
        return ScoredTokens(tokens=tokens, semantics=LogprobSemantics("raw"), backend=self.name, model=self.model,
                            request={"endpoint": public_url(url), "continuation_ids": ids, "image_sha256": [im.sha256 for im in images],
                                     "by": "ids", "prompt_tokens": expected,
                                     "prompt_logprobs": int(top_logprobs), "latency_s": time.perf_counter() - t0},
                            response=kept, top_k_requested=int(top_logprobs))

    def parse_score(self, resp: dict, ids: list[int], k: int | None = None, expected_len: int | None = None):
        """The continuation's tokens from a scoring reply (see the module): ``/v1/completions`` keeps them in
        ``choices[0]``, the token-in route at the top. ``k``: alternatives asked; ``expected_len``: the whole
        prompt's length after the images' expansion, which the server's own count must equal."""
        token_route = isinstance(resp, dict) and "choices" in resp and "prompt_logprobs" in resp
        where = f"{public_url(self.base)}{TOKEN_ROUTE + ' prompt_logprobs' if token_route else '/completions choices[0].prompt_logprobs'}"
        if isinstance(resp, dict) and (resp.get("object") == "error" or ("error" in resp and "choices" not in resp)):
            raise BadReply(f"{where}: the server answered 200 with an error object: {redact(str(resp))[:300]}")
        try:
            holder = resp if token_route else resp["choices"][0]
            entries = holder["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{where}: the reply has no prompt logprobs: {redact(str(resp))[:300]}") from None
        n = len(ids)
        if not isinstance(entries, list) or len(entries) < n + 1:
            got = len(entries) if isinstance(entries, list) else "no"
            raise BackendError(f"{where}: {got} prompt positions for a {n}-token continuation after a prompt")
        sent = holder.get("prompt_token_ids")
        if token_route and not isinstance(sent, list):
            raise BackendError(f"{where}: no prompt_token_ids (return_token_ids): the scored tokens cannot be checked")
        if isinstance(sent, list) and sent[-n:] != list(ids):
            raise BackendError(f"{where}: the server's prompt does not end with the continuation's ids; refusing to "
                               "report logprobs of other tokens")
        if expected_len is not None and len(entries) != expected_len:
            raise BackendError(f"{where}: the server's prompt is {len(entries)} tokens where the model's processor "
                               f"expands this prompt and its images to {expected_len}: the images did not arrive as the "
                               "model sees them (reduced or dropped); refusing the score")
        chosen, tops = [], []
        for j, (tid, d) in enumerate(zip(ids, entries[-n:])):
            if not isinstance(d, dict) or str(tid) not in d or not isinstance(d[str(tid)], dict):
                raise BackendError(f"{where}[{len(entries) - n + j}]: no logprob for the continuation's token {tid} "
                                   "(the server scored other tokens); refusing the reply")
            chosen.append([d[str(tid)].get("logprob"), int(tid), None])
            alts = sorted(((v.get("rank") or 0, v.get("logprob"), key) for key, v in d.items() if isinstance(v, dict)),
                          key=lambda r: r[0] if isinstance(r[0], (int, float)) else 0)
            try:
                tops.append([[lp, int(key), None] for rank, lp, key in alts if k is None or 1 <= rank <= k])
            except (ValueError, TypeError):
                raise BadReply(f"{where}[{len(entries) - n + j}]: a token id or rank that is not a number") from None
        return tokens_from_triples(chosen, tops, decode=self._decode, decode_many=self._decode_many, where=where,
                                   k=k, vocab=self.vocab)

    async def served_weights(self, policy: RetryPolicy | None = None) -> str | None:
        """vLLM's ``/v1/models`` names the served model's ``root`` (its path or hub id)."""
        try:
            data = await request_json(self._client, "GET", self.base + "/models", headers=self._headers,
                                      policy=policy or self.policy, what="list models")
        except HTTPError as e:
            raise BackendError(str(e)) from e
        for m in (data or {}).get("data") or []:
            if isinstance(m, dict) and m.get("id") == self.model:
                return m.get("root")
        return None
