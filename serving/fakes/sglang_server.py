"""A loopback stand-in for an SGLang server, speaking SGLang's real wire format.

    python serving/fakes/sglang_server.py --port 30000 [--model-name NAME] [--tokenizer DIR] [--latency S] [--reply TEXT]
        [--alternatives-vocab N]

Serves ``/health``, ``/health_generate``, ``/v1/models``, ``/get_model_info``, native
``/generate`` (``meta_info`` with ``[logprob, token_id, text_or_null]`` triples; scoring with
``max_new_tokens: 0`` and ``logprob_start_len``; ``input_token_logprobs[0]`` = ``[null, id, …]``,
``input_top_logprobs[0]`` = ``null``; with ``return_flat_raw_top_logprobs[_b64]`` the prompt's top lists as
SGLang 0.5.23's flat arrays instead; each image placeholder expanded to several tokens) and
``/v1/chat/completions`` (``logprobs.content[].top_logprobs[]`` deduplicated by text,
``reasoning_content``, and ``choices[0].meta_info`` when ``return_meta_info`` is set).

Faults for tests: ``server.faults`` is a list consumed one per request, or ``fault_rate`` (with a seed)
draws one at random for that share of the requests; ``server.injected`` counts them. Transport faults:
``"429"``, ``"500"``, ``"500_echo"`` (the error body echoes the Authorization header), ``"200_error"`` (an SGLang
error object with status 200), ``"400"``, ``"drop"`` (the connection closes without a reply), ``"truncated"`` /
``"malformed"`` (a 200 whose body is cut), ``"slow"`` (the reply comes after ``slow_s``), ``"drift"``
(scoring returns shifted token ids). Model-output faults (a well-formed reply carrying garbage, see
:data:`GARBAGE`): no tags, an unclosed ``<think>``, invalid JSON, an unknown tool, a 200 KB output, empty
or null content, a JSON-escaped lone surrogate (in the tool arguments, or in the reply body itself),
control characters, a ``<subtask>`` with missing fields. ``None`` answers normally. Used by the tests
in-process (``FakeSGLang``) and as a command (the launcher's tests, ``scripts/soak.py``).
"""
from __future__ import annotations

import argparse
import base64
import collections
import io
import json
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # runnable as a script too

from agent.jsonio import dumps, loads  # noqa: E402
from serving.fakes import sglang_tokens as toks  # noqa: E402
from serving.fakes.http_base import JSONHandler  # noqa: E402

#: Model-output faults: what a confused model can emit (each must become a correction or an error
#: observation, never abort a run).
GARBAGE = {
    "no_tags": "I think the answer might be in the picture somewhere, let me see.",
    "unclosed_think": "<think>\nstill thinking about the flag and the colours and",
    "invalid_json": '<tool_call>\n{"name": "search", "arguments": {"query": }\n</tool_call>',
    "unknown_tool": '<tool_call>\n{"name": "browse_web", "arguments": {"url": "https://x.example"}}\n</tool_call>',
    "huge": "blah " * 40_000,  # 200 KB of visible text
    "empty": "",
    "null_content": None,
    "surrogate_args": '<tool_call>\n{"name": "search", "arguments": {"query": "\\ud800 broken", "goal": "g"}}\n</tool_call>',
    "surrogate_body": "</think>\n\n<answer>\ud800 lone</answer>",
    "control_chars": "</think>\n\n<answer>\x00\x07\x1b[31mred\x1b[0m\x08</answer>",
    "subtask_missing": '<subtask>\n{"description": "look"}\n</subtask>',
}
TRANSPORT_FAULTS = ("429", "500", "drop", "truncated", "slow")
#: Value faults on native /generate replies: a well-formed body with values no true distribution has (the
#: backend must refuse it and ask again), and SGLang's own clamp of an underflowed scaled logprob (valid).
BAD_VALUES = {
    "null_logprob": lambda m: m["output_token_logprobs"][0].__setitem__(0, None),  # what orjson makes of a NaN
    "positive_logprob": lambda m: m["output_token_logprobs"][0].__setitem__(0, 0.5),
    "huge_id": lambda m: m["output_top_logprobs"][0][-1].__setitem__(1, 2**40 + 7),
    "short_top": lambda m: m["output_top_logprobs"][0].pop(),
    "underflow": lambda m: m["output_top_logprobs"][0][-1].__setitem__(0, -3.4028234663852886e38),
    # one entry fewer than the output ids (F1); an entry naming another token than the output id there (F3)
    "short_logprobs": lambda m: (m["output_token_logprobs"].pop(), m["output_top_logprobs"].pop()),
    "wrong_entry_id": lambda m: m["output_token_logprobs"][0].__setitem__(1, (m["output_token_logprobs"][0][1] + 1) % 100),
    # a token twice among the alternatives (F2); alternatives whose probabilities sum to 1.8 (F4)
    "dup_top_id": lambda m: m["output_top_logprobs"][0][1].__setitem__(1, m["output_top_logprobs"][0][0][1]),
    "overfull_top": lambda m: [t.__setitem__(0, -2.4079456) for t in m["output_top_logprobs"][0]],
}
DEFAULT_REPLY = "Let me look at the picture.</think>\n\nIt shows a red square."


