"""Keys go only to their own host, never follow a redirect to another origin, and are redacted whatever the
variable's name; a request timeout is a deadline; 200 replies of the wrong shape are parsed or named (issue 22)."""
from __future__ import annotations

import json
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from agent.http import HTTPError, RetryPolicy, make_client, request_json
from agent.model_http import ModelClient
from agent.redact import is_host, redact, redact_console, register_key_var
from serving.fakes.http_base import JSONHandler
from tests.guards import HANG_GUARD_S
from tests.records import recorded_lines

#: the clients request_json is given: httpx for the live tools, aiohttp for the model servers (the backends, a judge)
CLIENTS = {"httpx": lambda: make_client(follow_redirects=False), "aiohttp": ModelClient}
#: what each client's library calls a refused connection (named in the error)
REFUSED = {"httpx": "ConnectError", "aiohttp": "ClientConnectorError"}


class _Server:
    def __init__(self, handler):
        self.seen: list[dict] = []
        outer = self

        class H(handler):
            def record(self):
                outer.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_the_openrouter_key_goes_to_openrouter_only():
    from agent.judge import judge_key_env

    assert judge_key_env("https://openrouter.ai/api/v1", None) == "OPENROUTER_API_KEY"
    for url in ("http://127.0.0.1:9/openrouter.ai/v1", "https://openrouter.ai.evil.example/v1",
                "http://openrouter.ai/api/v1", "https://evil.example/?u=openrouter.ai"):
        assert judge_key_env(url, None) is None, url
    assert judge_key_env("http://127.0.0.1:9/v1", "MY_JUDGE_KEY") == "MY_JUDGE_KEY"  # named for it: sent
    assert is_host("https://OpenRouter.ai/api", "openrouter.ai")


@pytest.mark.parametrize("kind", sorted(CLIENTS))
async def test_a_key_never_follows_a_redirect_to_another_origin(kind):
    class Other(JSONHandler):
        def do_GET(self):
            self.record()
            self._send(200, {"ok": True})

    other = _Server(Other)

    class Redirect(JSONHandler):
        def do_GET(self):
            self.record()
            target = other.url + "/steal" if self.path == "/away" else "/here"
            if self.path == "/here":
                return self._send(200, {"same": True})
            self.send_response(307)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()

    a = _Server(Redirect)
    client = CLIENTS[kind]()
    try:
        with pytest.raises(HTTPError, match="redirected to another origin"):
            await request_json(client, "GET", a.url + "/away", headers={"X-API-KEY": "serper-PLANTED"},
                               policy=RetryPolicy(retries=0, timeout_s=30))
        assert other.seen == []  # the key (and the request) never reached the other origin
        # the same origin is followed, key included
        got = await request_json(client, "GET", a.url + "/start", headers={"X-API-KEY": "serper-PLANTED"},
                                 policy=RetryPolicy(retries=0, timeout_s=30))
        assert got == {"same": True} and a.seen[-1]["headers"]["x-api-key"] == "serper-PLANTED"
        # without a key a cross-origin redirect is followed
        got = await request_json(client, "GET", a.url + "/away", policy=RetryPolicy(retries=0, timeout_s=30))
        assert got == {"ok": True} and "x-api-key" not in other.seen[-1]["headers"]
    finally:
        await client.aclose()
        a.close()
        other.close()


@pytest.mark.parametrize("kind", sorted(CLIENTS))
async def test_the_request_timeout_is_a_deadline_for_the_whole_reply(kind):
    class Drip(JSONHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "400")
            self.end_headers()
            for _ in range(400):  # one byte every 0.1 s: each read is quick, the whole reply takes 40 s
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.1)

    s = _Server(Drip)
    client = CLIENTS[kind]()
    t0 = time.monotonic()
    try:
        with pytest.raises(HTTPError, match="no complete reply within 1 s"):
            await request_json(client, "GET", s.url + "/", policy=RetryPolicy(retries=0, timeout_s=1))
    finally:
        await client.aclose()
        s.close()
    assert time.monotonic() - t0 < 30  # a bound far above the deadline, far below the drip's 40 s


