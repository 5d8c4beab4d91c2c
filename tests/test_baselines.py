"""AgentFold and ContextFold as adapted by the paper (C.1): the cases of ../shared/baselines-spec.md §4."""
from __future__ import annotations

import json

import pytest

from agent.backends.messages import text_of
from agent.backends.scripted import ScriptedBackend
from agent.benchmarks import resolve_benchmark
from agent.methods import Budgets, MethodSpec, run_sample
from agent.methods.agentfold import Block, fold, render_memory
from agent.parsing import parse_function_calls, trailing_group
from agent.prompts import CONTEXTFOLD_BRANCH, CONTEXTFOLD_FORCE_FINISH, CONTEXTFOLD_FORCED_RETURN
from agent.tools import make_toolbox


@pytest.fixture(scope="module")
def demo():
    return {s.id: s for s in resolve_benchmark("demo").samples}


@pytest.fixture
def toolbox():
    return make_toolbox("offline")


def llm_events(line):
    return [e for e in line["events"] if e["type"] == "llm_call"]


def tools(line):
    return [e for e in line["events"] if e["type"] == "tool_call"]


def msgs_of(line, ev):
    return [line["messages"][i] for i in ev["message_ids"]]


# ====================================================================== AgentFold
def af(tool=None, compress=None, answer=None, motivation="next"):
    out = "<think>\nthinking\n</think>\n\n"
    if compress is not None:
        out += "<compress>" + json.dumps({"compress_range": compress[0], "compress_text": compress[1]}) + "</compress>\n"
    out += f"<motivation>{motivation}</motivation>\n"
    if answer is not None:
        out += f"<answer>{answer}</answer>"
    if tool is not None:
        out += "<tool_call>\n" + (tool if isinstance(tool, str) else json.dumps(tool)) + "\n</tool_call>"
    return out


def S(name, **args):
    return {"name": name, "arguments": args}


def test_fold_rule_is_the_releases():
    blocks = [Block(0, 0, "s0"), Block(1, 1, "s1"), Block(2, 2, "s2")]
    new, rec = fold(blocks, 1, 2, "merged", latest=2)
    assert [(b.start, b.end, b.text) for b in new] == [(0, 0, "s0"), (1, 2, "merged")]
    assert rec == {"range": [1, 2], "removed": [1, 2], "anomaly": []}
    # i inside an older block: the older block is kept (overlap), the new one added
    new2, rec2 = fold(new, 2, 2, "odd", latest=2)
    assert [(b.start, b.end) for b in new2] == [(0, 0), (1, 2), (2, 2)] and rec2["anomaly"][0].startswith("overlap")
    # a block starting in range is dropped whole even past j; j < i inserts an odd block and drops nothing
    new3, rec3 = fold([Block(0, 3, "a"), Block(4, 4, "b")], 0, 1, "c", latest=4)
    assert [(b.start, b.end) for b in new3] == [(0, 1), (4, 4)]
    assert any(a.startswith("dropped_past_j") for a in rec3["anomaly"])
    assert any(a.startswith("latest_not_folded") for a in rec3["anomaly"])
    new4, rec4 = fold([Block(0, 0, "a")], 3, 1, "d", latest=0)
    assert [(b.start, b.end) for b in new4] == [(0, 0), (3, 1)] and rec4["removed"] == []
    # rendering: sorted by start, the highest start is "[Step t]" verbatim, others "Compressed"
    mem = render_memory([Block(2, 2, "latest"), Block(0, 1, "early")])
    assert mem == "**[Compressed Step 0 to 1]**\nearly\n\n**[Step 2]**\nlatest"
    assert render_memory([]) == "EMPTY"
    assert render_memory([Block(0, 0, "x"), Block(1, 1, "y")]).startswith("**[Compressed Step 0]**")


