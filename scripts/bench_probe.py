"""The entropy probe's client cost on the HTTP path, against the honest floor of the same bytes, at the defaults.

    python scripts/bench_probe.py [--scales 30,300] [--reply-tokens 1000] [--against REV]
    python scripts/bench_probe.py --fault dead|hung [--trajectories 300]

What a user with a GPU node runs: ``python -m probes.entropy RUN --mode teacher-forced --backend sglang
--endpoint URL --model-dir DIR``, at its default concurrency (128 trajectories in flight per server: one endpoint
128, two endpoints 256). The servers are the loopback SGLang stand-in (serving/fakes/sglang_server.py), each in its
own process, replying to every ``/generate`` with a ~``--reply-tokens`` reply and top-20 alternatives per token in
SGLang's native JSON; the run is paper-shaped (scripts/bench_data.py: 10 calls of ~1,000 tokens per trajectory, a
distinct ~320 KB photo-sized query image each). Each probe runs as one process; its CPU time comes from the kernel
(``os.wait4``) and its peak memory from its own ``/proc/self/status`` VmHWM at exit (a child's ``ru_maxrss``
starts from its parent's high-water mark under vfork, so the bench's own memory would be counted). Printed:

- **client CPU per step** (marginal between the two scales, so start-up drops out);
- **against the floor**: what no client can skip in a step, measured on the run's own steps: both scoring
  requests serialised and sent, their replies read, and each reply decoded once, cold, into arrays (JSON, then
  the top-20 triples);
- **what a step is made of**, back to back on the run's first 60 steps at the end: the floor, the same exchange
  through httpx's and aiohttp's asynchronous clients and through the toolkit's own (``request_json`` over the model
  servers' client), one request at a time (each one's own cost), and the probe's own work
  beyond the exchange (``probe_step`` with both replies served from memory); the floor is also sampled before each
  probe run, and the ratio above takes the median (the machine's speed moves within a run);
- **its share of a GPU step** per backbone by the FLOPs model of docs/performance.md (a teacher-forced step
  prefills its two scored continuations, the prompts cached: 2 x ``--reply-tokens`` tokens);
- **peak memory** at each scale and in-flight count;
- with ``--against REV``: the same command from commit REV's tree on the same run, in turn, and the paired ratio.

``--fault``: the probe at 128 in flight, its server killed (``dead``) or stopped with SIGSTOP (``hung``: no reply and
no health answer) after 500 steps; prints how long the probe took to end after it, its exit code and the steps kept.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

#: The FLOPs model of docs/performance.md (probes/prefix_cache/): tokens a GPU-second per backbone at H20's
#: 148 TFLOPS x 0.4 MFU, 2 x active parameters a token.
ACTIVE_PARAMS = {"9B": 9e9, "27B": 27e9, "35B-A3B": 3e9}
TOKENS_PER_GPU_S = {k: 148e12 * 0.4 / (2 * p) for k, p in ACTIVE_PARAMS.items()}

#: Run a module as ``python -m``, writing its own peak RSS (VmHWM, kB) to $MMCF_BENCH_HWM at exit.
HWM_WRAPPER = """
import atexit, os, runpy, sys
def _hwm(path=os.environ["MMCF_BENCH_HWM"]):
    with open("/proc/self/status") as f:
        kb = next(x for x in f if x.startswith("VmHWM")).split()[1]
    with open(path, "w") as f:
        f.write(kb)
atexit.register(_hwm)
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc, timeout: float = 600.0) -> None:
    """Until the stand-in at ``url`` answers /health (a deadline, not a speed: a loaded machine takes long)."""
    t = time.time()
    while time.time() - t < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the stand-in at {url} exited: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
        try:
            urllib.request.urlopen(url + "/health", timeout=5)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the stand-in at {url} did not answer /health within {timeout:.0f} s")


