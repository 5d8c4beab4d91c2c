"""``--protocol release``: what goes over the wire is what the authors' released MM-ContextFold sends.

The release is iLearn-Lab/MM26-MMContextFold at commit 16fa474 (``../shared/release-protocol.md``). Three scripted
conversations run through ``python -m agent.run --method mmcontextfold --protocol release --backend openai`` against a
loopback chat server; each assertion on the request bodies cites the release's file:line it follows.
"""
from __future__ import annotations

import json
import re

import pytest

from agent import prompts_release as R
from agent.record import RunHeader
from agent.run import main as run_main
from agent.rundir import load_run
from serving.fakes.sglang_server import FakeSGLang
from tests import records
from tests.records import recorded_lines

FIELDS = {"model", "messages", "max_completion_tokens", "temperature", "top_p"}


def texts(msg) -> list[str]:
    c = msg["content"]
    return [c] if isinstance(c, str) else [p["text"] for p in c if p.get("type") == "text"]


def pixels(msg) -> list[dict]:
    c = msg["content"]
    return [] if isinstance(c, str) else [p["image_url"] for p in c if p.get("type") == "image_url"]


def reply(content: str) -> str:
    return "thinking it over</think>\n\n" + content


def tool(name: str, key: str = "parameters", **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, key: args}) + "\n</tool_call>"


def subtask(**fields) -> str:
    return "<subtask>\n" + json.dumps(fields) + "\n</subtask>"


def run(tmp_path, policy, sample="demo_6", *extra):
    with FakeSGLang(reply=lambda req: reply(policy(req))) as srv:
        out = tmp_path / "run"
        argv = ["--method", "mmcontextfold", "--protocol", "release", "--backend", "openai", "--server", "sglang",
                "--endpoint", srv.url, "--sample-ids", sample, "--out", str(out), "--no-progress", *extra]
        assert run_main(argv) == 0
        bodies = [b for b in srv.bodies if "messages" in b]
    return bodies, recorded_lines(out)[0]


def last_text(req) -> str:
    return texts(req["messages"][-1])[0]


# ------------------------------------------------------------------ 1. a normal run with two images
def normal_policy():
    inits = iter(['{"summary": "a crimson crest with a golden bar", "source_hint": "club website"}',
                  '{"summary": "a stadium with a curved roof", "source_hint": "stadium page"}'])

    def policy(req):
        if req["messages"][0]["content"] == R.INIT_SYSTEM:
            return next(inits)
        last = last_text(req)
        if last.startswith("**MODE: MAIN**"):
            return subtask(description="identify club", prompt="Use lens_search on <image_0> to identify the club.",
                           assigned_images=["<image_0>"])
        if last.startswith("**MODE: BRANCH**"):
            return tool("lens_search", image_id="<image_0>", goal="club") if "Assigned Images" in last else \
                tool("search", query="Rivermoor FC Moorside Park moved", goal="year")
        if last.startswith("Reverse image search results"):
            return tool("search", query="Rivermoor FC", goal="history")
        if last.startswith("## text_search Results") and "**Query:** Rivermoor FC\n" in last:
            return tool("visit", url=re.search(r"\]\((https?://[^)]+)\)", last).group(1), goal="history")
        if last.startswith("## text_search Results"):
            return tool("return", message="Rivermoor FC moved into Moorside Park in 1998.")
        if last.startswith("## Subtask [identify club] completed"):
            return subtask(description="move year", prompt="Find the year Rivermoor FC moved into Moorside Park.",
                           assigned_images=[])
        if last.startswith("## Subtask [move year] completed"):
            return "<answer>1998</answer>"
        return tool("return", message="The crest belongs to Rivermoor FC.")  # after the page
    return policy