async def test_agentfold_memory_images_and_fold(demo, toolbox):
    s = demo["demo_6"]  # two query images
    script = [af(S("lens_search", image_id="<image_0>", goal="crest")),
              af(S("search", query="Rivermoor FC stadium", goal="g"), compress=([0, 0], "crest: Rivermoor FC")),
              af(S("search", query="Moorside Park", goal="g"), compress=([0, 1], "Rivermoor FC; stadium search")),
              af(answer="1998", compress=([2, 2], "x"), tool=S("search", query="ignored", goal="g"))]
    b = ScriptedBackend(script)
    line, _ = await run_sample(MethodSpec("agentfold"), s, 0, backend=b, toolbox=toolbox)
    evs = llm_events(line)
    assert line["status"] == "ok" and line["answer"] == "1998" and line["n_calls"] == 4
    assert all(len(msgs_of(line, e)) == 2 for e in evs)  # [system, user], re-rendered every call
    assert evs[0]["n_images"] == 2 and "### Previous Steps\nEMPTY" in text_of(msgs_of(line, evs[0])[1])
    for e in evs[1:]:  # later calls name the ids, no pixels
        assert e["n_images"] == 0 and "<image_0>, <image_1>" in text_of(msgs_of(line, e)[1])
    # call 3 sees step 0 compressed, step 1 verbatim; call 4 sees steps 0..1 merged, step 2 verbatim
    m3 = text_of(msgs_of(line, evs[2])[1])
    assert "**[Compressed Step 0]**\ncrest: Rivermoor FC" in m3 and "**[Step 1]**\n**Motivation:** next" in m3
    assert "Lens found" not in m3  # the raw lens observation is shown exactly once
    m4 = text_of(msgs_of(line, evs[3])[1])
    assert "**[Compressed Step 0 to 1]**\nRivermoor FC; stadium search" in m4 and "**[Step 2]**" in m4
    assert evs[2]["action"]["fold"] == {"range": [0, 1], "removed": [0, 1], "anomaly": []}
    # the answer wins over a tool call in the same response; its fold is ignored; no tool ran for it
    assert len(tools(line)) == 3 and evs[3]["action"]["kind"] == "answer"


async def test_agentfold_overlap_turn0_compress_and_resamples(demo, toolbox):
    s = demo["demo_1"]
    missing = af(S("search", query="k", goal="g"))  # no compress at turn 1: resampled, same prompt
    script = [af(S("search", query="kestrel", goal="g"), compress=([5, 9], "ignored at turn 0")),
              missing, missing,
              af(S("search", query="founded", goal="g"), compress=([0, 0], "kestrel observatory")),
              af(S("visit", url="https://wiki.example.org/Kestrel_Observatory", goal="g"), compress=([1, 1], "overlap?")),
              af(S("search", query="x", goal="g"), compress=([0, 2], "all")), af(answer="1911")]
    line, _ = await run_sample(MethodSpec("agentfold"), s, 0, backend=ScriptedBackend(script), toolbox=toolbox)
    evs = llm_events(line)
    assert "fold" not in evs[0]["action"]  # turn 0: compress ignored
    assert evs[1]["action_error"] and evs[2]["action_error"] and evs[2]["correction"]
    assert msgs_of(line, evs[1]) == msgs_of(line, evs[2]) == msgs_of(line, evs[3])  # identical prompt
    assert [t["call_index"] for t in tools(line)] == [1, 4, 5, 6]  # no tool for the rejected outputs
    assert line["answer"] == "1911"


async def test_agentfold_five_failures_end_no_answer(demo, toolbox):
    bad = af(S("search", query="k", goal="g"))  # never folds after turn 0
    line, _ = await run_sample(MethodSpec("agentfold"), demo["demo_1"], 0,
                               backend=ScriptedBackend([af(S("search", query="k", goal="g"))] + [bad] * 5),
                               toolbox=toolbox)
    assert line["status"] == "no_answer" and line["n_calls"] == 6 and len(tools(line)) == 1


async def test_agentfold_bad_json_is_an_error_observation_and_first_call_runs(demo, toolbox):
    two = af(S("search", query="first", goal="g")) + "\n<tool_call>\n" + json.dumps(S("search", query="second")) + "\n</tool_call>"
    script = [two, af('{"name": "search", "arguments": {"query": }', compress=([0, 0], "s")), af(answer="x")]
    line, _ = await run_sample(MethodSpec("agentfold"), demo["demo_1"], 0, backend=ScriptedBackend(script), toolbox=toolbox)
    t = tools(line)
    assert len(t) == 1 and t[0]["args"]["query"] == "first"
    m3 = text_of(msgs_of(line, llm_events(line)[2])[1])
    assert "**Tool response:** [Tool call error]" in m3


async def test_agentfold_forced_last_call_without_answer(demo, toolbox):
    script = [af(S("search", query="k", goal="g"))] + [af(S("search", query=f"q{i}", goal="g"), compress=([i, i], "s"))
                                                      for i in range(30)]
    line, _ = await run_sample(MethodSpec("agentfold", budgets=Budgets(t_max=4)), demo["demo_1"], 0,
                               backend=ScriptedBackend(script), toolbox=toolbox)
    evs = llm_events(line)
    assert line["status"] == "no_answer" and line["n_calls"] == 4 and evs[-1]["forced"]
    assert len(tools(line)) == 3  # the forced call's tool call did not run
    assert "This is your last step" in text_of(msgs_of(line, evs[-1])[-1])


