"""Step-k removal replays: the prefix is the recorded one byte for byte, images go from step k, outcomes."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from agent.backends.scripted import ScriptedBackend
from agent.judge import Grader
from agent.run import RunConfig, run
from agent.rundir import RunDir, RunError, frames, load_run
from agent.rundir.lines import seal
from agent.rundir.probe_outputs import write_outputs
from agent.tools.demo_world import QUESTIONS
from probes.removal import parse_steps, removal_probe
from probes.removal.replays import draw_panel
from tests.records import recorded_lines

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
    assert (out / "outcomes.csv").exists() and not (out / "fig2c_removal.png").exists()  # tables only
    draw_panel(res)  # the command's view
    assert (out / "fig2c_removal.png").exists()
    # each replay is a run directory of its own, with the prefix recorded as it was
    orig = {(ln["sample_id"], ln["trial"]): ln for ln in recorded_lines(rd)}
    for ln in recorded_lines(out / "k2"):
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
    # each outcome names the seal of the line it replays, and of its replay's line (issue 68)
    seals = load_run(rd).seals()
    k2 = load_run(out / "k2").seals()
    o = res["outcomes"]
    assert all(seals[(r.sample_id, r.trial)] == r.source_sha256 for r in o.itertuples())
    assert all(k2[(r.sample_id, r.trial)] == r.replay_sha256 for r in o[o.k == 2].itertuples())
    assert o[o.k == 5].replay_sha256.isna().all()  # ended before step 5: nothing replayed
    assert len(frames.removal(rd)) == len(o)
    table = pd.read_csv(out / "outcomes.csv")
    table.loc[0, "source_sha256"] = "0" * 64  # an outcome of a line the run does not hold
    table.to_csv(out / "outcomes.csv", index=False)
    with pytest.raises(RunError, match="outcomes.csv: changed since its probe wrote it"):  # edited: its seal
        frames.removal(rd)
    write_outputs(out, {"outcomes.csv": table})  # as sealed by a probe that read a line since replaced
    with pytest.raises(RunError, match="1 of 16 row.*python -m probes.removal"):
        frames.removal(rd)


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
    res.write_bytes(seal(line) + b"\n")  # a crafted run: sealed again, so only the prefix tells
    (rd / "results.index.jsonl").unlink()
    await removal_probe(rd, [3], backend=ScriptedBackend([sees_image_policy] * 50), grader=Grader("exact"), progress=False)
    rep = RunDir(rd / "probes" / "removal" / "k3").index()[0]
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


# ------------------------------------------------------------------ live tools: replays go through the cache
def _question_gold(messages):
    question = next(p["text"] for p in messages[1]["content"] if p.get("type") == "text" and "Question:" in p["text"])
    return next(g for q, g in GOLD.items() if q in question)


def _assistant_turns(messages):
    return [m for m in messages if m["role"] == "assistant"]


def _query_image_present(messages):
    return any(p.get("type") == "image_url" for p in messages[1]["content"])


def _tool(name, **args):
    return ("<think>\nthinking\n</think>\n\n<tool_call>\n" + json.dumps({"name": name, "arguments": args})
            + "\n</tool_call>")


def image_blind_policy(tag="run"):
    """Ignores the images entirely; its search queries carry ``tag`` (so replays with another tag miss the cache)."""
    def policy(messages):
        n = len(_assistant_turns(messages))
        if n < 2:
            return _tool("search", query=f"{tag} {_question_gold(messages)} step {n}", goal="g")
        gold = _question_gold(messages)
        right = sorted(GOLD.values()).index(gold) % 2 == 0  # a fixed half of the questions is answered right
        return f"<think>\nanswer\n</think>\n\n<answer>{gold if right else 'wrong'}</answer>"
    return policy


def needs_image_at_step_1_policy(tag="run"):
    """Grounds with lens_search at step 1 if (and only if) the query image is there; answers from the lens evidence."""
    def policy(messages):
        turns = _assistant_turns(messages)
        if not turns:
            if _query_image_present(messages):
                return _tool("lens_search", image_id="<image_0>", goal="identify")
            return _tool("search", query="what is in the picture", goal="identify")
        if len(turns) < 3:
            return _tool("search", query=f"{tag} follow-up {len(turns)}", goal="g")
        grounded = "lens_search" in turns[0]["content"]
        return f"<think>\nanswer\n</think>\n\n<answer>{_question_gold(messages) if grounded else 'no idea'}</answer>"
    return policy


async def _live_react_run(tmp_path, policy, n=6):
    await run(RunConfig(method="react", out=str(tmp_path / "run"), limit=n, t_max=8, tools="live", progress=False),
              [], backends=[ScriptedBackend([policy] * 200)])
    return tmp_path / "run"


async def test_image_blind_policy_keeps_its_accuracy_at_every_k_with_live_tools(tmp_path, live_web):
    rd = await _live_react_run(tmp_path, image_blind_policy("run"))
    n_before = len(live_web.log)
    res = await removal_probe(rd, [1, 2, 3], backend=ScriptedBackend([image_blind_policy("replay")] * 500),
                              grader=Grader("exact"), progress=False)
    s = res["summary"].set_index(["paper_category", "k"])
    orig = s.loc[("All", 1), "accuracy_original"]
    assert 0 < orig < 100
    for k in (1, 2, 3):
        assert s.loc[("All", k), "accuracy_removed"] == orig and s.loc[("All", k), "n_error"] == 0
        assert s.loc[("All", k), "n"] == 6
    assert not res["errors"]
    # the replays' new queries (cache misses) went to the live tools instead of failing ...
    assert len(live_web.log) > n_before
    # ... and were written back: rerunning the probe from scratch replays them from the cache, no live call
    import shutil

    shutil.rmtree(res["out"])
    n_after = len(live_web.log)
    res2 = await removal_probe(rd, [1, 2, 3], backend=ScriptedBackend([image_blind_policy("replay")] * 500),
                               grader=Grader("exact"), progress=False)
    assert res2["summary"].equals(res["summary"]) and len(live_web.log) == n_after


async def test_policy_needing_the_image_at_step_1_loses_it_only_at_k1(tmp_path, live_web):
    rd = await _live_react_run(tmp_path, needs_image_at_step_1_policy("run"))
    res = await removal_probe(rd, [1, 2, 3, 4], backend=ScriptedBackend([needs_image_at_step_1_policy("replay")] * 500),
                              grader=Grader("exact"), progress=False)
    s = res["summary"].set_index(["paper_category", "k"])
    assert s.loc[("All", 1), "accuracy_original"] == 100.0
    assert s.loc[("All", 1), "accuracy_removed"] == 0.0 and s.loc[("All", 1), "mcnemar_p"] < 0.05
    for k in (2, 3, 4):
        assert s.loc[("All", k), "accuracy_removed"] == 100.0 and s.loc[("All", k), "n_error"] == 0
    # the prefix carried the lens result images (retrieved, kept) from the run's image store
    k2 = load_run(res["out"] / "k2")
    first = next(ln for ln in k2.lines)
    ev2 = [e for e in first.events if e.type == "llm_call"][1]
    assert ev2.n_query_images == 0 and ev2.n_images == 5


async def test_a_failed_replay_is_a_missing_pair_not_a_wrong_answer(tmp_path):
    from agent.backends.base import BackendError

    rd = await _react_run(tmp_path, n=4)
    state = {"n": 0}

    def flaky(messages):  # the second replayed trajectory's backend call fails (a harness error)
        state["n"] += 1
        if state["n"] == 4:
            raise BackendError("server went away")
        return sees_image_policy(messages)

    res = await removal_probe(rd, [4], backend=ScriptedBackend([flaky] * 50), grader=Grader("exact"), progress=False)
    s = res["summary"].set_index(["paper_category", "k"])
    assert s.loc[("All", 4), "n_error"] == 1 and s.loc[("All", 4), "n"] == 3
    assert s.loc[("All", 4), "accuracy_removed"] == 0.0 and s.loc[("All", 4), "accuracy_original"] == 100.0
    assert len(res["errors"]) == 1 and "server went away" in res["errors"][0]["error"]
    errors_csv = (res["out"] / "errors.csv").read_text()
    assert res["errors"][0]["sample_id"] in errors_csv
    # a rerun retries exactly the failed replay
    b = ScriptedBackend([sees_image_policy] * 50)
    res2 = await removal_probe(rd, [4], backend=b, grader=Grader("exact"), progress=False)
    assert not res2["errors"] and res2["summary"].set_index(["paper_category", "k"]).loc[("All", 4), "n"] == 4
    assert sum(c["kind"] == "generate" for c in b.calls) == 1


async def test_an_interrupted_removal_probe_records_the_cost_of_what_was_answered(tmp_path):
    """K3: a probe stopped mid-way (Ctrl-C, SIGTERM) writes the session's GPU time and replay count before it
    stops; the rerun adds its own session to it."""
    import asyncio
    import json

    rd = await _react_run(tmp_path)
    calls = {"n": 0}

    def stops_on_the_fifth(messages):
        calls["n"] += 1
        if calls["n"] == 5:  # what Ctrl-C or SIGTERM does to the replays in flight
            raise asyncio.CancelledError
        return sees_image_policy(messages)

    hw = {"servers": 1, "gpus_per_server": 4, "gpus_held": 4}
    with pytest.raises(asyncio.CancelledError):
        await removal_probe(rd, [1, 2], backend=ScriptedBackend([stops_on_the_fifth] * 200), grader=Grader("exact"),
                            progress=False, concurrency=1, hardware=hw)
    rec = json.loads((rd / "probes" / "removal" / "probe.json").read_text())
    assert rec["interrupted"] is True and len(rec["cost"]["sessions"]) == 1 and rec["cost"]["gpu_seconds"] is not None
    await removal_probe(rd, [1, 2], backend=ScriptedBackend([sees_image_policy] * 200), grader=Grader("exact"),
                        progress=False, hardware=hw)
    rec = json.loads((rd / "probes" / "removal" / "probe.json").read_text())
    assert "interrupted" not in rec and len(rec["cost"]["sessions"]) == 2
