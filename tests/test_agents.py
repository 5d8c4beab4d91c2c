"""The agents' real loops driven by the scripted backend; assertions on the recorded events."""
from __future__ import annotations

import json

import pytest

from agent.backends.messages import text_of
from agent.backends.scripted import ScriptedBackend
from agent.benchmarks import resolve_benchmark
from agent.methods import Budgets, MethodSpec, run_sample
from agent.prompts import BRANCH_SUMMARISE, FORCE_ANSWER, INIT, MAIN
from agent.tools import make_toolbox


@pytest.fixture(scope="module")
def demo():
    return {s.id: s for s in resolve_benchmark("demo").samples}


@pytest.fixture
def toolbox():
    return make_toolbox("offline")


def tc(name, **args):
    return "<think>\nplan\n</think>\n\n<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def ans(a):
    return f"<think>\nok\n</think>\n\n<answer>{a}</answer>"


def sub(desc, prompt, imgs):
    return "<think>\nplan\n</think>\n\n<subtask>\n" + json.dumps(
        {"description": desc, "prompt": prompt, "assigned_images": imgs}) + "\n</subtask>"


def ret(msg):
    return "<think>\ndone\n</think>\n\n<tool_call>\n" + json.dumps({"name": "return", "parameters": {"message": msg}}) + "\n</tool_call>"


def llm_events(line):
    return [e for e in line["events"] if e["type"] == "llm_call"]


def msgs_of(line, ev):
    return [line["messages"][i] for i in ev["message_ids"]]


# ------------------------------------------------------------------------------------------ ReAct
async def test_react_solves_demo_question_through_the_tools(demo, toolbox):
    b = ScriptedBackend([tc("lens_search", image_id="<image_0>", goal="identify"),
                         tc("search", query="Kestrel Observatory founded", goal="year"),
                         tc("visit", url="https://wiki.example.org/Kestrel_Observatory", goal="year"),
                         ans("1911")])
    line, traj = await run_sample(MethodSpec("react"), demo["demo_1"], 0, backend=b, toolbox=toolbox)
    assert line["status"] == "ok" and line["answer"] == "1911" and line["gold"] == "1911"
    assert line["n_calls"] == 4 and line["tool_calls"] == {"lens_search": 1, "search": 1, "visit": 1}
    tools = [e for e in line["events"] if e["type"] == "tool_call"]
    assert "Kestrel Observatory" in tools[0]["observation"] and tools[0]["image_sha256"] == line["query_images"]["<image_0>"]
    assert "1911" in tools[2]["observation"]
    # every call kept the query image; lens's result image joined the context from step 2 on (WebWatcher-style)
    assert [c["n_query_images"] for c in line["calls"]] == [1, 1, 1, 1]
    assert [c["n_images"] for c in line["calls"]] == [1, 2, 2, 2]
    assert len(tools[0]["result_images"]) == 1 and not tools[1]["result_images"]
    lens_reply = msgs_of(line, llm_events(line)[1])[-1]
    assert lens_reply["role"] == "user" and text_of(lens_reply).startswith("<tool_response>")
    assert text_of(lens_reply).rstrip().endswith("</tool_response>")
    assert [p["sha256"] for p in lens_reply["content"] if p["type"] == "image"] == tools[0]["result_images"]
    # the observation of step t is in the context of step t+1
    assert tools[1]["observation"] in text_of(msgs_of(line, llm_events(line)[2])[-1])
    # each step's reasoning stays in the history as reasoning_content (the template decides what it shows)
    hist = [m for m in msgs_of(line, llm_events(line)[3]) if m["role"] == "assistant"]
    assert [m["reasoning_content"] for m in hist] == ["plan", "plan", "plan"]
    assert all("<think>" not in m["content"] for m in hist)
    for c in line["calls"]:
        assert c["think_tokens"] > 0 and c["completion_tokens"] > c["think_tokens"]
    # per-token arrays kept for every call
    assert set(traj.tokens) == {1, 2, 3, 4} and traj.tokens[1]["top_logprobs"].shape[1] == 20


