"""``--protocol release`` where replies and tools are not clean: what the authors' release
(iLearn-Lab/MM26-MMContextFold @16fa474) sends at each of its edges, request for request, model and tool API
requests alike (issue 57; ``../shared/release-protocol.md`` D). The expected requests are written from the
release's code, cited file:line next to each assertion; the default protocol's own choices at the same points are
asserted beside them where they differ (docs/fidelity.md).
"""
from __future__ import annotations

import json

import pytest

from agent import prompts_release as R
from agent.run import main as run_main
from agent.rundir import load_run
from serving.fakes.sglang_server import FakeSGLang
from serving.fakes.web_apis import thumbnail
from tests.records import recorded_lines


def texts(msg) -> list[str]:
    c = msg["content"]
    return [c] if isinstance(c, str) else [p["text"] for p in c if p.get("type") == "text"]


def last_text(req) -> str:
    return texts(req["messages"][-1])[0]


def tool(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "parameters": args}) + "\n</tool_call>"


def subtask(**fields) -> str:
    return "<subtask>\n" + json.dumps(fields) + "\n</subtask>"


def is_init(req) -> bool:
    return req["messages"][0]["content"] == R.INIT_SYSTEM


RELEASE = ("--method", "mmcontextfold", "--protocol", "release")


def run_release(tmp_path, policy, sample="demo_1", *extra, method=RELEASE):
    """Run one sample against a loopback chat server whose replies ``policy(request)`` writes (None: null
    content; else the visible content after a short reasoning)."""
    def reply(req):
        said = policy(req)
        return None if said is None else "thinking it over</think>" + said

    with FakeSGLang(reply=reply) as srv:
        out = tmp_path / "run"
        argv = [*method, "--backend", "openai", "--server", "sglang",
                "--endpoint", srv.url, "--sample-ids", sample, "--out", str(out), "--no-progress", *extra]
        assert run_main(argv) == 0
        bodies = [b for b in srv.bodies if "messages" in b]
    return bodies, recorded_lines(out)[0]


# ------------------------------------------------------------------ 1. replies are appended raw
def test_a_reply_with_surrounding_whitespace_goes_back_as_it_came_and_is_recorded_so(tmp_path):
    said = "\n\n" + subtask(description="look", prompt="Search for it.", assigned_images=[]) + "\n"

    def policy(req):
        if is_init(req):
            return '\n{"summary": "logo", "source_hint": "site"}'
        if last_text(req).startswith("## Subtask [look] completed"):
            return "\n\n<answer>1911</answer>\n"
        if last_text(req).startswith("**MODE: BRANCH**"):
            return "\n" + tool("return", message="founded 1911")
        return said

    bodies, line = run_release(tmp_path, policy)
    # utils/search_backbone_model.py:124-125: message.content appended as sent, surrounding whitespace included
    branch = bodies[2]["messages"]
    assert branch[2] == {"role": "assistant", "content": said}
    main_call = next(e for e in line["events"] if e["type"] == "llm_call" and e["state"] == "main")
    assert main_call["text"] == said  # the record keeps what arrived
    assert line["answer"] == "1911"


def test_the_default_protocol_records_the_reply_raw_and_cleans_it_only_in_the_next_prompt(tmp_path):
    call = tool("search", query="kestrel observatory founded")
    replies = iter(["\n\n" + call + "\n", "\n\n<answer>1911</answer>"])
    bodies, line = run_release(tmp_path, lambda req: next(replies), method=("--method", "react"))
    assert [e["text"] for e in line["events"] if e["type"] == "llm_call"] == ["\n\n" + call + "\n",
                                                                             "\n\n<answer>1911</answer>"]
    # ours (docs/fidelity.md): the next prompt carries the reply without its surrounding whitespace (Qwen3.5's
    # template trims it anyway when it renders the history)
    assert bodies[1]["messages"][2]["role"] == "assistant" and bodies[1]["messages"][2]["content"] == call
    assert line["answer"] == "1911"