def test_a_normal_two_image_run_sends_the_release_s_requests(tmp_path):
    bodies, line = run(tmp_path, normal_policy())
    assert line["status"] == "ok" and line["answer"] == "1998"
    # 11 calls: init x2, main, 4 in the first branch, main, 2 in the second, main (release-protocol.md, C)
    assert len(bodies) == 11 == line["n_calls"]
    for b in bodies:  # utils/search_backbone_model.py:116-122 (send_message), :148-150 (send_single_message)
        assert set(b) == FIELDS and (b["max_completion_tokens"], b["temperature"], b["top_p"]) == (8192, 0.0, 1.0)
    # init: its own system prompt (pipelines/pipeline_mmcontextfold.py:107-111); the prompt text, then the image
    # with detail "high" and no identifier part (utils/search_backbone_model.py:83-106, :100)
    for b in bodies[:2]:
        assert b["messages"][0] == {"role": "system", "content": R.INIT_SYSTEM} and len(b["messages"]) == 2
        assert texts(b["messages"][1]) == [R.INIT] and [p["detail"] for p in pixels(b["messages"][1])] == ["high"]
    # main: the release's system prompt (prompts_mmcontextfold.py:18-21), MAIN filled with the [Query Image] blocks
    # (pipelines/pipeline_mmcontextfold.py:124-138, joined at :151), as a text part
    main = bodies[2]["messages"]
    assert main[0] == {"role": "system", "content": R.SYSTEM} and len(main) == 2
    blocks = ("<image_0>: [Query Image]\n  Content: a crimson crest with a golden bar\n  Source: club website\n\n"
              "<image_1>: [Query Image]\n  Content: a stadium with a curved roof\n  Source: stadium page")
    assert texts(main[1]) == [R.fill(R.MAIN, image_context=blocks, question=line["question"])]
    # the branch continues the main conversation; the reply went back as content only, no reasoning
    # (utils/search_backbone_model.py:124-125); the task prompt carries the images note and the image follows
    # (pipelines/pipeline_mmcontextfold.py:192-203)
    b1 = bodies[3]["messages"]
    # (its "\n\n" after </think> too: SGLang's qwen3 parser sends the content as the model wrote it)
    assert b1[:2] == main and b1[2] == {"role": "assistant", "content": "\n\n" + subtask(
        description="identify club", prompt="Use lens_search on <image_0> to identify the club.", assigned_images=["<image_0>"])}
    assert texts(b1[3]) == [R.BRANCH.replace("{task_prompt}", "Use lens_search on <image_0> to identify the club."
                                             + R.images_note(["<image_0>"]))]
    assert [p["detail"] for p in pixels(b1[3])] == ["high"]
    # Lens: <result#i> entries, the compare instruction, then the result images (pipeline :383-400, :305-308)
    lens = bodies[4]["messages"][-1]
    assert texts(lens)[0].startswith("Reverse image search results for <image_0>:\n\n<result#1>: **")
    assert texts(lens)[0].endswith("use both visual and text information to continue your task.")
    assert len(pixels(lens)) >= 1 and all(p["detail"] == "high" for p in pixels(lens))
    # search: the text_search block (utils/search_tools.py:23-43, :90-99), no <tool_response> wrapper
    assert texts(bodies[5]["messages"][-1])[0].startswith("## text_search Results\n\n**Query:** Rivermoor FC\n**Goal:** \n")
    # visit: the page as returned (utils/search_tools.py, visit_page)
    assert texts(bodies[6]["messages"][-1])[0].startswith("# ")
    # after the branch: its messages are gone, the continuation follows (pipelines/pipeline_mmcontextfold.py:165,
    # :329, prompts_mmcontextfold.py:62-77)
    after = bodies[7]["messages"]
    assert after[:3] == b1[:3] and len(after) == 4
    assert texts(after[3]) == [R.fill(R.CONTINUE, description="identify club",
                                      return_message="The crest belongs to Rivermoor FC.")]
    assert not pixels(bodies[8]["messages"][-1])  # a branch with no images assigned loads none


# ------------------------------------------------------------------ 2. a model that never answers
def test_a_model_that_never_answers_makes_the_release_s_73_calls(tmp_path):
    def policy(req):
        if req["messages"][0]["content"] == R.INIT_SYSTEM:
            return '{"summary": "logo", "source_hint": "site"}'
        if texts(req["messages"][-1])[0].startswith("**MODE: BRANCH**") or any(
                "**MODE: BRANCH**" in t for m in req["messages"] for t in texts(m) if m["role"] == "user"):
            return tool("search", query="kestrel observatory", goal="year")
        return subtask(description="look", prompt="Search for it.", assigned_images=[])

    bodies, line = run(tmp_path, policy, "demo_1")
    # init 1 + main 1 + 5 branches x (11 calls + 1 continuation) + 10 rounds of the branch-limit message + the force
    # answer: pipelines/base_pipeline.py:26 (15 rounds), pipeline_mmcontextfold.py:39-40 (5 branches, 10 turns)
    assert len(bodies) == 73 == line["n_calls"]
    lasts = [texts(b["messages"][-1])[0] for b in bodies]
    assert lasts.count(R.BRANCH_LIMIT) == 10                                   # :496-502
    # the warnings ride on the observations of the last turns (pipeline_mmcontextfold.py:284-296)
    first = [i for i, t in enumerate(lasts) if t.startswith("**MODE: BRANCH**")][0]
    turns = lasts[first + 1:first + 11]
    assert [t.endswith(R.TWO_TURNS_LEFT) for t in turns] == [False] * 7 + [True, False, False]
    assert [t.endswith(R.LAST_TURN) for t in turns] == [False] * 8 + [True, True]
    # the force answer is a user turn of its own after the model's last reply (:522-523); without <answer>, the
    # reply's first 500 characters are the answer (:529)
    assert bodies[-1]["messages"][-1] == {"role": "user", "content": [{"type": "text", "text": R.FORCE_ANSWER}]}
    assert bodies[-1]["messages"][-2]["role"] == "assistant"
    assert line["status"] == "ok" and line["answer"] == ("\n\n" + subtask(description="look", prompt="Search for it.",
                                                                         assigned_images=[]))[:500]