async def test_react_removal_at_k_drops_pixels_from_step_k_only(demo, toolbox):
    script = [tc("lens_search", image_id="<image_0>", goal="g"), tc("search", query="Valdoria capital", goal="g"),
              tc("search", query="Marsel", goal="g"), ans("Marsel")]
    full, _ = await run_sample(MethodSpec("react"), demo["demo_2"], 0, backend=ScriptedBackend(list(script)), toolbox=toolbox)
    rm, _ = await run_sample(MethodSpec("react", remove_images_from_step=3), demo["demo_2"], 0,
                             backend=ScriptedBackend(list(script)), toolbox=toolbox)
    # only the query image goes from step 3 on; lens's retrieved image stays (paper B.5)
    assert [c["n_query_images"] for c in rm["calls"]] == [1, 1, 0, 0]
    assert [c["n_images"] for c in rm["calls"]] == [1, 2, 1, 1]
    assert rm["variant"] == "removal@3"
    query = set(rm["query_images"].values())
    for ev_full, ev_rm in zip(llm_events(full), llm_events(rm)):
        m_full, m_rm = msgs_of(full, ev_full), msgs_of(rm, ev_rm)
        if ev_rm["index"] < 3:
            assert m_full == m_rm
        else:  # the same messages with only the query image parts dropped; the identifier text stays
            stripped = [{**m, "content": [p for p in m["content"] if p.get("sha256") not in query]}
                        if isinstance(m["content"], list) else m for m in m_full]
            assert m_rm == stripped
            assert "<image_0>" in text_of(m_rm[1])


class LensReturnsTheQueryImage:
    """The offline toolbox, except that Lens answers with a byte-identical copy of the query image among its
    results (what real Lens often does: the query image is on the web)."""

    def __init__(self, inner):
        self.inner = inner

    async def call(self, name, args, registry):
        res = await self.inner.call(name, args, registry)
        if name == "lens_search" and res.ok:
            from dataclasses import replace

            r = registry.resolve(args["image_id"])
            res = replace(res, images=[(r.sha256, str(r.path)), *res.images])
        return res


async def test_a_retrieved_copy_of_a_query_image_is_an_observation_not_a_query_image(demo, toolbox):
    """Query images are identified by where they sit, never by content (paper B.5 keeps retrieved images)."""
    script = [tc("lens_search", image_id="<image_0>", goal="g"), tc("search", query="Valdoria capital", goal="g"),
              tc("search", query="Marsel", goal="g"), ans("Marsel")]
    rm, _ = await run_sample(MethodSpec("react", remove_images_from_step=3), demo["demo_2"], 0,
                             backend=ScriptedBackend(list(script)), toolbox=LensReturnsTheQueryImage(toolbox))
    qsha = rm["query_images"]["<image_0>"]
    lens = next(e for e in rm["events"] if e["type"] == "tool_call")
    assert lens["result_images"][0] == qsha  # the copy entered the context as an observation
    assert [c["n_query_images"] for c in rm["calls"]] == [1, 1, 0, 0]
    assert [c["n_images"] for c in rm["calls"]] == [1, 3, 2, 2]  # Removal@3 keeps both retrieved images
    third = msgs_of(rm, llm_events(rm)[2])
    assert [p["sha256"] for m in third if isinstance(m["content"], list) for p in m["content"]
            if p["type"] == "image"] == lens["result_images"]


async def test_react_malformed_outputs_get_counted_corrections(demo, toolbox):
    two_calls = tc("search", query="a", goal="g") + "\n" + tc("search", query="b", goal="g")
    bad_json = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": }\n</tool_call>"
    b = ScriptedBackend(["<think>hmm</think> I think it is a flag.", two_calls, bad_json, ans("Marsel")])
    line, _ = await run_sample(MethodSpec("react"), demo["demo_2"], 0, backend=b, toolbox=toolbox)
    evs = llm_events(line)
    assert line["status"] == "ok" and line["n_calls"] == 4 and line["n_tool_calls"] == 0
    assert [e.get("action_error") is not None for e in evs] == [True, True, True, False]
    assert [e["correction"] for e in evs] == [False, True, True, True]
    assert "no action found" in evs[0]["action_error"] and "2 <tool_call>" in evs[1]["action_error"]
    assert "not valid JSON" in evs[2]["action_error"]
    # the correction re-prompt follows the malformed output in the next call's context
    assert "could not be executed" in text_of(msgs_of(line, evs[1])[-1])