# ------------------------------------------------------------------ 2. null content
def test_a_null_init_reply_is_perception_failed_and_a_null_branch_reply_ends_the_branch(tmp_path):
    def policy(req):
        if is_init(req):
            return None
        last = last_text(req)
        if last.startswith("**MODE: BRANCH**"):
            return None
        if last.startswith("## Subtask [look] completed"):
            return "<answer>1911</answer>"
        return subtask(description="look", prompt="Search for it.", assigned_images=[])

    bodies, line = run_release(tmp_path, policy)
    # pipelines/pipeline_mmcontextfold.py:113-115: an empty or failed perception reply
    assert last_text(bodies[1]) == R.fill(R.MAIN, image_context="<image_0>: [Query Image] (perception failed)",
                                          question=line["question"])
    # :209, :218-219: a failed branch call ends the branch with the default return message; the branch's messages
    # (the null reply among them) are cut off (:329)
    assert last_text(bodies[3]) == R.fill(R.CONTINUE, description="look", return_message=R.BRANCH_NO_RETURN)
    assert len(bodies) == 4 and line["answer"] == "1911"
    init = line["events"][0]
    assert init["type"] == "llm_call" and init["text"] is None and "perception failed" in init["action_error"]


def test_a_null_main_reply_goes_into_the_history_as_null_and_the_release_asks_to_continue(tmp_path):
    replies = iter([None, "<answer>1911</answer>"])

    def policy(req):
        return '{"summary": "logo", "source_hint": "site"}' if is_init(req) else next(replies)

    bodies, line = run_release(tmp_path, policy)
    # utils/search_backbone_model.py:124-125 appends content as sent (None); pipeline :463-466 asks again
    assert bodies[2]["messages"][-2] == {"role": "assistant", "content": None}
    assert bodies[2]["messages"][-1] == {"role": "user", "content": [{"type": "text", "text": R.AFTER_FAILED_CALL}]}
    assert line["status"] == "ok" and line["answer"] == "1911"


# ------------------------------------------------------------------ 3. a reply starting with "Error:"
def test_a_reply_starting_with_error_is_a_failed_call_and_its_answer_is_ignored(tmp_path):
    replies = iter(["Error: upstream <answer>wrong</answer>", "<answer>1911</answer>"])

    def policy(req):
        return '{"summary": "logo", "source_hint": "site"}' if is_init(req) else next(replies)

    bodies, line = run_release(tmp_path, policy)
    # pipelines/pipeline_mmcontextfold.py:155-163 reads it as a failed call; :463-466 asks to continue
    assert bodies[2]["messages"][-2] == {"role": "assistant", "content": "Error: upstream <answer>wrong</answer>"}
    assert last_text(bodies[2]) == R.AFTER_FAILED_CALL
    assert len(bodies) == 3 and line["answer"] == "1911"


def test_a_failed_force_answer_is_the_release_s_no_answer_text(tmp_path):
    def policy(req):
        if is_init(req):
            return '{"summary": "logo", "source_hint": "site"}'
        return "Error: still nothing"

    bodies, line = run_release(tmp_path, policy)
    # 15 rounds each asking again (pipelines/base_pipeline.py:26, pipeline :463-466), then the force answer
    # (:522-523) whose failure gives the fixed text (:525-531)
    assert [last_text(b) for b in bodies[2:]] == [R.AFTER_FAILED_CALL] * 15 + [R.FORCE_ANSWER]
    assert line["status"] == "ok" and line["answer"] == R.NO_ANSWER


# ------------------------------------------------------------------ 4-9. the tools, request for request
BRANCH_SCRIPT = [
    tool("lens_search", image_id="<image_0>"),
    tool("search", query=""),
    tool("search", query="  kestrel observatory  "),
    tool("search", query="  kestrel observatory  "),
    tool("visit", url="wiki.example.org/Kestrel"),
    tool("visit", url="https://blocked.example/page"),
    tool("search", query="fail me"),
    tool("return", message="founded 1911"),
]


def tools_policy():
    branch = iter(BRANCH_SCRIPT)

    def policy(req):
        if is_init(req):
            return '{"summary": "logo", "source_hint": "site"}'
        last = last_text(req)
        if last.startswith("## Subtask [look] completed"):
            return "<answer>1911</answer>"
        if last.startswith("**MODE: MAIN**"):
            return subtask(description="look", prompt="Find it.", assigned_images=["<image_0>"])
        return next(branch)
    return policy


