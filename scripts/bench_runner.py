"""Benchmark: the runner's call rate against a fixed-latency SGLang stand-in, its decode cost, and storage.

    python scripts/bench_runner.py [--quick]

1. **Call rate** (``agent.run`` end to end: chat template, request, wire decode, tools, record). A stand-in
   for SGLang's native ``/generate`` runs in its own process (as a real server does) and answers every request
   after ``--latency`` seconds with a reply of exactly ``--reply-tokens`` tokens, each with 20 realistic
   alternatives (distinct ids, full-precision logprobs, as SGLang prints them); bodies are prepared once, so
   the stand-in costs next to no CPU. Each sample makes ``--calls`` calls (search tool calls through the
   offline world, then an answer); sample ids are random. With C samples in flight the ideal wall time is
   ceil(samples / C) x calls x latency; the ratio ideal / measured is printed for the whole command (target
   >= 0.90; it includes starting the runner processes) and for the serving span (first sample started to last
   sample finished, from the record's own timestamps: the rate once the processes are up). The stated
   load (the defaults): **64 in flight, 165-token replies, 3 s latency** (55 tokens/s per stream), with 1 and 2
   runner processes; then **256 in flight** with the default ``--processes auto``; then the real load at 256:
   **~1,000-token replies (18 s), each sample its own ~320 KB photo-sized JPEG**, ``--processes auto``
   (targets: >= 0.95 of the ideal, <= 20 us of runner CPU per generated token all-in).
2. **Decode cost**: the runner's path from a reply's bytes to the record's arrays (JSON parse, wire format,
   think split, token arrays) for a 1,000-token top-20 reply, in µs of CPU per generated token (target <= 20).
3. **Storage**: bytes per generated token of the token sidecar written by the runner's own writer, on
   realistic top-20 rows (``scripts/bench_data.py``: distinct Zipf-distributed ids; and the uniform-id worst
   case), float32 (target <= 100) and float16, with the grouped-entropy error float16 causes.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
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
        for _ in range(400):
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
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

    from agent import run as run_mod
    from agent.backends.tiny_model import ensure_tiny_model
    from agent.run import RunConfig, run

    run_mod._SHARED["freeze"] = True  # as python -m agent.run does (its process is the runner's)
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
            stamps = [json.loads(x) for x in (tmp / "run" / "results.jsonl").read_bytes().splitlines() if x.strip()]
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


# ---------------------------------------------------------------------------- 2. decode
def decode_cost(reply_tokens: int = 1000, reps: int = 20) -> dict:
    import gc

    from agent.backends.base import SamplingParams
    from agent.backends.sglang_native import SGLangBackend
    from agent.backends.tiny_model import ensure_tiny_model
    from agent.backends.wire import decode_generate_reply
    from agent.trajectory import token_arrays

    tiny = str(ensure_tiny_model(quiet=True))
    body = render_bodies(tiny, 2, reply_tokens)[0]
    b = SGLangBackend("http://127.0.0.1:9", tiny)
    sp = SamplingParams()
    prompt = "<|im_start|>assistant\n<think>\n"
    out = b.parse_generate(decode_generate_reply(body), sp, prompt)  # warm the decode cache (the runner's parse)
    gc.freeze()
    times = []
    for _ in range(reps):
        t = time.process_time()
        out = b.parse_generate(decode_generate_reply(body), sp, prompt)
        token_arrays(out, 20)
        times.append(time.process_time() - t)
    n = len(out.tokens)
    return {"tokens": n, "bytes": len(body), "us_per_token_median": float(np.median(times)) / n * 1e6,
            "us_per_token_min": min(times) / n * 1e6}


# ---------------------------------------------------------------------------- 3. storage
def storage(trajectories: int, ids: str, prompts: bool = False, qwen_ranks=None) -> dict:
    from bench_data import RowPool, write_run

    from agent.rundir import load_run
    from analysis.entropy import grouped_tail_entropy

    pool = RowPool(0, n_rows=1 << 17, ids=ids)
    res = {}
    for precision in ("float32", "float16"):
        tmp = Path(tempfile.mkdtemp(prefix="mmcf-store-"))
        try:
            pool.rng = np.random.default_rng(7)  # the same tokens for both precisions
            info = write_run(tmp, trajectories, pool, precision=precision, progress=False)
            r = {"tokens": info["tokens"], "sidecar_B_per_token": info["sidecar_bytes"] / info["tokens"],
                 "run_B_per_token": sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file()) / info["tokens"]}
            if precision == "float16":
                run = load_run(tmp)
                stored = np.concatenate([run.tokens(ln, ["top_logprobs"])["top_logprobs"] for ln in run.index])
                res["_f16"] = stored
            else:
                run = load_run(tmp)
                res["_f32"] = np.concatenate([run.tokens(ln, ["top_logprobs"])["top_logprobs"] for ln in run.index])
            res[precision] = r
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    err = np.abs(grouped_tail_entropy(res.pop("_f16")) - grouped_tail_entropy(res.pop("_f32")))
    res["float16"]["entropy_abs_err_max"] = float(err.max())
    res["float16"]["entropy_abs_err_mean"] = float(err.mean())
    if prompts:  # float32 again, the same tokens, with each call's prompt ids recorded as --backend sglang records them
        from agent.backends.sglang_native import SGLangBackend
        from agent.backends.tiny_model import ensure_tiny_model

        vocabularies = [("embedded", None)]
        if qwen_ranks:  # the same prompts tokenised with Qwen's vocabulary (scripts/bench_tokenize.py builds it)
            from bench_tokenize import read_ranks, tokenizer_from_ranks

            fast = tokenizer_from_ranks(read_ranks(qwen_ranks))._tokenizer
            vocabularies.append(("qwen", lambda piece: fast.encode_batch_fast([piece], add_special_tokens=False)[0].ids))
        # the history's text as bench_data writes it: random letter strings (each word new: many short tokens, a
        # real vocabulary's worst case) or windows of English prose; the generated tokens are the same either way
        for text in ("synthetic", "english"):
            for name, encode in vocabularies:
                b = SGLangBackend("http://127.0.0.1:9", str(ensure_tiny_model(quiet=True)))
                if encode is not None:
                    b._encode = encode
                tmp = Path(tempfile.mkdtemp(prefix="mmcf-store-"))
                try:
                    pool.rng = np.random.default_rng(7)
                    info = write_run(tmp, trajectories, pool, progress=False, prompts=b, text=text)
                    res["float32"][f"with_prompt_ids_{name}_{text}"] = info["sidecar_bytes"] / info["tokens"]
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    return res


# ---------------------------------------------------------------------------- main
def main() -> int:
    from agent.cli import make_parser

    ap = make_parser("python scripts/bench_runner.py", __doc__, [
        "python scripts/bench_runner.py             # everything (~12 min on 2 cores)",
        "python scripts/bench_runner.py --quick     # fewer samples per configuration (~4 min)"])
    ap.add_argument("--samples", type=int, default=512, help="samples at the stated load (8 waves of 64)")
    ap.add_argument("--concurrency", type=int, default=64, help="samples in flight at the stated load")
    ap.add_argument("--reply-tokens", type=int, default=165, help="tokens per reply at the stated load")
    ap.add_argument("--latency", type=float, default=3.0, help="seconds per call (165 tokens in 3 s = 55 tok/s per stream)")
    ap.add_argument("--calls", type=int, default=5, help="LLM calls per sample")
    ap.add_argument("--quick", action="store_true", help="a quarter of the samples in every configuration")
    ap.add_argument("--only", help="comma-separated parts: rate, decode, storage (default: all)")
    ap.add_argument("--seed", type=int, default=0, help="sample ids and token rows")
    ap.add_argument("--qwen-ranks", type=Path, default=None,
                    help="storage: also record the prompt ids with Qwen's vocabulary, from qwen.tiktoken or the dashscope "
                         "wheel holding it (pip download --no-deps dashscope==2.0.2; scripts/bench_tokenize.py)")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--bodies", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, a.latency, a.bodies, a.model_path)
        return 0
    parts = set((a.only or "rate,decode,storage").split(","))
    q = 4 if a.quick else 1
    print(f"machine: {os.cpu_count()} CPUs; python {sys.version.split()[0]}; the stand-in server runs on the same cores")
    if "decode" in parts:
        d = decode_cost()
        print(f"\n[decode] a {d['tokens']}-token reply with top-20 ({d['bytes'] / 1e3:.0f} KB of JSON) into the record's "
              f"arrays: {d['us_per_token_median']:.1f} us CPU per token (median of 20; min {d['us_per_token_min']:.1f})"
              f"  (target <= 20)")
    if "rate" in parts:
        configs = [
            ("stated load, 1 process", dict(samples=a.samples // q, concurrency=a.concurrency, processes=1,
                                           reply_tokens=a.reply_tokens), 0.90),
            ("stated load, 2 processes", dict(samples=a.samples // q, concurrency=a.concurrency, processes=2,
                                             reply_tokens=a.reply_tokens), 0.90),
            ("256 in flight, auto processes", dict(samples=4 * 256 // q if q == 1 else 512, concurrency=256,
                                                   processes="auto", reply_tokens=a.reply_tokens), 0.90),
            # the issue-24 load: ~1,000-token replies (18 s at 55 tokens/s), each sample its own ~320 KB photo
            ("256 in flight, ~1,000 tokens, photos, auto", dict(samples=2 * 256 // q if q == 1 else 256,
                                                               concurrency=256, processes="auto", reply_tokens=1000,
                                                               latency=18.0, image_kb=320), 0.95),
        ]
        print(f"\n[call rate] {a.calls} calls per sample, server latency {a.latency:g} s (18 s for ~1,000-token "
              "replies), SGLang native wire format, random sample ids")
        for name, kw, target in configs:
            kw.setdefault("latency", a.latency)
            r = call_rate(calls=a.calls, seed=a.seed, **kw)
            us = r["cpu_ms_per_call"] * 1e3 / max(r["tokens"] / r["calls"], 1)
            print(f"  {name:42s} {r['samples']:5d} samples x {a.calls} calls, {r['concurrency']:3d} in flight "
                  f"({r['processes_used']} process(es)), {r['reply_tokens']:4d}-token replies: {r['wall_s']:6.1f} s vs "
                  f"ideal {r['ideal_s']:5.0f} s -> ratio {r['ratio']:.3f}" + (f" (target >= {target:.2f})" if target else "")
                  + f"; serving span {r['span_s']:.1f} s -> {r['span_ratio']:.3f} (without process start-up)"
                  + f"; runner CPU {r['cpu_ms_per_call']:.1f} ms per call ({us:.1f} us per generated token, all-in"
                  + ("; target <= 20" if r["reply_tokens"] >= 1000 else "") + ")", flush=True)
    if "storage" in parts:
        print("\n[storage] the runner's writer on realistic top-20 rows (scripts/bench_data.py), 10 calls x ~1,000 "
              "tokens per trajectory")
        for ids in ("zipf", "uniform"):
            s = storage(40 // (2 if a.quick else 1), ids, prompts=ids == "zipf", qwen_ranks=a.qwen_ranks)
            f32, f16 = s["float32"], s["float16"]
            print(f"  ids {ids:8s}: float32 {f32['sidecar_B_per_token']:.1f} B/token in the sidecar "
                  f"({f32['run_B_per_token']:.1f} for the whole run dir), float16 {f16['sidecar_B_per_token']:.1f} "
                  f"({f16['run_B_per_token']:.1f}); float16 moves the grouped entropy by <= "
                  f"{f16['entropy_abs_err_max']:.1e} nats (mean {f16['entropy_abs_err_mean']:.1e}); "
                  f"{f32['tokens']:,} tokens", flush=True)
            for name, what in (("embedded", "the embedded tokenizer"), ("qwen", "Qwen's vocabulary (--qwen-ranks)")):
                got = {t: f32.get(f"with_prompt_ids_{name}_{t}") for t in ("synthetic", "english")}
                if got["synthetic"] is not None:
                    print(f"  ids {ids:8s}: float32 with each call's prompt ids recorded (a run through --backend "
                          f"sglang), tokenised by {what}: {got['synthetic']:.1f} B/token in the sidecar with the "
                          f"random-letter history text, {got['english']:.1f} with English prose", flush=True)
        print("  target: <= 100 B per generated token with top-20 float32 on realistic (zipf) ids")
    return 0


if __name__ == "__main__":
    sys.exit(main())