async def test_react_budget_and_force_answer(demo, toolbox):
    b = ScriptedBackend([tc("search", query=f"q{i}", goal="g") for i in range(5)] + [ans("1998")])
    line, _ = await run_sample(MethodSpec("react", budgets=Budgets(t_max=6)), demo["demo_6"], 0, backend=b, toolbox=toolbox)
    evs = llm_events(line)
    assert line["n_calls"] == 6 and line["status"] == "ok" and line["answer"] == "1998"
    assert [e["forced"] for e in evs] == [False] * 5 + [True]
    assert FORCE_ANSWER in text_of(msgs_of(line, evs[-1])[-1])
    assert FORCE_ANSWER not in json.dumps([msgs_of(line, e) for e in evs[:-1]])
    # a forced call that still calls a tool ends without an answer (judged NOT_ATTEMPTED), within budget
    b = ScriptedBackend([tc("search", query=f"q{i}", goal="g") for i in range(10)])
    line, _ = await run_sample(MethodSpec("react", budgets=Budgets(t_max=4)), demo["demo_6"], 0, backend=b, toolbox=toolbox)
    assert line["status"] == "no_answer" and line["n_calls"] == 4 and line["n_tool_calls"] == 3


async def test_harness_error_is_recorded_not_raised(demo, toolbox):
    b = ScriptedBackend([tc("search", query="a", goal="g")])  # runs out of script on call 2
    line, _ = await run_sample(MethodSpec("react"), demo["demo_1"], 0, backend=b, toolbox=toolbox)
    assert line["status"] == "error" and "script ran out" in line["error"] and line["n_calls"] == 1
    assert line["events"][-1]["type"] == "error"


# ----------------------------------------------------------------------------------- MM-ContextFold
def cf_script(imgs_for_branch):
    return [
        '{"summary": "a crest, crimson with a golden bar", "source_hint": "club website"}',      # init <image_0>
        '<think>x</think>{"summary": "a stadium with a curved roof", "source_hint": "stadium page"}',  # init <image_1>
        sub("identify club", "Identify the club from its crest.", imgs_for_branch),          # main
        tc("lens_search", image_id="<image_0>", goal="identify"),                             # branch 1
        ret("The crest belongs to Rivermoor FC."),                                            # branch 1
        sub("move year", "Find the year Rivermoor FC moved into Moorside Park.", []),        # main
        tc("search", query="Rivermoor FC Moorside Park moved", goal="year"),                  # branch 2
        ret("Rivermoor FC moved into Moorside Park in 1998."),                                # branch 2
        ans("1998"),                                                                          # main
    ]


async def test_contextfold_main_is_text_only_and_branches_see_exactly_their_images(demo, toolbox):
    s = demo["demo_6"]
    line, _ = await run_sample(MethodSpec("mmcontextfold"), s, 0, backend=ScriptedBackend(cf_script(["<image_0>"])),
                               toolbox=toolbox)
    assert line["status"] == "ok" and line["answer"] == "1998" and line["n_calls"] == 9
    q = line["query_images"]
    states = [c["state"] for c in line["calls"]]
    assert states == ["init", "init", "main", "branch", "branch", "main", "branch", "branch", "main"]
    evs = llm_events(line)
    # init: each call sees exactly its own image and the E.4 prompt
    assert evs[0]["image_hashes"] == [q["<image_0>"]] and evs[1]["image_hashes"] == [q["<image_1>"]]
    assert INIT in text_of(msgs_of(line, evs[0])[1])
    # main: never any pixels; the image context holds the init descriptions
    for e in evs:
        if e["state"] == "main":
            assert e["n_images"] == 0
    main_first = text_of(msgs_of(line, evs[2])[1])
    assert "<image_0>: " in main_first and "golden bar" in main_first and "curved roof" in main_first
    assert main_first.startswith(MAIN.split("\n")[0])
    # branches: exactly the assigned images
    begins = {e["branch"]: e for e in line["events"] if e["type"] == "branch_begin"}
    assert begins["b1"]["assigned_hashes"] == [q["<image_0>"]] and begins["b2"]["assigned_hashes"] == []
    for e in evs:
        if e["state"] == "branch":  # query pixels: exactly the assigned ones; lens result images come on top
            assert [h for h in e["image_hashes"] if h in q.values()] == begins[e["branch"]]["assigned_hashes"]
    # a branch gets the same observations as ReAct: lens's result image is in the next branch call
    lens_ev = next(e for e in line["events"] if e["type"] == "tool_call")
    assert lens_ev["result_images"] and set(lens_ev["result_images"]) <= set(evs[4]["image_hashes"])
    # folding: the return message reaches the main state; the branch's tool observation does not
    ends = [e for e in line["events"] if e["type"] == "branch_end"]
    assert [e["reason"] for e in ends] == ["return", "return"]
    main3 = json.dumps(msgs_of(line, evs[5]))
    assert "The crest belongs to Rivermoor FC." in main3
    lens_obs = next(e for e in line["events"] if e["type"] == "tool_call")["observation"]
    assert lens_obs[:60] not in main3
    # the second branch inherits the main text (including the first fold) but not the first branch
    b2_first = json.dumps(msgs_of(line, evs[6]))
    assert "The crest belongs to Rivermoor FC." in b2_first and lens_obs[:60] not in b2_first


