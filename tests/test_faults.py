"""Fault tests: no model output, transport fault, kill or bad file loses a unit or aborts a run.

The loopback SGLang stand-in injects the faults (serving/fakes/sglang_server.py: TRANSPORT_FAULTS, GARBAGE);
``scripts/soak.py`` is the long version of the kill loop below.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from agent.run import main as run_main
from agent.rundir import RunDir, check_run
from agent.rundir.lines import seal
from scripts.soak import soak
from serving.fakes.policy import agent_policy
from serving.fakes.sglang_server import GARBAGE, FakeSGLang
from tests import records
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S
from tests.records import recorded_lines

#: Client timeouts far above what any normal reply of the loopback stand-in takes on a loaded 2-core machine,
#: and "slow" faults far above those: no assertion depends on how busy the CPU is (a 1 s timeout did, and a
#: 200 KB reply missed it under load).
NO_TIMEOUT_S = 120
SLOW_TIMEOUT_S, SLOW_FAULT_S = 5, 40


def _cli(url, out, *extra, method="react", request_timeout=NO_TIMEOUT_S):
    return ["--method", method, "--backend", "openai", "--endpoint", url, "--benchmark", "demo", "--t-max", "6",
            "--out", str(out), "--no-progress", "--request-timeout", str(request_timeout), *extra]


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_no_model_output_aborts_a_run(tmp_path, kind):
    method = "mmcontextfold" if kind == "subtask_missing" else "react"
    with FakeSGLang(reply=agent_policy) as srv:
        # the first generation of the first unit is garbage; (MM-ContextFold: its first main call, after 1 init call)
        srv.faults = [None, kind] if method == "mmcontextfold" else [kind]
        rc = run_main(_cli(srv.url, tmp_path / "r", "--limit", "2", "--concurrency", "1", method=method))
    assert rc == 0
    lines = {ln["sample_id"]: ln for ln in recorded_lines(tmp_path / "r")}
    assert set(lines) == {"demo_1", "demo_2"} and all(ln["status"] in ("ok", "no_answer") for ln in lines.values())
    first = [e for e in lines["demo_1"]["events"] if e["type"] == "llm_call"][1 if method == "mmcontextfold" else 0]
    if kind in ("surrogate_body", "control_chars"):  # a parseable answer with odd text: scrubbed and kept
        assert first["action"]["kind"] == "answer"
    elif kind == "unknown_tool":  # a well-formed call of a tool that does not exist: an error observation
        obs = next(e for e in lines["demo_1"]["events"] if e["type"] == "tool_call")
        assert not obs["ok"] and obs["observation"].startswith("Unknown tool 'browse_web'")
    else:  # everything else is the model's mistake: a correction re-prompt, counted toward the budget
        assert first.get("action_error"), first
    if kind == "surrogate_args":
        assert "lone surrogate" in first["action_error"]
    assert check_run(tmp_path / "r").intact


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["429", "500", "drop", "truncated", "slow"])
def test_transport_faults_are_retried(tmp_path, kind):
    with FakeSGLang(reply=agent_policy, slow_s=SLOW_FAULT_S) as srv:
        srv.faults = [kind]
        rc = run_main(_cli(srv.url, tmp_path / "r", "--limit", "1", request_timeout=SLOW_TIMEOUT_S))
        posts = srv.requests.count("/v1/chat/completions")
    line = recorded_lines(tmp_path / "r")[0]
    assert rc == 0 and line["status"] == "ok"
    assert posts == line["n_calls"] + 1  # every call, plus the one that was retried


@pytest.mark.slow
@pytest.mark.parametrize("method", ["react", "mmcontextfold"])
def test_a_run_under_20_percent_faults_accounts_for_every_unit(tmp_path, method):
    with FakeSGLang(reply=agent_policy, fault_rate=0.2, seed=3, slow_s=SLOW_FAULT_S) as srv:
        rc = run_main(_cli(srv.url, tmp_path / "r", "--trials", "4", "--concurrency", "4", method=method,
                           request_timeout=SLOW_TIMEOUT_S))
        injected, posts = dict(srv.injected), len(srv.requests)
    assert rc in (0, 3)  # 3: a unit ran out of retries (then it is an accounted-for error, with its reason)
    assert sum(injected.values()) >= 0.1 * posts and len(injected) >= 4
    rep = check_run(tmp_path / "r")
    assert rep.intact and rep.complete and rep.present == rep.expected == 24
    for ln in recorded_lines(tmp_path / "r"):
        assert ln["status"] in ("ok", "no_answer", "error", "timeout")
        assert ln["status"] != "error" or ln["error"]


@pytest.mark.slow
def test_kill_9_loop_then_resume_leaves_a_clean_run(tmp_path):
    # kills after progress (1-3 more lines each), not after a time: 5 kills land whatever the machine's load
    r = soak(tmp_path / "run", kills=5, trials=8, processes=2, fault_rate=0.1, latency=0.2, min_lines=1, max_lines=3, seed=1,
             progress=lambda *_: None)
    assert r["kills"] == 5, r
    assert r["lost"] == 0 and r["duplicated"] == 0 and r["present"] == r["expected"] == 48
    assert r["intact"] and r["complete"] and r["final_exit"] in (0, 3)
    assert subprocess.run([sys.executable, "-m", "agent.rundir", "check", str(tmp_path / "run")], cwd=REPO,
                          capture_output=True).returncode == 0


# ------------------------------------------------------------------ the record
def _unit_line(sample="s1", trial=0, status="ok"):
    return records.line(sample, trial, status)


def test_no_record_is_glued_onto_a_torn_fragment_and_repair_quarantines(tmp_path):
    from agent.trajectory import Trajectory

    rd = RunDir(tmp_path / "r")
    rd.write_header(records.header())
    with open(rd.results, "wb") as f:  # a crash mid-write left a fragment without its newline
        f.write(seal(_unit_line("s0")) + b"\n" + b'{"sample_id": "s1", "tri')

    class S:
        image_paths = []

    traj = Trajectory.__new__(Trajectory)
    traj.tokens, traj.sample, traj.image_files, traj.top_k = {}, S(), {}, 0
    rd.append(traj, _unit_line("s2"))
    assert {ln["sample_id"] for ln in rd.index(warn=False)} == {"s0", "s2"}  # s2 is intact
    (rd.path / "tokens" / "stray.parquet").write_bytes(b"x")
    (rd.path / "tokens" / "a.parquet.tmp123-4").write_bytes(b"x")
    rep = check_run(rd.path)
    assert [n for n, _ in rep.torn] == [2] and not rep.intact
    assert rep.orphans == ["tokens/stray.parquet"] and rep.temp_files
    out = subprocess.run([sys.executable, "-m", "agent.rundir", "check", str(rd.path), "--repair"], cwd=REPO,
                         capture_output=True, text=True)
    assert "torn line(s) moved to quarantine" in out.stdout and "removed" in out.stdout
    assert (rd.path / "quarantine" / "tokens" / "stray.parquet").exists()  # moved, never deleted
    assert b'"tri' in next((rd.path / "quarantine").glob("torn-lines-*.jsonl")).read_bytes()
    rep = check_run(rd.path)
    assert rep.intact and not rep.temp_files and not rep.orphans


async def test_superseded_lines_keep_their_tokens(tmp_path):
    from agent.backends.base import BackendError
    from agent.backends.scripted import ScriptedBackend
    from agent.run import RunConfig, run
    from tests.test_runner import react_policy

    state = {"n": 0}

    def flaky(msgs):
        state["n"] += 1
        if state["n"] == 2:
            raise BackendError("server went away")
        return react_policy(msgs)

    cfg = RunConfig(method="react", out=str(tmp_path / "r"), limit=1, progress=False)
    await run(cfg, [], backends=[ScriptedBackend([flaky] * 10)])
    cfg.retry_errors = True
    await run(cfg, [], backends=[ScriptedBackend([react_policy] * 10)])
    lines = RunDir(tmp_path / "r").index()
    assert [ln["status"] for ln in lines] == ["error", "ok"]
    assert lines[0]["tokens_file"] != lines[1]["tokens_file"]
    assert (tmp_path / "r" / lines[0]["tokens_file"]).exists() and (tmp_path / "r" / lines[1]["tokens_file"]).exists()
    rep = check_run(tmp_path / "r")
    assert rep.intact and rep.superseded == 1 and not rep.orphans


# ------------------------------------------------------------------ bad data
def test_bad_data_is_reported_not_used(tmp_path, monkeypatch):
    import shutil

    from agent.benchmarks import load_benchmark
    from agent.images import ImageError, load_image
    from agent.tools.demo_world import ensure_demo_world

    b = tmp_path / "bench"
    shutil.copytree(ensure_demo_world() / "demo", b)
    (b / "imgs" / "notimage.png").write_text("hello")
    (b / "imgs" / "big.png").write_bytes(b"\0" * (3 * 2**20))
    (tmp_path / "secret.png").write_bytes((b / "imgs" / "kestrel_logo.png").read_bytes())
    rows = [{"id": "a", "query": "q", "query_images": ["kestrel_logo.png"], "answer": "x"},
            {"id": "b", "query": "q", "query_images": ["notimage.png"], "answer": "x"},
            {"id": "c", "query": "q", "query_images": ["big.png"], "answer": "x"},
            {"id": "d", "query": "q", "query_images": ["../../secret.png"], "answer": "x"},
            {"id": "e", "query": "q", "query_images": [str(tmp_path / "secret.png")], "answer": "x"}]
    data = b"\xef\xbb\xbf" + b"".join(json.dumps(r).encode() + b"\n" for r in rows) + b'{"id": "f", "query": "\xff\xfe"}\n'
    (b / "data_unified.jsonl").write_bytes(data)
    monkeypatch.setenv("MMCF_MAX_IMAGE_MB", "2")
    m = load_benchmark(b)
    kinds = {(p.id, p.kind) for p in m.problems}
    assert ("b", "not_an_image") in kinds and ("c", "image_too_large") in kinds
    assert ("d", "path_outside_imgs") in kinds and ("e", "path_outside_imgs") in kinds
    assert any(p.kind == "non_utf8" and p.line == 6 for p in m.problems)
    assert [s.id for s in m.samples] == ["a", "b", "c"]  # the BOM line parses; refused rows are not used
    assert not any(p.kind == "torn_line" for p in m.problems)
    with pytest.raises(ImageError, match="not a regular file"):
        load_image("/dev/zero")
    with pytest.raises(ImageError, match="over the image size limit"):
        load_image(b / "imgs" / "big.png")
    out = subprocess.run([sys.executable, "-m", "agent.benchmarks", "stats", str(tmp_path), "--json"], cwd=REPO,
                         capture_output=True, text=True, env={**os.environ, "MMCF_MAX_IMAGE_MB": "2"})
    rep = json.loads(out.stdout)["benchmarks"]["bench"]
    assert {p["kind"] for p in rep["problems"]} >= {"not_an_image", "image_too_large", "path_outside_imgs", "non_utf8"}


# ------------------------------------------------------------------ keys stay where they belong
SECRETS = {"SERPER_API_KEY": "sk-serper-PLANTED-1111", "JINA_API_KEY": "jina-PLANTED-2222",
           "OPENROUTER_API_KEY": "sk-or-PLANTED-3333", "MY_SERVER_API_KEY": "srv-PLANTED-4444",
           "HF_TOKEN": "hf_PLANTED_5555"}


def test_no_key_is_written_anywhere(tmp_path, monkeypatch, capsys):
    """Plant a key in every variable, make every server echo what it receives (headers included) in its
    errors, run, probe and judge, then grep every file they wrote."""
    from http.server import ThreadingHTTPServer

    from serving.fakes.http_base import JSONHandler
    from serving.fakes.web_apis import FakeWeb

    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)

    seen = []

    class Echo(JSONHandler):  # a judge server that refuses, echoing the request's headers
        def do_POST(self):
            seen.append(dict(self.headers))
            self._send(400, {"error": "bad request", "headers": dict(self.headers)})

        def do_GET(self):
            self._send(200, {"data": [{"id": "judge"}]})

    echo = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    import threading

    threading.Thread(target=echo.serve_forever, daemon=True).start()
    judge_url = f"http://127.0.0.1:{echo.server_address[1]}"
    with FakeWeb() as web, FakeSGLang(reply=agent_policy) as srv:
        web.faults = ["403"] * 3  # the web tools refuse (and are retried): their error bodies carry headers
        monkeypatch.setenv("MMCF_SERPER_BASE", web.url)
        monkeypatch.setenv("MMCF_JINA_BASE", web.url)
        monkeypatch.setenv("MMCF_LENS_URL_TEMPLATE", "https://img.example/{sha256}")
        srv.faults = ["400"]  # the model server refuses once: the error is recorded in the unit
        url = srv.url.replace("http://", "http://alice:pw-PLANTED-6666@")
        out = tmp_path / "run"
        # credentials in the URL and a key variable: refused (httpx would send the URL's as Basic auth instead)
        assert run_main(["--method", "react", "--backend", "openai", "--endpoint", url, "--api-key-env",
                         "MY_SERVER_API_KEY", "--benchmark", "demo", "--limit", "1", "--out", str(tmp_path / "both"),
                         "--no-progress"]) == 2
        rc = run_main(["--method", "react", "--backend", "openai", "--endpoint", url, "--tools", "live", "--benchmark",
                       "demo", "--limit", "2", "--out", str(out), "--no-progress", "--concurrency", "1"])
        assert rc == 3  # the refused unit
        from agent.judge import main as judge_main

        assert judge_main([str(out), "--judge-endpoint", judge_url, "--judge-model", "judge", "--judge-api-key-env",
                           "MY_SERVER_API_KEY", "--no-progress"]) == 1  # every judge call failed (recorded, retried next time)
        assert judge_main([str(out), "--judge", "exact", "--no-progress"]) == 0
    echo.shutdown()
    written = [p for p in out.rglob("*") if p.is_file()]
    assert len(written) > 5
    planted = [*SECRETS.values(), "pw-PLANTED-6666"]
    printed = capsys.readouterr()
    assert "rerun them with:" in printed.err  # the exit-3 hint, printed without the URL's password
    for v in planted:
        assert v not in printed.out and v not in printed.err, f"{v} printed"
    for p in written:
        data = p.read_bytes()
        for v in planted:
            assert v.encode() not in data, f"{v} written into {p}"
    # the judge server got the key named for it, never OpenRouter's
    assert seen and all(h.get("Authorization") == "Bearer srv-PLANTED-4444" for h in seen)
    assert not any("sk-or-PLANTED" in str(h) for h in seen)


# ------------------------------------------------------------------ signals and small ones
@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_is_handled_like_ctrl_c(tmp_path, processes):
    with FakeSGLang(reply=agent_policy, latency_s=0.2) as srv:
        cmd = [sys.executable, "-m", "agent.run", *_cli(srv.url, tmp_path / "r", "--trials", "4", "--processes",
                                                         str(processes))]
        p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        res = tmp_path / "r" / "results.jsonl"
        deadline = time.time() + 60
        while time.time() < deadline and not (res.exists() and res.read_bytes().count(b"\n") >= 2):
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=HANG_GUARD_S)
    assert p.returncode == 143, err[-2000:]
    assert "rerun the same command to resume" in err and "Traceback" not in err
    n = len(RunDir(tmp_path / "r").index())
    assert f"interrupted: {n} written" in err  # the summary counts what was written, workers included
    # and what was abandoned: the units in flight and the calls already spent on them
    import re

    m = re.search(r"(\d+) unit\(s\) were in flight: the (\d+) LLM call\(s\) they had completed are kept in (\S+)/inflight/",
                  err)
    assert m or "no unit was in flight" in err, err[-2000:]  # what the interrupt stopped, said either way
    # what it says is kept is what the journals hold (each call's reply file is written last: c0001.json, ...)
    kept = list((tmp_path / "r" / "inflight").glob("*/c*.json"))
    assert (int(m.group(2)) if m else 0) == len(kept), (err[-1500:], len(kept))


def test_small_ones(tmp_path, capsys):
    from agent.rundir import RESUME_HISTORY

    rd = RunDir(tmp_path / "r")
    h = records.header()
    for _ in range(RESUME_HISTORY + 20):
        rd.write_header(h)
    hist = rd.read_header()["resumed"]
    assert len(hist) == RESUME_HISTORY and hist[5] == {"omitted": 20}
    # waiting for another runner's lock is said
    holder = RunDir(tmp_path / "r")
    holder.lock()
    with pytest.raises(Exception, match="another runner"):
        RunDir(tmp_path / "r").lock(wait_s=0.5)
    assert "another runner holds this run directory; waiting" in capsys.readouterr().err
    holder.unlock()
    # demo_world --help prints usage and creates nothing
    r = subprocess.run([sys.executable, "-m", "agent.tools.demo_world", "--help"], cwd=tmp_path, capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0 and r.stdout.startswith("usage:") and not (tmp_path / "--help").exists()


def test_a_full_disk_names_the_file_and_keeps_what_was_written(tmp_path):
    from agent.rundir import RunError
    from agent.trajectory import Trajectory

    rd = RunDir(tmp_path / "r")
    rd.write_header(records.header())

    class S:
        image_paths = []

    traj = Trajectory.__new__(Trajectory)
    traj.tokens, traj.sample, traj.image_files, traj.top_k = {}, S(), {}, 0
    rd.append(traj, _unit_line("s0"))
    os.chmod(rd.results, 0o444)
    try:
        if os.access(rd.results, os.W_OK):  # root ignores permissions: simulate with a directory in the way
            os.chmod(rd.results, 0o644)
            rd.results.rename(tmp_path / "moved.jsonl")
            rd.results.mkdir()
        with pytest.raises(RunError, match="results.jsonl: cannot write the run record"):
            rd.append(traj, _unit_line("s1"))
    finally:
        if rd.results.is_dir():
            rd.results.rmdir()


def test_image_caches_are_bounded_by_bytes(tmp_path):
    """Every distinct image stayed in memory (bytes and data URI) for good: ~2.8 GB per runner over the release.
    Now both caches together stay within --image-cache-mb, least recently used out first, and an evicted image
    comes back identical."""
    import numpy as np
    from PIL import Image

    from agent import images as I

    rng = np.random.default_rng(0)
    paths = []
    for i in range(24):  # ~190 KB PNGs of noise (they do not compress)
        p = tmp_path / f"im{i}.png"
        Image.fromarray(rng.integers(0, 255, (256, 256, 3), dtype=np.uint8)).save(p)
        paths.append(p)
    before = os.environ.get("MMCF_IMAGE_CACHE_MB")
    try:
        I.set_image_cache_mb(2)
        first = {}
        for p in paths:
            img = I.load_image(p)
            first[p] = (img.sha256, img.data_uri()[:80])
            st = I.image_cache_stats()
            assert st["image_bytes"] <= st["budget_bytes"] // 2 + len(img.data) * 2
            assert st["uri_bytes"] <= st["budget_bytes"] // 2 + len(img.data_uri())
        st = I.image_cache_stats()
        assert st["budget_bytes"] == 2 * 2**20 and st["uris"] < len(paths)
        # a file's image holds no bytes between its uses: they are read again from the file when sent
        assert img.content is None and img.file is not None and st["image_bytes"] <= st["budget_bytes"] // 2
        assert I.load_image(paths[-1]) is I.load_image(paths[-1])  # the most recent one is a hit
        again = I.load_image(paths[0])  # long evicted: read again, the same image
        assert (again.sha256, again.data_uri()[:80]) == first[paths[0]]
        I.set_image_cache_mb(0)  # no cache: nothing kept
        assert I.image_cache_stats()["image_bytes"] == 0 and I.image_cache_stats()["uri_bytes"] == 0
    finally:
        I.set_image_cache_mb(float(before) if before else I.DEFAULT_IMAGE_CACHE_MB)
        if before is None:
            os.environ.pop("MMCF_IMAGE_CACHE_MB", None)


def test_a_probe_lets_go_of_an_image_when_the_last_trajectory_sending_it_is_done(tmp_path):
    """A probe takes each trajectory once: the images its finished trajectories sent were kept in the caches up to
    their bound (512 MB; 794 MB of RSS at 3,000 teacher-forced steps with photos, ~1.1 GB at paper scale by
    extrapolation). Now an image leaves both caches when the last trajectory
    in flight that sends it is done, and not before (two trials of one sample share their query image)."""
    import numpy as np
    from PIL import Image

    from agent import images as I
    from agent.backends import messages as M

    rng = np.random.default_rng(1)
    imgs = {}
    for name in ("a", "b"):
        p = tmp_path / f"{name}.png"
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(p)
        img = I.load_image(p)
        img.data_uri()
        imgs[name] = (p, img.sha256)

    def msgs(*names):
        return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(imgs[n][0])},
                                              "sha256": imgs[n][1]} for n in names]}]

    def cached(name):
        with I._lock:
            uri = I._uri_by_sha.get(imgs[name][1]) is not None
            data = any(v.sha256 == imgs[name][1] for v, _ in I._by_key.items.values())
        return uri, data

    users, t1, t2 = M.ImageUsers(), set(), set()
    users.use(t1, M.image_shas(msgs("a", "b")))
    users.use(t1, M.image_shas(msgs("a")))  # a later step of the same trajectory: counted once
    users.use(t2, M.image_shas(msgs("a")))
    users.done(t1)
    assert cached("a") == (True, True) and cached("b") == (False, False)  # a: still sent by t2
    users.done(t2)
    assert cached("a") == (False, False) and users.users == {}
    assert I.load_image(imgs["a"][0]).sha256 == imgs["a"][1]  # read again if it is needed after all


def test_ctrl_c_in_any_command_is_one_line_and_status_130_not_a_traceback():
    """X1: every command parses its arguments with agent.cli's parser, which makes an uncaught Ctrl-C one line."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("from agent.cli import make_parser\nmake_parser('python -m x', None, []).parse_args([])\n"
            "raise KeyboardInterrupt")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode in (130, -2) and "Traceback" not in r.stderr
    assert "interrupted (Ctrl-C): every output finished so far is kept" in r.stderr
    other = subprocess.run([sys.executable, "-c", code.replace("KeyboardInterrupt", "ValueError('boom')")], cwd=REPO,
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert other.returncode == 1 and "Traceback" in other.stderr and "boom" in other.stderr  # bugs stay visible


def _ignores_ctrl_c() -> None:  # a worker stuck where Ctrl-C does not reach it (a blocking call, a busy C loop)
    import signal
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(600)


@pytest.mark.timeout(120)  # a hang guard: one deadline for all takes seconds; one per worker took a minute each
async def test_workers_that_ignore_ctrl_c_are_stopped_within_one_deadline(tmp_path, monkeypatch):
    """P1: on Ctrl-C / SIGTERM the parent gives its workers one deadline all together, then SIGTERM, then SIGKILL:
    three workers that ignore SIGINT are all gone when it returns."""
    import asyncio
    import multiprocessing as mp

    from agent.run import processes
    from agent.rundir import RunDir

    monkeypatch.setattr(processes, "STOP_GRACE_S", 1)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_ignores_ctrl_c) for _ in range(3)]
    for p in procs:
        p.start()

    class Bar:
        def update(self, n):
            pass

    watch = asyncio.ensure_future(processes._watch(procs, ctx.Queue(), RunDir(tmp_path / "run"), Bar()))
    await asyncio.sleep(0.5)
    watch.cancel()  # what Ctrl-C does to the parent's wait
    summaries, interrupted = await watch
    assert interrupted and summaries == [] and not any(p.is_alive() for p in procs)
