"""``--protocol release`` where replies and tools are not clean: what the authors' release
(iLearn-Lab/MM26-MMContextFold @16fa474) sends at each of its edges, request for request, model and tool API
requests alike (issue 57; ``../shared/release-protocol.md`` D). The expected requests are written from the
release's code, cited file:line next to each assertion; the default protocol's own choices at the same points are
asserted beside them where they differ (docs/fidelity.md).
"""
from __future__ import annotations

import json

from agent import prompts_release as R
from agent.run import main as run_main
from agent.rundir import load_run
from tests.fakes.sglang_server import FakeSGLang


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


def run_release(tmp_path, policy, sample="demo_1", *extra, strip=True, method=RELEASE):
    """Run one sample against a loopback chat server whose replies ``policy(request)`` writes (None: null
    content; else the visible content after a short reasoning)."""
    def reply(req):
        said = policy(req)
        return None if said is None else "thinking it over</think>" + said

    with FakeSGLang(reply=reply) as srv:
        srv.strip_content = strip
        out = tmp_path / "run"
        argv = [*method, "--backend", "openai", "--server", "sglang",
                "--endpoint", srv.url, "--sample-ids", sample, "--out", str(out), "--no-progress", *extra]
        assert run_main(argv) == 0
        bodies = [b for b in srv.bodies if "messages" in b]
    return bodies, load_run(out).lines[0]


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

    bodies, line = run_release(tmp_path, policy, strip=False)
    # utils/search_backbone_model.py:124-125: message.content appended as sent, surrounding whitespace included
    branch = bodies[2]["messages"]
    assert branch[2] == {"role": "assistant", "content": said}
    main_call = next(e for e in line["events"] if e["type"] == "llm_call" and e["state"] == "main")
    assert main_call["text"] == said  # the record keeps what arrived
    assert line["answer"] == "1911"


def test_the_default_protocol_records_the_reply_raw_and_cleans_it_only_in_the_next_prompt(tmp_path):
    call = tool("search", query="kestrel observatory founded")
    replies = iter(["\n\n" + call + "\n", "\n\n<answer>1911</answer>"])
    bodies, line = run_release(tmp_path, lambda req: next(replies), strip=False, method=("--method", "react"))
    assert [e["text"] for e in line["events"] if e["type"] == "llm_call"] == ["\n\n" + call + "\n",
                                                                             "\n\n<answer>1911</answer>"]
    # ours (docs/fidelity.md): the next prompt carries the reply without its surrounding whitespace, what SGLang's
    # own reasoning parser sends
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
