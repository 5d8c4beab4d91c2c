"""The entropy probe on the HTTP path: client CPU per step and peak memory, at two scales, as whole processes.

    python scripts/bench_probe_http.py [--scales 10,100,300] [--reply-tokens 1000] [--concurrency 64]
        [--mode regenerate|teacher-forced] [--server fake|standin] [--small-images] [--text synthetic|english]
        [--variants recorded,retokenize] [--against REV] [--no-breakdown]

What a user with a GPU node runs: ``python -m probes.entropy RUN --backend sglang --endpoint URL
--model-dir DIR`` against a server. The server is the loopback SGLang stand-in (tests/fakes/sglang_server.py)
in its own process, replying to every ``/generate`` with a ~``--reply-tokens`` think block and top-20
alternatives per token (SGLang's native JSON shape); the run is paper-shaped (scripts/bench_data.py: 10 calls
of ~1,000 tokens per trajectory, each with its query image: by default a distinct ~320 KB 1024 x 768 JPEG per
trajectory, a real photo's size, so every with-images request carries its own ~0.43 MB of base64;
``--small-images`` shares one small image instead; ``--text english`` makes the history's reasoning and
observations windows of English prose, this README, instead of random letter strings). For each scale
(trajectories; x 10 steps) and variant (below) the probe runs as one process; its CPU time (user + system, from
the kernel) and peak RSS are printed, per step
and in all, so scaling shows: CPU per step should stay flat and peak memory should not grow with the steps.
The tokenizer and chat template are the embedded tiny model's (the real Qwen3.5 classes; a 628-token
vocabulary, so the replies' JSON is a little smaller than a real model's, and tokenising costs ~1.3x less than
with Qwen's 151,643-token vocabulary: scripts/bench_tokenize.py).

Two variants run in turn on the same run at each scale (``--variants``), so their ratio is paired: **recorded**,
the run records its prompts' token ids by message piece as a run through ``--backend sglang`` does
(agent/backends/pieces.py; made here by the runner's own backend class) and the probe sends them again, tokenising
only what the run never sent; **retokenize**, the same command with ``--retokenize``, which tokenises every prompt
piece again (what a run without recorded ids costs: one through the chat path, or an older one).

``--against REV`` (ours) adds a variant: the same command at an earlier commit (``git archive REV``, run from
its own tree) on the same run, in turn with the others, so its ratio to today's code is paired too. This machine
is shared and its speed drifts by up to ~4x between sessions; a past commit measured in the same run is the one
yardstick that drifts with it, e.g. ``--against 34c23d2 --reference 34c23d2=11.4`` (the fifth pass's code and
what it measured then with this command) also prints today's step in the fifth pass's units.

``--mode teacher-forced`` also prints where a step's client CPU goes (``--no-breakdown`` skips it): each scale's
command runs through scripts/_probe_parts.py, which is the same command with the function doing each part
(renders, tokenising, request bodies, the JSON decode, the triples into arrays, the entropy / KL arithmetic,
the viewer's alternatives, the line and sidecar reads, the token results written, the messages and records, the
collections) wrapped to add up its CPU time, HTTP and the rest being what is left;
the per-step figures are the differences between the smallest and largest scale. The loopback fake keeps its
connections alive (HTTP/1.1), as SGLang's server does.

``--server standin``: instead of the loopback fake, SGLang's own HTTP server, TokenizerManager (with the
Qwen-VL processor: every image is decoded and processed by SGLang) and DetokenizerManager, with
serving/standin.py's scripted scheduler (planted replies and logprobs; needs bash
scripts/sglang_conformance.sh). The replies are then SGLang's own bytes. It serves one request at a time
and shares this machine's cores, so use small scales (e.g. 10,30); the client's CPU is measured as before.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc, timeout: float = 120.0) -> None:
    import urllib.request

    t = time.time()
    while time.time() - t < timeout:
        if proc.poll() is not None:
            err = proc.stderr.read()[-2000:] if proc.stderr else "(its log: bench-standin-PORT.log in the temp dir)"
            raise SystemExit(f"the stand-in exited: {err}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the stand-in did not start")


def _decode_floor(root: Path, url: str, tiny: str) -> dict:
    """What no teacher-forced client can skip per step, timed on one real reply of the stand-in: decoding the
    two scoring replies (JSON, then the triples into arrays) and tokenising the step's new prompt pieces."""
    import statistics

    import httpx

    from agent.backends.base import Continuation
    from agent.backends.sglang_native import SGLangBackend
    from agent.backends.wire import decode_generate_reply
    from agent.http import dumps
    from agent.rundir import load_run

    run = load_run(root)
    line = run.full(run.index[0])
    calls = [e for e in line["events"] if e["type"] == "llm_call"]
    ev = calls[len(calls) // 2]
    tok = run.tokens(line, ["call", "id"])
    ids = [int(i) for i in tok["id"][tok["call"] == ev["index"]]]
    b = SGLangBackend(url, tiny)
    msgs = run.sendable_messages(line, ev)
    payload = b.score_payload(msgs, Continuation(ids=ids))[0]
    with httpx.Client(trust_env=False, timeout=600) as c:
        body = c.post(url + "/generate", content=dumps(payload), headers={"Content-Type": "application/json"}).content

    def med(f, n=20):
        ts = []
        for _ in range(n):
            t = time.process_time()
            f()
            ts.append(time.process_time() - t)
        return 1000 * statistics.median(ts)

    resp = decode_generate_reply(body)
    if not isinstance(resp, dict) or "meta_info" not in resp:
        raise SystemExit(f"the floor's scoring request was not answered: {str(resp)[:400]}")
    fresh = SGLangBackend(url, tiny)
    prev = b.render(run.sendable_messages(line, calls[len(calls) // 2 - 1]), {"enable_thinking": True})[0]
    fresh.prompt_ids(prev)  # the previous step's pieces are known; this step's new ones are tokenised

    cur = b.render(msgs, {"enable_thinking": True})[0]

    def tokenise():
        fresh._piece_ids.clear()
        fresh.prompt_ids(prev)
        t = time.process_time()
        fresh.prompt_ids(cur)
        return time.process_time() - t

    tk = statistics.median(tokenise() for _ in range(5)) * 1000
    return {"step": ev["index"], "bytes": len(body), "decode_ms": med(lambda: decode_generate_reply(body)),
            "parse_ms": med(lambda: b.parse_score(resp, ids, k=20)), "tokenise_ms": tk}


#: The breakdown's parts (scripts/_probe_parts.py wraps the function that does each).
_PARTS = (("render", "chat template renders (2 a step)"),
          ("tokenise", "prompt pieces: the new ones tokenised or recorded"),
          ("body", "request bodies to JSON"),
          ("decode", "reply JSON decoded (msgspec, by type)"),
          ("arrays", "triples into arrays + value checks"),
          ("influence", "grouped entropy, bounds, union-tail KL"),
          ("alternatives", "top-5 alternatives for the viewer"),
          ("line_read", "the trajectory's line read"),
          ("sidecar_read", "its token sidecar read"),
          ("token_store", "token results written (per trajectory)"),
          ("messages", "the step's messages, with and without images"),
          ("records", "request records, think masks"),
          ("histograms", "entropy histograms (forking tokens)"),
          ("collector", "collections + heap trims (when grown)"))


def _tree_at(rev: str, where: Path) -> Path:
    """Commit ``rev``'s files (``git archive``) unpacked in ``where``: an earlier version of the probe to run."""
    where.mkdir(parents=True)
    arc = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev], check=False,
                         capture_output=True)
    if arc.returncode:
        raise SystemExit(f"--against {rev}: git archive failed: {arc.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(where)], input=arc.stdout, check=True)
    return where


def run_measured(cmd: list[str], env: dict, cwd: Path = REPO) -> tuple[int, str, float, float, float]:
    """Run ``cmd`` in ``cwd``; (exit code, its stderr, its CPU seconds (user + system), wall seconds, its own peak RSS in
    MB), the CPU and the peak from the kernel's account of that one process (``os.wait4``)."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    return p.returncode, text, ru.ru_utime + ru.ru_stime, wall, ru.ru_maxrss / 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="10,100,300", help="trajectories per scale (x 10 steps each)")
    ap.add_argument("--reply-tokens", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--server", choices=("fake", "standin"), default="fake",
                    help="fake: the loopback stand-in; standin: SGLang's real front end (serving/standin.py)")
    ap.add_argument("--mode", choices=("regenerate", "teacher-forced"), default="regenerate",
                    help="teacher-forced: two scoring requests per step (with / without the query images)")
    ap.add_argument("--small-images", dest="photos", action="store_false",
                    help="one small image shared by every trajectory instead of a distinct ~320 KB 1024 x 768 JPEG per "
                         "trajectory (the default: a real query photo's size, and no image is sent twice)")
    ap.add_argument("--text", choices=("synthetic", "english"), default="synthetic",
                    help="the history's texts: random letter strings (default; nearly every word new to the "
                         "tokenizer's word cache) or windows of English prose (this README): scripts/bench_data.py "
                         "write_run")
    ap.add_argument("--variants", default="recorded,retokenize",
                    help="recorded: the run records its prompt ids (as a run through --backend sglang does) and the "
                         "probe sends them again; retokenize: the same command with --retokenize (a run without them); "
                         "both (the default) run in turn on the same run at each scale")
    ap.add_argument("--against", default="",
                    help="comma-separated git revisions: each runs the same command from that commit's tree on the same "
                         "run, in turn with the variants (a paired yardstick for a machine whose speed drifts)")
    ap.add_argument("--reference", default="",
                    help="REV=MS[,REV=MS...]: what REV's step cost where it was measured before (e.g. 34c23d2=11.4, the "
                         "fifth pass); prints each variant's step in those units: MS x the paired ratio to @REV")
    ap.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                    help="teacher-forced: run the plain command, without timing a step's CPU by part")
    a = ap.parse_args(argv)
    try:
        refs = {r.split("=")[0]: float(r.split("=")[1]) for r in a.reference.split(",") if r}
    except (IndexError, ValueError):
        ap.error(f"--reference wants REV=MS[,REV=MS...], got {a.reference!r}")
    if set(refs) - {r for r in a.against.split(",") if r} or (refs and len(a.scales.split(",")) < 2):
        ap.error("--reference REV=MS needs --against REV and two scales (its ratio is paired and marginal)")

    from bench_data import RowPool, write_run

    from agent.backends.sglang_native import SGLangBackend
    from agent.backends.tiny_model import ensure_tiny_model

    tiny = str(ensure_tiny_model(quiet=True))
    words = ("the image shows a building with a tower and we should search for its name before the answer "
             "because the style suggests a date ").split()
    from agent.backends.local import load_chat_renderer

    tok = load_chat_renderer(tiny)

    def make(n_words):
        return "<think>\n" + " ".join(words[i % len(words)] for i in range(n_words)) + "\n</think>\n\n<answer>1911</answer>"

    n_words = a.reply_tokens
    for _ in range(4):  # calibrate the reply to --reply-tokens tokens of this tokenizer
        n_words = max(1, round(n_words * a.reply_tokens / len(tok(make(n_words))["input_ids"])))
    reply = make(n_words)
    reply_tokens = len(tok(reply)["input_ids"])
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    if a.server == "standin":
        site = REPO / ".venv-sglang" / "site"
        if not (site / "fastapi").is_dir():
            raise SystemExit(f"--server standin needs SGLang's front end at {site}: bash scripts/sglang_conformance.sh")
        # the planted reply without its <think> (the chat template pre-fills it)
        srv = subprocess.Popen([sys.executable, "-m", "serving.standin", "--model-path", tiny, "--port", str(port),
                                "--served-model-name", Path(tiny).name, "--mode", "scripted",
                                "--context-length", "262144",
                                "--reply", reply.removeprefix("<think>\n")],
                               cwd=REPO, stdout=subprocess.DEVNULL, text=True,
                               stderr=open(Path(tempfile.gettempdir()) / f"bench-standin-{port}.log", "w"),
                               env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{site}", "PYTHONWARNINGS": "ignore"})
    else:
        srv = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakes" / "sglang_server.py"), "--port", str(port),
                                "--tokenizer", tiny, "--model-name", tiny, "--reply", reply, "--keep-alive"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait(url, srv, timeout=600.0)
        rows, floor, parts = [], None, []
        with tempfile.TemporaryDirectory() as d:
            # recorded ids are scored in every mode (the teacher-forced steps, and the fidelity check before a
            # regenerate probe), so they are the model's: its ordinary tokens only (a think block never holds a
            # special token; SGLang's front end reads a <|video_pad|> in the ids as a video without data and
            # refuses the request)
            import bench_data

            from agent.backends.base import model_vocab_size

            bench_data.VOCAB = min([model_vocab_size(tiny), *tok.all_special_ids])
            pool = RowPool(seed=0, n_rows=1 << 16 if a.mode == "teacher-forced" else 1 << 19)
            prompts = SGLangBackend(url, tiny)  # the runner's backend: records each call's prompt ids by piece
            variants = [v for v in a.variants.split(",") if v]
            trees = {}  # "@REV": that commit's tree (its own probes.entropy, run from there)
            for rev in (r for r in a.against.split(",") if r):
                trees[f"@{rev}"] = _tree_at(rev, Path(d) / f"tree-{rev}")
            variants += list(trees)
            for n in (int(x) for x in a.scales.split(",")):
                root = Path(d) / f"run{n}"
                write_run(root, n, pool, progress=False, distinct_images=a.photos, text=a.text,
                          prompts=prompts if "recorded" in variants else None)
                prompts._piece_ids.clear()
                for variant in variants:  # in turn on the same run: paired
                    driver = os.environ.get("BENCH_DRIVER")  # (experiments) a wrapper: DRIVER MODE ARGS...
                    parts_file = Path(d) / f"parts{n}-{variant}.json"
                    head = driver.split() if driver else ["-m", "probes.entropy"]
                    tree = trees.get(variant)
                    if tree is not None:
                        head = ["-m", "probes.entropy"]
                    elif not driver and a.mode == "teacher-forced" and a.breakdown:  # the same command, its parts timed
                        head = [str(REPO / "scripts" / "_probe_parts.py"), str(parts_file)]
                    out = root / "probes" / f"entropy-{a.mode}-{variant}"
                    cmd = [sys.executable, *head, str(root), "--backend", "sglang", "--endpoint", url,
                           "--model-dir", tiny, "--force", "--no-progress", "--concurrency", str(a.concurrency),
                           "--mode", a.mode, "--out", str(out), *(["--retokenize"] if variant == "retokenize" else [])]
                    code, err, cpu, wall, rss = run_measured(cmd, env={**os.environ, "PYTHONPATH": str(tree or REPO)},
                                                             cwd=tree or REPO)
                    if code:
                        raise SystemExit(f"probe failed ({code}): {err[-3000:]}")
                    if driver:
                        print("\n".join(x for x in err.splitlines() if x.startswith(("MAXRSS", "TIMERS", "MEM"))))
                    steps = sum(1 for _ in open(out / "steps.jsonl", "rb"))
                    used = json.loads((out / "probe.json").read_text()).get("prompt_ids") or {}
                    if a.mode == "teacher-forced" and floor is None:
                        floor = _decode_floor(root, url, tiny)
                    if parts_file.exists():
                        parts.append((variant, steps, cpu, json.loads(parts_file.read_text())))
                    rows.append((variant, n, steps, cpu, wall, rss, used))
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    what = "SGLang's real front end (serving/standin.py, scripted)" if a.server == "standin" else "the loopback fake"
    imgs = "a distinct ~320 KB 1024 x 768 JPEG per trajectory" if a.photos else "one small image for all trajectories"
    print(f"python -m probes.entropy RUN --backend sglang ({a.mode}) against {what}, {reply_tokens}-token replies "
          f"with top-20, {imgs}, {a.text} history text, --concurrency {a.concurrency}; one process per scale and variant")
    print(f"{'prompt ids':<11} {'trajectories':>12} {'steps':>6} {'client CPU s':>12} {'ms CPU/step':>11} {'wall s':>7} "
          f"{'peak RSS MB':>11} {'pieces: from the run / tokenised':>33}")
    for variant, n, steps, cpu, wall, rss, used in rows:
        pieces = f"{used.get('pieces_from_the_record', 0)} / {used.get('pieces_tokenised', 0)}" if used else "-"
        print(f"{variant:<11} {n:>12} {steps:>6} {cpu:>12.1f} {1000 * cpu / steps:>11.1f} {wall:>7.1f} {rss:>11.0f} "
              f"{pieces:>33}")
    print("(recorded: the run's recorded prompt ids sent again, the default; retokenize: the same command with "
          "--retokenize, every prompt tokenised again, as for a run without recorded ids; @REV: the same command from "
          "commit REV's tree (--against); peak RSS: each process's own)")
    marginal = {}
    for variant in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == variant]
        if len(mine) >= 2:
            (_, _, s0, c0, *_), (_, _, s1, c1, *_) = mine[0], mine[-1]
            marginal[variant] = 1000 * (c1 - c0) / (s1 - s0)
            print(f"marginal client CPU per step, {variant}: {marginal[variant]:.1f} ms ({s0} -> {s1} steps)")
    if "recorded" in marginal and "retokenize" in marginal:
        print(f"recorded / retokenize, paired: {marginal['recorded'] / marginal['retokenize']:.2f}")
    for v in (v for v in marginal if v.startswith("@")):
        for mine in (m for m in ("recorded", "retokenize") if m in marginal):
            print(f"{mine} / the code at {v[1:]}, paired: {marginal[mine] / marginal[v]:.3f}")
    for rev, ms in refs.items():  # the yardstick: a past measurement of REV, carried over by the paired ratio
        for mine in (m for m in ("recorded", "retokenize") if m in marginal):
            print(f"{mine} in the units of the run where {rev} measured {ms:g} ms a step: "
                  f"{ms * marginal[mine] / marginal[f'@{rev}']:.1f} ms ({ms:g} x {marginal[mine] / marginal[f'@{rev}']:.3f}; "
                  f"here {rev} measured {marginal[f'@{rev}']:.1f} ms, {marginal[f'@{rev}'] / ms:.2f}x its old figure)")
    if floor:
        print(f"floor per step (two scoring replies of a step-{floor['step']} request, {floor['bytes'] / 1e6:.2f} MB each, "
              f"decoded in-process, median of 20): JSON {2 * floor['decode_ms']:.1f} ms + the triples into arrays "
              f"{2 * floor['parse_ms']:.1f} ms = {2 * (floor['decode_ms'] + floor['parse_ms']):.1f} ms; the prompt's "
              f"pieces tokenised (this step's new ones; what --retokenize pays) {floor['tokenise_ms']:.1f} ms")
    for variant in dict.fromkeys(p[0] for p in parts):
        mine = [p for p in parts if p[0] == variant]
        if len(mine) < 2:
            continue
        (_, s0, c0, p0), (_, s1, c1, p1) = mine[0], mine[-1]
        dn = s1 - s0
        per = {k: 1000 * (p1["cpu_s"][k] - p0["cpu_s"][k]) / dn for k in p1["cpu_s"]}
        total = 1000 * (c1 - c0) / dn
        print(f"\nwhere a teacher-forced step's client CPU goes ({variant}): the same command with each part's function "
              f"wrapped (scripts/_probe_parts.py), per step between the {s0}- and {s1}-step runs (constant costs drop "
              "out):")
        print(f"{'part':<48} {'ms/step':>8} {'share':>6}")
        known = 0.0
        for key, label in _PARTS:
            known += per[key]
            print(f"{label:<48} {per[key]:>8.2f} {per[key] / total:>6.0%}")
        if "trim" in per:
            print(f"{'  of which glibc heap trims':<48} {per['trim']:>8.2f}")
        rest = total - known
        print(f"{'the rest: HTTP (aiohttp), asyncio, rows, bookkeeping':<48} {rest:>8.2f} {rest / total:>6.0%}")
        print(f"{'all (the process CPU, marginal)':<48} {total:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