@pytest.mark.parametrize("kind", sorted(CLIENTS))
async def test_a_refused_connection_and_a_cut_reply_are_retried_then_named(kind):
    """Transport faults through either client: retried, then refused with the error's name and the endpoint."""
    import socket

    with socket.socket() as sk:  # a port nobody listens on
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    client = CLIENTS[kind]()
    try:
        with pytest.raises(HTTPError, match=rf"127.0.0.1:{port}/x failed after 2 attempts; last error: {REFUSED[kind]}"):
            await request_json(client, "GET", f"http://127.0.0.1:{port}/x", policy=RetryPolicy(retries=1, backoff_s=0.01))

        class Cut(JSONHandler):  # promises 100 bytes, sends 9 and closes: the first time only
            n = 0

            def do_GET(self):
                Cut.n += 1
                if Cut.n > 1:
                    return self._send(200, {"whole": True})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "100")
                self.end_headers()
                self.wfile.write(b'{"whole":')
                self.wfile.flush()
                self.close_connection = True

        s = _Server(Cut)
        try:
            assert await request_json(client, "GET", s.url + "/", policy=RetryPolicy(retries=2, backoff_s=0.01)) == {"whole": True}
            assert Cut.n == 2
        finally:
            s.close()
    finally:
        await client.aclose()