class _Handler(JSONHandler):
    server: "FakeServer"

    def setup(self):
        super().setup()
        with self.server.lock:
            self.server.connections += 1   # TCP connections accepted (one per request unless keep-alive)

    def _fault(self):
        srv = self.server
        with srv.lock:
            srv.requests.append(self.path)
            if srv.faults:
                f = srv.faults.pop(0)
            elif srv.fault_rate and srv.rng.random() < srv.fault_rate:
                f = srv.rng.choice(srv.fault_kinds)
            else:
                f = None
            if f is not None:
                srv.injected[f] += 1
            return f

    def do_GET(self):
        if self.path in ("/health", "/health_generate"):  # SGLang's: 503 once its scheduler produces nothing
            return self._send(503 if self.server.hung.is_set() else 200, b"", "text/plain")
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": self.server.model_name, "object": "model",
                                    "created": 1777365666, "owned_by": "sglang", "root": self.server.model_name,
                                    "parent": None, "max_model_len": 262144}]})
        if self.path == "/fault_stats":  # for scripts/soak.py: what was injected
            with self.server.lock:
                return self._send(200, dict(self.server.injected))
        if self.path in ("/server_info", "/get_server_info"):
            if self.server.server_args is None:
                return self._send(404, {"detail": "Not Found"})
            info = {"model_path": self.server.model_name, "tp_size": 1, "version": "0.5.23", "dtype": "auto",
                    "attention_backend": "fa3", "disable_radix_cache": False, "mamba_ssm_dtype": "float32",
                    "linear_attn_backend": "triton", "mamba_radix_cache_strategy": "extra_buffer",
                    "launch_command": f"python -m sglang.launch_server --model-path {self.server.model_name}",
                    "enable_deterministic_inference": self.server.deterministic, **self.server.server_args}
            return self._send(200, {k: v for k, v in info.items() if v is not None})
        if self.path in ("/model_info", "/get_model_info"):  # 0.5.23 has both; the old one is deprecated
            return self._send(200, {"model_path": self.server.model_name, "tokenizer_path": self.server.model_name,
                                    "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                                    "has_image_understanding": True, "has_audio_understanding": False,
                                    "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"]})
        self._send(404, {"detail": "Not Found"})

    def _request(self) -> dict | None:
        """The request's JSON body; None when there is none to serve (answered 400 if it is not JSON), or when the
        client went away before all of it came (killed mid-request): nothing arrived to serve or to record."""
        n = int(self.headers.get("Content-Length") or 0)
        with self.server.lock:
            self.server.framing.append((self.headers.get("Content-Length"), self.headers.get("Transfer-Encoding")))
        data = self.rfile.read(n)
        if len(data) < n:
            self.close_connection = True
            return None
        try:
            return loads(data or b"{}")
        except ValueError:
            self._send(400, {"error": "bad json"})
            return None

    def _wait_if_held(self) -> None:
        while self.server.hung.is_set() and not self.server.closing:  # a hung scheduler: no reply, ever
            time.sleep(0.05)
        self.server.gate.wait(600)  # a test holds every reply here to stop a run mid-way, whatever the machine's speed
        key = self.headers.get("x-smg-routing-key")
        if key in self.server.held_keys:  # one trajectory's requests held, the rest answered (a run stopped mid-way)
            with self.server.lock:
                self.server.holding.add(key)
            while key in self.server.held_keys and not self.server.closing:
                time.sleep(0.05)

    def do_POST(self):
        req = self._request()
        if req is None:
            return None
        with self.server.lock:
            self.server.bodies.append(req)
            self.server.routing_keys.append(self.headers.get("x-smg-routing-key"))
            crash = self.server.crash_when is not None and self.server.crash_when(self.server)
        if crash:  # a worker that dies on this request: no reply, and it stops listening
            self.close_connection = True
            srv = self.server
            threading.Thread(target=lambda: (srv.shutdown(), srv.server_close()), daemon=True).start()
            return
        if self.server.flat == "refuse" and any(key.startswith("return_flat_raw") for key in req):
            return self._send(400, {"object": "error", "message": "unexpected keyword argument "
                                    "'return_flat_raw_top_logprobs'", "type": "BadRequestError", "code": 400})
        bad = self._undecodable_image(req) if self.path in ("/generate", "/v1/chat/completions") else None
        if bad:  # SGLang opens each image with PIL while it prepares the request; what it cannot open is a 400
            return self._send(400, {"object": "error", "message": f"Failed to load image: {bad}",
                                    "type": "BadRequestError", "code": 400})
        fault = self._fault()
        self._wait_if_held()
        if self.server.latency_s:
            time.sleep(self.server.latency_s)
        if fault == "429":
            return self._send(429, {"error": "rate limited"})
        if fault == "500":
            return self._send(500, {"error": "internal"})
        if fault == "500_echo":  # a logging proxy that sends back what it received, the key included
            return self._send(500, {"error": f"internal; request had Authorization: {self.headers.get('Authorization')}"})
        if fault == "malformed":
            return self._send(200, b'{"text": "oops", "meta_info": {', "application/json")
        if fault == "200_error":  # an SGLang error object sent with status 200
            return self._send(200, {"object": "error", "message": "scheduler busy", "type": "InternalError", "code": 500})
        if fault == "400":
            return self._send(400, {"object": "error", "message": "bad request", "code": 400})
        if fault == "drop":  # the connection closes with no reply at all
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            return None
        if fault == "slow":
            time.sleep(self.server.slow_s)
        if fault in GARBAGE:
            req = {**req, "_garbage": GARBAGE[fault]}
        if self.path == "/flush_cache":  # SGLang answers with a plain-text line
            with self.server.lock:
                self.server.seen.clear()
            return self._send(200, b"Cache flushed.\nPlease check backend logs for more details.", "text/plain")
        if self.path == "/generate":
            res = self._generate(req, drift=(fault == "drift"))
            if isinstance(res, tuple):
                return self._send(*res)
            body = res
            if fault in BAD_VALUES and body["meta_info"].get("output_token_logprobs"):
                body = json.loads(json.dumps(body))  # the replies are cached: change a copy
                BAD_VALUES[fault](body["meta_info"])
        elif self.path == "/v1/chat/completions":
            body = self._chat_cached(req) if "_garbage" not in req else json.dumps(self._chat({**req, "_reply": req["_garbage"]}))
        else:
            return self._send(404, {"detail": "Not Found"})
        if fault == "truncated":  # a 200 cut in transit: the advertised length is the full one
            data = body if isinstance(body, (bytes, str)) else dumps(body)
            data = data.encode() if isinstance(data, str) else data
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.connection.shutdown(2)
            except OSError:
                pass
            self.close_connection = True
            return None
        return self._send(200, body)

    # -------------------------------------------------------------- native
    def _expand(self, ids: list[int], images: list) -> list[int]:
        out, k = [], 0
        for i in ids:
            if i == self.server.tok.image_pad and k < len(images):
                n = self.server.tok.image_tokens(images[k])
                short = self.server.image_shortfall
                out.extend([i] * (n if short is None else 1 if short == "all" else n - short))
                k += 1
            else:
                out.append(i)
        return out

    def _leaks(self, ids_in: list, req: dict) -> bool:
        """With ``leak`` set: whether this scoring repeats a prompt seen since the last flush (a cached state
        reused, which then scores differently)."""
        if not self.server.leak:
            return False
        key = (tuple(ids_in), len(req.get("image_data") or []))
        with self.server.lock:
            hit = key in self.server.seen
            self.server.seen.add(key)
        return hit

    def _cached(self, ids: list) -> int:
        seen = self.server.prompts
        if seen is None:
            return 0
        with self.server.lock:
            best = 0
            for p in seen:
                n = next((i for i, (a, b) in enumerate(zip(p, ids)) if a != b), min(len(p), len(ids)))
                best = max(best, n)
            seen.append(list(ids))
        return min(best, max(len(ids) - 1, 0))

    def _generate(self, req: dict, drift: bool):
        tok = self.server.tok
        sp = req.get("sampling_params") or {}
        k = int(req.get("top_logprobs_num") or 0)
        with_text = bool(req.get("return_text_in_logprobs"))
        ids_in = list(req["input_ids"]) if req.get("input_ids") is not None else tok.encode(req.get("text", ""))
        prompt_ids = self._expand(ids_in, req.get("image_data") or [])
        meta = {"id": "16364db12c7841408db86b720b5d37b9", "prompt_tokens": len(prompt_ids), "weight_version": "default",
                "total_retractions": 0, "cached_tokens": self._cached(prompt_ids)}
        if int(sp.get("max_new_tokens", 16)) == 0:
            start = int(req.get("logprob_start_len", -1))
            start = len(prompt_ids) - 1 if start < 0 else start
            if start > len(prompt_ids):  # SGLang's scheduler refuses it (it indexes the *expanded* prompt)
                return 400, {"object": "error", "message": f"req.logprob_start_len={start} is higher than the number of "
                                                           f"input tokens len(req.origin_input_ids)={len(prompt_ids)}"}
            ids = prompt_ids[start:]
            if drift:
                ids = ids[:-1] + [ids[-1] + 1]
            # the scored token's logprob is its entry in the top list (:func:`toks.top` puts it first), as on a real server
            entries = [[None if j == 0 else toks.f32(-0.05 - 0.01 * (j % 7) - 1e-4 * (j % 97)), t,
                        tok.decode(t) if with_text else None] for j, t in enumerate(ids)]
            flat = bool(req.get("return_flat_raw_top_logprobs")) and k > 0 and self.server.flat == "yes"
            if flat and not with_text and len(ids) > 1:  # the arrays straight away (what the benches ask for)
                val, idx = toks.tops_arrays(ids, k, tok)
                if self._leaks(ids_in, req):
                    entries = [[e[0] if e[0] is None else e[0] - self.server.leak, *e[1:]] for e in entries]
                    val = val.astype("float32").astype("float64") - self.server.leak
                meta.update({"finish_reason": {"type": "length", "length": 0}, "completion_tokens": 0,
                             "input_token_logprobs": entries, "output_token_logprobs": [], "output_top_logprobs": [],
                             **toks.flat_from_arrays("input", val, idx, 1,
                                                 bool(req.get("return_flat_raw_top_logprobs_b64")))})
                return {"text": "", "output_ids": [], "meta_info": meta}
            tops = [None if j == 0 else toks.top(t, k, j, tok, with_text) for j, t in enumerate(ids)]
            if self._leaks(ids_in, req):
                entries = [[e[0] if e[0] is None else e[0] - self.server.leak, *e[1:]] for e in entries]
                tops = [t if t is None else [[a[0] - self.server.leak, *a[1:]] for a in t] for t in tops]
            meta.update({"finish_reason": {"type": "length", "length": 0}, "completion_tokens": 0,
                         "input_token_logprobs": entries, "input_top_logprobs": tops,
                         "output_token_logprobs": [], "output_top_logprobs": []})
            if flat:
                meta.update(toks.flat_fields("input", tops, k, bool(req.get("return_flat_raw_top_logprobs_b64"))))
                del meta["input_top_logprobs"]  # flat replaces nested for the input side (SGLang 0.5.23)
            return {"text": "", "output_ids": [], "meta_info": meta}
        if callable(self.server.reply) and req.get("text") is None and req.get("input_ids") is not None:
            req = {**req, "text": tok.decode_all(req["input_ids"])}  # a policy reads the prompt as text either way
        reply = req["_garbage"] if "_garbage" in req else (self._policy(req) if callable(self.server.reply)
                                                           else self.server.reply)
        reply = reply or ""
        full_ids = tok.encode(reply) + ([tok.eos] if tok.eos is not None else [])
        out_ids = full_ids[: int(sp.get("max_new_tokens", 16))]
        finish = ({"type": "stop", "matched": tok.eos or 151645} if len(out_ids) == len(full_ids)
                  else {"type": "length", "length": len(out_ids)})
        # SGLang: with return_logprob and the default logprob_start_len (-1), no input logprobs at all
        meta.update({"finish_reason": finish, "completion_tokens": len(out_ids), "e2e_latency": 0.01,
                     "reasoning_tokens": 0, "input_token_logprobs": [], "input_top_logprobs": []})
        if req.get("return_logprob"):  # depends on the reply only: computed once per distinct reply
            key = ("gen", reply, k, with_text, len(out_ids))
            with self.server.lock:
                hit = self.server.chat_cache.get(key)
            if hit is None:
                hit = ([[toks.top(t, max(k, 1), j, tok, with_text)[0][0], t, tok.decode(t) if with_text else None]
                        for j, t in enumerate(out_ids)], [toks.top(t, k, j, tok, with_text) for j, t in enumerate(out_ids)])
                with self.server.lock:
                    self.server.chat_cache[key] = hit
            meta["output_token_logprobs"], meta["output_top_logprobs"] = hit
        text = "".join(tok.decode(t) for t in out_ids)
        return {"text": text, "output_ids": out_ids, "meta_info": meta}

    # -------------------------------------------------------------- chat
    def _chat_cached(self, req: dict) -> bytes:
        """Replies depend only on (text, k, max_tokens, flags): encode each distinct one once."""
        reply = self._policy(req) if callable(self.server.reply) else self.server.reply
        n_prompt = self._chat_prompt_tokens(req)
        key = (reply, req.get("top_logprobs"), req.get("max_tokens"), bool(req.get("logprobs")),
               bool(req.get("return_meta_info")), self.server.model_name, n_prompt)
        with self.server.lock:
            hit = self.server.chat_cache.get(key)
        if hit is None:
            hit = json.dumps(self._chat({**req, "_reply": reply, "_n_prompt": n_prompt})).encode()
            with self.server.lock:
                self.server.chat_cache[key] = hit
        return hit

    def _undecodable_image(self, req: dict) -> str | None:
        """Why the first image of the request that PIL cannot open is no image (None: all open)."""
        uris = [it["image_url"]["url"] for m in req.get("messages") or [] if isinstance(m.get("content"), list)
                for it in m["content"] if isinstance(it, dict) and it.get("type") == "image_url"]
        uris += [u for u in req.get("image_data") or [] if isinstance(u, str)]
        for uri in uris:
            if not uri.startswith("data:"):
                continue
            key = hash(uri)
            if key not in self.server.opened:
                try:
                    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[-1]))) as im:
                        im.verify()
                    self.server.opened[key] = None
                except Exception as e:  # noqa: BLE001 - whatever PIL raises, the server's answer is the same
                    self.server.opened[key] = f"{type(e).__name__}: {e}"
            if self.server.opened[key]:
                return self.server.opened[key]
        return None

    def _chat_prompt_tokens(self, req: dict) -> int:
        """The prompt's length as SGLang's chat layer counts it: the model's chat template rendered server-side,
        each image placeholder expanded (with the tiny model's tokenizer); 17 without one."""
        tok = self.server.tok
        if tok.hf is None:
            return 17
        msgs, images = [], []
        for m in req.get("messages") or []:
            c = m.get("content")
            if isinstance(c, list):
                parts = []
                for it in c:
                    if it.get("type") == "image_url":
                        images.append(it["image_url"]["url"])
                        parts.append({"type": "image"})
                    else:
                        parts.append(it)
                m = {**m, "content": parts}
            msgs.append(m)
        text = tok.hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                          chat_template=self.server.chat_template,
                                          **(req.get("chat_template_kwargs") or {}))
        return len(self._expand(tok.encode(text), images))

    def _policy(self, req: dict):
        """The reply policy's text for ``req``; it sees the request's ``Authorization`` header as
        ``req["_authorization"]`` (a server that echoes what it was sent)."""
        return self.server.reply({**req, "_authorization": self.headers.get("Authorization")})

    def _chat(self, req: dict) -> dict:
        n_prompt = req.get("_n_prompt", 17)
        tok = self.server.tok
        k = int(req.get("top_logprobs") or 0)
        reply = req["_reply"]
        null = reply is None
        all_ids = tok.encode(reply or "") + ([tok.eos] if tok.eos is not None and not null else [])
        out_ids = all_ids[: int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)]
        texts = [tok.decode(t) for t in out_ids]
        full = "".join(texts).removesuffix("<|im_end|>")  # the chat layer skips special tokens in content
        # --reasoning-parser qwen3 with the <think> pre-fill: SGLang's rules (which split_think mirrors, as
        # tests/conformance checks): </think> ends the reasoning, else a <tool_call> does, else all is reasoning
        from agent.backends.think import split_think

        thinking = (req.get("chat_template_kwargs") or {}).get("enable_thinking", True) is not False
        reasoning, content = split_think(full, thinking)  # nothing stripped: SGLang 0.5.23 sends them as parsed
        choice = {"index": 0, "message": {"role": "assistant", "content": None if null else content,
                                          "reasoning_content": None if null else (reasoning or None),
                                          "tool_calls": None},
                  **({"finish_reason": "stop", "matched_stop": 151645} if len(out_ids) == len(all_ids)
                     else {"finish_reason": "length", "matched_stop": None})}
        if req.get("logprobs") and not self.server.no_logprobs:
            content_lp = []
            for j, (t, s) in enumerate(zip(out_ids, texts)):
                top, seen = [], set()
                for lp, i, _ in toks.top(t, k, j, tok, True):
                    txt = tok.decode(i)
                    if txt in seen:  # SGLang dedupes alternatives by decoded text
                        continue
                    seen.add(txt)
                    top.append({"token": txt, "bytes": list(txt.encode("utf-8", "surrogatepass")), "logprob": lp})
                content_lp.append({"token": s, "bytes": list(s.encode("utf-8", "surrogatepass")),
                                   "logprob": top[0]["logprob"] if top else -0.05,
                                   "top_logprobs": top})
            choice["logprobs"] = {"content": content_lp}
            if req.get("return_meta_info"):
                choice["meta_info"] = {"id": "e037366a24d14dedaa779408681a5a5f", "prompt_tokens": n_prompt,
                                       "completion_tokens": len(out_ids), "cached_tokens": 0,
                                       "output_token_logprobs": [[toks.top(t, max(k, 1), j, tok, True)[0][0], t, s]
                                                                 for j, (t, s) in enumerate(zip(out_ids, texts))],
                                       "output_top_logprobs": [toks.top(t, k, j, tok, True) for j, t in enumerate(out_ids)]}
        else:
            choice["logprobs"] = None
        return {"id": "e037366a24d14dedaa779408681a5a5f", "object": "chat.completion", "created": 1775407536,
                "model": self.server.model_name, "choices": [choice],
                "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt + len(out_ids), "completion_tokens": len(out_ids),
                          "prompt_tokens_details": None, "reasoning_tokens": 0,
                          # OpenRouter's bill for the call (usage.cost, credits = USD) and who served it
                          **({"cost": self.server.cost_per_token * (n_prompt + len(out_ids))}
                             if self.server.cost_per_token else {})},
                **({"provider": "FakeProvider"} if self.server.cost_per_token else {}),
                "metadata": {"weight_version": "default"}}