async def test_contextfold_budgets_corrections_and_force_answer(demo, toolbox):
    s = demo["demo_1"]

    def never_returns(msgs):
        return tc("search", query="kestrel", goal="g")

    def main_or_branch(msgs):
        last = text_of(msgs[-1])
        if "STATE: BRANCH" in json.dumps(msgs):
            return never_returns(msgs)
        if FORCE_ANSWER in last:
            return ans("1911")
        return sub("look", "search it", [])

    script = ['{"summary": "logo", "source_hint": "site"}', "no action here"] + [main_or_branch] * 40
    line, _ = await run_sample(MethodSpec("mmcontextfold", budgets=Budgets(t_max=20, b_max=5)), s, 0,
                               backend=ScriptedBackend(script), toolbox=toolbox)
    evs = llm_events(line)
    assert line["n_calls"] == 20 and line["status"] == "ok" and line["answer"] == "1911"
    assert evs[1]["action_error"] and evs[2]["correction"] and evs[2]["state"] == "main"
    assert evs[-1]["state"] == "main" and evs[-1]["forced"]
    per_branch = {}
    for e in evs:
        if e["state"] == "branch":
            per_branch[e["branch"]] = per_branch.get(e["branch"], 0) + 1
    assert max(per_branch.values()) <= 5 and per_branch["b1"] == 5
    # the last allowed call of a branch carries the summarise constraint and the branch ends by budget
    b1 = [e for e in evs if e["branch"] == "b1"]
    assert [e["forced"] for e in b1] == [False] * 4 + [True]
    assert BRANCH_SUMMARISE in text_of(msgs_of(line, b1[-1])[-1])
    ends = [e for e in line["events"] if e["type"] == "branch_end"]
    assert ends[0]["reason"] == "branch_budget"
    assert all(e["reason"] in ("branch_budget", "global_budget") for e in ends)


async def test_branch_without_return_folds_visible_text_else_reasoning(demo, toolbox):
    def policy(msgs):
        if "STATE: BRANCH" in json.dumps(msgs):  # only think text and tool calls: no visible prose, no return
            return "<think>\nThe logo is the Kestrel Observatory's.\n</think>\n\n" + tc("search", query="k", goal="g").split("</think>\n\n")[1]
        if "Subtask [look] completed" in text_of(msgs[-1]):
            return ans("1911")
        return sub("look", "search it", [])

    line, _ = await run_sample(MethodSpec("mmcontextfold", variant="no-init", budgets=Budgets(t_max=20, b_max=2)),
                               demo["demo_1"], 0, backend=ScriptedBackend([policy] * 20), toolbox=toolbox)
    end = next(e for e in line["events"] if e["type"] == "branch_end")
    assert end["reason"] == "branch_budget" and end["message"] == "The logo is the Kestrel Observatory's."
    # and the main state's history keeps its own reasoning for the next call
    main2 = [e for e in llm_events(line) if e["state"] == "main"][1]
    hist = [m for m in msgs_of(line, main2) if m["role"] == "assistant"]
    assert hist[0]["reasoning_content"] == "plan"