@pytest.mark.slow  # the release pauses 3 s between search attempts (t2t_search_serper): 12 s of its five
def test_the_release_s_tool_requests_and_observations_at_every_edge(tmp_path, web):
    from PIL import Image

    web.lens_items = [
        {"link": "https://match1.example/", "thumbnailUrl": f"{web.url}/thumb/1.png"},                  # no title
        {"title": "A JPEG", "link": "https://match2.example/", "thumbnailUrl": f"{web.url}/thumb/2.jpg"},
        {"title": "Moved", "link": "https://match3.example/", "thumbnailUrl": f"{web.url}/moved/3.png"},
        {"title": "Gone", "link": "https://match4.example/", "thumbnailUrl": f"{web.url}/thumb/4.png"},
    ]
    web.bad_thumbs = {4}
    web.fail = {"/lens": 1, "/https://blocked.example/page": 3}
    web.pages["wiki.example.org/Kestrel"] = "\n# Kestrel Observatory\n\nFounded in 1911.\n"
    web.scrape["https://blocked.example/page"] = "The Kestrel page, scraped."
    web.fail["/search"] = 0
    bodies, line = run_release(tmp_path, _failing_last_search(web, tools_policy()), "demo_1", "--tools", "live")
    lens_url = "https://img.example/demo/kestrel_logo.png"
    where = {"search": {"location": "United States"}}
    # utils/search_tools.py: every call is a request (no cache), the arguments as given, retries per service
    assert [(m, p) for m, p, _ in web.log] == [
        ("POST", "/lens"), ("POST", "/lens"),                       # i2i_search_serper: a 500, then again (5 tries)
        ("GET", "/thumb/1.png"), ("GET", "/thumb/2.jpg"),           # img_download: each thumbnail once
        ("GET", "/moved/3.png"), ("GET", "/thumb/3.png"),           # requests follows the redirect
        ("GET", "/thumb/4.png"),                                    # a 404: skipped
        ("POST", "/search"), ("POST", "/search"), ("POST", "/search"),  # "", then the same query twice
        ("GET", "/wiki.example.org/Kestrel"),                       # call_visit_jina: no scheme needed
        ("GET", "/https://blocked.example/page"), ("GET", "/https://blocked.example/page"),
        ("GET", "/https://blocked.example/page"),                   # Jina: 3 tries
        ("POST", "/scrape"),                                        # then call_visit_serper
        *[("POST", "/search")] * 5,                                 # t2t_search_serper: 5 tries
    ]
    assert web.bodies[0] == ("/lens", {"url": lens_url, "num": 100, "location": "United States"})
    assert [b for p, b in web.bodies if p == "/search"][:3] == [
        {"q": "", **where["search"]}, {"q": "  kestrel observatory  ", **where["search"]},
        {"q": "  kestrel observatory  ", **where["search"]}]
    assert ("/scrape", {"url": "https://blocked.example/page", "includeMarkdown": True}) in web.bodies
    jina = next(h for m, p, h in web.log if p == "/wiki.example.org/Kestrel")
    assert jina["Authorization"] == "Bearer jina-test-key-1" and jina["X-Retain-imgs"] == "none"

    branch = [b for b in bodies if any("**MODE: BRANCH**" in t for m in b["messages"] for t in texts(m))]
    obs = [last_text(b) for b in branch[1:]]
    # pipeline :383-400: the results whose thumbnail arrived; a missing title reads None (item.get("title") on a
    # None value); the images after the text, every one a PNG (search_tools.py:218-220)
    assert obs[0].startswith("Reverse image search results for <image_0>:\n\n<result#1>: **None**\n   URL: "
                             "https://match1.example/\n\n<result#2>: **A JPEG**\n")
    assert "<result#3>: **Moved**" in obs[0] and "Gone" not in obs[0]
    images = [p["image_url"]["url"] for p in branch[1]["messages"][-1]["content"] if p["type"] == "image_url"]
    assert len(images) == 3 and all(u.startswith("data:image/png;base64,") for u in images)
    import base64
    import io
    jpeg = io.BytesIO()
    with Image.open(io.BytesIO(thumbnail(2, "jpg"))) as im:
        im.save(jpeg, format="PNG")
    assert base64.b64decode(images[1].split(",", 1)[1]) == jpeg.getvalue()
    # search_tools.py:90-99: an empty query is searched; every organic result listed (12, 0-based)
    assert obs[1].startswith("## text_search Results\n\n**Query:** \n**Goal:** \n**Status:** Success\n"
                             "**Count:** 12 results") and "\n\n11. [Result 12 for ]" in obs[1]
    assert obs[2] == obs[3] and "**Query:**   kestrel observatory  \n" in obs[2]
    assert obs[4] == "# Kestrel Observatory\n\nFounded in 1911."                   # stripped, as returned
    assert json.loads(obs[5]) == {"text": "The Kestrel page, scraped.", "metadata": {"title": "t"}}  # the raw body
    assert obs[6] == ("## text_search Results\n\n**Query:** fail me\n**Goal:** \n**Status:** Failed\n\n"
                      "No results found. Try to fix the current query or use a different tool.")
    assert line["answer"] == "1911"
    assert load_run(tmp_path / "run").header.tools.policy == "release"