def tree_at(rev: str, where: Path) -> Path:
    """Commit ``rev``'s files (``git archive``) unpacked in ``where``."""
    where.mkdir(parents=True)
    arc = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev], capture_output=True, check=False)
    if arc.returncode:
        raise SystemExit(f"--against {rev}: git archive failed: {arc.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(where)], input=arc.stdout, check=True)
    return where


def run_measured(module_args: list[str], env: dict, cwd: Path) -> tuple[int, str, float, float]:
    """(exit code, stderr, CPU seconds user + system, peak RSS MB) of ``python -m`` ``module_args``: CPU from the
    kernel (os.wait4), the peak from the process's own VmHWM."""
    with tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile(suffix=".hwm") as hwm:
        p = subprocess.Popen([sys.executable, "-c", HWM_WRAPPER, *module_args], cwd=cwd, stdout=subprocess.DEVNULL,
                             stderr=err, env={**env, "MMCF_BENCH_HWM": hwm.name})
        _, status, ru = os.wait4(p.pid, 0)
        err.seek(0)
        kb = Path(hwm.name).read_text().strip()
        return os.waitstatus_to_exitcode(status), err.read().decode("utf-8", "replace"), \
            ru.ru_utime + ru.ru_stime, int(kb) / 1024 if kb else float("nan")


#: The floor's steps: the first trajectories of the run (10 steps each), sampled before every probe run and after.
FLOOR_TRAJECTORIES = 6


def step_requests(root: Path, url: str, tiny: str, trajectories: int) -> list:
    """The run's first ``trajectories`` teacher-forced steps as the probe sends them: per step, both scoring
    requests ``[(payload, ids), (payload, ids)]`` (built here, before any timing)."""
    from agent.backends.base import Continuation
    from agent.backends.messages import strip_query_images
    from agent.backends.sglang_native import SGLangBackend
    from agent.record import LlmCall
    from agent.rundir import load_run

    run = load_run(root)
    b = SGLangBackend(url, tiny)
    work = []
    for summary in run.index[:trajectories]:
        line = run.full(summary)
        tok = run.tokens(line, ["call", "id"])
        for ev in (e for e in line.events if isinstance(e, LlmCall)):
            ids = [int(i) for i in tok["id"][tok["call"] == ev.index]]
            msgs = run.sendable_messages(line, ev)
            work.append([(b.score_payload(m, Continuation(ids=ids))[0], ids)
                         for m in (msgs, strip_query_images(msgs))])
    return work


def floor(work: list, url: str, tiny: str) -> dict:
    """CPU ms a step cannot skip, on the run's own teacher-forced steps (``work``: :func:`step_requests`): both
    scoring requests serialised and sent, their replies read and each decoded once, cold, into arrays; through the
    plainest correct exchange, the standard library's ``http.client``, one request at a time on one kept-alive
    connection (no pool, no event loop: what no client can go below)."""
    import http.client
    from urllib.parse import urlsplit

    from agent.backends.sglang_native import SGLangBackend
    from agent.backends.wire import decode_generate_reply
    from agent.jsonio import dumps

    b, where = SGLangBackend(url, tiny), urlsplit(url)
    per_step, sent, got = [], 0, 0
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=600)
    try:
        for step in work:
            t = time.process_time()
            for payload, ids in step:
                body = dumps(payload)
                conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                reply = r.read()
                if r.status != 200:
                    raise SystemExit(f"bench: the stand-in answered {r.status} to a scoring request: {reply[:300]!r}")
                b.parse_score(decode_generate_reply(reply), ids, k=20)
                sent, got = sent + len(body), got + len(reply)
            per_step.append(time.process_time() - t)
    finally:
        conn.close()
    n = len(per_step)
    return {"ms_per_step": 1000 * statistics.mean(per_step), "steps": n,
            "request_mb": sent / 2 / n / 1e6, "reply_mb": got / 2 / n / 1e6}


#: The asynchronous exchanges :func:`client_exchange` measures: each library on its own, and the toolkit's exchange
#: (agent.http.request_json over the model servers' client: retries, deadline, liveness watch, pieces written).
EXCHANGES = ("httpx", "aiohttp", "toolkit")


