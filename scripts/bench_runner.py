"""The runner's call rate against the ideal, at 64 and 256 samples in flight, with a fixed-latency SGLang stand-in.

    python scripts/bench_runner.py [--samples 512] [--latency 3]

``agent.run`` end to end (chat template, request, wire decode, tools, record) against a stand-in for SGLang's
native ``/generate`` in its own process, answering every request after ``--latency`` seconds with a reply of
``--reply-tokens`` tokens, each with 20 alternatives (bodies prepared once: the stand-in costs next to no CPU).
Each sample makes ``--calls`` calls (search tool calls through the offline world, then an answer). With C samples
in flight the ideal wall time is ceil(samples / C) x calls x latency; printed: ideal / measured for the whole
command and for the serving span (first sample started to last finished: without process start-up), and the
runner's CPU per call.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

ASSISTANT = b"<|im_start|>assistant"


# ---------------------------------------------------------------------------- the stand-in server
def reply_texts(calls: int) -> list[str]:
    """What the model says at each step: search tool calls, then an answer (the run's policy)."""
    out = []
    for n in range(calls):
        if n < calls - 1:
            out.append("</think>\n\n<tool_call>\n" + json.dumps({"name": "search", "arguments": {
                "query": f"kestrel observatory {n}", "goal": "year"}}) + "\n</tool_call>")
        else:
            out.append("</think>\n\n<answer>1911</answer>")
    return out


def render_bodies(tokenizer_dir: str, calls: int, reply_tokens: int, seed: int = 0) -> list[bytes]:
    """One /generate body per step: ``reply_tokens`` tokens (reasoning filler, then the step's action), each
    with a realistic top-20 list (the chosen token first), every logprob a full-precision float."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    rng = np.random.default_rng(seed)
    vocab = len(tok)
    words = ["the", " image", " shows", " a", " building", ",", " which", " I", " should", " search", " for", "."]
    bodies = []
    for n, action in enumerate(reply_texts(calls)):
        act_ids = tok(action, add_special_tokens=False)["input_ids"]
        filler = []
        while len(filler) < max(0, reply_tokens - len(act_ids)):
            filler += tok(words[len(filler) % len(words)], add_special_tokens=False)["input_ids"]
        ids = filler[: max(0, reply_tokens - len(act_ids))] + act_ids
        text = tok.decode(ids, skip_special_tokens=False)
        g = rng.gamma(np.exp(rng.uniform(np.log(0.02), np.log(2.0), size=(len(ids), 1))), size=(len(ids), 64))
        lp = np.log(-np.sort(-(g / g.sum(axis=1, keepdims=True)), axis=1)[:, :20]).astype(np.float32).astype(float)
        tops, outs = [], []
        for i, t in enumerate(ids):
            alt = [t] + [int(x) for x in rng.choice(vocab, size=25, replace=False) if x != t][:19]
            tops.append([[float(lp[i, j]), alt[j], None] for j in range(20)])
            outs.append([float(lp[i, 0]), t, None])
        body = {"text": text, "output_ids": ids, "meta_info": {
            "id": uuid.uuid4().hex, "finish_reason": {"type": "stop", "matched": 151645}, "prompt_tokens": 2000,
            "completion_tokens": len(ids), "cached_tokens": 1800, "weight_version": "default", "e2e_latency": 3.0,
            "input_token_logprobs": [[None, 1, None]], "input_top_logprobs": [None],
            "output_token_logprobs": outs, "output_top_logprobs": tops}}
        bodies.append(json.dumps(body).encode())
    return bodies


def serve(port: int, latency: float, bodies_file: str, model_path: str) -> None:
    """The stand-in: /generate answers after ``latency`` s with the body of the step the prompt is at."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bodies = json.loads(Path(bodies_file).read_text())
    bodies = [b.encode() for b in bodies]
    info = json.dumps({"model_path": model_path, "tokenizer_path": model_path, "is_generation": True,
                       "weight_version": "default", "has_image_understanding": True}).encode()
    models = json.dumps({"object": "list", "data": [{"id": model_path, "object": "model"}]}).encode()
    server_info = json.dumps({"model_path": model_path, "enable_deterministic_inference": False}).encode()

    # the runner sends token ids (agent/backends/sglang_native.py): the prompt's assistant turns are the ids of
    # "<|im_start|>assistant" side by side in the body's JSON array (a text prompt is counted as text)
    import re

    from transformers import AutoTokenizer

    turn = AutoTokenizer.from_pretrained(model_path)(ASSISTANT.decode(), add_special_tokens=False)["input_ids"]
    turn_ids = re.compile(rb"[\[,]" + b",".join(b"%d" % i for i in turn) + rb"[,\]]")

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, body: bytes, code: int = 200):
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send({"/get_model_info": info, "/v1/models": models, "/server_info": server_info}.get(self.path, b"{}"))

        def do_POST(self):
            req = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            # the prompt ends with the generation prompt's assistant turn
            n = max(0, req.count(ASSISTANT) + len(turn_ids.findall(req)) - 1)
            time.sleep(latency)
            self._send(bodies[min(n, len(bodies) - 1)])

    class S(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024

    S(("127.0.0.1", port), H).serve_forever()


@contextlib.contextmanager
def stand_in(latency: float, bodies: list[bytes], model_path: str):
    import socket
    import urllib.request

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    f = Path(tempfile.mkstemp(suffix=".json")[1])
    f.write_text(json.dumps([b.decode() for b in bodies]))
    p = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--latency", str(latency),
                          "--bodies", str(f), "--model-path", model_path])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600  # a guard against a server that never comes up, not a speed
        while True:
            if p.poll() is not None:
                raise SystemExit(f"the stand-in at {url} exited ({p.returncode}) before answering /v1/models")
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit(f"the stand-in at {url} did not answer /v1/models within 600 s") from None
                time.sleep(0.1)
        yield url
    finally:
        p.terminate()
        p.wait(10)
        f.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- 1. call rate