class _KeepAliveHandler(_Handler):
    """HTTP/1.1 with persistent connections, as SGLang's uvicorn serves (the default handler speaks HTTP/1.0 and
    closes the connection after every reply, so each request pays a TCP connect and a new client connection:
    ~2 ms of client CPU a request, which a real server does not cost; the benches use this one)."""
    protocol_version = "HTTP/1.1"


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # listen() backlog: the default 5 drops bursts of connections (1 s SYN retries)

    def __init__(self, port: int = 0, *, model_name: str = "fake-qwen3.5", tokenizer_dir: str | None = None,
                 reply: str = DEFAULT_REPLY, latency_s: float = 0.0, deterministic: bool = False,
                 fault_rate: float = 0.0, fault_kinds=None, seed: int = 0, slow_s: float = 3.0, leak: float = 0.0,
                 chat_template: str | None = None, keep_alive: bool = False, flat: str = "yes",
                 alternatives_vocab: int | None = None):
        super().__init__(("127.0.0.1", port), _KeepAliveHandler if keep_alive else _Handler)
        # SGLang's flat top-logprob format: "yes" (0.5.23), "ignore" (a server without it: nested lists), "refuse"
        # (a server that rejects the fields with a 400)
        self.flat = flat
        self.leak = leak      # > 0: a repeated scoring request's logprobs shifted by this (a cache-state leak)
        # images that do not arrive whole (SGLang #39831): "all" makes each one token, an int drops that many tokens
        self.image_shortfall: str | int | None = None
        self.no_logprobs = False  # True: a chat reply never carries logprobs, asked or not (some OpenRouter providers)
        self.routing_keys: list = []
        self.crash_when = None  # callable(server) -> bool, asked on each POST: True = die there (no reply, stop)  # each POST's x-smg-routing-key header (None: none sent)
        self.server_args: dict = {}  # more /server_info fields (a dtype, a quantization, a radix cache turned off);
        # a field set to None is left out; server_args = None: /server_info answers 404 (a server that never says)
        self.cost_per_token = 0.0  # > 0: replies carry OpenRouter's usage.cost (this times the call's tokens)
        self.chat_template = chat_template  # the chat path's own template (a server started with --chat-template)
        self.seen: set = set()
        self.opened: dict = {}  # hash of an image's data URI -> why PIL cannot open it (None: it opens)
        # a list: generation requests report cached_tokens as an unbounded token-level prefix cache would (the
        # longest prefix shared with an earlier prompt, at most len - 1, as SGLang caps a match); None: always 0
        self.prompts: list | None = None
        self.model_name = model_name
        self.tok = toks.Tok(tokenizer_dir, alternatives_vocab)
        self.reply = reply
        self.latency_s = latency_s
        self.gate = threading.Event()  # cleared: replies wait (see the handler); set by default
        self.gate.set()
        self.hung = threading.Event()  # set: a hung scheduler (no POST is ever answered; /health says 503)
        self.held_keys: set = set()  # routing keys whose requests wait until the key is removed
        self.holding: set = set()    # the held keys a request has arrived under
        self.closing = False
        self.deterministic = deterministic
        self.faults: list = []
        self.fault_rate = fault_rate
        self.fault_kinds = list(fault_kinds or [*TRANSPORT_FAULTS, *GARBAGE])
        self.rng = __import__("random").Random(seed)
        self.injected = __import__("collections").Counter()
        self.slow_s = slow_s
        self.chat_cache: dict = {}
        self.requests: list[str] = []
        self.bodies: list[dict] = []
        self.framing: list[tuple] = []  # each POST's (Content-Length, Transfer-Encoding) headers
        self.connections = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class FakeSGLang:
    """Context manager running a :class:`FakeServer` in a background thread."""

    def __init__(self, **kw):
        self.server = FakeServer(**kw)
        self._t = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self._t.start()
        return self.server

    def __exit__(self, *exc):
        self.server.closing = True  # a hung handler lets go
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    ap = argparse.ArgumentParser(description="loopback SGLang stand-in for tests")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--model-name", "--served-model-name", dest="model_name", default="fake-qwen3.5")
    ap.add_argument("--tokenizer")
    ap.add_argument("--latency", type=float, default=0.0, help="seconds to wait before each POST reply")
    ap.add_argument("--reply", default=DEFAULT_REPLY, help="the text every generation returns")
    ap.add_argument("--enable-deterministic-inference", dest="deterministic", action="store_true")
    ap.add_argument("--fault-rate", type=float, default=0.0, help="share of POSTs that get a random fault")
    ap.add_argument("--fault-kinds", help="comma-separated subset of the faults (default: all)")
    ap.add_argument("--fault-seed", type=int, default=0)
    ap.add_argument("--slow-s", type=float, default=3.0, help="delay of a 'slow' fault")
    ap.add_argument("--alternatives-vocab", type=int,
                    help="spread the top-k alternatives over every ordinary id of a vocabulary this size (the benches: "
                         "248320, Qwen3.5's) rather than near the chosen token")
    ap.add_argument("--keep-alive", action="store_true",
                    help="HTTP/1.1 persistent connections, as SGLang's server (default: HTTP/1.0, one per request)")
    args, _unknown = ap.parse_known_args()
    srv = FakeServer(args.port, model_name=args.model_name, tokenizer_dir=args.tokenizer, reply=args.reply,
                     latency_s=args.latency, deterministic=args.deterministic, fault_rate=args.fault_rate,
                     fault_kinds=args.fault_kinds.split(",") if args.fault_kinds else None, seed=args.fault_seed,
                     slow_s=args.slow_s, keep_alive=args.keep_alive, alternatives_vocab=args.alternatives_vocab)
    # as its own process nobody reads what it received: keep none of it (the bodies hold every image sent; a
    # benchmark's ~13,000 requests grew it past 10 GB)
    srv.bodies, srv.routing_keys, srv.requests, srv.framing = (collections.deque(maxlen=0) for _ in range(4))
    print(f"fake sglang serving {args.model_name} on {srv.url}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