def client_exchange(work: list, url: str, tiny: str, kind: str) -> float:
    """:func:`floor`'s exchange through an asynchronous client (what a probe with 128 requests in flight must use),
    still one request at a time: CPU ms a step; its excess over the floor is that client's own cost. ``kind``: one
    of :data:`EXCHANGES`."""
    import asyncio

    from agent.backends.sglang_native import SGLangBackend
    from agent.backends.wire import decode_generate_reply
    from agent.jsonio import dumps

    b = SGLangBackend(url, tiny)
    hdrs = {"Content-Type": "application/json"}

    async def go() -> float:
        if kind == "httpx":
            import httpx
            c = httpx.AsyncClient(trust_env=False, timeout=600)

            async def one(payload):
                return (await c.post(url + "/generate", content=dumps(payload), headers=hdrs)).content
        elif kind == "aiohttp":
            import aiohttp
            c = aiohttp.ClientSession()

            async def one(payload):
                async with c.post(url + "/generate", data=dumps(payload), headers=hdrs) as r:
                    return await r.read()
        else:
            from agent.http import request_json
            from agent.model_http import ModelClient
            c = ModelClient()

            async def one(payload):  # the reply decoded below, as the others: request_json's own parse left out
                return await request_json(c, "POST", url + "/generate", json_body=payload, decode=bytes,
                                          liveness=url + "/health")
        try:
            t = time.process_time()
            for step in work:
                for payload, ids in step:
                    b.parse_score(decode_generate_reply(await one(payload)), ids, k=20)
            return time.process_time() - t
        finally:
            await (c.aclose() if hasattr(c, "aclose") else c.close())
    return 1000 * asyncio.run(go()) / len(work)


def own_work(root: Path, url: str, tiny: str, trajectories: int) -> float:
    """The probe's own CPU ms a step beyond the exchange: each step of the run's first ``trajectories`` probed as
    the probe does (``probes.entropy.step.probe_step``: both requests built, the recorded prompt ids lent; the
    entropies, bounds, KL and alternatives; the token store; the row checked and sealed) with both scoring
    replies served from memory, already decoded (a first, untimed pass gets them from the server)."""
    import asyncio
    from collections import deque

    from agent.backends.sglang_native import SGLangBackend
    from agent.record import LlmCall, validate
    from agent.rundir import load_run, token_key
    from agent.rundir.lines import SOURCE_KEY, seal
    from probes.entropy.step import StepContext, probe_step, vocab_of
    from probes.entropy.store import TokenStore
    from probes.session import RecordedPrompts

    class Replay(SGLangBackend):
        """Scores from the server once (``replies`` filled), then from ``replies`` (the request still built)."""
        record = True

        async def score(self, messages, continuation, *, top_logprobs=20, **kw):
            if self.record:
                self.replies.append(await super().score(messages, continuation, top_logprobs=top_logprobs, **kw))
                return self.replies[-1]
            self.score_payload(messages, continuation, top_logprobs=top_logprobs)
            if not self.replies:
                raise SystemExit("bench: the timed pass asked for more replies than the recording pass got")
            return self.replies.popleft()

    run, b = load_run(root), Replay(url, tiny)
    b.replies = deque()
    vocab, recorded = vocab_of(b), RecordedPrompts(b)

    async def one_pass(store: TokenStore) -> int:
        n = 0
        for summary in run.index[:trajectories]:
            line = run.full(summary)
            tok = run.tokens(line, ["call", "think", "id"])
            give_back, ctx = recorded.lend(run, line), StepContext(run, line, tok, b, "teacher-forced", vocab)
            key = token_key(line.sample_id, line.trial)
            try:
                for ev in (e for e in line.events if isinstance(e, LlmCall)):
                    row, t = await probe_step(ctx, ev)
                    store.append(key, ev.index, t)
                    row[SOURCE_KEY] = line.line_sha256
                    validate("entropy_step", row, key)
                    seal(row)
                    n += 1
            finally:
                give_back()
            store.commit(key)
        return n

    with tempfile.TemporaryDirectory() as d:
        asyncio.run(one_pass(TokenStore(Path(d) / "record")))
        b.record = False
        t = time.process_time()
        n = asyncio.run(one_pass(TokenStore(Path(d) / "tokens")))
        asyncio.run(b.aclose())
        if b.replies:
            raise SystemExit(f"bench: {len(b.replies)} recorded replies were not replayed")
        return 1000 * (time.process_time() - t) / n


def tiny_reply(tiny: str, n_tokens: int) -> str:
    """A think block and an answer of about ``n_tokens`` tokens of the tiny model's tokenizer."""
    from agent.backends.local import load_chat_renderer

    tok = load_chat_renderer(tiny)
    words = "the image shows a building with a tower and we should search for its name before the answer".split()

    def make(n):
        return "<think>\n" + " ".join(words[i % len(words)] for i in range(n)) + "\n</think>\n\n<answer>1911</answer>"

    n = n_tokens
    for _ in range(4):
        n = max(1, round(n * n_tokens / len(tok(make(n))["input_ids"])))
    return make(n)


