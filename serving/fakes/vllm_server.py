"""A loopback vLLM stand-in speaking vLLM's own request and response models, with the tiny Qwen3.5's real logprobs.

    PYTHONPATH=.:.venv-vllm/site:.venv-sglang/site python serving/fakes/vllm_server.py --port P --model-dir DIR
    bash serving/launch_qwen35.sh --engine vllm --server-command "python serving/fakes/vllm_server.py" ...  # as vllm serve

Every request body is read by vLLM 0.33.0's ``CompletionRequest`` / ``ChatCompletionRequest`` / ``GenerateRequest``
(its token-in route, ``/inference/v1/generate``) and turned into vLLM's ``SamplingParams`` (a field vLLM refuses is
its 400, in its words); every reply is built as vLLM's ``CompletionResponse`` / ``ChatCompletionResponse`` /
``GenerateTokensResponse`` with ``Logprob`` entries and serialised by them. What vLLM's
engine would compute is the tiny model's, on the CPU: prompt logprobs are log_softmax of its logits at each
prompt position (the target token and the top k, ranks counted over the vocabulary, as vLLM's prompt-logprob pass
gathers them); a chat reply's text is the scripted agent's (serving/fakes/policy.py ``agent_policy``) and its logprobs the
model's own for those tokens, raw, as under vLLM's default ``--logprobs-mode raw_logprobs``. Images are counted,
not seen: on the token-in route each placeholder is expanded to as many tokens as the model's processor gives the
image (transformers' own), and the model reads them as tokens. Its numbers are meaningless; its shapes, fields and
semantics are vLLM's. A real vLLM engine runs in tests/test_real_engine.py; this stand-in is for the faults it
cannot be made to show cheaply. ``POST /_restart_as {"logprobs_mode": ..., "enable_scale_out": ...,
"collapse_images": ..., "root": ...}`` stands for a restart with other flags or weights (a model load saved);
``collapse_images`` expands every image to one token (SGLang #39831's fault).
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from PIL import Image
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, AutoProcessor, AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
)
from vllm.entrypoints.openai.completion.protocol import CompletionRequest, CompletionResponse, CompletionResponseChoice
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    GenerateRequest,
    GenerateTokensChoice,
    GenerateTokensResponse,
)
from vllm.entrypoints.serve.engine.protocol import UsageInfo
from vllm.logprobs import Logprob

from serving.fakes.policy import agent_policy


class Engine:
    """The tiny model on the CPU, one forward pass at a time."""

    def __init__(self, model_dir: str, logprobs_mode: str = "raw_logprobs", scale_out: bool = False):
        self.scale_out = scale_out
        self.collapse_images = False
        self.processed = logprobs_mode == "processed_logprobs"  # output logprobs only: prompt logprobs stay raw
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.proc = AutoProcessor.from_pretrained(model_dir)
        self.image_pad = self.tok.convert_tokens_to_ids("<|image_pad|>")
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.lock = threading.Lock()
        self.vocab = self.model.get_output_embeddings().weight.shape[0]

    def expand(self, ids: list[int], uris: list[str]) -> list[int]:
        """Each image placeholder as the processor expands it (prod(image_grid_thw) / merge²; one token when
        ``collapse_images``)."""
        ims = [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).convert("RGB") for u in uris]
        thw = self.proc.image_processor(images=ims)["image_grid_thw"].tolist() if ims else []
        merge = int(self.proc.image_processor.merge_size)
        counts = iter([1 if self.collapse_images else t * h * w // (merge * merge) for t, h, w in thw])
        out: list[int] = []
        for i in ids:
            out.extend([i] * next(counts) if i == self.image_pad else [i])
        return out

    def logprobs(self, ids: list[int], temperature: float | None = None) -> torch.Tensor:
        """log_softmax of the logits at every position of ``ids`` (row i predicts token i + 1); with
        ``temperature``, of the logits / T (``--logprobs-mode processed_logprobs``, its top-k / top-p filtering left
        out)."""
        with self.lock, torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits / temperature if temperature else logits, dim=-1)

    def position(self, row: torch.Tensor, target: int, k: int) -> tuple[dict[int, Logprob], list]:
        """One position as vLLM gathers it: the target's logprob and rank, then the top k (ranks 1..k)."""
        top = torch.topk(row, k) if k > 0 else None
        rank = int((row > row[target]).sum()) + 1
        out = {target: Logprob(float(row[target]), rank, self.tok.decode([target]))}
        pairs = [] if top is None else list(zip(top.indices.tolist(), top.values.tolist()))
        for r, (tid, lp) in enumerate(pairs, start=1):
            out.setdefault(tid, Logprob(float(lp), r, self.tok.decode([tid])))
        return out, pairs