# ------------------------------------------------------------------ 3. malformed outputs
def test_malformed_outputs_are_handled_as_the_release_handles_them(tmp_path):
    script = iter([
        '{"summary": "logo", "source_hint": "site"}',                                          # init
        "I am not sure what to do.",                                                           # main: no tag
        subtask(prompt="Find when the observatory was founded."),                              # only the prompt
        tool("search", query="wrong") + "\n" + tool("search", query="Kestrel Observatory founded"),  # the last runs
        tool("visit", key="arguments", url="https://wiki.example.org/Kestrel_Observatory"),    # "arguments": ignored
        "hmm",                                                                                 # unparsable
        "still nothing",                                                                       # twice: folded back
        subtask(description="confirm", prompt="Confirm the year.", assigned_images=["<image_7>"]),  # unknown id
        tool("return", message="see <tool_call> for more"),                                 # a call in a return
        tool("finish", message="<answer>1911</answer>"),                                       # finish = return
        subtask(description="again", prompt="Double-check.") + "\n<answer>1911</answer>",      # the answer wins
    ])
    bodies, line = run(tmp_path, lambda req: next(script), "demo_1")
    lasts = [texts(b["messages"][-1])[0] for b in bodies]
    assert lasts[2] == R.MAIN_CORRECTION                                                       # :486-492
    # a subtask without description / assigned_images: "subtask", no images (prompts :187; pipeline :180, :504)
    assert lasts[3] == R.BRANCH.replace("{task_prompt}", "Find when the observatory was founded.")
    assert not pixels(bodies[3]["messages"][-1])
    assert "**Query:** Kestrel Observatory founded\n" in lasts[4]                              # prompts :210
    assert lasts[5] == "Failed to read page content."                                          # visit with no url
    assert lasts[6] == R.BRANCH_CORRECTION                                                     # :240-246
    # two unparsable replies in a row: the reply's first 1,000 characters go back (:232-234)
    assert lasts[7] == R.fill(R.CONTINUE, description="subtask", return_message="\n\nstill nothing")
    # an unknown image id is dropped silently: no images note, no pixels (:184-191)
    assert lasts[8] == R.BRANCH.replace("{task_prompt}", "Confirm the year.") and not pixels(bodies[8]["messages"][-1])
    assert lasts[9] == R.CALL_IN_RETURN                                                        # :262-270
    # finish is a return; <answer> tags are stripped from the message (:252-280)
    assert lasts[10] == R.fill(R.CONTINUE, description="confirm", return_message="1911")
    assert len(bodies) == 11 and line["status"] == "ok" and line["answer"] == "1911"


def test_the_release_protocol_is_recorded_labelled_and_never_pooled(tmp_path, capsys):
    bodies, line = run(tmp_path, normal_policy())
    run_dir = load_run(tmp_path / "run")
    assert run_dir.header.protocol == "release" and run_dir.header.label == "mmcontextfold@release"
    assert run_dir.header.sampling.temperature == 0.0 and run_dir.header.logprobs == "absent"
    # resuming it under the paper's protocol is another run
    assert run_main(["--method", "mmcontextfold", "--backend", "scripted", "--out", str(tmp_path / "run"),
                     "--no-progress"]) == 2
    assert "protocol" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--method", "react"], "--method mmcontextfold"),
    (["--method", "mmcontextfold", "--variant", "no-init"], "no --variant"),
    (["--method", "mmcontextfold", "--temperature", "0.7"], "fixes --temperature"),
    (["--method", "mmcontextfold", "--backend", "sglang", "--endpoint", "http://127.0.0.1:9", "--model-dir", "x"],
     "--backend openai --server sglang"),
])
def test_what_the_release_protocol_cannot_combine_with_is_refused(tmp_path, capsys, extra, message):
    assert run_main(["--protocol", "release", "--out", str(tmp_path / "r"), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_tables_show_the_two_protocols_as_two_methods_and_never_pool_them(tmp_path):
    import asyncio
    from types import SimpleNamespace as NS

    from agent.judge import judge_run
    from agent.rundir import RunError
    from analysis.pooling import refuse_mixed_protocols
    from analysis.tables import table1

    run(tmp_path, normal_policy())
    assert run_main(["--method", "mmcontextfold", "--backend", "scripted", "--sample-ids", "demo_6",
                     "--out", str(tmp_path / "paper"), "--no-progress"]) == 0
    for d in ("run", "paper"):
        asyncio.run(judge_run(tmp_path / d, judge="exact", progress=False))
    t = table1([tmp_path / "run", tmp_path / "paper"])
    assert sorted(t["method"]) == ["mmcontextfold", "mmcontextfold@release"]
    assert "protocol differs" in t.attrs["note"]
    old = records.header()
    del old["protocol"]
    paper, before, release = (NS(header=RunHeader.model_validate(h), path=tmp_path / n) for n, h in
                              (("p", records.header(protocol="paper")), ("b", old),
                               ("r", records.header(protocol="release"))))
    refuse_mixed_protocols(("m", "x"), [paper, before])  # a header from before --protocol followed the paper
    with pytest.raises(RunError, match=r"different protocols \(paper, release\)"):
        refuse_mixed_protocols(("m", "x"), [paper, release])
