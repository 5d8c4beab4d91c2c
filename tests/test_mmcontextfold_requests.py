"""What MM-ContextFold sends, call by call, where the paper is silent and the authors' release decides.

The release is iLearn-Lab/MM26-MMContextFold at commit 16fa474; each expectation cites the file:line it follows
(docs/fidelity.md has the whole table). The bodies are the messages as the OpenAI-compatible backend sends them
(``to_openai_messages`` of what the method passed to the backend).
"""
from __future__ import annotations

import json

import pytest

from agent.backends.messages import to_openai_messages
from agent.backends.scripted import ScriptedBackend
from agent.benchmarks import resolve_benchmark
from agent.benchmarks.manifest import Sample
from agent.methods import Budgets, MethodSpec, run_sample
from agent.prompts import BRANCH_SUMMARISE, FORCE_ANSWER, INIT
from agent.tools import make_toolbox
from tests.test_agents import cf_script, sub, tc


@pytest.fixture(scope="module")
def demo():
    return {s.id: s for s in resolve_benchmark("demo").samples}


def recording(script):
    """The script, each entry also recording the request body's messages it answered."""
    bodies = []

    def entry(out):
        def answer(msgs):
            bodies.append(to_openai_messages(msgs))
            return out(msgs) if callable(out) else out
        return answer
    return [entry(o) for o in script], bodies


def images(content) -> list[dict]:
    return [p["image_url"] for p in content if isinstance(p, dict) and p.get("type") == "image_url"]


async def normal_run(demo):
    script, bodies = recording(cf_script(["<image_0>"]))
    line, _ = await run_sample(MethodSpec("mmcontextfold"), demo["demo_6"], 0, backend=ScriptedBackend(script),
                               toolbox=make_toolbox("offline"))
    assert line["status"] == "ok" and len(bodies) == 9
    return bodies


async def test_init_calls_send_the_prompt_first_then_the_image_in_high_detail(demo):
    bodies = await normal_run(demo)
    for k in (0, 1):
        user = bodies[k][1]["content"]
        # the prompt text first, then the image with "detail": "high" (utils/search_backbone_model.py:83-106, :100);
        # ours: the <image_k> identifier stays before its pixels (it marks a query image for the removal probes)
        assert user[0] == {"type": "text", "text": INIT} and user[1] == {"type": "text", "text": f"<image_{k}>"}
        assert [i["detail"] for i in images(user)] == ["high"] and images(user)[0]["url"].startswith("data:image/")


async def test_the_main_state_sees_the_release_s_query_image_blocks(demo):
    main = (await normal_run(demo))[2][1]["content"]
    # one block per image, [Query Image], indented Content / Source, a blank line between blocks
    # (pipelines/pipeline_mmcontextfold.py:124-138, joined at :151)
    assert ("<image_0>: [Query Image]\n  Content: a crest, crimson with a golden bar\n  Source: club website\n\n"
            "<image_1>: [Query Image]\n  Content: a stadium with a curved roof\n  Source: stadium page") in main


async def test_a_non_json_description_is_cut_to_200_characters():
    from agent.methods.mmcontextfold import _description

    # pipelines/pipeline_mmcontextfold.py:151
    assert _description("<image_0>", None, "x" * 300) == "<image_0>: [Query Image] " + "x" * 200


async def test_a_branch_sends_its_prompt_then_its_images_and_lens_results_as_the_release_names_them(demo):
    bodies = await normal_run(demo)
    first = bodies[3][-1]["content"]
    assert first[0]["type"] == "text" and first[0]["text"].startswith("**STATE: BRANCH**")
    assert [i["detail"] for i in images(first)] == ["high"]                      # search_backbone_model.py:100
    obs = bodies[4][-1]["content"]
    # Lens inside a branch (pipelines/pipeline_mmcontextfold.py:383-400, images attached after the text :305-308):
    # the results whose thumbnail arrived, named <result#i>, the compare instruction, then the images in order
    text = obs[0]["text"]
    assert text.startswith("<tool_response>\nReverse image search results for <image_0>:\n\n<result#1>: **")
    assert "\n   URL: https://" in text
    assert text.endswith("The result images are attached in the same order (<result#1> ~ <result#1>). Compare each "
                         "result image with the query image <image_0> and use both visual and text information to "
                         "continue your task.\n")
    assert len(images(obs)) == 1 and obs[-1] == {"type": "text", "text": "\n</tool_response>"}
    assert [i["detail"] for i in images(obs)] == ["high"]  # every image high detail (search_backbone_model.py:100)
    # search: the release's text_search block (utils/search_tools.py:23-43), wrapped as a tool response (ours)
    assert bodies[7][-1]["content"].startswith("<tool_response>\n## text_search Results\n\n**Query:** Rivermoor FC")