#: What vLLM's SamplingParams held for the last request, by field (GET /_last_sampling: the tests read it)
LAST_SAMPLING: dict = {}
SAMPLING_FIELDS = ("prompt_logprobs", "logprobs", "temperature", "top_p", "top_k", "min_p", "max_tokens",
                   "skip_reading_prefix_cache")


def _seen(sp) -> None:
    LAST_SAMPLING.clear()
    LAST_SAMPLING.update({k: getattr(sp, k) for k in SAMPLING_FIELDS})


def completion(engine: Engine, req: CompletionRequest, name: str) -> CompletionResponse:
    sp = req.to_sampling_params(max_tokens=req.max_tokens or 16, default_sampling_params={})
    _seen(sp)
    ids = list(req.prompt)
    lp = engine.logprobs(ids)
    k = sp.prompt_logprobs or 0
    prompt_lps: list = [None] + [engine.position(lp[i - 1], ids[i], k)[0] for i in range(1, len(ids))]
    nxt = int(lp[-1].argmax())
    choice = CompletionResponseChoice(index=0, text=engine.tok.decode([nxt]), finish_reason="length",
                                      prompt_logprobs=prompt_lps if sp.prompt_logprobs is not None else None,
                                      prompt_token_ids=ids if req.return_token_ids else None)
    return CompletionResponse(model=name, choices=[choice],
                              usage=UsageInfo(prompt_tokens=len(ids), completion_tokens=1, total_tokens=len(ids) + 1))


def _text_messages(req: ChatCompletionRequest) -> tuple[list[dict], int]:
    msgs, images = [], 0
    for m in req.messages:
        m = dict(m)
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                part = dict(part)
                if part.get("type") == "text":
                    texts.append(part.get("text") or "")
                else:
                    images += 1
            m["content"] = "".join(texts)
        msgs.append(m)
    return msgs, images


def generate_tokens(engine: Engine, req: GenerateRequest, name: str) -> GenerateTokensResponse:
    """vLLM's token-in route: the ids as given, each image placeholder expanded for its ``content_parts`` image, then
    prompt logprobs over every position of the expanded prompt (``prompt_logprobs`` at the top, as vLLM's
    ``GenerateResponseBase``), its ``prompt_token_ids`` when asked."""
    sp = req.sampling_params
    _seen(sp)
    uris = [p["url"] for p in req.content_parts or [] if p.get("type") == "image_url"]
    ids = engine.expand(list(req.token_ids), uris)
    lp = engine.logprobs(ids)
    k = sp.prompt_logprobs or 0
    prompt_lps: list = [None] + [engine.position(lp[i - 1], ids[i], k)[0] for i in range(1, len(ids))]
    nxt = int(lp[-1].argmax())
    return GenerateTokensResponse(
        model=name, choices=[GenerateTokensChoice(index=0, finish_reason="length", token_ids=[nxt])],
        prompt_logprobs=prompt_lps if sp.prompt_logprobs is not None else None,
        prompt_token_ids=ids if req.return_token_ids else None,
        usage=UsageInfo(prompt_tokens=len(ids), completion_tokens=1, total_tokens=len(ids) + 1))


def chat(engine: Engine, req: ChatCompletionRequest, name: str) -> ChatCompletionResponse:
    sp = req.to_sampling_params(max_tokens=req.max_tokens or 4096, default_sampling_params={})
    _seen(sp)
    msgs, _ = _text_messages(req)
    prompt = engine.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False,
                                            **(req.chat_template_kwargs or {}))
    p_ids = engine.tok(prompt, add_special_tokens=False)["input_ids"]
    reply = agent_policy({"messages": json.dumps(msgs)})
    r_ids = engine.tok(reply, add_special_tokens=False)["input_ids"][: sp.max_tokens]
    lp = engine.logprobs(p_ids + r_ids, temperature=sp.temperature if engine.processed else None)
    content = None
    if sp.logprobs is not None:
        content = []
        for j, tid in enumerate(r_ids):
            row = lp[len(p_ids) + j - 1]
            _, pairs = engine.position(row, tid, sp.logprobs)
            text = engine.tok.decode([tid])
            content.append(ChatCompletionLogProbsContent(
                token=text, logprob=float(row[tid]), bytes=list(text.encode()),
                top_logprobs=[ChatCompletionLogProb(token=engine.tok.decode([t]), logprob=float(v),
                                                    bytes=list(engine.tok.decode([t]).encode())) for t, v in pairs]))
    text = engine.tok.decode(r_ids)
    reasoning, sep, answer = text.partition("</think>")  # vLLM's qwen3 reasoning parser: thinking, then content
    msg = ChatMessage(role="assistant", content=answer if sep else text, reasoning=reasoning if sep else None)
    choice = ChatCompletionResponseChoice(index=0, message=msg, finish_reason="stop",
                                          token_ids=r_ids if req.return_token_ids else None,
                                          logprobs=None if content is None else ChatCompletionLogProbs(content=content))
    return ChatCompletionResponse(model=name, choices=[choice], usage=UsageInfo(
        prompt_tokens=len(p_ids), completion_tokens=len(r_ids), total_tokens=len(p_ids) + len(r_ids)))