@pytest.mark.parametrize("kind", sorted(CLIENTS))
async def test_proxies_come_from_the_environment_and_no_proxy_is_honoured(kind, monkeypatch):
    class Proxy(JSONHandler):  # an HTTP proxy gets the absolute URL as its request target
        def do_GET(self):
            self.record()
            self._send(200, {"via": "proxy"})

    class Direct(JSONHandler):
        def do_GET(self):
            self.record()
            self._send(200, {"via": "direct"})

    proxy, direct = _Server(Proxy), _Server(Direct)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    for k in ("http_proxy", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    client = CLIENTS[kind]()
    try:
        pol = RetryPolicy(retries=0, timeout_s=30)
        got = await request_json(client, "GET", "http://model-node.invalid:30000/v1/models", policy=pol)
        assert got == {"via": "proxy"} and proxy.seen[-1]["path"] == "http://model-node.invalid:30000/v1/models"
        assert await request_json(client, "GET", direct.url + "/v1/models", policy=pol) == {"via": "direct"}
        assert [x["path"] for x in direct.seen] == ["/v1/models"] and len(proxy.seen) == 1
    finally:
        await client.aclose()
        proxy.close()
        direct.close()


def test_the_value_of_a_named_key_variable_is_redacted_whatever_its_name(monkeypatch):
    monkeypatch.setenv("MODEL_SRV_KEY", "odd-name-PLANTED-123")
    assert "odd-name-PLANTED-123" in redact("token odd-name-PLANTED-123")  # not a key-looking name: not known
    register_key_var("MODEL_SRV_KEY")
    assert redact("error: bad token odd-name-PLANTED-123 given") == "error: bad token [REDACTED] given"


@pytest.mark.parametrize("body,expect", [
    ({"object": "error", "message": "queue full", "code": 503}, "BadReply"),
    ({"error": {"message": "bad key sk-x"}}, "BadReply"),
    ({"choices": [{"message": None, "finish_reason": "stop"}]}, "message is NoneType"),
    ({"choices": [{"message": {"content": 7}, "finish_reason": "stop"}]}, "content is int"),
])
def test_200_replies_of_the_wrong_shape_are_named(body, expect):
    from agent.backends.base import BackendError, BadReply, SamplingParams
    from agent.backends.openai_compat import OpenAIBackend

    b = OpenAIBackend("http://127.0.0.1:9", model="m")
    with pytest.raises(BackendError) as e:
        b.parse(body, SamplingParams(top_logprobs=0))
    if expect == "BadReply":
        assert isinstance(e.value, BadReply) and "error object" in str(e.value)  # asked again, like a 5xx
    else:
        assert expect in str(e.value) and "AttributeError" not in str(e.value)


def test_content_parts_are_joined():
    from agent.backends.base import SamplingParams
    from agent.backends.openai_compat import OpenAIBackend

    b = OpenAIBackend("http://127.0.0.1:9", model="m")
    out = b.parse({"choices": [{"message": {"content": [{"type": "text", "text": "<answer>"},
                                                         {"type": "text", "text": "1911</answer>"}]},
                                "finish_reason": "stop"}]}, SamplingParams(top_logprobs=0))
    assert out.text == "<answer>1911</answer>"


# ------------------------------------------------------------------ files a run must not trust blindly
def test_symlinks_that_leave_imgs_are_refused_with_file_and_line(tmp_path, red_image):
    import json
    import os

    from agent.benchmarks import load_benchmark

    bench = tmp_path / "b"
    (bench / "imgs").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.png").write_bytes(red_image.read_bytes())
    (bench / "imgs" / "ok.png").write_bytes(red_image.read_bytes())
    os.symlink(elsewhere / "x.png", bench / "imgs" / "a.png")  # a link to a file outside
    os.symlink("/", bench / "imgs" / "r")                        # a link to the root
    rows = [{"id": "1", "query": "q", "query_images": ["ok.png"], "answer": "a"},
            {"id": "2", "query": "q", "query_images": ["a.png"], "answer": "a"},
            {"id": "3", "query": "q", "query_images": [f"r{elsewhere}/x.png"], "answer": "a"}]
    (bench / "data_unified.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = load_benchmark(bench)
    assert [s.id for s in m.samples] == ["1"]
    refused = [(p.line, p.kind) for p in m.problems if p.kind == "path_outside_imgs"]
    assert refused == [(2, "path_outside_imgs"), (3, "path_outside_imgs")]
    # an imgs/ that is itself a link (a shared image store) is fine
    store = tmp_path / "store"
    store.mkdir()
    (store / "ok.png").write_bytes(red_image.read_bytes())
    b2 = tmp_path / "b2"
    b2.mkdir()
    os.symlink(store, b2 / "imgs")
    (b2 / "data_unified.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert [s.id for s in load_benchmark(b2).samples] == ["1"]


def test_a_corrupt_tool_cache_is_named_with_how_to_recover(tmp_path, capsys):
    from agent.run import main as run_main

    run = tmp_path / "r"
    assert run_main(["--method", "react", "--backend", "scripted", "--out", str(run), "--limit", "1", "--no-progress"]) == 0
    (run / "tools.sqlite").write_bytes(b"this is not a database" * 100)
    for wal in ("tools.sqlite-wal", "tools.sqlite-shm"):
        (run / wal).unlink(missing_ok=True)
    capsys.readouterr()
    assert run_main(["--method", "react", "--backend", "scripted", "--out", str(run), "--limit", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'tools.sqlite'}: the tool cache is not a usable SQLite database" in err and "mv " in err
    assert "Traceback" not in err


def test_a_line_damaged_in_place_is_seen_by_every_reader(tmp_path, capsys):
    """Same inode, same length, one byte changed (a disk error): the index must not vouch for the old line. The
    unit reruns on resume, the judge does not grade it, a reader that reaches it by an older index is refused
    with the file and offset."""
    import json

    from agent.judge import main as judge_main
    from agent.run import main as run_main
    from agent.rundir import Lines, RunDir, RunError

    run = tmp_path / "r"
    args = ["--method", "react", "--backend", "scripted", "--out", str(run), "--limit", "3", "--no-progress"]
    assert run_main(args) == 0
    rd = RunDir(run)
    old_index = rd.index()
    res = run / "results.jsonl"
    data = bytearray(res.read_bytes())
    first_end = data.index(b"\n")
    victim = json.loads(data[:first_end])["sample_id"]
    mid = first_end // 2
    data[mid] = ord("\x01") if data[mid] != 1 else ord("\x02")  # one byte, same length, same inode
    with open(res, "r+b") as f:
        f.write(bytes(data))
    assert victim not in {k[0] for k in rd.done_keys()}  # the index no longer vouches for it
    with pytest.raises(RunError, match=r"results.jsonl: the line at byte 0 changed"):
        Lines(res, old_index)[0]  # a reader holding the old index is refused, naming file and offset
    capsys.readouterr()
    assert judge_main([str(run), "--judge", "exact", "--no-progress"]) == 1  # graded the rest, said so, exit 1
    assert "changed since they were written" in capsys.readouterr().err
    graded = [json.loads(x)["sample_id"] for x in (run / "judge-exact.jsonl").read_text().splitlines()]
    assert victim not in graded and len(graded) == 2
    assert run_main(args) == 0  # resume: the damaged unit runs again
    assert victim in {ln["sample_id"] for ln in recorded_lines(run)}


@pytest.mark.slow
def test_a_full_disk_is_one_clear_message_with_its_own_exit_status(tmp_path):
    """A run that fills the disk, a rerun while it is still full, and a --repair at (almost) 100 %: one message
    naming the directory, exit 5, no traceback; the repair blanks torn lines in place (no copy of the file)."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode:
        pytest.skip("needs root to mount a small tmpfs (CI runs as root)")
    try:
        run = mnt / "r"

        def agent_run(*extra):
            return subprocess.run([sys.executable, "-m", "agent.run", "--method", "react", "--backend", "scripted",
                                   "--out", str(run), "--no-progress", *extra], cwd=REPO, capture_output=True,
                                  text=True, timeout=600)

        (mnt / "ballast").write_bytes(b"\0" * 96 * 1024)  # what the user frees later
        for _ in range(2):  # the run that fills it, then a rerun while it is still full
            r = agent_run("--trials", "60")
            assert r.returncode == 5, r.stderr[-2000:]
            msg = next(ln for ln in r.stderr.splitlines() if "the disk is full" in ln)
            assert msg.startswith(f"error: {run}") and "Traceback" not in r.stderr  # the run dir, or the file in it
        # a torn line, then --repair with only a few KB free (far less than results.jsonl's size)
        (mnt / "ballast").unlink()
        with open(run / "results.jsonl", "ab") as f:
            f.write(b'{"sample_id": "demo_1", "tri')
        st = os.statvfs(mnt)
        free = st.f_bavail * st.f_frsize
        with open(mnt / "filler", "wb") as f:
            f.write(b"\0" * max(free - 49152, 0))  # 48 KB left: a few directory and file pages
        size = (run / "results.jsonl").stat().st_size
        assert size > 2 * 49152  # the repair could not have copied the file
        c = subprocess.run([sys.executable, "-m", "agent.rundir", "check", str(run), "--repair"], cwd=REPO,
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert "Traceback" not in c.stderr and "torn line(s) moved to quarantine" in c.stdout, c.stdout + c.stderr
        assert (run / "results.jsonl").stat().st_size == size  # blanked in place: not a byte more
        assert not list(run.glob("results.jsonl.tmp*"))
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


async def test_a_key_echoed_in_a_200_tool_reply_is_never_cached_shown_or_recorded(tmp_path, monkeypatch):
    from agent.tools.cache import ToolCache
    from agent.tools.live import LiveProvider, ProviderResult
    from agent.tools.toolbox import Toolbox

    monkeypatch.setenv("SERPER_API_KEY", "serper-PLANTED-7777")
    await LiveProvider.from_env().aclose()  # the provider that sends the key registers it as a credential in use

    class Echoing:  # an API that puts the caller's key into a successful reply (seen in real error texts)
        async def search(self, q):
            return ProviderResult(f"results for {q} (key serper-PLANTED-7777)", {"echo": "serper-PLANTED-7777",
                                                                                "items": ["serper-PLANTED-7777 ok"]})

        async def aclose(self):
            pass

    tb = Toolbox(Echoing(), ToolCache(tmp_path / "tools.sqlite"))
    res = await tb.call("search", {"query": "kestrel", "goal": "g"}, None)
    assert "serper-PLANTED-7777" not in res.observation and "[REDACTED]" in res.observation
    assert "serper-PLANTED-7777" not in str(res.raw)
    assert b"serper-PLANTED-7777" not in (tmp_path / "tools.sqlite").read_bytes()
    again = await tb.call("search", {"query": "kestrel", "goal": "g"}, None)  # from the cache
    assert again.cache_hit and "serper-PLANTED-7777" not in again.observation


@pytest.mark.parametrize("kind", ["make_client(follow_redirects=False)", "ModelClient()"])
def test_the_model_client_serves_one_backend_across_event_loops_and_leaves_nothing_open(kind):
    """A client used by two ``asyncio.run`` (a preflight, then the work) gets new connections in the second loop
    (a connection belongs to the loop it was opened in), and nothing warns about what was left open."""
    import subprocess
    import sys

    class Ok(JSONHandler):
        def do_GET(self):
            self._send(200, {"ok": True})

    s = _Server(Ok)
    code = f"""
import asyncio, gc, sys
sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parents[1])!r})
from agent.http import RetryPolicy, make_client, request_json
from agent.model_http import ModelClient
c = {kind}
async def one():
    return await request_json(c, "GET", {s.url + "/x"!r}, policy=RetryPolicy(retries=0, timeout_s=30))
print(asyncio.run(one()), asyncio.run(one()))
asyncio.run(c.aclose())
gc.collect()
"""
    try:
        r = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    finally:
        s.close()
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["{'ok':", "True}", "{'ok':", "True}"]
    assert "Unclosed" not in r.stderr and "never awaited" not in r.stderr, r.stderr


def _echo_key_reply(key: str):
    """A server that puts the key it received into the reasoning, a tool call's arguments, the answer and (for a
    judge's prompt) the grade."""
    def reply(req) -> str:
        text = json.dumps(req.get("messages") or req.get("text") or "")
        if "correct" in text.lower() and "gold" in text.lower() or "judge" in text.lower():
            return f"The key was {key}. Correct"
        if "<tool_response>" in text or "search results" in text.lower():
            return f"<think>\nI also saw {key}\n</think>\n\n<answer>{key}</answer>"
        return (f"<think>\nmy key is {key}\n</think>\n\n<tool_call>\n"
                f'{{"name": "search", "arguments": {{"query": "{key}", "goal": "find {key}"}}}}\n</tool_call>')
    return reply


@pytest.mark.slow
def test_a_key_the_server_echoes_is_in_no_file_of_the_run_and_never_printed(tmp_path):
    """S1: the runner, the judge, the annotator and the entropy probe against a loopback server that echoes the key
    in the content, the reasoning, a tool call's arguments and an error body; then every file under the run
    directory and the console output are searched for the key (the variable's name is not secret-looking: it is
    redacted because it was named)."""
    import os
    import subprocess
    import sys

    from serving.fakes.sglang_server import FakeSGLang
    from tests.conftest import REPO

    key = "zq-echoed-9f8e7d6c5b4a3210"
    env = {**os.environ, "MMCF_PLAIN_VAR": key, "PYTHONPATH": str(REPO)}
    run = tmp_path / "run"
    with FakeSGLang(reply=_echo_key_reply(key)) as srv:
        srv.faults = ["500_echo", "500_echo"]
        cmds = [["agent.run", "--method", "react", "--backend", "openai", "--endpoint", srv.url, "--api-key-env",
                 "MMCF_PLAIN_VAR", "--benchmark", "demo", "--limit", "2", "--t-max", "3", "--out", str(run),
                 "--no-progress"],
                ["agent.judge", str(run), "--judge-endpoint", srv.url, "--judge-model", "fake-qwen3.5",
                 "--judge-api-key-env", "MMCF_PLAIN_VAR", "--no-progress"],
                ["probes.grounding", str(run), "--judge-endpoint", srv.url, "--judge-model", "fake-qwen3.5",
                 "--judge-api-key-env", "MMCF_PLAIN_VAR", "--include-unparsed", "--no-progress"],
                ["probes.entropy", str(run), "--mode", "regenerate", "--backend", "openai", "--endpoint", srv.url,
                 "--api-key-env", "MMCF_PLAIN_VAR", "--skip-fidelity", "--include-unparsed", "--no-progress"],
                ["agent.show", str(run)], ["agent.show", str(run), "--html", str(run / "page.html")],
                ["agent.ledger", str(run)]]
        console = ""
        for c in cmds:
            r = subprocess.run([sys.executable, "-m", *c], cwd=REPO, env=env, capture_output=True, text=True,
                               timeout=HANG_GUARD_S)
            console += r.stdout + r.stderr
            assert r.returncode == 0, (c, r.stdout[-2000:], r.stderr[-2000:])
        assert any(key in json.dumps(b) for b in srv.bodies) or srv.injected["500_echo"] == 2  # it was echoed
    assert "[REDACTED]" in (run / "results.jsonl").read_text()  # the echo landed where redaction applies
    assert key not in console
    leaked = [str(p.relative_to(run)) for p in run.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert leaked == []


def test_a_urls_password_is_never_printed(tmp_path):
    """G1: serving.gateway names a server it cannot use by its URL; the URL's password is redacted."""
    import subprocess
    import sys

    from tests.conftest import REPO

    (tmp_path / "endpoints.json").write_text(json.dumps([{
        "url": "http://alice:s3cretpw@127.0.0.1:9", "served_model": "qwen3.5-9b", "model": "qwen3.5-9b",
        "weights": "/m", "size": "9b", "gpus": "0,1,2,3", "logprob_mode": "scaled", "deterministic": False,
        "pid": 1, "log": "x", "status": "running", "kind": "server"}]))
    r = subprocess.run([sys.executable, "-m", "serving.gateway", str(tmp_path), "--dry-run"], cwd=REPO,
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode != 0 and "alice:[REDACTED]@127.0.0.1:9" in r.stderr
    assert "s3cretpw" not in r.stdout + r.stderr
    assert redact_console("see https://bob:hunter22@example.org/x") == "see https://bob:[REDACTED]@example.org/x"


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` pixels in 60 bytes (its header; no pixel data)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def test_a_decompression_bomb_in_a_benchmark_is_a_clear_error_naming_the_image(tmp_path, capsys):
    """I1: a 20000 x 20000 PNG is named (and agent.benchmarks stats reports it), never a traceback."""
    from agent.benchmarks import main as bench_main
    from agent.images import ImageError, load_image

    bench = tmp_path / "data" / "simplevqa"
    (bench / "imgs").mkdir(parents=True)
    (bench / "imgs" / "bomb.png").write_bytes(_png_header_only(20000, 20000))
    (bench / "data_unified.jsonl").write_text(json.dumps({"id": "a", "query": "q?", "query_images": ["bomb.png"],
                                                          "answer": "x"}) + "\n")
    with pytest.raises(ImageError, match=r"bomb.png: too many pixels to read safely"):
        load_image(bench / "imgs" / "bomb.png")
    assert bench_main(["stats", str(tmp_path / "data")]) == 0  # a report: the problem is listed with its line
    out = capsys.readouterr().out
    assert "data_unified.jsonl:1" in out and "bomb.png: too many pixels to read safely" in out


@pytest.mark.parametrize("damage", ["out is a file", "header field of the wrong type", "header is a list"])
def test_a_file_for_a_run_or_an_edited_header_is_one_clear_error_in_every_reader(tmp_path, capsys, damage):
    """Tracebacks instead of messages: OUT that is an existing file, a header field of the wrong type."""
    from agent.judge import main as judge_main
    from agent.run import main as run_main
    from agent.show import main as show_main
    from probes.entropy import main as entropy_main

    run = tmp_path / "run"
    if damage == "out is a file":
        run.write_text("notes")
        expect = "is a file, not a run directory"
    else:
        assert run_main(["--method", "react", "--backend", "scripted", "--limit", "1", "--out", str(run),
                         "--no-progress"]) == 0
        h = json.loads((run / "header.json").read_text())
        (run / "header.json").write_text(json.dumps({**h, "budgets": "lots"} if "field" in damage else [h]))
        expect = ("not a valid header record (1 problem(s); first: budgets: Input should be a valid dictionary or "
                  "instance of Budgets (got 'lots'))" if "field" in damage else "the header is a list")
    capsys.readouterr()
    for main, argv in ((run_main, ["--method", "react", "--backend", "scripted", "--limit", "1", "--out", str(run)]),
                       (show_main, [str(run)]), (judge_main, [str(run), "--judge", "exact"]),
                       (entropy_main, [str(run), "--backend", "scripted"])):
        assert main(argv) != 0, main
        err = capsys.readouterr().err
        assert expect in err and "Traceback" not in err, (main, err[-500:])


def test_a_line_edited_in_place_that_still_parses_is_left_out_by_every_reader_and_reported(tmp_path, capsys):
    """H1: an answer changed in place (valid JSON, same length): the checksum written with the line catches it;
    check reports it, the judge and the readers leave it out with a loud warning and the judge exits non-zero."""
    from agent.judge import main as judge_main
    from agent.run import main as run_main
    from agent.rundir import check_run, load_run

    run = tmp_path / "r"
    assert run_main(["--method", "react", "--backend", "scripted", "--out", str(run), "--limit", "3",
                     "--no-progress"]) == 0
    res = run / "results.jsonl"
    data = res.read_bytes()
    first = json.loads(data[: data.index(b"\n")])
    i = data.index(b'"answer":"') + len(b'"answer":"')
    res.write_bytes(data[:i] + (b"Z" if data[i:i + 1] != b"Z" else b"Y") + data[i + 1:])  # still valid JSON
    rep = check_run(run)
    assert not rep.intact and rep.changed == [(1, f"{first['sample_id']}/t{first['trial']}")]
    capsys.readouterr()
    assert first["sample_id"] not in {s.sample_id for s in load_run(run).index}
    assert "changed since they were written" in capsys.readouterr().err
    assert judge_main([str(run), "--judge", "exact", "--no-progress"]) == 1
    graded = {json.loads(x)["sample_id"] for x in (run / "judge-exact.jsonl").read_text().splitlines()}
    assert first["sample_id"] not in graded and len(graded) == 2


def test_token_texts_that_spell_a_key_are_redacted(monkeypatch):
    """Only the tokens overlapping an occurrence change: the first reads [REDACTED], the rest of it empty."""
    from agent.redact import redact_token_texts

    monkeypatch.setenv("MY_API_KEY", "sk-abc123xyz")
    register_key_var("MY_API_KEY")
    texts = ["I", " saw", " sk", "-abc", "123", "xyz", " and", " sk-abc123xyz!", None]
    assert redact_token_texts(texts) == ["I", " saw", "[REDACTED]", "", "", "", " and", "[REDACTED]", None]
    assert redact_token_texts(["no", " key"]) == ["no", " key"]