def _failing_last_search(web, policy):
    """The model's policy, arming five 500s for the search the branch makes last."""
    def wrapped(req):
        said = policy(req)
        if said == BRANCH_SCRIPT[-2]:
            web.fail["/search"] = 5
        return said
    return wrapped


@pytest.mark.slow
def test_the_default_protocol_keeps_its_own_tool_choices(tmp_path, web):
    """Ours where the release has a defect (docs/fidelity.md): the same branch under the paper's protocol strips the
    arguments, answers an empty query and a scheme-less URL without a request, a repeat from the cache, lists the
    top 10, and says the API failed."""
    web.fail = {"/https://blocked.example/page": 4}
    web.scrape["https://blocked.example/page"] = "The Kestrel page, scraped."
    script = iter([tool("search", query=""), tool("search", query="  kestrel observatory  "),
                   tool("search", query="kestrel observatory"), tool("visit", url="wiki.example.org/Kestrel"),
                   tool("visit", url="https://blocked.example/page"), "<answer>1911</answer>"])
    bodies, line = run_release(tmp_path, lambda req: next(script), "demo_1", "--tools", "live",
                               method=("--method", "react"))
    assert [(m, p) for m, p, _ in web.log] == [("POST", "/search"), *[("GET", "/https://blocked.example/page")] * 4,
                                               ("POST", "/scrape")]
    assert web.bodies[0] == ("/search", {"q": "kestrel observatory", "location": "United States"})
    obs = [texts(b["messages"][-1])[-1] for b in bodies[1:]]
    assert "needs a non-empty string argument 'query'" in obs[0]
    assert obs[1] == obs[2] and "**Count:** 10 results" in obs[1]            # the top 10; the repeat from the cache
    assert "Failed to read page content." in obs[3]                          # no scheme: no request
    assert "The Kestrel page, scraped." in obs[4] and '"metadata"' not in obs[4]  # the scrape's text


# ------------------------------------------------------------------ 10. a missing query image
def test_a_missing_query_image_is_dropped_and_the_sample_runs_with_the_rest(tmp_path, capsys):
    import shutil

    from agent.tools.demo_world import ensure_demo_world

    bench = tmp_path / "bench"
    shutil.copytree(ensure_demo_world() / "demo", bench)
    first = json.loads(next(x for x in (bench / "data_unified.jsonl").read_text().splitlines() if '"demo_6"' in x))
    (bench / "imgs" / first["query_images"][0]).unlink()

    def policy(req):
        return '{"summary": "a stadium", "source_hint": "site"}' if is_init(req) else "<answer>1998</answer>"

    bodies, line = run_release(tmp_path, policy, "demo_6", "--benchmark", str(bench))
    # pipelines/base_pipeline.py (_prepare_images): the image whose file is missing is left out, the rest renumbered
    # from <image_0> (pipeline :80-83); one perception call, one block
    assert len(bodies) == 2 and line["status"] == "ok"
    assert last_text(bodies[1]) == R.fill(R.MAIN, question=line["question"], image_context=(
        "<image_0>: [Query Image]\n  Content: a stadium\n  Source: site"))
    assert line["dropped_images"] == [first["query_images"][0]] and list(line["query_images"]) == ["<image_0>"]
    assert "run without a query image" in capsys.readouterr().err
    # the paper's protocol refuses the same benchmark (ours: a question without its image is another question)
    assert run_main(["--method", "mmcontextfold", "--backend", "scripted", "--benchmark", str(bench),
                     "--sample-ids", "demo_6", "--out", str(tmp_path / "paper"), "--no-progress"]) == 2


