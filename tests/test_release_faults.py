"""``--protocol release`` under faults, odd input and malformed actions (issue 81): what the authors' release
(iLearn-Lab/MM26-MMContextFold @16fa474) does at each, asserted from its code (file:line beside each), and the default
protocol's own choice beside it (docs/fidelity.md). Loopback Serper / Lens / Jina (serving/fakes/web_apis.py) and a
scripted model (tests/test_release_edges.py's harness)."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent import prompts_release as R
from agent.http import HTTPError, RetryPolicy, make_client, request_json, requote_uri
from agent.run import main as run_main
from agent.tools.formatting import LENS_BRANCH_EMPTY
from serving.fakes.sglang_server import FakeSGLang
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S
from tests.records import recorded_lines
from tests.test_release_edges import PAPER, RELEASE, branch_policy, run_release, texts, tool

PROTOCOLS = {"release": RELEASE, "paper": PAPER}


def _tool_events(line) -> list[dict]:
    return [e for e in line["events"] if e["type"] == "tool_call"]


def _continuation(bodies) -> str:
    """The text the main state got back from the branch (the release's CONTINUE, ours E.2's)."""
    return next(t for b in bodies for m in b["messages"] for t in texts(m)
                if "completed" in t or "Subtask [look]" in t)


# ------------------------------------------------------------------ malformed actions
@pytest.mark.parametrize("protocol", ["release", "paper"])
def test_a_tool_call_holding_a_json_array(tmp_path, protocol):
    """pipeline :246 ``tool_call.get("name", "")`` on a list: the AttributeError ends the sample, whose answer is its
    text (:531-538). Ours: a malformed action, corrected (B.3)."""
    bodies, line = run_release(tmp_path, branch_policy([], ["<tool_call>[1, 2]</tool_call>"]), "demo_1",
                               method=PROTOCOLS[protocol])
    if protocol == "release":
        assert line["answer"] == "Error: 'list' object has no attribute 'get'"
    else:
        assert line["answer"] == "1998" and any(e.get("correction") for e in line["events"] if e["type"] == "llm_call")


@pytest.mark.parametrize("protocol", ["release", "paper"])
@pytest.mark.parametrize("params,kind", [("kestrel", "str"), (None, "NoneType")])
def test_parameters_that_are_no_object_get_no_request(tmp_path, web, protocol, params, kind):
    """pipeline :410-433: ``params.get("query", "")`` inside ``_execute_tool``'s try: "Tool error: ..." and no
    request. Ours: a malformed action, corrected; no request either."""
    call = "<tool_call>" + json.dumps({"name": "search", "parameters": params}) + "</tool_call>"
    bodies, line = run_release(tmp_path, branch_policy([], [call]), "demo_1", "--tools", "live",
                               method=PROTOCOLS[protocol])
    assert not [p for p, _ in web.bodies if p == "/search"]  # never a paid request
    if protocol == "release":
        assert [e["observation"] for e in _tool_events(line)] == [f"Tool error: '{kind}' object has no attribute 'get'"]
    else:
        assert not _tool_events(line) and line["answer"] == "1998"


@pytest.mark.parametrize("protocol", ["release", "paper"])
def test_a_numeric_return_message(tmp_path, protocol):
    """pipeline :234 ``(params.get("message") or "").strip()`` on a number: the sample ends with its error answer.
    Ours: a message that is no text is a malformed action, corrected (B.3)."""
    call = "<tool_call>" + json.dumps({"name": "return", "parameters": {"message": 1911}}) + "</tool_call>"
    bodies, line = run_release(tmp_path, branch_policy([], [call]), "demo_1", method=PROTOCOLS[protocol])
    if protocol == "release":
        assert line["answer"] == "Error: 'int' object has no attribute 'strip'"
    else:
        assert line["answer"] == "1998" and any(e.get("correction") for e in line["events"] if e["type"] == "llm_call")


@pytest.mark.parametrize("protocol", ["release", "paper"])
def test_a_stray_closing_answer_tag_in_a_return(tmp_path, protocol):
    """pipeline :254-259: only a message holding ``<answer>`` loses its tags; a stray ``</answer>`` stays. Ours strips
    it."""
    bodies, line = run_release(tmp_path, branch_policy([], [tool("return", message="founded 1911</answer>")]),
                               "demo_1", method=PROTOCOLS[protocol])
    cont = _continuation(bodies)
    if protocol == "release":
        assert cont == R.fill(R.CONTINUE, description="look", return_message="founded 1911</answer>")
    else:
        assert "founded 1911" in cont and "founded 1911</answer>" not in cont


# ------------------------------------------------------------------ tool faults
LENS = [tool("lens_search", image_id="<image_0>")]


@pytest.mark.parametrize("protocol", ["release", "paper"])
def test_lens_results_only_under_visual_matches(tmp_path, web, protocol):
    """utils/search_tools.py:150-157: no ``organic`` is "no results" there (the branch reads LENS_BRANCH_EMPTY). Ours
    reads ``visual_matches`` too."""
    web.lens_field = "visual_matches"
    bodies, line = run_release(tmp_path, branch_policy(["<image_0>"], LENS), "demo_1", "--tools", "live",
                               method=PROTOCOLS[protocol])
    (ev,) = _tool_events(line)
    if protocol == "release":
        assert ev["observation"] == LENS_BRANCH_EMPTY
    else:
        assert "<result#1>" in ev["observation"] and line["status"] == "ok"


@pytest.mark.parametrize("protocol", ["release", "paper"])
def test_a_null_row_in_search_results(tmp_path, web, protocol):
    """utils/search_tools.py:91 ``page.get('snippet', '')`` on a null row, caught by ``_execute_tool``. Ours leaves
    the row out and lists the others."""
    web.search_items = [{"title": "A", "link": "https://a.example/", "snippet": "s"}, None,
                        {"title": "B", "link": "https://b.example/"}]
    bodies, line = run_release(tmp_path, branch_policy([], [tool("search", query="q")]), "demo_1", "--tools", "live",
                               method=PROTOCOLS[protocol])
    (ev,) = _tool_events(line)
    if protocol == "release":
        assert ev["observation"] == "Tool error: 'NoneType' object has no attribute 'get'"
    else:
        assert "0. [A](https://a.example/)" in ev["observation"] and "1. [B](https://b.example/)" in ev["observation"]


@pytest.mark.parametrize("protocol", ["release", "paper"])
def test_a_null_lens_result_carries_on(tmp_path, web, protocol):
    """utils/search_tools.py:211 ``data.get("thumbnailUrl")`` outside its try, caught around the lens search
    (pipeline :371-374): "lens_search error: ...", and the branch goes on. Ours leaves the row out."""
    web.lens_items = [{"title": "M1", "link": "https://m1.example/", "thumbnailUrl": f"{web.url}/thumb/1.png"}, None,
                      {"title": "M2", "link": "https://m2.example/", "thumbnailUrl": f"{web.url}/thumb/2.png"}]
    bodies, line = run_release(tmp_path, branch_policy(["<image_0>"], LENS), "demo_1", "--tools", "live",
                               method=PROTOCOLS[protocol])
    (ev,) = _tool_events(line)
    assert line["status"] == "ok" and line["answer"] == "1998"
    if protocol == "release":
        assert ev["observation"] == "lens_search error: 'NoneType' object has no attribute 'get'"
    else:
        assert "<result#2>" in ev["observation"] and "M2" in ev["observation"]


@pytest.mark.parametrize("protocol", ["release", "paper"])
def test_urls_go_on_the_wire_as_requests_requotes_them_under_the_release(tmp_path, web, protocol):
    """requests re-quotes every URL it sends (requests/utils.py ``requote_uri``): the Jina reader URL and each
    thumbnail URL. httpx (ours) sends a URL as given."""
    page = "https://m.example/a%7Eb|c^d"
    web.pages[requote_uri(page)] = web.pages[page] = "the page"
    web.lens_items = [{"title": "M1", "link": "https://m1.example/", "thumbnailUrl": f"{web.url}/thumb/%31.png"}]
    bodies, line = run_release(tmp_path, branch_policy(["<image_0>"], [*LENS, tool("visit", url=page)]), "demo_1",
                               "--tools", "live", method=PROTOCOLS[protocol])
    gets = [p for m, p, _ in web.log if m == "GET"]
    if protocol == "release":
        assert "/" + requote_uri(page) in gets and "/thumb/1.png" in gets
        assert "/https://m.example/a~b%7Cc%5Ed" in gets
    else:
        assert "/" + requote_uri(page) not in gets and "/thumb/%31.png" in gets


def test_requote_uri_is_requests_own_rule():
    """Held equal to requests' own function, from the SGLang conformance layer that carries it (a process of its
    own: requests is no dependency of the toolkit)."""
    site = REPO / ".venv-sglang" / "site"
    if not (site / "requests" / "utils.py").is_file():
        pytest.skip("the SGLang conformance layer (with requests) is not built: bash scripts/sglang_conformance.sh")
    urls = ["https://a.example/x%7Ey|z^w v", "https://a.example/Ünï/ç?q=a b&c=%zz", "https://x/%41%2F%7e",
            "http://h/p?x=1|2#frag ment", "http://x/%", "http://x/%4", "http://x/%GG", "https://r.jina.ai/https://e/[a]"]
    code = "import json, sys; from requests.utils import requote_uri as q; print(json.dumps([q(u) for u in json.load(sys.stdin)]))"
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], input=json.dumps(urls), capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(site)}, timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr[-1000:]
    assert [requote_uri(u) for u in urls] == json.loads(r.stdout)


@pytest.mark.slow
def test_a_slow_but_steady_reply_is_kept_per_read_and_dropped_per_request():
    """requests' timeout bounds the connect and each read (the release's thumbnails, pages and searches); ours bounds
    the whole request. A reply that trickles in for longer than the timeout, each piece well within it."""
    class Slow(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", "40")
            self.end_headers()
            for _ in range(40):  # 40 bytes over ~8 s, one every 0.2 s
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.2)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/thumb"

    async def get(per_read: bool):
        c = make_client()
        try:
            return await request_json(c, "GET", url, decode=bytes,
                                      policy=RetryPolicy(retries=0, timeout_s=4.0, per_read=per_read))
        finally:
            await c.aclose()
    try:
        assert asyncio.run(get(True)) == b"x" * 40
        with pytest.raises(HTTPError, match="no complete reply within 4 s"):
            asyncio.run(get(False))
    finally:
        srv.shutdown()


# ------------------------------------------------------------------ a query file that is no image; a refused call
def _bench_with_empty_image(tmp_path, sample="demo_1"):
    """The demo benchmark with ``sample``'s query image emptied (0 bytes); its file name."""
    import shutil

    from agent.tools.demo_world import ensure_demo_world

    bench = tmp_path / "bench"
    shutil.copytree(ensure_demo_world() / "demo", bench)
    row = next(json.loads(x) for x in (bench / "data_unified.jsonl").read_text().splitlines() if f'"{sample}"' in x)
    (bench / "imgs" / row["query_images"][0]).write_bytes(b"")
    return bench, row["query_images"][0]