async def test_contextfold_branch_correction_counts_toward_branch_budget(demo, toolbox):
    script = ['{"summary": "logo", "source_hint": "x"}', sub("a", "do it", ["<image_0>"]),
              "I will search now.", "still no tool", "nope", "nah", "no", sub("b", "again", []), ret("found 1911"), ans("1911")]
    line, _ = await run_sample(MethodSpec("mmcontextfold"), demo["demo_1"], 0, backend=ScriptedBackend(script),
                               toolbox=toolbox)
    b1 = [e for e in llm_events(line) if e["branch"] == "b1"]
    assert len(b1) == 5 and [e["correction"] for e in b1] == [False, True, True, True, True]
    end = next(e for e in line["events"] if e["type"] == "branch_end" and e["branch"] == "b1")
    assert end["reason"] == "branch_budget" and end["message"]  # the visible text is folded back
    assert line["status"] == "ok"


async def test_contextfold_unknown_assigned_image_is_a_correction(demo, toolbox):
    script = ['{"summary": "logo", "source_hint": "x"}', sub("a", "do it", ["<image_7>"]), ans("1911")]
    line, _ = await run_sample(MethodSpec("mmcontextfold"), demo["demo_1"], 0, backend=ScriptedBackend(script),
                               toolbox=toolbox)
    evs = llm_events(line)
    assert "unknown image id" in evs[1]["action_error"] and evs[2]["correction"] and line["answer"] == "1911"


@pytest.mark.parametrize("variant", ["image-caption", "no-init", "no-image-in-branch", "image-in-main"])
async def test_contextfold_ablations(demo, toolbox, variant):
    s = demo["demo_6"]
    script = cf_script(["<image_0>"])
    if variant == "no-init":
        script = script[2:]
    line, _ = await run_sample(MethodSpec("mmcontextfold", variant=variant), s, 0, backend=ScriptedBackend(script),
                               toolbox=toolbox)
    evs = llm_events(line)
    q = line["query_images"]
    states = [e["state"] for e in evs]
    assert line["variant"] == variant and line["status"] == "ok"
    assert ("init" in states) == (variant != "no-init")
    mains = [e for e in evs if e["state"] == "main"]
    branches = [e for e in evs if e["state"] == "branch"]
    if variant == "image-in-main":
        assert all(sorted(h for h in e["image_hashes"] if h in q.values()) == sorted(q.values()) for e in mains + branches)
    else:
        assert all(e["n_images"] == 0 for e in mains)
    b1 = [e for e in branches if e["branch"] == "b1"]  # assigned <image_0>
    b2 = [e for e in branches if e["branch"] == "b2"]  # assigned nothing
    assert len(b1) == 2 and len(b2) == 2
    if variant == "no-init":  # §4.3: only the initialization cycle is skipped; branches load their assigned images
        assert all(e["n_query_images"] == 1 and q["<image_0>"] in e["image_hashes"] for e in b1)
        assert all(e["n_query_images"] == 0 for e in b2)
        assert b1[1]["n_images"] > 1  # and, like the default, Lens result images in the observation
    if variant in ("image-caption", "no-image-in-branch"):  # §4.3: no pixel access at all in a branch
        assert all(e["n_images"] == 0 and e["image_hashes"] == [] for e in branches)
        rendered = [p for e in branches for m in msgs_of(line, e) if isinstance(m["content"], list) for p in m["content"]]
        assert not any(p.get("type") == "image" for p in rendered)
    lens = next(e for e in line["events"] if e["type"] == "tool_call")
    if variant == "image-caption":  # lens_search is not offered and is refused
        assert not lens["ok"] and "not available" in lens["observation"]
        assert '"name": "lens_search"' not in text_of(msgs_of(line, branches[0])[-1])
    else:
        assert lens["ok"] and "Rivermoor" in lens["observation"]
    if variant == "no-init":
        assert "not described: <image_0>, <image_1>" in text_of(msgs_of(line, mains[0])[1])


