"""The grounding annotator: both passes with the verbatim prompts, retries, invalid combinations, outputs."""
from __future__ import annotations

import json
import re

import pytest

from agent.backends.openai_compat import OpenAIBackend
from agent.backends.scripted import ScriptedBackend
from agent.prompts import GROUNDING_PASS1, GROUNDING_PASS2
from agent.run import RunConfig, run
from probes.grounding import LabelError, annotate_run, parse_labels
from probes.grounding.annotate import draw_panel
from serving.fakes.sglang_server import FakeSGLang


def policy(messages):
    n = sum(m["role"] == "assistant" for m in messages)
    if n == 0:
        return '<think>\nthe logo\n</think>\n\n<tool_call>\n{"name": "lens_search", "arguments": {"image_id": "<image_0>"}}\n</tool_call>'
    if n == 1:
        return '<think>\nname found\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": "founded"}}\n</tool_call>'
    return "<think>\ndone\n</think>\n\n<answer>1911</answer>"


def annotator(mode):
    """A fake annotator: labels step 1 Image Needed, step 2 Image-Derived, the rest Text Only."""
    seen = {"n": 0}

    def reply(req):
        seen["n"] += 1
        text = next(p["text"] for p in req["messages"][0]["content"] if p.get("type") == "text" and len(p["text"]) > 100)
        n = len(re.findall(r"^### Step \d+", text, flags=re.M))
        if text.startswith(GROUNDING_PASS1[:60]):
            if mode == "bad_then_good" and seen["n"] == 1:
                return "</think>Here are the labels: [{'step': 1}]"
            arr = [{"step": i, "tool": "x", "image_needed": i == 1, "reason": "r"} for i in range(1, n + 1)]
        else:
            assert "image_needed: true" in text  # pass 2 carries the pass-1 labels
            arr = [{"step": i, "tool": "x", "image_needed": i == 1,
                    "image_info_used": (i == 2) if mode == "invalid" else i <= 2, "reason": "r"} for i in range(1, n + 1)]
        return "</think>```json\n" + json.dumps(arr) + "\n```"
    return reply


async def _run(tmp_path):
    await run(RunConfig(method="react", out=str(tmp_path / "run"), limit=2, progress=False), [],
              backends=[ScriptedBackend([policy] * 20)])
    return tmp_path / "run"


@pytest.mark.parametrize("mode", ["good", "bad_then_good", "invalid"])
async def test_annotate_run(tmp_path, mode):
    rd = await _run(tmp_path)
    with FakeSGLang(reply=annotator(mode)) as srv:
        backend = OpenAIBackend(srv.url, "annotator", server="other")
        res = await annotate_run(rd, backend=backend, retries=2, progress=False)
        await backend.aclose()
        bodies = list(srv.bodies)
    s = res["summary"]
    first = bodies[0]["messages"][0]["content"]
    assert first[0] == {"type": "text", "text": "<image_0>"} and first[1]["type"] == "image_url"
    assert first[-1]["text"].startswith(GROUNDING_PASS1.split("{question}")[0])
    if mode == "invalid":  # pass 2 keeps breaking the rule: asked 3 times, then reported, never guessed
        assert s["invalid"] == 2 and s["annotated"] == 0 and res["steps"].empty
        assert len(bodies) == 2 * (1 + 3)
        assert "requires image_info_used=true" in s["invalid_examples"][0]["errors"][-1]
        return
    assert s["annotated"] == 2 and s["invalid"] == 0
    steps = res["steps"]
    assert list(steps[steps.sample_id == "demo_1"].category) == ["Image Needed", "Image-Derived", "Text Only"]
    assert list(steps.tool[:3]) == ["lens_search", "search", "answer"]
    assert s["image_needed_within_first_5"] == 1.0 and s["share_per_step"][1]["Image Needed"] == 1.0
    assert (res["out"] / "steps.csv").exists() and not (res["out"] / "fig2a_grounding.png").exists()  # tables only
    draw_panel(res)  # the command's view
    assert (res["out"] / "fig2a_grounding.png").exists()
    assert len(bodies) == (5 if mode == "bad_then_good" else 4)
    assert any(b["messages"][0]["content"][-1]["text"].startswith(GROUNDING_PASS2[:40]) for b in bodies)


async def test_annotation_resumes_after_a_torn_multibyte_append(tmp_path):
    """labels.jsonl cut inside a multi-byte character: the rerun sets the fragment aside (quarantine/), annotates
    that trajectory again and keeps the other one."""
    rd = await _run(tmp_path)
    with FakeSGLang(reply=annotator("good")) as srv:
        backend = OpenAIBackend(srv.url, "annotator", server="other")
        res = await annotate_run(rd, backend=backend, retries=2, progress=False)
        path = res["out"] / "labels.jsonl"
        lines = path.read_bytes().splitlines(keepends=True)
        assert len(lines) == 2
        path.write_bytes(lines[0] + '{"sample_id": "demo_2", "reason": "caf\u00e9'.encode()[:-1])
        n = len(srv.bodies)
        res2 = await annotate_run(rd, backend=backend, retries=2, progress=False)
        await backend.aclose()
        assert len(srv.bodies) == n + 2  # the torn trajectory only: its two passes
    assert res2["summary"]["annotated"] == 2
    assert len(path.read_bytes().splitlines()) == 2 and b"caf\xc3" not in path.read_bytes()
    assert (res["out"] / "quarantine" / "labels.jsonl").read_bytes().endswith(b"caf\xc3\n")  # the fragment, aside


@pytest.mark.parametrize("reply,msg", [
    ("no json here", "no JSON array"),
    ('[{"step": 1, "image_needed": true}', "no JSON array"),
    ('[{"step": 1, "image_needed": "maybe"}, {"step": 2, "image_needed": false}]', "true or false"),
    ('[{"step": 1, "image_needed": true}]', "expected steps 1..2"),
    ('[{"step": 1, "image_needed": true}, {"step": 1, "image_needed": false}]', "labelled twice"),
    ('[{"step": 1}, {"step": 2, "image_needed": false}]', "no image_needed"),
    ('[{"image_needed": true}, {"step": 2, "image_needed": false}]', "integer step"),
])
def test_parse_labels_malformed(reply, msg):
    with pytest.raises(LabelError, match=msg):
        parse_labels(reply, 2, ("image_needed",))


def test_parse_labels_ok():
    got = parse_labels('<think>[1]</think>\n```json\n[{"step": "2", "image_needed": "false", "reason": "x"}, '
                       '{"step": 1, "image_needed": true}]\n```', 2, ("image_needed",))
    assert [g["image_needed"] for g in got] == [True, False]