# ------------------------------------------------------------------ 11. image ids, null fields, encodings, file types
PAPER = ("--method", "mmcontextfold")


def branch_policy(assigned, branch_reply, main_first=None):
    """Init answers, the main state opens one branch with ``assigned`` images, the branch replies from
    ``branch_reply`` in turn (then returns), the continuation answers."""
    replies = iter(branch_reply)

    def policy(req):
        if is_init(req):
            return '{"summary": "a crest", "source_hint": "site"}'
        text = " ".join(t for m in req["messages"] for t in texts(m))
        last = last_text(req)
        if "completed" in last or "Subtask [look]" in last:
            return "<answer>1998</answer>"
        if "MODE: BRANCH" in text or "STATE: BRANCH" in text or "Subtask:" in last:
            return next(replies, tool("return", message="found it"))
        return main_first or subtask(description="look", prompt="Find the club.", assigned_images=assigned)
    return policy


def _images_in(body) -> list[str]:
    return [p["image_url"]["url"] for m in body["messages"] if isinstance(m["content"], list)
            for p in m["content"] if p.get("type") == "image_url"]


def _branch_bodies(bodies):
    return [b for b in bodies if any("**MODE: BRANCH**" in t for m in b["messages"] for t in texts(m))]


def test_an_image_id_is_looked_up_exactly_as_written_under_the_release(tmp_path):
    """``<image_01>`` (pipeline_mmcontextfold.py:85-99: ``self.images.get(id)``, then ``<image_{digits}>`` with the
    digits as written) loads nothing into the branch, adds no images note, and a Lens call on it gets the release's
    "Invalid image_id" reply (:357-368) without a Lens request."""
    bodies, line = run_release(tmp_path, branch_policy(["<image_01>"], [tool("lens_search", image_id="<image_01>")]),
                               "demo_6")
    first, second = _branch_bodies(bodies)[:2]
    assert _images_in(first) == _images_in(bodies[2])  # the main history's images only: none
    assert "## Assigned Images" not in last_text(first)
    assert last_text(second) == R.invalid_image("<image_01>", ["<image_0>", "<image_1>"])
    assert not [e for e in line["events"] if e["type"] == "tool_call"]


def test_the_default_protocol_resolves_a_spelling_of_an_image_id_and_pays_one_lens_call_for_both(tmp_path):
    """Ours (docs/fidelity.md): ``<image_01>`` is ``<image_1>`` (a model's spelling of the id it was shown); the
    tool cache keys a Lens call by the image's content hash, so both spellings are one call."""
    from agent.tools.cache import cache_key

    bodies, line = run_release(tmp_path, branch_policy(["<image_01>"], [
        "<think>x</think>" + tool("lens_search", image_id="<image_01>"),
        "<think>x</think>" + tool("lens_search", image_id="<image_1>")]), "demo_6", method=PAPER)
    calls = [e for e in line["events"] if e["type"] == "tool_call" and e["name"] == "lens_search"]
    assert len(calls) == 2 and calls[0]["cache_hit"] is False and calls[1]["cache_hit"] is True
    assert cache_key("lens_search", {"image_id": "<image_01>"}, "h") == cache_key("lens_search", {"image_id": "<image_1>"}, "h")
    branch = [e for e in line["events"] if e["type"] == "branch_begin"][0]
    assert branch["assigned_images"] == ["<image_1>"]