# ====================================================================== ContextFold
def fn(name, **params):
    return f"<function={name}>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items()) + "</function>"


def cf(*calls, think="plan"):
    return f"<think>\n{think}\n</think>\n\n" + "\n".join(calls)


def test_xml_grammar_multiline_last_call_and_parallel_group():
    text = cf(fn("search", query="a\nmulti-line\nquery"), fn("search", query="b"), fn("visit", url="u"))
    calls = parse_function_calls(text)
    assert [c.name for c in calls] == ["search", "search", "visit"] and calls[0].params["query"] == "a\nmulti-line\nquery"
    assert [c.name for c in trailing_group(text, calls)] == ["search", "search", "visit"]
    far = fn("search", query="old") + "\n\n\n\n\n" + fn("search", query="new")
    assert [c.params["query"] for c in trailing_group(far, parse_function_calls(far))] == ["new"]


async def test_contextfold_parallel_group_and_image_id(demo, toolbox):
    script = [cf(fn("lens_search", image_id="<image_0>", goal="g"), fn("search", query="Kestrel Observatory founded")),
              cf(fn("finish", answer="1911", explanation="page"))]
    line, _ = await run_sample(MethodSpec("contextfold"), demo["demo_1"], 0, backend=ScriptedBackend(script),
                               toolbox=toolbox)
    t = tools(line)
    assert [x["name"] for x in t] == ["lens_search", "search"] and t[0]["ok"]
    assert t[0]["image_sha256"] == line["query_images"]["<image_0>"]
    assert line["status"] == "ok" and line["answer"] == "1911"
    obs = text_of(msgs_of(line, llm_events(line)[1])[-1])
    assert "Google Lens found" in obs and "## text_search Results" in obs and "<tool_response>" not in obs


async def test_contextfold_branch_inherits_everything_and_returns_one_message(demo, toolbox):
    s = demo["demo_6"]
    branch_call = cf(fn("branch", description="identify crest", prompt="lens_search <image_0> and report"))
    script = [branch_call,
              cf(fn("lens_search", image_id="<image_0>", goal="g")),
              cf(fn("return", message="The crest is Rivermoor FC's.")),
              cf(fn("finish", answer="1998", explanation="e"))]
    line, _ = await run_sample(MethodSpec("contextfold"), s, 0, backend=ScriptedBackend(script), toolbox=toolbox)
    evs = llm_events(line)
    assert [e["state"] for e in evs] == ["main", "branch", "branch", "main"]
    assert all(e["n_query_images"] == 2 for e in evs)  # every call carries both query images
    main1, br1 = msgs_of(line, evs[0]), msgs_of(line, evs[1])
    assert br1[: len(main1)] == main1  # a full copy of main...
    assert br1[len(main1)]["role"] == "assistant" and "<function=branch>" in br1[len(main1)]["content"]  # ...through the call
    assert br1[-1]["content"] == CONTEXTFOLD_BRANCH and len(br1) == len(main1) + 2
    main2 = msgs_of(line, evs[3])
    assert len(main2) == len(main1) + 2  # exactly one new user message after the branch call turn
    assert main2[-1]["content"] == "Branch has finished its task, the returned message is:\n\nThe crest is Rivermoor FC's."
    assert "Lens found" not in json.dumps(main2)  # the branch's turns never enter main
    begin = next(e for e in line["events"] if e["type"] == "branch_begin")
    assert begin["assigned_images"] == [] and begin["assigned_hashes"] == []
    assert evs[0]["action"]["kind"] == "subtask" and evs[2]["action"]["name"] == "return"


