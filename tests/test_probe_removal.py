"""Step-k removal replays: the prefix is the recorded one byte for byte, images go from step k, outcomes."""
from __future__ import annotations

import json

import pytest

from agent.backends.scripted import ScriptedBackend
from agent.judge import Grader
from agent.run import RunConfig, run
from agent.rundir import RunDir, RunError, load_run
from agent.tools.demo_world import QUESTIONS
from probes.removal import parse_steps, removal_probe

GOLD = {q[1]: q[3] for q in QUESTIONS}


def sees_image_policy(messages):
    """Three searches, then the gold answer if the image is in the context, else a wrong one."""
    n = sum(m["role"] == "assistant" for m in messages)
    if n < 3:
        return ('<think>\nsearch\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": "step ' + str(n)
                + '", "goal": "g"}}\n</tool_call>')
    has_image = any(isinstance(m["content"], list) and any(p.get("type") == "image_url" for p in m["content"])
                    for m in messages)
    question = next(p["text"] for p in messages[1]["content"] if p.get("type") == "text" and "Question:" in p["text"])
    gold = next(g for q, g in GOLD.items() if q in question)
    return f"<think>\nanswer\n</think>\n\n<answer>{gold if has_image else 'no idea'}</answer>"


async def _react_run(tmp_path, n=4):
    await run(RunConfig(method="react", out=str(tmp_path / "run"), limit=n, t_max=8, progress=False), [],
              backends=[ScriptedBackend([sees_image_policy] * 200)])
    return tmp_path / "run"


async def test_removal_replays_accuracy_vs_k(tmp_path):
    rd = await _react_run(tmp_path)
    backend = ScriptedBackend([sees_image_policy] * 500)
    res = await removal_probe(rd, [1, 2, 4, 5], backend=backend, grader=Grader("exact"), progress=False)
    s = res["summary"].set_index(["paper_category", "k"])
    assert s.loc[("All", 1), "accuracy_original"] == 100.0
    # the answer comes at call 4: removing the images at k <= 4 loses it; k = 5 is after the end
    for k in (1, 2, 4):
        assert s.loc[("All", k), "accuracy_removed"] == 0.0 and s.loc[("All", k), "replayed"] == 4
    assert s.loc[("All", 5), "accuracy_removed"] == 100.0 and s.loc[("All", 5), "replayed"] == 0
    assert s.loc[("All", 1), "mcnemar_p"] < 0.2
    out = res["out"]
    assert (out / "fig2c_removal.png").exists() and (out / "outcomes.csv").exists()
    # each replay is a run directory of its own, with the prefix recorded as it was
    orig = {(ln["sample_id"], ln["trial"]): ln for ln in load_run(rd).lines}
    for ln in load_run(out / "k2").lines:
        o = orig[(ln["sample_id"], ln["trial"])]
        ev = [e for e in ln["events"] if e["type"] == "llm_call"]
        oe = [e for e in o["events"] if e["type"] == "llm_call"]
        assert ev[0]["text"] == oe[0]["text"] and ev[0]["message_ids"] == oe[0]["message_ids"]
        assert [c["n_images"] for c in ln["calls"]] == [1, 0, 0, 0]
        assert ln["answer"] == "no idea" and ln["variant"] == "replay-removal@2"
        # call 2's context: the original one with only the image part dropped
        strip = [{**m, "content": [p for p in m["content"] if p.get("type") != "image"]} if isinstance(m["content"], list)
                 else m for m in [o["messages"][i] for i in oe[1]["message_ids"]]]
        assert [ln["messages"][i] for i in ev[1]["message_ids"]] == strip
    # only the live part was generated: calls 2..4 for k=2 etc., never the prefix
    assert sum(c["kind"] == "generate" for c in backend.calls) == 4 * (4 + 3 + 1)


async def test_removal_is_resumable(tmp_path):
    rd = await _react_run(tmp_path, n=2)
    b = ScriptedBackend([sees_image_policy] * 200)
    await removal_probe(rd, [2], backend=b, grader=Grader("exact"), progress=False)
    n = len(b.calls)
    await removal_probe(rd, [2], backend=b, grader=Grader("exact"), progress=False)
    assert len(b.calls) == n


async def test_a_prefix_that_does_not_rebuild_is_an_error(tmp_path):
    rd = await _react_run(tmp_path, n=1)
    res = rd / "results.jsonl"
    line = json.loads(res.read_text())
    tool = next(e for e in line["events"] if e["type"] == "tool_call")
    tool["observation"] = "tampered " + tool["observation"]
    res.write_text(json.dumps(line) + "\n")
    await removal_probe(rd, [3], backend=ScriptedBackend([sees_image_policy] * 50), grader=Grader("exact"), progress=False)
    rep = RunDir(rd / "probes" / "removal" / "k3").read_lines()[0]
    assert rep["status"] == "error" and "byte for byte" in rep["error"]


async def test_removal_needs_a_plain_react_run(tmp_path):
    await run(RunConfig(method="direct", out=str(tmp_path / "run"), limit=1, progress=False), [],
              backends=[ScriptedBackend(["<answer>x</answer>"])])
    with pytest.raises(RunError, match="plain ReAct run"):
        await removal_probe(tmp_path / "run", [1], backend=None, grader=Grader("exact"), progress=False)


def test_parse_steps():
    assert parse_steps("1..5") == [1, 2, 3, 4, 5] and parse_steps("1,3, 7") == [1, 3, 7] and parse_steps("2") == [2]
    with pytest.raises(ValueError):
        parse_steps("0..2")