def make_benchmark(root: Path, n: int, seed: int, image_kb: int | None = None) -> Path:
    """n demo questions with random ids; ``image_kb``: each sample's query image replaced by its own distinct
    photo-sized JPEG of about that size (scripts/bench_data.py's ``photo_image``: 1024 x 768), as real benchmark
    samples each carry their own (the demo world's drawings are a few KB and flatter the runner)."""
    from agent.tools.demo_world import ensure_demo_world

    demo = ensure_demo_world() / "demo"
    rows = [json.loads(x) for x in (demo / "data_unified.jsonl").read_text().splitlines()]
    out = root / "bench"
    shutil.copytree(demo / "imgs", out / "imgs")
    rng = np.random.default_rng(seed)
    with open(out / "data_unified.jsonl", "w") as f:
        for i in range(n):  # random ids: no accidental balance between worker processes
            row = dict(rows[i % len(rows)], id=f"q{rng.integers(1 << 62):x}")
            if image_kb:
                from bench_data import photo_image

                p = photo_image(root, i, image_kb)
                shutil.move(str(p), str(out / "imgs" / p.name))
                row["query_images"] = [p.name]
            f.write(json.dumps(row) + "\n")
    return out


def call_rate(*, samples: int, concurrency: int, processes: int | str, calls: int, latency: float, reply_tokens: int,
              seed: int, image_kb: int | None = None) -> dict:
    import resource

    from agent.backends.tiny_model import ensure_tiny_model
    from agent.run import RunConfig, run
    from agent.rundir import RunDir

    tiny = str(ensure_tiny_model(quiet=True))
    bodies = render_bodies(tiny, calls, reply_tokens, seed)
    tmp = Path(tempfile.mkdtemp(prefix="mmcf-bench-"))
    try:
        bench = make_benchmark(tmp, samples, seed, image_kb)
        with stand_in(latency, bodies, tiny) as url:
            common = dict(benchmark=str(bench), endpoints=[url], progress=False, backend="sglang", model_dir=tiny)
            # the tool cache and the first connection are warmed by one sample that is not timed
            asyncio.run(run(RunConfig(method="react", out=str(tmp / "warm"), limit=1, **common), []))
            cfg = RunConfig(method="react", out=str(tmp / "run"), concurrency=concurrency, processes=processes,
                            tool_cache=str(tmp / "warm" / "tools.sqlite"), **common)
            t0 = time.perf_counter()
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            s = asyncio.run(run(cfg, []))
            wall = time.perf_counter() - t0
            # the serving span: first sample started -> last sample finished (what the runner does once its
            # processes are up; the whole command above also holds their start-up)
            stamps = RunDir(tmp / "run").index()
            span = max(x["finished"] for x in stamps) - min(x["started"] for x in stamps)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) + \
            (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)  # worker processes, if any (waited for)
        if s["counts"] != {"ok": samples}:
            raise SystemExit(f"benchmark run did not finish cleanly: {s['counts']} ({s.get('first_error')})")
        n_calls = s["llm_calls"]
        ideal = -(-samples // concurrency) * calls * latency
        used = json.loads((tmp / "run" / "header.json").read_text()).get("processes")
        return {"samples": samples, "concurrency": concurrency, "processes": processes, "processes_used": used,
                "reply_tokens": reply_tokens,
                "wall_s": wall, "ideal_s": ideal, "ratio": ideal / wall, "span_s": span, "span_ratio": ideal / span,
                "calls": n_calls,
                "cpu_ms_per_call": cpu / n_calls * 1e3, "tokens": s.get("generated_tokens", 0)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=512, help="samples per configuration")
    ap.add_argument("--reply-tokens", type=int, default=165, help="tokens per reply")
    ap.add_argument("--latency", type=float, default=3.0, help="seconds per call (165 tokens in 3 s = 55 tok/s)")
    ap.add_argument("--calls", type=int, default=5, help="LLM calls per sample")
    ap.add_argument("--seed", type=int, default=0, help="sample ids")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--bodies", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, a.latency, a.bodies, a.model_path)
        return 0
    for concurrency in (64, 256):
        r = call_rate(samples=max(a.samples, 2 * concurrency), concurrency=concurrency, processes="auto",
                      calls=a.calls, latency=a.latency, reply_tokens=a.reply_tokens, seed=a.seed)
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
