"""Hostile and damaged run directories (issue 55): what is not a file is never waited on, what a sidecar claims is
checked against its line before anything is allocated, and each is named in one line, never a traceback."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent.rundir import check_run, load_run
from agent.rundir.lines import seal
from agent.rundir.sidecar import sha256_of
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S
from tests.records import recorded_lines

#: a guard against a hang, never a verdict on speed: each command here takes seconds on an idle machine
GUARD_S = HANG_GUARD_S


def _cmd(*args):
    try:
        return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"python -m {' '.join(args)}: no progress for {GUARD_S} s (waiting on a FIFO?)")


@pytest.fixture(scope="module")
def graded_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("trust") / "run"
    assert _cmd("agent.run", "--method", "react", "--backend", "scripted", "--limit", "2", "--out", str(run),
                "--no-progress").returncode == 0
    assert _cmd("agent.judge", str(run), "--judge", "exact", "--no-progress").returncode == 0
    return run


def _copy(run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


@pytest.mark.slow
@pytest.mark.parametrize("where", ["results.jsonl", "judge-exact.jsonl", "tokens/*", "images/*", "tools.sqlite"])
def test_a_fifo_inside_a_run_is_named_and_never_waited_on(graded_run, tmp_path, where):
    """check, the viewer (terminal and page) and export each end at once with the FIFO named (check lists it and
    exits 1; a reader that needs it exits 2; one that can do without it goes on), never hang (issue 55, item 6)."""
    run = _copy(graded_run, tmp_path)
    victim = sorted(run.glob(where))[0]
    victim.unlink()
    os.mkfifo(victim)
    name = str(victim.relative_to(run))
    rep = _cmd("agent.rundir", "check", str(run))
    assert rep.returncode == 1 and name in rep.stdout and "Traceback" not in rep.stderr, rep.stdout + rep.stderr
    for args in (["agent.show", str(run)], ["agent.show", str(run), "--html", str(tmp_path / "p.html")],
                 ["agent.rundir", "export", str(run), str(tmp_path / "export")]):
        r = _cmd(*args)
        assert "Traceback" not in r.stderr, (args, r.stderr[-2000:])
        assert r.returncode == 0 or (r.returncode == 2 and "a FIFO, not a regular file" in r.stderr), (args, r.stderr)
    shutil.rmtree(tmp_path / "export", ignore_errors=True)


def _rewrite_sidecar(run, i: int, edit) -> str:
    """Line ``i``'s sidecar rewritten by ``edit(table) -> table`` and the line sealed again with the new file's
    checksum, as a crafted run would be: only what the sidecar claims is wrong. Returns the unit."""
    res = run / "results.jsonl"
    lines = res.read_bytes().splitlines()
    line = json.loads(lines[i])
    path = run / line["tokens_file"]
    buf = io.BytesIO()
    pq.write_table(edit(pq.read_table(path)), buf)
    path.write_bytes(buf.getvalue())
    line["tokens_sha256"] = sha256_of(buf.getvalue())
    lines[i] = seal(line)
    res.write_bytes(b"\n".join(lines) + b"\n")
    (run / "results.index.jsonl").unlink()
    return f"{line['sample_id']}/t{line['trial']}"


def _top_k(t):
    return t.replace_schema_metadata({**t.schema.metadata, b"mmcf.top_k": b"3000000000"})


def _wrong_type(t):
    return t.set_column(t.schema.get_field_index("top_logprobs"), "top_logprobs",
                        t.column("top_logprobs").cast(pa.list_(pa.float64())))


@pytest.mark.parametrize("edit,finding", [(_top_k, "mmcf.top_k is 3000000000: outside 1..1024"),
                                          (_wrong_type, "column 'top_logprobs' is list<element: double>, not list<item: float>")])
def test_a_sidecar_whose_footer_or_schema_lies_is_refused_by_check_and_every_reader(graded_run, tmp_path, edit,
                                                                                     finding):
    """A footer claiming 3e9 alternatives a token (a reader would allocate terabytes) or a column of the wrong
    type: check names it (so merge refuses the run), and the viewer, the export and the token reader refuse it
    in one line before allocating anything (issue 55, item 11)."""
    from agent.rundir import RunError

    run = _copy(graded_run, tmp_path)
    unit = _rewrite_sidecar(run, 0, edit)
    for f in run.glob("judge-*.jsonl"):  # the line was rewritten: its grade is of another line (tests/test_seals.py)
        f.unlink()
    rep = check_run(run)
    assert not rep.intact and [(u, p.split(": ", 1)[1]) for u, p in rep.sidecars] == [(unit, finding)]
    loaded = load_run(run)
    with pytest.raises(RunError, match="unreadable token sidecar"):
        loaded.tokens(loaded.index[0])
    r = _cmd("agent.rundir", "export", str(run), str(tmp_path / "export"))
    assert r.returncode == 2 and finding in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_swapped_sidecar_is_caught_by_the_checksum_its_line_keeps(graded_run, tmp_path):
    run = _copy(graded_run, tmp_path)
    a, b = [json.loads(x)["tokens_file"] for x in (run / "results.jsonl").read_bytes().splitlines()]
    (run / a).rename(run / "swap")
    (run / b).rename(run / a)
    (run / "swap").rename(run / b)
    rep = check_run(run)
    assert len(rep.sidecars) == 2 and all("not the ones its line was written with" in p for _, p in rep.sidecars)


def test_a_non_ascii_sample_id_runs_and_a_control_character_in_an_id_is_refused_naming_its_line(tmp_path):
    """``样本_1`` failed every request of its unit (the routing-key header could not be encoded); an id holding CR/LF
    was retried five times. Now the routing key is an ASCII digest of the unit and such an id is refused when the
    manifest is read, naming the line (issue 55, item 8)."""
    from PIL import Image

    from agent.backends.base import routing_key
    from serving.fakes.sglang_server import FakeSGLang

    bench = tmp_path / "bench"
    (bench / "imgs").mkdir(parents=True)
    Image.new("RGB", (32, 32), "red").save(bench / "imgs" / "red.png")
    rows = [{"id": "样本_1", "query": "What colour?", "query_images": ["red.png"], "answer": "red"},
            {"id": "bad\r\nid", "query": "What colour?", "query_images": ["red.png"], "answer": "red"}]
    (bench / "data_unified.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    run = tmp_path / "run"
    with FakeSGLang(reply="<think>\nred\n</think>\n\n<answer>red</answer>") as srv:
        refused = _cmd("agent.run", "--method", "react", "--backend", "openai", "--endpoint", srv.url,
                       "--benchmark", str(bench), "--out", str(run), "--no-progress")
        # a row that cannot run changes the denominator: named, and refused unless the user opts in (issue 82)
        assert refused.returncode == 2 and "line 2" in refused.stderr and "control characters" in refused.stderr
        assert "--skip-bad-rows" in refused.stderr and not srv.bodies
        r = _cmd("agent.run", "--method", "react", "--backend", "openai", "--endpoint", srv.url, "--benchmark",
                 str(bench), "--out", str(run), "--no-progress", "--skip-bad-rows")
        keys = set(srv.routing_keys)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "line 2" in r.stderr and "control characters" in r.stderr
    (line,) = recorded_lines(run)
    assert line["sample_id"] == "样本_1" and line["status"] == "ok"
    assert keys == {routing_key(("样本_1", 0))} and all(k.isascii() for k in keys)
    assert not routing_key(("s", 1)).endswith(("_t1", "_r1"))  # smg strips such suffixes (issue 58)


@pytest.mark.slow
def test_a_hung_model_server_ends_the_run_within_its_request_timeout_keeping_what_finished(tmp_path):
    """A server that stops answering (its scheduler hung: no reply, /health 503) ends the run one request timeout
    after it hung, with one line and exit 6; the finished units are written, those in flight resume on the rerun
    (issue 55, item 9: it waited the timeout once per request and retry before)."""
    from serving.fakes.sglang_server import FakeSGLang

    run = tmp_path / "run"
    with FakeSGLang(reply="<think>\nhm\n</think>\n\n<answer>red</answer>") as srv:
        base = ["agent.run", "--method", "react", "--backend", "openai", "--endpoint", srv.url, "--benchmark", "demo",
                "--out", str(run), "--no-progress", "--request-timeout", "3"]
        assert _cmd(*base, "--limit", "2").returncode == 0
        srv.hung.set()
        r = _cmd(*base, "--concurrency", "4")
        assert r.returncode == 6, r.stderr[-2000:]
        assert "health check" in r.stderr and "the server is down or hung" in r.stderr and "Traceback" not in r.stderr
        n_posts = len(srv.bodies)
        srv.hung.clear()
        assert len(load_run(run).index) == 2  # the two finished units; nothing written for those in flight
        assert n_posts <= 2 + 4  # each unit in flight asked once, none retried
        assert _cmd(*base).returncode == 0  # the server is back: the rerun finishes the run
    assert len(load_run(run).index) == 6


@pytest.mark.slow
def test_a_model_server_that_dies_mid_probe_ends_the_probe_at_once_keeping_every_finished_step(tmp_path,
                                                                                           tiny_model_dir):
    """The entropy probe (teacher-forced, SGLang's native API) against a server that dies part-way: it ends with one
    line (exit 2) at the first request that gets no reply, every finished step kept, instead of retrying every
    remaining step in turn (issue 55, item 9)."""
    from serving.fakes.sglang_server import FakeSGLang
    from tests.records import record_react_run

    run = tmp_path / "run"
    record_react_run(run, tiny_model_dir, limit=3)
    with FakeSGLang(tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:
        srv.crash_when = lambda s: len(s.bodies) > 4
        r = _cmd("probes.entropy", str(run), "--mode", "teacher-forced", "--backend", "sglang", "--endpoint", srv.url,
                 "--model-dir", str(tiny_model_dir), "--skip-fidelity", "--include-unparsed", "--no-progress",
                 "--concurrency", "1")
    assert r.returncode == 2 and "the server is down or hung" in r.stderr and "Traceback" not in r.stderr, r.stderr
    steps = run / "probes" / "entropy-teacher-forced" / "steps.jsonl"
    assert 1 <= len(steps.read_bytes().splitlines()) <= 2  # a step is two scoring requests: what finished is kept


# ------------------------------------------------------------------ issue 55, the low items: one line each
def test_the_terminal_view_shows_control_characters_as_escapes_and_a_closed_pipe_is_quiet(graded_run, tmp_path):
    run = _copy(graded_run, tmp_path)
    res = run / "results.jsonl"
    lines = [json.loads(x) for x in res.read_bytes().splitlines()]
    lines[0]["answer"] = "\x1b]0;pwned\x07\x1b[31mred\x1b[0m"
    res.write_bytes(b"".join(seal(ln) + b"\n" for ln in lines))
    (run / "results.index.jsonl").unlink()
    for f in run.glob("judge-*.jsonl"):  # the line was rewritten: its grade is of another line
        f.unlink()
    r = _cmd("agent.show", str(run), lines[0]["sample_id"])
    assert r.returncode == 0 and "\x1b" not in r.stdout + r.stderr and "\\x1b[31mred" in r.stdout
    piped = subprocess.run(f"{sys.executable} -m agent.show {run} {lines[0]['sample_id']} | head -1", shell=True,
                           cwd=REPO, capture_output=True, text=True, timeout=GUARD_S)
    assert piped.stdout.count("\n") == 1 and piped.stderr == "", piped.stderr


def test_a_page_under_a_regular_file_and_a_refused_run_leave_one_line_and_nothing_behind(graded_run, tmp_path):
    (tmp_path / "file").write_text("x")
    r = _cmd("agent.show", str(graded_run), "--html", str(tmp_path / "file" / "page.html"))
    assert r.returncode == 2 and "cannot write the page" in r.stderr and "Traceback" not in r.stderr, r.stderr
    out = tmp_path / "refused"
    r = _cmd("agent.run", "--method", "react", "--backend", "openai", "--endpoint", "http://127.0.0.1:9",
             "--limit", "1", "--out", str(out), "--no-progress")
    assert r.returncode == 2 and "unreachable" in r.stderr and not out.exists(), r.stderr


def test_absurd_usage_numbers_are_never_summed_into_a_bill():
    """A provider cost of 1e308 a call is no cost (the ledger would sum it to infinity); a negative token count is a
    reply with impossible values, asked again, then named."""
    from agent.backends.base import BadReply, SamplingParams
    from agent.backends.openai_compat import OpenAIBackend

    b = OpenAIBackend("http://127.0.0.1:9", "m", server="openrouter")
    reply = {"model": "m", "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 3, "completion_tokens": 1, "cost": 1e308}}
    assert b.parse(reply, SamplingParams(top_logprobs=0)).usage.cost is None
    reply["usage"]["cost"] = 0.002
    assert b.parse(reply, SamplingParams(top_logprobs=0)).usage.cost == 0.002
    reply["usage"]["prompt_tokens"] = -5
    with pytest.raises(BadReply, match="usage.prompt_tokens is -5, not a token count"):
        b.parse(reply, SamplingParams(top_logprobs=0))


# ------------------------------------------------------------------ issue 80's smaller leaks
@pytest.mark.parametrize("bad", [["x", 4, None], [-1.0, -5, None], [-1.0, 10 ** 11, None], [-1.0, "abc", None],
                                 [-1.0, float("nan"), None]])
def test_a_malformed_alternative_is_refused_before_anything_decodes_it(bad):
    """A non-numeric logprob, an id below 0 or beyond the vocabulary, an id that is no integer: the reply is refused
    naming the field (asked again within the bounded retries), never a tokenizer's traceback."""
    from agent.backends.base import BadReply
    from agent.backends.wire import tokens_from_triples

    decoded = []
    with pytest.raises(BadReply, match="refusing the reply|is not a number"):
        tokens_from_triples([[-0.5, 3, None]], [[[-0.5, 3, None], bad]], where="meta_info.input", k=2, vocab=628,
                            decode=lambda i: decoded.append(i) or f"t{i}").texts
    assert all(0 <= i < 628 for i in decoded)


def test_a_reply_longer_than_its_request_can_be_is_refused_as_it_arrives():
    """A model server answering with a body far beyond what the request can hold (tokens x alternatives) is refused
    by its declared length, or as its chunks arrive, never read whole."""
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from agent.http import ReplyTooLarge, RetryPolicy, reply_cap, request_json
    from agent.model_http import ModelClient

    sent = {"bytes": 0}

    class Huge(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if self.path == "/declared":
                self.send_header("Content-Length", str(200 << 20))
            self.end_headers()
            try:
                for _ in range(200):  # 200 MB in 1 MB pieces, unless the client hangs up
                    self.wfile.write(b" " * (1 << 20))
                    sent["bytes"] += 1 << 20
            except OSError:
                pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Huge)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    cap = reply_cap(100, 20)

    async def ask(path):
        c = ModelClient()
        try:
            return await request_json(c, "POST", url + path, json_body={}, policy=RetryPolicy(retries=2),
                                      max_bytes=cap)
        finally:
            await c.aclose()
    try:
        for path in ("/declared", "/chunked"):
            with pytest.raises(ReplyTooLarge, match="more than the .* its request can be answered with"):
                asyncio.run(ask(path))
    finally:
        srv.shutdown()
    assert cap < 10 << 20 and sent["bytes"] < 100 << 20  # the client stopped reading long before the 200 MB


@pytest.mark.slow
def test_keys_in_sglang_extra_args_are_never_printed_or_written_and_bad_quoting_is_one_line(tmp_path):
    from tests.test_serving_launch import LAUNCH, sh

    key = "sk-launch-PLANTED-0123456789"
    r = sh([LAUNCH, "--dry-run", "--gpus", "8", "9b"], env={"SGLANG_EXTRA_ARGS": f"--api-key {key} --bogus-flag 1"})
    assert key not in r.stdout + r.stderr and "--api-key" in r.stdout
    r = sh([LAUNCH, "--dry-run", "--gpus", "8", "9b"], env={"SGLANG_EXTRA_ARGS": "--api-key 'unbalanced"})
    assert r.returncode == 1 and "SGLANG_EXTRA_ARGS cannot be split as a shell would" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