async def test_direct_inference(demo, toolbox):
    line, _ = await run_sample(MethodSpec("direct"), demo["demo_4"], 0, backend=ScriptedBackend([ans("87")]), toolbox=toolbox)
    assert line["status"] == "ok" and line["answer"] == "87" and line["n_calls"] == 1 and line["calls"][0]["n_images"] == 1
    line, _ = await run_sample(MethodSpec("direct"), demo["demo_4"], 0, backend=ScriptedBackend(["<think>t</think>It is 87 m."]),
                               toolbox=toolbox)
    assert line["answer"] == "It is 87 m." and llm_events(line)[0]["action"]["tagged"] is False


def test_method_spec_validation():
    with pytest.raises(ValueError, match="react only"):
        MethodSpec("mmcontextfold", remove_images_from_step=2)
    with pytest.raises(ValueError, match="unknown variant"):
        MethodSpec("mmcontextfold", variant="nope")
    with pytest.raises(ValueError, match="mmcontextfold only"):
        MethodSpec("react", variant="no-init")
    assert MethodSpec("react", remove_images_from_step=3).label == "react-removal@3"


async def test_missing_action_fields_get_a_counted_correction_in_every_state(demo, toolbox):
    """B.3: missing action fields trigger a correction re-prompt (counted toward B_max and T_max), never a default."""
    no_images = "<think>\nplan\n</think>\n\n<subtask>\n" + json.dumps({"description": "d", "prompt": "p"}) + "\n</subtask>"
    no_args = '<think>\nx\n</think>\n\n<tool_call>\n{"name": "search"}\n</tool_call>'
    script = ['{"summary": "logo", "source_hint": "x"}', no_images, sub("look", "do it", []), no_args,
              tc("search", query="Kestrel Observatory founded", goal="year"), ret("1911"), ans("1911")]
    line, _ = await run_sample(MethodSpec("mmcontextfold", budgets=Budgets(t_max=20, b_max=3)), demo["demo_1"], 0,
                               backend=ScriptedBackend(script), toolbox=toolbox)
    evs = llm_events(line)
    assert "missing 'assigned_images'" in evs[1]["action_error"] and evs[2]["correction"]
    b1 = [e for e in evs if e["branch"] == "b1"]
    assert 'no "arguments"' in b1[0]["action_error"] and b1[1]["correction"]
    assert [e["type"] for e in line["events"]].count("tool_call") == 1  # the argument-less call ran nothing
    assert len(b1) == 3 and b1[-1]["forced"]  # the correction counted toward B_max = 3
    assert "at most 3 tool calls;" in text_of(msgs_of(line, b1[0])[-1])  # E.3's budget sentence follows --b-max
    assert line["n_calls"] == 7 and line["status"] == "ok"


async def test_agentfold_tool_call_without_arguments_is_an_error_observation(demo, toolbox):
    first = '<think>\nx\n</think>\n<motivation>m</motivation>\n<tool_call>{"name": "search"}</tool_call>'
    comp = '<compress>{"compress_range": [0, 0], "compress_text": "nothing"}</compress>'
    line, _ = await run_sample(MethodSpec("agentfold"), demo["demo_1"], 0,
                               backend=ScriptedBackend([first, f"<think>\ny\n</think>\n{comp}\n<answer>1911</answer>"]),
                               toolbox=toolbox)
    assert line["status"] == "ok" and line["n_tool_calls"] == 0
    second = msgs_of(line, llm_events(line)[1])
    assert "[Tool call error]" in text_of(second[-1]) and "arguments" in text_of(second[-1])


async def test_history_reasoning_drop_is_the_release_s_history(demo, toolbox):
    """The release's client appends only ``message.content`` of each reply to the history (no reasoning):
    ``--history-reasoning drop`` sends exactly that; ``keep`` (our default) adds ``reasoning_content``."""
    script = [tc("lens_search", image_id="<image_0>", goal="g"), tc("search", query="q", goal="g"), ans("1911")]
    for mode in ("drop", "keep"):
        line, _ = await run_sample(MethodSpec("react", history_reasoning=mode), demo["demo_1"], 0,
                                   backend=ScriptedBackend(list(script)), toolbox=toolbox)
        hist = [m for m in msgs_of(line, llm_events(line)[-1]) if m["role"] == "assistant"]
        assert len(hist) == 2
        if mode == "drop":
            assert all(set(m) == {"role", "content"} and "<think>" not in m["content"] for m in hist)
        else:
            assert all(m["reasoning_content"] == "plan" for m in hist)
