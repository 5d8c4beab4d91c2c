"""Benchmark: the runner's call rate against a fixed-latency loopback server, and bytes stored per token.

    python scripts/bench_runner.py [--samples 512] [--concurrency 64] [--latency 3.0] [--calls 5] [--processes 2]

1. Call rate. A loopback server speaking SGLang's OpenAI-compatible wire format (tests/fakes) answers
   every request after ``--latency`` seconds (in its own process, as a real server is); a scripted
   policy makes each sample do ``--calls`` LLM calls (search tool calls through the offline world,
   then an answer), each reply ~165 tokens with top-20 logprobs. With C samples in flight the ideal
   rate is C / latency calls/s; the script prints the measured rate, the ratio (target >= 0.9) and
   the runner's CPU per call, which bounds the rate when latency is short (decoding top-20 JSON).
2. Storage. Trajectories with realistic token data (ids Zipf-distributed over a 248k vocabulary,
   top-20 logprobs from Dirichlet-like distributions) go through the real writer; prints bytes per
   generated token of the token sidecar and of the whole run directory, for float16 and float32
   storage (target <= 100 with top-20 kept), and the grouped-entropy error float16 storage causes.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.backends.base import LogprobSemantics, ModelOutput, TokenLogprob, TopLogprob, Usage  # noqa: E402
from agent.run import RunConfig, run  # noqa: E402
from agent.rundir import RunDir  # noqa: E402
from agent.tools.demo_world import ensure_demo_world  # noqa: E402
from analysis.entropy import grouped_tail_entropy  # noqa: E402


def make_benchmark(root: Path, n: int) -> Path:
    demo = ensure_demo_world() / "demo"
    rows = [json.loads(x) for x in (demo / "data_unified.jsonl").read_text().splitlines()]
    out = root / "bench"
    shutil.copytree(demo / "imgs", out / "imgs")
    with open(out / "data_unified.jsonl", "w") as f:
        for i in range(n):
            r = dict(rows[i % len(rows)], id=f"bench_{i}")
            f.write(json.dumps(r) + "\n")
    return out


def policy(calls: int):
    def reply(req):
        if "messages" in req:  # chat API
            n = sum(m["role"] == "assistant" for m in req["messages"])
        else:  # native /generate: the rendered prompt ends with the generation prompt's assistant turn
            n = req.get("text", "").count("<|im_start|>assistant") - 1
        if n < calls - 1:
            return ("Let me search for the entity in the picture and check the facts.</think>\n\n<tool_call>\n"
                    + json.dumps({"name": "search", "arguments": {"query": f"kestrel observatory {n}", "goal": "year"}})
                    + "\n</tool_call>")
        return "The pages agree on the founding year.</think>\n\n<answer>1911</answer>"
    return reply


@contextlib.contextmanager
def _server_process(args):
    """The loopback server in its own process (as a real server is): it must not share our GIL."""
    import socket
    import subprocess
    import urllib.request

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    cmd = [sys.executable, __file__, "--serve", str(port), "--latency", str(args.latency), "--calls", str(args.calls)]
    if args.tokenizer == "bpe":
        from agent.backends.tiny_model import ensure_tiny_model

        cmd += ["--server-tokenizer", str(ensure_tiny_model(quiet=True))]
    p = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        yield url
    finally:
        p.terminate()
        p.wait(10)


def serve(port: int, latency: float, calls: int, tokenizer: str | None) -> None:
    from tests.fakes.sglang_server import FakeServer

    srv = FakeServer(port, reply=policy(calls), latency_s=latency, tokenizer_dir=tokenizer)
    srv.serve_forever()


async def bench_rate(args) -> dict:
    import resource

    from agent.backends.tiny_model import ensure_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="mmcf-bench-"))
    try:
        bench = make_benchmark(tmp, args.samples)
        with _server_process(args) as url:
            kind = {"sglang": dict(backend="sglang", model_dir=str(ensure_tiny_model(quiet=True))),  # chat template
                    "openai": dict(backend="openai", model="fake-qwen3.5")}[args.backend]
            common = dict(benchmark=str(bench), endpoints=[url], progress=False, **kind)
            # warm-up: one sample, so the first connection and imports are not timed
            await run(RunConfig(method="react", out=str(tmp / "warm"), limit=1, **common), [])
            cfg = RunConfig(method="react", out=str(tmp / "run"), concurrency=args.concurrency,
                            processes=args.processes, **common)
            t0, c0 = time.perf_counter(), time.process_time()
            ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            s = await run(cfg, [])
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if args.processes > 1:  # the work is in the worker processes (the server is still running)
                cpu = (ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime)
        calls = s["llm_calls"]
        if s["counts"] != {"ok": args.samples}:
            raise SystemExit(f"benchmark run did not finish cleanly: {s['counts']}")
        waves = -(-args.samples // args.concurrency)
        ideal_wall = waves * args.calls * args.latency
        return {"samples": args.samples, "concurrency": args.concurrency, "latency_s": args.latency,
                "llm_calls": calls, "wall_s": wall, "rate": calls / wall, "ideal_rate": calls / ideal_wall,
                "ratio": ideal_wall / wall, "statuses": s["counts"], "cpu_ms_per_call": cpu / calls * 1000,
                "tokens_per_call": s.get("generated_tokens", 0) / max(calls, 1)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _Sample:
    def __init__(self, i):
        self.id, self.benchmark, self.category, self.paper_category = f"s{i}", "bench", None, "x"
        self.question, self.answer, self.image_paths = "q?", "a", []


def synthetic_output(rng, n_tokens: int, k: int = 20, vocab: int = 248_000) -> ModelOutput:
    ids = np.minimum(rng.zipf(1.2, size=(n_tokens, k)), vocab) - 1
    alpha = rng.choice([0.05, 0.3, 1.0], size=n_tokens)
    toks = []
    for i in range(n_tokens):
        p = np.sort(rng.dirichlet(np.full(200, alpha[i])))[::-1][:k]
        lp = np.log(np.maximum(p, 1e-30))
        top = [TopLogprob(int(ids[i, j]), "", float(lp[j])) for j in range(k)]
        toks.append(TokenLogprob(int(ids[i, 0]), "", float(lp[0]), top, think=i < 0.8 * n_tokens))
    return ModelOutput(text="", reasoning="", tokens=toks, finish_reason="stop", usage=Usage(100, n_tokens),
                       semantics=LogprobSemantics("raw"), backend="synthetic", model="synthetic")


def bench_storage(args) -> dict:
    from agent.trajectory import Trajectory

    rng = np.random.default_rng(0)
    outs = [synthetic_output(rng, int(rng.integers(300, 1500))) for _ in range(args.storage_calls)]
    res = {}
    for precision in ("float16", "float32"):
        tmp = Path(tempfile.mkdtemp(prefix="mmcf-store-"))
        try:
            rd = RunDir(tmp, precision)
            rd.write_header({"method": "bench"})
            n_tok = 0
            for s in range(args.storage_calls // 10):
                traj = Trajectory(_Sample(s), 0, "react")
                for out in outs[s * 10:(s + 1) * 10]:
                    traj.llm_call([{"role": "user", "content": "q?"}], out, state="react")
                    n_tok += len(out.tokens)
                rd.append(traj, traj.to_line("ok", "a"))
            side = sum(p.stat().st_size for p in (tmp / "tokens").iterdir())
            total = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
            res[precision] = {"tokens": n_tok, "sidecar_bytes_per_token": side / n_tok, "run_bytes_per_token": total / n_tok}
            if precision == "float16":
                from agent.rundir import load_run

                run_ = load_run(tmp)
                stored = np.concatenate([run_.tokens(ln)["top_logprobs"] for ln in run_.lines]).astype(np.float64)
                exact = np.concatenate([np.array([[t.logprob for t in tok.top] for tok in o.tokens])
                                        for o in outs[: (args.storage_calls // 10) * 10]])
                err = np.abs(grouped_tail_entropy(stored) - grouped_tail_entropy(exact))
                res[precision]["entropy_abs_err_max"] = float(err.max())
                res[precision]["entropy_abs_err_mean"] = float(err.mean())
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return res


def main() -> int:
    from agent.cli import make_parser

    ap = make_parser("python scripts/bench_runner.py", __doc__, [
        "python scripts/bench_runner.py", "python scripts/bench_runner.py --processes 1 --samples 128 --backend openai"])
    ap.add_argument("--samples", type=int, default=512, help="enough waves that process start-up is amortised")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--latency", type=float, default=3.0,
                    help="seconds per call (3 s for ~165 tokens = 55 tok/s per stream, 3.5k tok/s over 64 streams)")
    ap.add_argument("--calls", type=int, default=5, help="LLM calls per sample")
    ap.add_argument("--storage-calls", type=int, default=200, help="synthetic calls for the storage measurement")
    ap.add_argument("--processes", type=int, default=2,
                    help="runner processes (agent.run --processes; the setting recommended for 64 samples in flight)")
    ap.add_argument("--backend", default="sglang", choices=("sglang", "openai"),
                    help="sglang = native /generate (SGLangBackend: triples only); openai = /v1/chat/completions "
                         "(OpenAIBackend, whose replies also carry logprobs.content: ~4x the bytes)")
    ap.add_argument("--tokenizer", default="bpe", choices=("bpe", "char"),
                    help="how the stand-in server tokenizes replies: the tiny model's BPE (~50 tokens per reply) "
                         "or one token per character (~165 tokens: 3x the JSON per call)")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--server-tokenizer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.latency, args.calls, args.server_tokenizer)
        return 0
    print(f"machine: {os.cpu_count()} CPUs; python {sys.version.split()[0]}")
    r = bench_rate(args)
    r = asyncio.run(r)
    print(f"\n[call rate] {r['samples']} samples x {args.calls} calls, concurrency {r['concurrency']}, "
          f"server latency {r['latency_s']:.2f}s, --backend {args.backend}, {args.processes} runner process(es)")
    print(f"  measured {r['rate']:.1f} calls/s over {r['wall_s']:.2f}s; ideal {r['ideal_rate']:.1f} calls/s")
    print(f"  ratio measured/ideal = {r['ratio']:.3f}  (target >= 0.90)  statuses={r['statuses']}")
    print(f"  runner CPU per call: {r['cpu_ms_per_call']:.1f} ms for {r['tokens_per_call']:.0f} tokens with top-20 "
          f"({r['cpu_ms_per_call'] / max(r['tokens_per_call'], 1) * 1000:.0f} us/token, mostly JSON decoding); with a "
          f"fixed latency all replies of a wave arrive together and are decoded one after another")
    s = bench_storage(args)
    print("\n[storage] synthetic top-20 tokens over a 248k vocabulary")
    for prec, v in s.items():
        extra = (f"; grouped-entropy |error| from float16 storage: max {v['entropy_abs_err_max']:.2e}, "
                 f"mean {v['entropy_abs_err_mean']:.2e} nats") if "entropy_abs_err_max" in v else ""
        print(f"  {prec}: {v['sidecar_bytes_per_token']:.1f} B/token in the sidecar, "
              f"{v['run_bytes_per_token']:.1f} B/token for the run dir ({v['tokens']} tokens){extra}")
    print("  target: <= 100 B per generated token with top-20 kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
