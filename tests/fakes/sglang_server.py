"""A loopback stand-in for an SGLang server, speaking SGLang's real wire format.

    python tests/fakes/sglang_server.py --port 30000 [--model-name NAME] [--tokenizer DIR] [--latency S] [--reply TEXT]

Serves ``/health``, ``/health_generate``, ``/v1/models``, ``/get_model_info``, native
``/generate`` (``meta_info`` with ``[logprob, token_id, text_or_null]`` triples; scoring with
``max_new_tokens: 0`` and ``logprob_start_len``; ``input_token_logprobs[0]`` = ``[null, id, …]``,
``input_top_logprobs[0]`` = ``null``; each image placeholder expanded to several tokens) and
``/v1/chat/completions`` (``logprobs.content[].top_logprobs[]`` deduplicated by text,
``reasoning_content``, and ``choices[0].meta_info`` when ``return_meta_info`` is set).

Faults for tests: ``server.faults`` is a list consumed one per request: ``"429"``, ``"500"``,
``"malformed"``, ``"drift"`` (scoring returns shifted token ids), ``None`` (answer normally).
Used by the tests in-process (``FakeSGLang``) and by the serving launcher's tests as a command.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # runnable as a script too

from agent.http import loads  # noqa: E402
from tests.fakes.http_base import JSONHandler  # noqa: E402

IMAGE_EXPANSION = 4  # tokens per image placeholder (unknown to the client, as on a real server)
DEFAULT_REPLY = "Let me look at the picture.</think>\n\nIt shows a red square."


class _Tok:
    """Tokenizer wrapper: the tiny model's real tokenizer (and processor) when given, else one id per character."""

    def __init__(self, tok_dir: str | None):
        self.hf = self.proc = None
        if tok_dir:
            from transformers import AutoTokenizer

            self.hf = AutoTokenizer.from_pretrained(tok_dir)
            try:
                from transformers import AutoProcessor

                self.proc = AutoProcessor.from_pretrained(tok_dir)
            except Exception:  # noqa: BLE001 - a tokenizer-only directory: fixed expansion
                self.proc = None
        self.image_pad = self.encode("<|image_pad|>")[0] if self.hf else 9001
        self._n_cache: dict[int, int] = {}

    def encode(self, text: str) -> list[int]:
        if self.hf:
            return self.hf(text, add_special_tokens=False)["input_ids"]
        return [ord(c) for c in text]

    def decode(self, i: int) -> str:
        if self.hf:
            return self.hf.decode([i], skip_special_tokens=False)
        return chr(i) if i < 0x110000 else "?"

    def image_tokens(self, data_uri: str) -> int:
        """How many tokens one image placeholder becomes: the processor's image_grid_thw / merge_size² (as
        SGLang's Qwen-VL processing does), or IMAGE_EXPANSION without a processor."""
        if self.proc is None:
            return IMAGE_EXPANSION
        key = hash(data_uri)
        if key not in self._n_cache:
            import base64
            import io

            from PIL import Image

            img = Image.open(io.BytesIO(base64.b64decode(data_uri.split(",", 1)[1]))).convert("RGB")
            g = self.proc.image_processor(images=[img])["image_grid_thw"][0].tolist()
            merge = int(getattr(self.proc.image_processor, "merge_size", 2))
            self._n_cache[key] = int(g[0] * g[1] * g[2]) // (merge * merge)
        return self._n_cache[key]


def _top(tid: int, k: int, pos: int, tok: _Tok, with_text: bool):
    """A deterministic top-k list (best first) whose first entry is the chosen token."""
    lps = [-0.05 - 0.01 * (pos % 7)] + [-(1.0 + 0.35 * j + 0.02 * (pos % 5)) for j in range(1, k)]
    ids = [tid] + [(tid + 7 * j) % 600 + 1 for j in range(1, k)]
    return [[lp, i, tok.decode(i) if with_text else None] for lp, i in zip(lps, ids)]