def bench_model() -> str:
    """The tiny model with Qwen3.5's vocabulary (248,320 ids; scripts/bench_data.py ``bench_model``): the recorded
    ids and the stand-in's alternatives spread over all of it, so no cache of token texts is hot by construction."""
    import bench_data

    from agent.backends.tiny_model import ensure_tiny_model

    return bench_data.bench_model(str(ensure_tiny_model(quiet=True)), REPO / ".cache" / "bench-model")


def _stand_in(tiny: str, reply: str):
    import bench_data

    port = free_port()
    p = subprocess.Popen([sys.executable, str(REPO / "serving" / "fakes" / "sglang_server.py"), "--port", str(port),
                          "--tokenizer", tiny, "--model-name", tiny, "--reply", reply, "--keep-alive",
                          "--alternatives-vocab", str(bench_data.VOCAB)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return f"http://127.0.0.1:{port}", p


def measure(scales: list[int], reply_tokens: int, against: list[str], endpoints: tuple[int, ...] = (1, 2, 3)) -> dict:
    """The probe at each scale, at its default concurrency over each number of ``endpoints`` (and each --against
    tree, in turn, on one endpoint); returns the rows and the floor. Each row carries its paired floor: the mean of
    the floors sampled just before and just after its own run (the machine's speed moves within a bench)."""
    import bench_data

    from agent.backends.sglang_native import SGLangBackend

    tiny = bench_model()
    reply = tiny_reply(tiny, reply_tokens)
    servers = [_stand_in(tiny, reply) for _ in range(max(endpoints))]
    urls = [u for u, _ in servers]
    rows, samples, parts, work, work_root = [], [], {}, None, None
    try:
        for u, p in servers:
            wait_up(u, p)
        with tempfile.TemporaryDirectory() as d:
            pool = bench_data.RowPool(seed=0, n_rows=1 << 16)
            trees = {"today": REPO, **{f"@{r}": tree_at(r, Path(d) / f"tree-{r}") for r in against}}
            for n in scales:
                root = Path(d) / f"run{n}"
                bench_data.write_run(root, n, pool, progress=False, distinct_images=True,
                                     prompts=SGLangBackend(urls[0], tiny))
                runs = [(name, tree, 1) for name, tree in trees.items()]  # in turn on the same run: paired
                runs += [("today", REPO, e) for e in endpoints if e > 1]
                if work is None:  # the floor's steps: the first run's, for every sample and part
                    work, work_root = step_requests(root, urls[0], tiny, FLOOR_TRAJECTORIES), root
                for name, tree, e in runs:
                    samples.append(floor(work, urls[0], tiny))  # before each probe: the machine's speed drifts
                    out = root / "probes" / f"tf-{name}-{e}"
                    args = ["probes.entropy", str(root), "--backend", "sglang", "--model-dir", tiny, "--force",
                            "--no-progress", "--mode", "teacher-forced", "--out", str(out), "--skip-fidelity"]
                    args += [x for u in urls[:e] for x in ("--endpoint", u)]
                    code, err, cpu, rss = run_measured(args, {**os.environ, "PYTHONPATH": str(tree)}, tree)
                    if code:
                        raise SystemExit(f"probe failed ({code}): {err[-3000:]}")
                    steps = sum(1 for _ in open(out / "steps.jsonl", "rb"))
                    rows.append({"code": name, "endpoints": e, "in_flight": min(n, 128 * e), "trajectories": n,
                                 "steps": steps, "cpu_s": cpu, "peak_rss_mb": rss})
            # the parts of a step, back to back on the same steps: what the ratio is made of
            samples.append(floor(work, urls[0], tiny))
            for i, row in enumerate(rows):  # sample i was taken just before run i, sample i + 1 just after it
                row["floor_ms"] = (samples[i]["ms_per_step"] + samples[i + 1]["ms_per_step"]) / 2
            parts = {"floor": samples[-1]["ms_per_step"],
                     **{k: client_exchange(work, urls[0], tiny, k) for k in EXCHANGES},
                     "own_work": own_work(work_root, urls[0], tiny, FLOOR_TRAJECTORIES)}
    finally:
        for _, p in servers:
            p.terminate()
            p.wait(timeout=30)
    ms = sorted(x["ms_per_step"] for x in samples)
    fl = {**samples[-1], "ms_per_step": statistics.median(ms), "samples_ms": ms}
    return {"rows": rows, "floor": fl, "parts": parts, "reply_tokens": reply_tokens}


def fault(how: str, trajectories: int = 300, reply_tokens: int = 1000, after_steps: int = 500) -> dict:
    """The probe against a server that dies (SIGKILL) or hangs (SIGSTOP) after ``after_steps`` steps."""
    import bench_data

    from agent.backends.sglang_native import SGLangBackend

    tiny = bench_model()
    url, server = _stand_in(tiny, tiny_reply(tiny, reply_tokens))
    try:
        wait_up(url, server)
        with tempfile.TemporaryDirectory() as d:
            root, out = Path(d) / "run", Path(d) / "probe"
            bench_data.write_run(root, trajectories, bench_data.RowPool(seed=0, n_rows=1 << 16), progress=False,
                                 distinct_images=True, prompts=SGLangBackend(url, tiny))
            probe = subprocess.Popen([sys.executable, "-m", "probes.entropy", str(root), "--backend", "sglang",
                                      "--model-dir", tiny, "--force", "--no-progress", "--mode", "teacher-forced", "--out",
                                      str(out), "--skip-fidelity", "--endpoint", url], cwd=REPO,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            steps = out / "steps.jsonl"

            def written():
                return sum(1 for _ in open(steps, "rb")) if steps.exists() else 0
            while written() < after_steps and probe.poll() is None:
                time.sleep(0.5)
            if probe.poll() is not None:
                raise SystemExit(f"the probe ended before the fault ({probe.returncode}): {probe.stderr.read()[-2000:]}")
            at, t0 = written(), time.monotonic()
            os.kill(server.pid, signal.SIGKILL if how == "dead" else signal.SIGSTOP)
            _, err = probe.communicate(timeout=1800)
            return {"fault": how, "in_flight": min(trajectories, 128), "steps_at_fault": at,
                    "ended_after_s": round(time.monotonic() - t0, 1), "exit": probe.returncode,
                    "steps_kept": written(), "last_line": (err.strip().splitlines() or [""])[-1][:300]}
    finally:
        server.kill()
        server.wait(timeout=30)


def summarise(m: dict) -> list[dict]:
    """Per code version and number of endpoints: marginal CPU per step between the two scales, its ratio to the
    floor, its share of a GPU step per backbone, the in-flight count at the larger scale; peak RSS per scale."""
    out = []
    gpu_s = {k: 2 * m["reply_tokens"] / r for k, r in TOKENS_PER_GPU_S.items()}
    for code, e in dict.fromkeys((r["code"], r["endpoints"]) for r in m["rows"]):
        mine = [r for r in m["rows"] if r["code"] == code and r["endpoints"] == e]
        a, b = mine[0], mine[-1]
        ms = 1000 * (b["cpu_s"] - a["cpu_s"]) / max(b["steps"] - a["steps"], 1)
        paired = (a["floor_ms"] + b["floor_ms"]) / 2  # the floors around its own two runs
        out.append({"code": code, "endpoints": e, "in_flight": b["in_flight"], "ms_per_step": ms,
                    "floor_ratio": ms / paired, "paired_floor_ms": paired, "gpu_step_s": gpu_s,
                    "gpu_share": {k: ms / 1000 / g for k, g in gpu_s.items()},
                    "rss": [(r["in_flight"], r["steps"], r["peak_rss_mb"]) for r in mine]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="40,400", help="trajectories per scale (x 10 steps each; the larger one "
                                                        "fills 128, 256 and 384 in flight)")
    ap.add_argument("--reply-tokens", type=int, default=1000)
    ap.add_argument("--against", default="", help="comma-separated git revisions run in turn on the same run")
    ap.add_argument("--fault", choices=("dead", "hung"), help="instead: the probe's server killed or stopped mid-probe")
    ap.add_argument("--trajectories", type=int, default=300, help="with --fault: the run's trajectories")
    a = ap.parse_args(argv)
    if a.fault:
        print(json.dumps(fault(a.fault, a.trajectories, a.reply_tokens), indent=2))
        return 0
    m = measure([int(x) for x in a.scales.split(",")], a.reply_tokens, [r for r in a.against.split(",") if r])
    print(json.dumps({"measured": m, "summary": summarise(m)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