def test_a_query_file_that_is_no_image_is_sent_under_the_release_and_each_call_carrying_it_fails(tmp_path, capsys):
    """utils/search_backbone_model.py: ``create_message_content`` base64-encodes whatever the file holds (an empty
    file too) and ``send_single_message`` / ``send_message`` return ``f"Error: {e}"`` when the server refuses it
    (SGLang and vLLM open each image with PIL and answer 400); the init block is ``(perception failed)``
    (pipeline_mmcontextfold.py:113-115) and a branch given the image ends at once with its fixed message
    (:209, :218-219). The turn the server refused is taken back (``message_history.pop()``)."""
    bench, name = _bench_with_empty_image(tmp_path)
    bodies, line = run_release(tmp_path, branch_policy(["<image_0>"], [tool("return", message="found it")]),
                               "demo_1", "--benchmark", str(bench), "--allow-missing-images")
    empty = '"data:image/png;base64,"'  # the type from the name (.png), no bytes after the comma
    sent_empty = [b for b in bodies if empty in json.dumps(b)]
    assert len(sent_empty) == 2  # the init call and the branch's first call: both sent, both refused
    assert line["status"] == "ok" and line["answer"] == "1998" and line["undecodable_images"] == [name]
    main = [b for b in bodies if any(R.fill(R.PERCEPTION_FAILED, image_id="<image_0>") in t
                                     for m in b["messages"] for t in texts(m))]
    assert main, "the main prompt carries the release's perception-failed block"
    refused = [e for e in line["events"] if e["type"] == "error"]
    assert [e["kind"] for e in refused] == ["RequestRefused", "RequestRefused"]
    assert "answered HTTP 400" in refused[0]["message"] and "init" in refused[0]["message"]
    assert _continuation(bodies).count(R.BRANCH_NO_RETURN) == 1
    end = next(e for e in line["events"] if e["type"] == "branch_end")
    assert end["reason"] == "failed_call" and end["steps"] == 1
    # no recorded call holds the image: the record's calls are what the model answered
    assert all(not e["image_hashes"] for e in line["events"] if e["type"] == "llm_call")
    assert "sent as the release sends it" in capsys.readouterr().err