async def test_contextfold_branch_refusals_forced_return_and_fallback(demo, toolbox):
    script = [cf(fn("branch", description="d", prompt="p")),
              cf(fn("branch", description="nested", prompt="p")),      # refused, no tool, one step used
              cf(fn("finish", answer="x", explanation="e")),            # refused too
              cf(fn("search", query="kestrel")),
              cf(fn("search", query="more")),
              cf("I am still looking, no return.", think="t"),          # 5th call: forced; no return -> fallback
              cf(fn("finish", answer="1911", explanation="e"))]
    line, _ = await run_sample(MethodSpec("contextfold"), demo["demo_1"], 0, backend=ScriptedBackend(script),
                               toolbox=toolbox)
    evs = llm_events(line)
    br = [e for e in evs if e["state"] == "branch"]
    assert len(br) == 5 and [e["forced"] for e in br] == [False] * 4 + [True]
    assert CONTEXTFOLD_FORCED_RETURN in text_of(msgs_of(line, br[-1])[-1])
    assert [t["call_index"] for t in tools(line)] == [br[2]["index"], br[3]["index"]]
    refusal = text_of(msgs_of(line, br[1])[-1])
    assert "cannot branch a task or finish" in refusal
    end = next(e for e in line["events"] if e["type"] == "branch_end")
    assert end["reason"] == "branch_budget"
    last_main = msgs_of(line, evs[-1])
    assert last_main[-1]["content"].startswith("Branch has finished its task. The last message was:")
    assert line["answer"] == "1911"


async def test_contextfold_eleventh_branch_is_refused(demo, toolbox):
    def policy(msgs):
        last = text_of(msgs[-1])
        if "You are now a BRANCH" in last or "branch mode" in last:
            return cf(fn("return", message="done"))
        return cf(fn("branch", description="d", prompt="p"))

    line, _ = await run_sample(MethodSpec("contextfold", budgets=Budgets(t_max=30)), demo["demo_1"], 0,
                               backend=ScriptedBackend([policy] * 40), toolbox=toolbox)
    begins = [e for e in line["events"] if e["type"] == "branch_begin"]
    assert len(begins) == 10
    assert any("limit of 10 branch calls" in text_of(m) for m in line["messages"] if m["role"] == "user")


async def test_contextfold_global_budget_forced_finish_and_cut_branch(demo, toolbox):
    def policy(msgs):
        if "BRANCH" in text_of(msgs[-1]) or "branch mode" in text_of(msgs[-1]):
            return cf(fn("search", query="x"))
        if CONTEXTFOLD_FORCE_FINISH in text_of(msgs[-1]):
            return cf(fn("finish", answer="1911", explanation="e"))
        return cf(fn("branch", description="d", prompt="p"))

    line, _ = await run_sample(MethodSpec("contextfold", budgets=Budgets(t_max=20, b_max=50)), demo["demo_1"], 0,
                               backend=ScriptedBackend([policy] * 60), toolbox=toolbox)
    evs = llm_events(line)
    assert line["n_calls"] == 20 and evs[-1]["state"] == "main" and evs[-1]["forced"]
    ends = [e for e in line["events"] if e["type"] == "branch_end"]
    assert ends[-1]["reason"] == "global_budget" and line["answer"] == "1911"


async def test_contextfold_error_observations(demo, toolbox):
    script = [cf(fn("return", message="m")), cf(fn("browse", url="x")), cf("nothing to call"),
              cf(fn("finish", answer="", explanation="e")), cf(fn("finish", answer="1911", explanation="e"))]
    line, _ = await run_sample(MethodSpec("contextfold"), demo["demo_1"], 0, backend=ScriptedBackend(script),
                               toolbox=toolbox)
    evs = llm_events(line)
    replies = [text_of(msgs_of(line, evs[i])[-1]) for i in range(1, 5)]
    assert replies[0].startswith("[Error] return can only be called in a branch")
    assert replies[1].startswith("[Error] browse is not a function")
    assert replies[2].startswith("No function call was detected")
    assert replies[3].startswith("The answer given to finish is empty")
    assert evs[2]["action_error"] and evs[3]["action_error"] and evs[4]["correction"]
    assert line["status"] == "ok" and line["n_calls"] == 5


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("method", ["agentfold", "contextfold"])
def test_embedded_default_runs_each_baseline(tmp_path, tiny_model_dir, monkeypatch, method):
    from agent.run import main as run_main
    from agent.rundir import check_run, load_run

    monkeypatch.setenv("MMCF_TINY_MODEL_DIR", str(tiny_model_dir))
    rc = run_main(["--method", method, "--limit", "2", "--t-max", "4", "--max-tokens", "8",
                   "--out", str(tmp_path / "r"), "--no-progress"])
    assert rc == 0
    run = load_run(tmp_path / "r")
    assert len(run.lines) == 2 and all(ln.method == method and ln.n_calls == 4 for ln in run.lines)
    assert check_run(tmp_path / "r").intact