@pytest.mark.parametrize("assigned,crash", [
    (None, "'NoneType' object is not iterable"),
    (5, "'int' object is not iterable"),
    ([["<image_0>"]], "unhashable type: 'list'"),
    ([0], "'int' object has no attribute 'strip'"),
])
def test_assigned_images_the_release_cannot_iterate_end_the_sample_with_its_error_answer(tmp_path, assigned, crash):
    """The release's ``for img_id in assigned_images`` (pipeline :184-191) raises; its ``run()`` catches it and the
    sample's answer is ``Error: <the exception>``. The same calls before it (init, the main call), the same answer,
    recorded as the release's crash."""
    bodies, line = run_release(tmp_path, branch_policy(assigned, []), "demo_6")
    assert len(bodies) == 3  # two perception calls, the main call: the branch never starts
    assert line["status"] == "ok" and line["answer"] == f"Error: {crash}"
    err = next(e for e in line["events"] if e["type"] == "error")
    assert err["kind"] == "ReleaseCrash" and crash in err["message"]


def test_the_default_protocol_asks_again_for_a_null_assigned_images(tmp_path):
    """Ours (paper B.3): a subtask whose ``assigned_images`` is not a list is a malformed output: the correction
    re-prompt, and the run goes on."""
    bad = subtask(description="look", prompt="Find the club.", assigned_images=None)
    asked = []

    def policy(req):
        if "STATE: MAIN" not in json.dumps(req["messages"]):  # an init call (E.4)
            return '{"summary": "s", "source_hint": "h"}'
        asked.append(1)
        return bad if len(asked) == 1 else "<answer>1998</answer>"

    bodies, line = run_release(tmp_path, policy, "demo_6", method=PAPER)
    main = [e for e in line["events"] if e["type"] == "llm_call" and e["state"] == "main"]
    assert '"assigned_images" must be a list' in main[0]["action_error"] and line["answer"] == "1998"


def test_runaway_nesting_ends_the_release_s_sample_with_its_recursion_error_answer(tmp_path):
    """The release's parsers catch JSONDecodeError only: 50,000 nested brackets raise RecursionError out of
    ``extract_subtask`` and the sample's answer is that error's text."""
    deep = "<subtask>\n{\"description\": \"d\", \"prompt\": " + "[" * 50_000 + "]" * 50_000 + "}\n</subtask>"
    bodies, line = run_release(tmp_path, branch_policy([], [], main_first=deep), "demo_6")
    assert len(bodies) == 3
    assert line["answer"].startswith("Error: maximum recursion depth exceeded")


def test_a_branch_given_every_image_in_reverse_order_loads_them_so(tmp_path):
    """pipeline :184-203: the images in the order assigned, the note naming them so, in both protocols."""
    for method in (RELEASE, PAPER):
        out = tmp_path / method[-1]
        out.mkdir()
        bodies, line = run_release(out, branch_policy(["<image_1>", "<image_0>"], []), "demo_6", method=method)
        begin = next(e for e in line["events"] if e["type"] == "branch_begin")
        assert begin["assigned_images"] == ["<image_1>", "<image_0>"]
        if method == RELEASE:
            first = _branch_bodies(bodies)[0]
            assert "loaded in this conversation: <image_1>, <image_0>" in last_text(first)
            uris = _images_in(first)[-2:]
            crest, stadium = (recorded_lines(out / "run")[0]["query_images"][k] for k in ("<image_0>", "<image_1>"))
            assert [__import__("hashlib").sha256(__import__("base64").b64decode(u.split(",", 1)[1])).hexdigest()
                    for u in uris] == [stadium, crest]


def test_nested_answer_tags_give_the_release_s_answer(tmp_path):
    """``<answer>(.*?)</answer>`` (prompts_mmcontextfold.py:194): the first closing tag ends it."""
    said = "<answer><answer>1998</answer></answer>"
    bodies, line = run_release(tmp_path, lambda req: '{"summary": "s", "source_hint": "h"}' if is_init(req) else said,
                               "demo_6")
    assert line["answer"] == "<answer>1998"


