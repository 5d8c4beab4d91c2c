"""The entropy probe's client cost on the HTTP path, against a fair read of the same bytes, at two scales.

    python scripts/bench_probe.py [--scales 10,100] [--reply-tokens 1000] [--against REV]

What a user with a GPU node runs: ``python -m probes.entropy RUN --mode teacher-forced --backend sglang
--endpoint URL --model-dir DIR``. The server is the loopback SGLang stand-in (tests/fakes/sglang_server.py) in its
own process, replying to every ``/generate`` with a ~``--reply-tokens`` reply and top-20 alternatives per token in
SGLang's native JSON; the run is paper-shaped (scripts/bench_data.py: 10 calls of ~1,000 tokens per trajectory, a
distinct ~320 KB photo-sized query image each). Each scale's probe runs as one process: its CPU time and peak RSS
come from the kernel (``os.wait4``). Printed:

- **client CPU per step** (marginal between the two scales, so start-up drops out) and its share of a stated GPU
  step time (a teacher-forced probe step costs 0.2-1.2 s of server time on an H20 node);
- **against a fair read**: the CPU that no client can skip per step, timed on one real reply: decoding the step's
  two scoring replies (JSON, then the top-20 triples into arrays);
- **peak memory** at each scale (it should not grow with the steps);
- with ``--against REV``: the same command from commit REV's tree on the same run, in turn, and the paired ratio
  (REV's tree runs with this venv: the packages it imports must be installed here, e.g. aiohttp and msgspec for
  commits before the one HTTP client).
"""
from __future__ import annotations

import argparse
import json
import os
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

#: A teacher-forced probe step's server time on a GPU node (the brief: 0.2-1.2 s); the share is given for both ends.
GPU_STEP_S = (0.2, 1.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc, timeout: float = 600.0) -> None:
    t = time.time()
    while time.time() - t < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the stand-in exited: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the stand-in did not start")


def tree_at(rev: str, where: Path) -> Path:
    """Commit ``rev``'s files (``git archive``) unpacked in ``where``."""
    where.mkdir(parents=True)
    arc = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev], capture_output=True, check=False)
    if arc.returncode:
        raise SystemExit(f"--against {rev}: git archive failed: {arc.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(where)], input=arc.stdout, check=True)
    return where


def run_measured(cmd: list[str], env: dict, cwd: Path) -> tuple[int, str, float, float]:
    """(exit code, stderr, CPU seconds user + system, peak RSS MB) of one process, from the kernel (os.wait4)."""
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        err.seek(0)
        return os.waitstatus_to_exitcode(status), err.read().decode("utf-8", "replace"), \
            ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def fair_read(root: Path, url: str, tiny: str) -> dict:
    """CPU ms a step cannot skip: its two scoring replies decoded (JSON, then the triples into arrays)."""
    import httpx

    from agent.backends.base import Continuation
    from agent.backends.sglang_native import SGLangBackend
    from agent.backends.wire import decode_generate_reply
    from agent.jsonio import dumps
    from agent.rundir import load_run

    run = load_run(root)
    line = run.full(run.index[0])
    ev = [e for e in line["events"] if e["type"] == "llm_call"][5]
    tok = run.tokens(line, ["call", "id"])
    ids = [int(i) for i in tok["id"][tok["call"] == ev["index"]]]
    b = SGLangBackend(url, tiny)
    payload = b.score_payload(run.sendable_messages(line, ev), Continuation(ids=ids))[0]
    with httpx.Client(trust_env=False, timeout=600) as c:
        body = c.post(url + "/generate", content=dumps(payload), headers={"Content-Type": "application/json"}).content

    def once():
        t = time.process_time()
        b.parse_score(decode_generate_reply(body), ids, k=20)
        return time.process_time() - t

    return {"bytes": len(body), "ms_per_step": 2 * 1000 * statistics.median(once() for _ in range(20))}


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


def measure(scales: list[int], reply_tokens: int, against: list[str], concurrency: int = 64) -> dict:
    """Run the probe at each scale (and each --against tree, in turn); returns rows and the fair read."""
    import bench_data

    from agent.backends.base import model_vocab_size
    from agent.backends.local import load_chat_renderer
    from agent.backends.sglang_native import SGLangBackend
    from agent.backends.tiny_model import ensure_tiny_model

    tiny = str(ensure_tiny_model(quiet=True))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    srv = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakes" / "sglang_server.py"), "--port", str(port),
                            "--tokenizer", tiny, "--model-name", tiny, "--reply", tiny_reply(tiny, reply_tokens),
                            "--keep-alive"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rows, fair = [], None
    try:
        wait_up(url, srv)
        with tempfile.TemporaryDirectory() as d:
            # recorded ids are scored: the model's ordinary tokens only
            bench_data.VOCAB = min([model_vocab_size(tiny), *load_chat_renderer(tiny).all_special_ids])
            pool = bench_data.RowPool(seed=0, n_rows=1 << 16)
            trees = {"today": REPO, **{f"@{r}": tree_at(r, Path(d) / f"tree-{r}") for r in against}}
            for n in scales:
                root = Path(d) / f"run{n}"
                bench_data.write_run(root, n, pool, progress=False, distinct_images=True,
                                     prompts=SGLangBackend(url, tiny))
                for name, tree in trees.items():  # in turn on the same run: paired
                    out = root / "probes" / f"tf-{name}"
                    cmd = [sys.executable, "-m", "probes.entropy", str(root), "--backend", "sglang", "--endpoint", url,
                           "--model-dir", tiny, "--force", "--no-progress", "--concurrency", str(concurrency),
                           "--mode", "teacher-forced", "--out", str(out), "--skip-fidelity"]
                    code, err, cpu, rss = run_measured(cmd, {**os.environ, "PYTHONPATH": str(tree)}, tree)
                    if code:
                        raise SystemExit(f"probe failed ({code}): {err[-3000:]}")
                    steps = sum(1 for _ in open(out / "steps.jsonl", "rb"))
                    rows.append({"code": name, "trajectories": n, "steps": steps, "cpu_s": cpu, "peak_rss_mb": rss})
                if fair is None:
                    fair = fair_read(root, url, tiny)
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    return {"rows": rows, "fair": fair, "reply_tokens": reply_tokens}


def summarise(m: dict) -> list[dict]:
    """Per code version: marginal CPU per step, its ratio to the fair read and to a GPU step, peak RSS per scale."""
    out = []
    for code in dict.fromkeys(r["code"] for r in m["rows"]):
        mine = [r for r in m["rows"] if r["code"] == code]
        a, b = mine[0], mine[-1]
        ms = 1000 * (b["cpu_s"] - a["cpu_s"]) / max(b["steps"] - a["steps"], 1)
        out.append({"code": code, "ms_per_step": ms, "fair_ratio": ms / m["fair"]["ms_per_step"],
                    "gpu_share": tuple(ms / 1000 / g for g in GPU_STEP_S),
                    "rss": {r["steps"]: r["peak_rss_mb"] for r in mine}})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="10,100", help="trajectories per scale (x 10 steps each)")
    ap.add_argument("--reply-tokens", type=int, default=1000)
    ap.add_argument("--against", default="", help="comma-separated git revisions run in turn on the same run")
    a = ap.parse_args(argv)
    m = measure([int(x) for x in a.scales.split(",")], a.reply_tokens, [r for r in a.against.split(",") if r])
    print(json.dumps({"measured": m, "summary": summarise(m)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