def test_a_query_file_that_is_no_image_is_refused_by_the_default_protocol(tmp_path, capsys):
    """Ours (docs/fidelity.md): a question without a readable image is another question; refused before any work,
    or skipped with ``--allow-missing-images``."""
    bench, name = _bench_with_empty_image(tmp_path)
    argv = [*PROTOCOLS["paper"], "--backend", "scripted", "--benchmark", str(bench), "--sample-ids", "demo_1",
            "--no-progress"]
    assert run_main([*argv, "--out", str(tmp_path / "a")]) == 2
    assert name in capsys.readouterr().err
    # under the release without --allow-missing-images: refused too (the flag is what says to run such samples)
    assert run_main([*RELEASE, *argv[2:], "--out", str(tmp_path / "b")]) == 2


@pytest.mark.parametrize("protocol", ["release", "paper"])
def test_a_refused_main_call(tmp_path, protocol):
    """A 400 on the first main call: under the release ``send_message`` pops the turn it could not send and returns
    ``Error: ...``; the main loop asks "Please continue with your analysis." (pipeline_mmcontextfold.py:463-466) on a
    history that has lost the main prompt. Ours: the unit ends ``error``, to be rerun."""
    policy = branch_policy([], [])
    with FakeSGLang(reply=lambda req: "ok</think>" + policy(req)) as srv:
        srv.faults = [None, "400"]  # the init call answers; the first main call is refused
        out = tmp_path / "run"
        code = run_main([*PROTOCOLS[protocol], "--backend", "openai", "--server", "sglang", "--endpoint", srv.url,
                         "--sample-ids", "demo_1", "--out", str(out), "--no-progress"])
        bodies = [b for b in srv.bodies if "messages" in b]
    line = recorded_lines(out)[0]
    if protocol == "release":
        assert code == 0 and line["status"] == "ok" and line["answer"] == "1998"
        assert [m["role"] for m in bodies[2]["messages"]] == ["system", "user"]
        assert texts(bodies[2]["messages"][1]) == [R.AFTER_FAILED_CALL]
        assert [e["kind"] for e in line["events"] if e["type"] == "error"] == ["RequestRefused"]
    else:
        assert line["status"] == "error" and "answered HTTP 400" in line["error"] and len(bodies) == 2