class Handler(BaseHTTPRequestHandler):
    server: "Server"
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        s = self.server
        if self.path == "/health":
            return self._send(200, b"")
        if self.path == "/_last_sampling":
            return self._send(200, json.dumps(LAST_SAMPLING).encode())
        if self.path == "/version":
            return self._send(200, json.dumps({"version": "0.33.0"}).encode())
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"object": "list", "data": [
                {"id": s.name, "object": "model", "root": s.root, "max_model_len": s.max_model_len}]}).encode())
        return self._send(404, b'{"error": "not found"}')

    def do_POST(self):
        s = self.server
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        with s.lock:
            s.bodies.append((self.path, body))
        if self.path == "/_restart_as":  # the tests' control: the same process as if started with other flags
            s.engine.processed = body.get("logprobs_mode") == "processed_logprobs"
            s.engine.scale_out = bool(body.get("enable_scale_out", True))
            s.engine.collapse_images = bool(body.get("collapse_images"))
            s.root = body.get("root") or s.model_dir
            return self._send(200, b"{}")
        kinds = {"/v1/completions": (CompletionRequest, completion), "/v1/chat/completions": (ChatCompletionRequest, chat),
                 "/inference/v1/generate": (GenerateRequest, generate_tokens)}
        if self.path not in kinds:
            return self._send(404, b'{"error": "not found"}')
        if self.path.startswith("/inference") and not s.engine.scale_out:  # vLLM's words (scale_out/factories.py)
            return self._send(403, json.dumps({"error": {
                "message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
                "type": "PermissionDeniedError", "code": 403}}).encode())
        model, answer = kinds[self.path]
        try:
            req = model.model_validate(body)
            if req.model not in (None, s.name):
                return self._send(404, json.dumps({"error": {"message": f"The model `{req.model}` does not exist.",
                                                             "type": "NotFoundError", "code": 404}}).encode())
            out = answer(s.engine, req, s.name)
        except (ValidationError, ValueError) as e:  # vLLM answers its validation errors with a 400
            return self._send(400, json.dumps({"error": {"message": str(e)[:2000], "type": "BadRequestError",
                                                         "code": 400}}).encode())
        return self._send(200, out.model_dump_json(exclude_none=True).encode())


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, model_dir: str, name: str, logprobs_mode: str = "raw_logprobs",
                 scale_out: bool = False, max_model_len: int = 32768):
        super().__init__(("127.0.0.1", port), Handler)
        self.engine = Engine(model_dir, logprobs_mode, scale_out)
        self.model_dir, self.name, self.root, self.max_model_len = model_dir, name, model_dir, max_model_len
        self.lock = threading.Lock()
        self.bodies: list = []


def main() -> None:
    ap = argparse.ArgumentParser(description="loopback vLLM stand-in for tests")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model-dir")
    ap.add_argument("--served-model-name", default="qwen3.5-tiny")
    ap.add_argument("--logprobs-mode", default="raw_logprobs", choices=("raw_logprobs", "processed_logprobs"))
    ap.add_argument("--enable-scale-out", action="store_true")
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--model")
    a, _ = ap.parse_known_args()
    weights = a.model_dir or a.model
    if not weights:
        ap.error("the weights: --model or --model-dir")
    srv = Server(a.port, weights, a.served_model_name, a.logprobs_mode, a.enable_scale_out, a.max_model_len)
    print(f"vllm stand-in serving {a.served_model_name} on http://127.0.0.1:{a.port}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
