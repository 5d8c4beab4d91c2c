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

**With images** the completions API cannot serve (0.33.0 ``CompletionRequest.prompt``: text or token ids, no
images), and the chat API renders a final assistant message through the template, which for Qwen3.5 closes the
think block. So a scored prompt with images goes to ``/v1/chat/completions`` with the model's own chat template
sent in the request plus one line at its end that writes ``mmcf_continuation`` (a template variable passed in
``chat_template_kwargs``) after the generation prompt: the server renders exactly the toolkit's prompt followed by
the continuation's text, expands the images itself, and returns ``prompt_logprobs`` over the whole prompt and its
``prompt_token_ids`` (``return_token_ids``). The last len(continuation) ids must be the continuation's: a sampled
sequence that the tokenizer would split otherwise (rare; the text is tokenised again on this route) is refused,
never scored as other tokens. The server must trust request templates (``--trust-request-chat-template``, which
``serving/launch_qwen35.sh --engine vllm`` passes). A request with ``prompt_logprobs`` skips vLLM's prefix cache
(sampling_params.py, ``skip_reading_prefix_cache``): every scoring request pays its whole prefill.
"""
from __future__ import annotations

import time

import numpy as np

from ..http import HTTPError, RetryPolicy, request_json
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
from .local import load_chat_renderer
from .messages import record_messages, split_text_and_images, to_openai_messages
from .openai_compat import OpenAIBackend
from .prompt_tokens import PromptTokens
from .think import THINK_OPEN, mark_think
from .wire import tokens_from_triples

__all__ = ["VLLMBackend", "check_logprobs_mode", "LOGPROBS_MODE", "SCORING_HOOK"]

#: What the chat route appends to the model's template (ours): the continuation, as text, after the prompt.
SCORING_HOOK = "{%- if mmcf_continuation is defined %}{{- mmcf_continuation }}{%- endif %}"

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
        if renderer is None:
            model_dir = str(resolve_model_dir(model_dir))
        self.setup_prompt_tokens(renderer or load_chat_renderer(model_dir), model_dir)

    def _payload(self, messages: list[dict], sp) -> dict:
        body = super()._payload(messages, sp)
        if sp.top_logprobs > 0:  # the generated tokens' ids (choices[0].token_ids): recorded, and scored back
            body["return_token_ids"] = True
        return body

    def parse(self, resp: dict, sp):
        out = super().parse(resp, sp)
        got = (resp.get("choices") or [{}])[0].get("token_ids")
        if isinstance(got, list) and len(got) == len(out.tokens) and all(
                type(i) is int and 0 <= i < (self.vocab or 1 << 31) for i in got):
            out.tokens.ids = np.asarray(got, dtype=np.int64)
        return out

    def score_payload(self, messages: list[dict], continuation: Continuation, *, top_logprobs: int = DEFAULT_TOP_LOGPROBS,
                      enable_thinking: bool | None = True) -> tuple[dict, list[int], str]:
        """(the /v1/completions body, the continuation ids, the prompt) for teacher-forced scoring."""
        hf, images = split_text_and_images(messages)
        if images:
            raise BackendError("a prompt with images is scored over the chat route (chat_score_payload)")
        kw = {"enable_thinking": enable_thinking} if enable_thinking is not None else {}
        prompt = self.tok.apply_chat_template(hf, add_generation_prompt=True, tokenize=False, **kw)
        ids = list(continuation.ids) if continuation.ids else self.tok(continuation.text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise BackendError("empty continuation: nothing to score")
        prompt_ids = self.prompt_ids(prompt)
        # scoring samples nothing that is kept: one greedy token, the neutral set spelled out (no server default)
        body = {"model": self.model, "prompt": np.concatenate([prompt_ids, np.asarray(ids, dtype=np.int32)]),
                "max_tokens": 1, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                "repetition_penalty": 1.0, "prompt_logprobs": int(top_logprobs), "add_special_tokens": False}
        return body, ids, prompt

    def chat_score_payload(self, messages: list[dict], continuation: Continuation, *,
                           top_logprobs: int = DEFAULT_TOP_LOGPROBS, enable_thinking: bool | None = True) -> tuple[dict, list[int]]:
        """(the /v1/chat/completions body, the continuation ids) for scoring a prompt with images (see the module)."""
        ids = list(continuation.ids) if continuation.ids else self.tok(continuation.text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise BackendError("empty continuation: nothing to score")
        kw = {"enable_thinking": enable_thinking} if enable_thinking is not None else {}
        body = {"model": self.model, "messages": to_openai_messages(messages),
                "chat_template": self.tok.chat_template + SCORING_HOOK,
                "chat_template_kwargs": {**kw, "mmcf_continuation": self.tok.decode(ids, skip_special_tokens=False)},
                "add_generation_prompt": True, "max_tokens": 1, "temperature": 0.0, "top_p": 1.0, "top_k": -1,
                "min_p": 0.0, "repetition_penalty": 1.0, "prompt_logprobs": int(top_logprobs), "return_token_ids": True}
        return body, ids

    async def score(self, messages: list[dict], continuation: Continuation, *, top_logprobs: int = DEFAULT_TOP_LOGPROBS,
                    enable_thinking: bool | None = True, temperature: float | None = None) -> ScoredTokens:
        if temperature:
            raise BackendError("vLLM's prompt logprobs are raw (log_softmax of the logits); scaled scoring is not available")
        await self.resolve_model()
        hf, images = split_text_and_images(messages)
        if images:
            body, ids = self.chat_score_payload(messages, continuation, top_logprobs=top_logprobs,
                                                enable_thinking=enable_thinking)
            url = self.base + "/chat/completions"
            # the prompt the server renders from the same template (here only to tell whether it opens the think block)
            prompt = self.tok.apply_chat_template(hf, add_generation_prompt=True, tokenize=False,
                                                  **({"enable_thinking": enable_thinking} if enable_thinking is not None else {}))
        else:
            body, ids, prompt = self.score_payload(messages, continuation, top_logprobs=top_logprobs,
                                                   enable_thinking=enable_thinking)
            url = self.base + "/completions"
        box: dict = {}
        t0 = time.perf_counter()

        async def attempt():
            try:
                box["resp"] = resp = await request_json(self._client, "POST", url, json_body=body,
                                                        headers=routing_headers(self._headers), policy=self.policy,
                                                        what="score", liveness=self.liveness)
            except HTTPError as e:
                if "trust-request-chat-template" in str(e):
                    raise BackendError(f"{public_url(url)}: this vLLM server refuses request chat templates, which "
                                       "scoring a prompt with images sends: start it with --trust-request-chat-template "
                                       "(serving/launch_qwen35.sh --engine vllm does)") from None
                raise backend_error(e) from e
            return self.parse_score(resp, ids, k=int(top_logprobs) or None)

        tokens = await retry_bad_replies(attempt, f"score @ {public_url(url)}")
        mark_think(tokens, prompt.rstrip().endswith(THINK_OPEN))
        resp = box["resp"]
        kept = {**{k: v for k, v in resp.items() if k not in ("prompt_logprobs", "prompt_token_ids")},
                "choices": [{k: v for k, v in c.items() if k not in ("prompt_logprobs", "prompt_token_ids")}
                            for c in resp.get("choices") or []]}
        return ScoredTokens(tokens=tokens, semantics=LogprobSemantics("raw"), backend=self.name, model=self.model,
                            request={"endpoint": public_url(url), "messages": record_messages(messages),
                                     "continuation_ids": ids, "image_sha256": [im.sha256 for im in images],
                                     "by": "text" if images else "ids",
                                     "prompt_logprobs": int(top_logprobs), "latency_s": time.perf_counter() - t0},
                            response=kept, top_k_requested=int(top_logprobs))

    def parse_score(self, resp: dict, ids: list[int], k: int | None = None):
        """The continuation's tokens from a /v1/completions reply (see the module); ``k``: alternatives asked."""
        chat = isinstance(resp, dict) and resp.get("object") == "chat.completion"  # prompt_logprobs at the top
        where = f"{public_url(self.base)}/{'chat/completions prompt_logprobs' if chat else 'completions choices[0].prompt_logprobs'}"
        if isinstance(resp, dict) and (resp.get("object") == "error" or ("error" in resp and "choices" not in resp)):
            raise BadReply(f"{where}: the server answered 200 with an error object: {redact(str(resp))[:300]}")
        try:
            holder = resp if chat else resp["choices"][0]
            entries = holder["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{where}: the reply has no prompt logprobs: {redact(str(resp))[:300]}") from None
        n = len(ids)
        if not isinstance(entries, list) or len(entries) < n + 1:
            got = len(entries) if isinstance(entries, list) else "no"
            raise BackendError(f"{where}: {got} prompt positions for a {n}-token continuation after a prompt")
        sent = holder.get("prompt_token_ids")
        if chat and not isinstance(sent, list):
            raise BackendError(f"{where}: no prompt_token_ids (return_token_ids): the scored tokens cannot be checked")
        if isinstance(sent, list) and sent[-n:] != list(ids):
            raise BackendError(f"{where}: the server's prompt does not end with the continuation's ids (its tokenizer "
                               "splits the continuation's text otherwise); refusing to report logprobs of other tokens")
        chosen, tops = [], []
        for j, (tid, d) in enumerate(zip(ids, entries[-n:])):
            if not isinstance(d, dict) or str(tid) not in d or not isinstance(d[str(tid)], dict):
                raise BackendError(f"{where}[{len(entries) - n + j}]: no logprob for the continuation's token {tid} "
                                   "(the server scored other tokens); refusing the reply")
            chosen.append([d[str(tid)].get("logprob"), int(tid), None])
            alts = sorted(((v.get("rank") or 0, v.get("logprob"), key) for key, v in d.items() if isinstance(v, dict)),
                          key=lambda r: r[0])
            try:
                tops.append([[lp, int(key), None] for rank, lp, key in alts if k is None or 1 <= rank <= k])
            except ValueError:
                raise BackendError(f"{where}[{len(entries) - n + j}]: a token id that is not a number") from None
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