def test_a_png_named_jpg_is_declared_by_its_name_under_the_release_and_by_its_bytes_by_default(tmp_path):
    """utils/search_backbone_model.py (get_image_mime_type): ``mimetypes.guess_type`` of the file's name, JPEG when
    that is no image type; ours reads the type from the bytes."""
    import shutil

    from agent.tools.demo_world import ensure_demo_world

    bench = tmp_path / "bench"
    shutil.copytree(ensure_demo_world() / "demo", bench)
    rows = [json.loads(x) for x in (bench / "data_unified.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["id"] == "demo_1")
    (bench / "imgs" / row["query_images"][0]).rename(bench / "imgs" / "d.jpg")
    row["query_images"] = ["d.jpg"]
    (bench / "data_unified.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    answer = lambda req: '{"summary": "s", "source_hint": "h"}' if is_init(req) else "<answer>1911</answer>"  # noqa: E731
    for method, want in ((RELEASE, "data:image/jpeg;base64,"), (PAPER, "data:image/png;base64,")):
        out = tmp_path / method[-1]
        out.mkdir()
        bodies, _ = run_release(out, answer, "demo_1", "--benchmark", str(bench), method=method)
        assert _images_in(bodies[0]) and all(u.startswith(want) for u in _images_in(bodies[0]))


@pytest.mark.parametrize("protocol", ["release", "paper"])
def test_a_null_search_title_and_a_page_without_a_charset(tmp_path, web, protocol):
    """search_tools.py:93: ``f"[{page['title']}]"`` shows a null title as ``None`` (ours: nothing); a page served as
    ``text/plain`` with no charset is read as ISO-8859-1 by the release's requests (ours: UTF-8)."""
    web.search_items = [{"title": None, "link": "https://a.example/", "snippet": "s"}]
    web.pages["https://m.example/"] = "München"
    script = iter([tool("search", query="q"), tool("visit", url="https://m.example/"), tool("return", message="ok")])
    method = RELEASE if protocol == "release" else PAPER
    bodies, line = run_release(tmp_path, branch_policy([], [next(script) for _ in range(3)]), "demo_1",
                               "--tools", "live", method=method)
    obs = [e["observation"] for e in line["events"] if e["type"] == "tool_call"]
    if protocol == "release":
        assert "0. [None](https://a.example/)" in obs[0] and obs[1] == "MÃ¼nchen"
    else:
        assert "0. [](https://a.example/)" in obs[0] and "München" in obs[1]


def test_a_search_row_without_a_title_is_the_release_s_tool_error(tmp_path, web):
    """``page['title']`` on a row without one raises KeyError, caught by ``_execute_tool``: "Tool error: 'title'"."""
    web.search_items = [{"link": "https://a.example/"}]
    bodies, line = run_release(tmp_path, branch_policy([], [tool("search", query="q")]), "demo_1", "--tools", "live")
    assert [e["observation"] for e in line["events"] if e["type"] == "tool_call"] == ["Tool error: 'title'"]


@pytest.mark.parametrize("protocol", ["release", "paper"])
def test_open_page_is_visit_in_the_release_and_an_unknown_tool_by_default_and_the_token_field(tmp_path, protocol):
    """pipeline :420 ``tool_name in ("visit", "open_page")``; ours offers the tools E.3 names, so ``open_page`` is
    an unknown tool. The token cap: the release sends ``max_completion_tokens`` (search_backbone_model.py:118), ours
    ``max_tokens`` (the field SGLang and vLLM have always read; docs/fidelity.md)."""
    method = RELEASE if protocol == "release" else PAPER
    bodies, line = run_release(tmp_path, branch_policy([], [tool("open_page", url="https://kestrel.example/")]),
                               "demo_1", method=method)
    obs = [e["observation"] for e in line["events"] if e["type"] == "tool_call"]
    names = [e["name"] for e in line["events"] if e["type"] == "tool_call"]
    if protocol == "release":
        assert names == ["visit"] and "Unknown tool" not in obs[0]
        assert all("max_completion_tokens" in b and "max_tokens" not in b for b in bodies)
    else:
        assert "Unknown tool" in json.dumps(line["events"]) or "Unknown tool" in json.dumps(line["messages"])
        assert all("max_tokens" in b and "max_completion_tokens" not in b for b in bodies)