class _Handler(JSONHandler):
    server: "FakeServer"

    def _fault(self):
        with self.server.lock:
            self.server.requests.append(self.path)
            return self.server.faults.pop(0) if self.server.faults else None

    def do_GET(self):
        if self.path in ("/health", "/health_generate"):
            return self._send(200, b"", "text/plain")
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": self.server.model_name, "object": "model",
                                    "created": 1777365666, "owned_by": "sglang", "root": self.server.model_name,
                                    "parent": None, "max_model_len": 262144}]})
        if self.path in ("/server_info", "/get_server_info"):
            return self._send(200, {"model_path": self.server.model_name, "tp_size": 1, "version": "0.5.23",
                                    "enable_deterministic_inference": self.server.deterministic})
        if self.path == "/get_model_info":
            return self._send(200, {"model_path": self.server.model_name, "tokenizer_path": self.server.model_name,
                                    "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                                    "has_image_understanding": True, "has_audio_understanding": False,
                                    "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"]})
        self._send(404, {"detail": "Not Found"})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        try:
            req = loads(self.rfile.read(n) or b"{}")
        except ValueError:
            return self._send(400, {"error": "bad json"})
        with self.server.lock:
            self.server.bodies.append(req)
        fault = self._fault()
        if self.server.latency_s:
            time.sleep(self.server.latency_s)
        if fault == "429":
            return self._send(429, {"error": "rate limited"})
        if fault == "500":
            return self._send(500, {"error": "internal"})
        if fault == "malformed":
            return self._send(200, b'{"text": "oops", "meta_info": {', "application/json")
        if fault == "400":
            return self._send(400, {"object": "error", "message": "bad request", "code": 400})
        if self.path == "/generate":
            res = self._generate(req, drift=(fault == "drift"))
            return self._send(*res) if isinstance(res, tuple) else self._send(200, res)
        if self.path == "/v1/chat/completions":
            return self._send(200, self._chat_cached(req))
        self._send(404, {"detail": "Not Found"})

    # -------------------------------------------------------------- native
    def _expand(self, ids: list[int], images: list) -> list[int]:
        out, k = [], 0
        for i in ids:
            if i == self.server.tok.image_pad and k < len(images):
                out.extend([i] * self.server.tok.image_tokens(images[k]))
                k += 1
            else:
                out.append(i)
        return out

    def _generate(self, req: dict, drift: bool):
        tok = self.server.tok
        sp = req.get("sampling_params") or {}
        k = int(req.get("top_logprobs_num") or 0)
        with_text = bool(req.get("return_text_in_logprobs"))
        ids_in = list(req["input_ids"]) if req.get("input_ids") is not None else tok.encode(req.get("text", ""))
        prompt_ids = self._expand(ids_in, req.get("image_data") or [])
        meta = {"id": "16364db12c7841408db86b720b5d37b9", "prompt_tokens": len(prompt_ids), "weight_version": "default",
                "total_retractions": 0, "cached_tokens": 0}
        if int(sp.get("max_new_tokens", 16)) == 0:
            start = int(req.get("logprob_start_len", -1))
            start = len(prompt_ids) - 1 if start < 0 else start
            if start > len(prompt_ids):  # SGLang's scheduler refuses it (it indexes the *expanded* prompt)
                return 400, {"object": "error", "message": f"req.logprob_start_len={start} is higher than the number of "
                                                           f"input tokens len(req.origin_input_ids)={len(prompt_ids)}"}
            ids = prompt_ids[start:]
            if drift:
                ids = ids[:-1] + [ids[-1] + 1]
            entries = [[None if j == 0 else -0.25 - 0.01 * (j % 9), t, tok.decode(t) if with_text else None] for j, t in enumerate(ids)]
            tops = [None if j == 0 else _top(t, k, j, tok, with_text) for j, t in enumerate(ids)]
            meta.update({"finish_reason": {"type": "length", "length": 0}, "completion_tokens": 0,
                         "input_token_logprobs": entries, "input_top_logprobs": tops,
                         "output_token_logprobs": [], "output_top_logprobs": []})
            return {"text": "", "output_ids": [], "meta_info": meta}
        reply = self.server.reply(req) if callable(self.server.reply) else self.server.reply
        out_ids = tok.encode(reply)[: int(sp.get("max_new_tokens", 16))]
        finish = {"type": "stop", "matched": 151645} if len(out_ids) == len(tok.encode(reply)) else {"type": "length", "length": len(out_ids)}
        meta.update({"finish_reason": finish, "completion_tokens": len(out_ids), "e2e_latency": 0.01,
                     "input_token_logprobs": [[None, prompt_ids[-1], None]], "input_top_logprobs": [None]})
        if req.get("return_logprob"):  # depends on the reply only: computed once per distinct reply
            key = ("gen", reply, k, with_text, len(out_ids))
            with self.server.lock:
                hit = self.server.chat_cache.get(key)
            if hit is None:
                hit = ([[_top(t, max(k, 1), j, tok, with_text)[0][0], t, tok.decode(t) if with_text else None]
                        for j, t in enumerate(out_ids)], [_top(t, k, j, tok, with_text) for j, t in enumerate(out_ids)])
                with self.server.lock:
                    self.server.chat_cache[key] = hit
            meta["output_token_logprobs"], meta["output_top_logprobs"] = hit
        text = "".join(tok.decode(t) for t in out_ids)
        return {"text": text, "output_ids": out_ids, "meta_info": meta}

    # -------------------------------------------------------------- chat
    def _chat_cached(self, req: dict) -> bytes:
        """Replies depend only on (text, k, max_tokens, flags): encode each distinct one once."""
        reply = self.server.reply(req) if callable(self.server.reply) else self.server.reply
        key = (reply, req.get("top_logprobs"), req.get("max_tokens"), bool(req.get("logprobs")),
               bool(req.get("return_meta_info")))
        with self.server.lock:
            hit = self.server.chat_cache.get(key)
        if hit is None:
            hit = json.dumps(self._chat({**req, "_reply": reply})).encode()
            with self.server.lock:
                self.server.chat_cache[key] = hit
        return hit

    def _chat(self, req: dict) -> dict:
        tok = self.server.tok
        k = int(req.get("top_logprobs") or 0)
        reply = req["_reply"]
        out_ids = tok.encode(reply)[: int(req.get("max_tokens") or 16)]
        texts = [tok.decode(t) for t in out_ids]
        full = "".join(texts)
        reasoning, content = (full.split("</think>", 1) if "</think>" in full else (full, ""))
        choice = {"index": 0, "message": {"role": "assistant", "content": content.strip(),
                                          "reasoning_content": reasoning.strip() or None, "tool_calls": None},
                  "finish_reason": "stop", "matched_stop": 151645}
        if req.get("logprobs"):
            content_lp = []
            for j, (t, s) in enumerate(zip(out_ids, texts)):
                top, seen = [], set()
                for lp, i, _ in _top(t, k, j, tok, True):
                    txt = tok.decode(i)
                    if txt in seen:  # SGLang dedupes alternatives by decoded text
                        continue
                    seen.add(txt)
                    top.append({"token": txt, "bytes": list(txt.encode()), "logprob": lp})
                content_lp.append({"token": s, "bytes": list(s.encode()), "logprob": top[0]["logprob"] if top else -0.05,
                                   "top_logprobs": top})
            choice["logprobs"] = {"content": content_lp}
            if req.get("return_meta_info"):
                choice["meta_info"] = {"id": "e037366a24d14dedaa779408681a5a5f", "prompt_tokens": 17,
                                       "completion_tokens": len(out_ids), "cached_tokens": 0,
                                       "output_token_logprobs": [[_top(t, max(k, 1), j, tok, True)[0][0], t, s]
                                                                 for j, (t, s) in enumerate(zip(out_ids, texts))],
                                       "output_top_logprobs": [_top(t, k, j, tok, True) for j, t in enumerate(out_ids)]}
        else:
            choice["logprobs"] = None
        return {"id": "e037366a24d14dedaa779408681a5a5f", "object": "chat.completion", "created": 1775407536,
                "model": self.server.model_name, "choices": [choice],
                "usage": {"prompt_tokens": 17, "total_tokens": 17 + len(out_ids), "completion_tokens": len(out_ids),
                          "prompt_tokens_details": None, "reasoning_tokens": 0},
                "metadata": {"weight_version": "default"}}


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # listen() backlog: the default 5 drops bursts of connections (1 s SYN retries)

    def __init__(self, port: int = 0, *, model_name: str = "fake-qwen3.5", tokenizer_dir: str | None = None,
                 reply: str = DEFAULT_REPLY, latency_s: float = 0.0, deterministic: bool = False):
        super().__init__(("127.0.0.1", port), _Handler)
        self.model_name = model_name
        self.tok = _Tok(tokenizer_dir)
        self.reply = reply
        self.latency_s = latency_s
        self.deterministic = deterministic
        self.faults: list = []
        self.chat_cache: dict = {}
        self.requests: list[str] = []
        self.bodies: list[dict] = []
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
    args, _unknown = ap.parse_known_args()
    srv = FakeServer(args.port, model_name=args.model_name, tokenizer_dir=args.tokenizer, reply=args.reply,
                     latency_s=args.latency, deterministic=args.deterministic)
    print(f"fake sglang serving {args.model_name} on {srv.url}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