async def test_the_force_answer_is_a_user_turn_of_its_own_and_summarise_stays_inside_the_tool_response(demo):
    def policy(msgs):
        if "STATE: BRANCH" in json.dumps(msgs):
            return tc("search", query="kestrel", goal="g")
        return sub("look", "search it", [])

    script, bodies = recording(['{"summary": "logo", "source_hint": "site"}'] + [policy] * 40)
    line, _ = await run_sample(MethodSpec("mmcontextfold", budgets=Budgets(t_max=20, b_max=5)), demo["demo_1"], 0,
                               backend=ScriptedBackend(script), toolbox=make_toolbox("offline"))
    assert line["n_calls"] == 20 and line["status"] == "no_answer"
    # pipelines/pipeline_mmcontextfold.py:522-523: the force-answer prompt is a new user message after the model's
    # last reply, which answered the last branch's continuation (never two user turns in a row)
    assert bodies[-1][-1] == {"role": "user", "content": FORCE_ANSWER}
    assert bodies[-1][-2]["role"] == "assistant" and bodies[-1][-2]["content"].startswith("<subtask>")
    assert bodies[-1][-3]["role"] == "user" and bodies[-1][-3]["content"].startswith("## Subtask [look] completed")
    assert all(not (a["role"] == b["role"] == "user") for body in bodies for a, b in zip(body, body[1:]))
    # the branch's last allowed call: the summarise note inside the observation's wrapper, as the release appends
    # its turn warnings to the observation (pipeline_mmcontextfold.py:284-296)
    last_branch = next(b for b in bodies if isinstance(b[-1]["content"], str) and BRANCH_SUMMARISE in b[-1]["content"])
    assert last_branch[-1]["content"].startswith("<tool_response>\n## text_search Results")
    assert last_branch[-1]["content"].endswith("\n\n" + BRANCH_SUMMARISE + "\n</tool_response>")


def test_options_are_bullets_after_a_blank_line_and_options_heading():
    s = Sample(id="q", query="Which city?", query_images=[], answer="A", benchmark="x", line=1,
               options=["Paris", "Rome", 3])
    # pipelines/base_pipeline.py:118-122
    assert s.question == "Which city?\n\nOptions:\n- Paris\n- Rome\n- 3"
    # lower-case options stay as written, no letters added (one question text for both protocols)
    low = Sample(id="q", query="Which city?", query_images=[], answer="paris", benchmark="x", line=1,
                 options=["paris", "a. rome"])
    assert low.question == "Which city?\n\nOptions:\n- paris\n- a. rome"


@pytest.mark.model
def test_on_qwen35s_template_the_wrapper_keeps_a_branch_s_reasoning_in_view(tiny_model_dir):
    """The decision for observation texts (U3): the release sends them bare; Qwen3.5's template then takes each
    one for a new user query and renders no reasoning of the turns before it. Wrapped in <tool_response>, the
    branch's own reasoning stays rendered, as the paper keeps reasoning in a state's history (B.3)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    def rendered(observation):
        msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "**STATE: BRANCH** task"},
                {"role": "assistant", "content": "<tool_call>{}</tool_call>", "reasoning_content": "BRANCH-THOUGHT"},
                {"role": "user", "content": observation}]
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)

    obs = "## text_search Results\n\n**Query:** q"
    assert "BRANCH-THOUGHT" in rendered(f"<tool_response>\n{obs}\n</tool_response>")
    assert "BRANCH-THOUGHT" not in rendered(obs)


async def test_a_branch_return_loses_its_answer_tags_as_in_the_release(demo):
    from tests.test_agents import ans, ret

    script = [*cf_script(["<image_0>"])[:4], ret("<answer>Rivermoor FC</answer>"), ans("1998")]
    rec, bodies = recording(script)
    line, _ = await run_sample(MethodSpec("mmcontextfold"), demo["demo_6"], 0, backend=ScriptedBackend(rec),
                               toolbox=make_toolbox("offline"))
    # pipelines/pipeline_mmcontextfold.py:272-278: the tags go, the findings stay
    assert line["status"] == "ok" and bodies[-1][-1]["content"].startswith("## Subtask [identify club] completed")
    assert bodies[-1][-1]["content"].startswith("## Subtask [identify club] completed\nRivermoor FC\n\n")
