"""Resume inside a trajectory (agent/run/journal.py): a runner killed with SIGKILL at random points of long
trajectories continues each unfinished unit from its last completed call; the finished lines equal an
uninterrupted run's, no call is paid twice beyond those in flight at a kill, and no unit is lost or doubled."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from agent.rundir import check_run, load_run, token_key
from serving.fakes.sglang_server import FakeSGLang
from tests.guards import HANG_GUARD_S

from .conftest import REPO

STEPS = 9  # tool calls before the answer: 10 LLM calls a trajectory


def policy(req: dict) -> str:
    """Deterministic: a search per step, then the answer (each reply a function of the request alone)."""
    n = sum(m.get("role") == "assistant" for m in req.get("messages") or [])
    if n < STEPS:
        return (f"Step {n}: look further.</think>\n\n<tool_call>\n"
                f'{{"name": "search", "arguments": {{"query": ["rivermoor stadium {n}"]}}}}\n</tool_call>')
    return "Enough.</think>\n\n<answer>1998</answer>"


def _cmd(url, out):
    return [sys.executable, "-m", "agent.run", "--method", "react", "--backend", "openai", "--endpoint", url,
            "--benchmark", "demo", "--concurrency", "2", "--t-max", "12", "--seed", "5", "--out", str(out), "--no-progress"]


# what differs between two runs of the same units: time, and that a resumed unit's earlier tool calls come from the
# run's tool cache (the line says so); the sidecar is compared by content, not by its per-attempt name
VARIES = {"duration_s", "latency_s", "started", "finished", "t", "cache_hit", "paid_calls", "tool_usage", "tokens_file",
          "line_sha256"}


def _norm(x):
    if isinstance(x, dict):
        return {k: _norm(v) for k, v in x.items() if k not in VARIES}
    if isinstance(x, list):
        return [_norm(v) for v in x]
    return x


def _lines(out) -> dict:
    run = load_run(out)
    return {ln.key: (_norm(run.full(ln).as_recorded()), run.tokens(ln)) for ln in run.index}


def _mid_trajectory(out) -> bool:
    """Is a unit that has no line yet at least two calls into its trajectory?"""
    done = {token_key(json.loads(x)["sample_id"], 0) for x in (out / "results.jsonl").read_bytes().splitlines()
            if x.strip()} if (out / "results.jsonl").exists() else set()
    return any(p.parent.name not in done for p in (out / "inflight").glob("*/c0002.json"))


def _chat_posts(srv) -> int:
    return sum(p.startswith("/v1/chat/completions") for p in srv.requests)


@pytest.mark.slow
def test_a_killed_runner_resumes_each_trajectory_from_its_last_completed_call(tmp_path):
    rng = random.Random(7)
    with FakeSGLang(reply=policy, latency_s=0.02) as srv:
        ref = tmp_path / "ref"
        assert subprocess.run(_cmd(srv.url, ref), cwd=REPO, capture_output=True, timeout=HANG_GUARD_S).returncode == 0
        want = _lines(ref)
        assert len(want) == 6 and all(v[0]["n_calls"] == STEPS + 1 for v in want.values())

        out, kills, start, left = tmp_path / "run", 0, _chat_posts(srv), 0
        # three kills, and more until one leaves a unit in flight with its calls recorded (a kill can land just
        # after a unit's line is written, before the next unit's first call completes: nothing in flight then)
        while (kills < 3 or not left) and kills < 20:
            p = subprocess.Popen(_cmd(srv.url, out), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            target = _chat_posts(srv) + rng.randint(4, 17)   # a random point: after that many more calls, with a
            while p.poll() is None and not (_chat_posts(srv) >= target and _mid_trajectory(out)):
                time.sleep(0.01)  # polls progress; no assertion depends on how long it takes
            if p.poll() is not None:
                break
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=HANG_GUARD_S)
            kills += 1
            left = check_run(out).in_flight  # units a kill interrupted, their completed calls recorded
        assert kills >= 3 and left >= 1, f"the run finished before three kills left a unit in flight ({kills} kills)"
        r = subprocess.run(_cmd(srv.url, out), cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "inside their trajectory" in r.stderr and "replayed" in r.stderr
        paid = _chat_posts(srv) - start
    got = _lines(out)
    assert sorted(got) == sorted(want)  # no unit lost or doubled
    keys = [(ln["sample_id"], ln["trial"]) for ln in map(json.loads, (out / "results.jsonl").read_bytes().splitlines())]
    assert len(keys) == len(set(keys)) == 6
    for k, (line, tok) in got.items():  # the finished lines and their tokens equal the uninterrupted run's
        assert line == want[k][0], k
        for col in ("id", "logprob", "think", "top_ids", "top_logprobs"):
            assert np.array_equal(tok[col], want[k][1][col], equal_nan=True), (k, col)
    calls = sum(v[0]["n_calls"] for v in got.values())
    # every call made once, but those in flight at a kill (at most --concurrency 2 a kill)
    assert calls <= paid <= calls + 2 * kills, (calls, paid, kills)
    assert not (out / "inflight").exists()  # a written line's journal goes
    # check counts as in flight only units still to run: a journal a kill left beside a written line is not one
    (out / "inflight" / token_key(keys[0][0], keys[0][1])).mkdir(parents=True)
    (out / "inflight" / token_key("not-written", 0)).mkdir()
    assert check_run(out).in_flight == 1


async def test_the_journal_replays_what_it_recorded_and_nothing_that_differs(tmp_path):
    """In process: recorded calls come back as the backend gave them (text, tokens, usage); a request that differs
    from the recorded one ends the replay and drops the rest; prune keeps only units still to run."""
    from agent.backends.base import SamplingParams
    from agent.backends.scripted import ScriptedBackend
    from agent.run.journal import Journal, JournaledBackend, prune

    inner = ScriptedBackend(["<think>\nalpha\n</think>\n\none", "<think>\nbeta\n</think>\n\ntwo", "three", "four"], model="m")
    sp = SamplingParams(seed=3)
    msgs = [[{"role": "user", "content": f"q{i}"}] for i in range(3)]
    j = JournaledBackend(inner, Journal(tmp_path, "s1", 0))
    first = [await j.generate(m, sp) for m in msgs]
    assert j.replayed == 0 and len(Journal(tmp_path, "s1", 0).entries) == 3
    again = JournaledBackend(ScriptedBackend(["other"] * 3, model="m"), Journal(tmp_path, "s1", 0))
    got = [await again.generate(m, sp) for m in msgs[:2]]
    assert again.replayed == 2
    for a, b in zip(first, got):
        assert (a.text, a.reasoning, a.finish_reason, a.model, a.usage) == (b.text, b.reasoning, b.finish_reason, b.model,
                                                                            b.usage)
        # float32, as the run records them (the sidecar's precision)
        assert np.array_equal(a.top_logprob_matrix().astype(np.float32), b.top_logprob_matrix().astype(np.float32),
                              equal_nan=True)
        assert a.think_mask().tolist() == b.think_mask().tolist() and [t.id for t in a.tokens] == [t.id for t in b.tokens]
    changed = await again.generate([{"role": "user", "content": "something else"}], sp)  # differs: asked live
    assert changed.text == "other" and again.replayed == 2
    assert len(Journal(tmp_path, "s1", 0).entries) == 3  # calls 1-2 kept, the third is the new one
    JournaledBackend(inner, Journal(tmp_path, "s2", 1))  # nothing recorded: no directory
    await JournaledBackend(inner, Journal(tmp_path, "s3", 0)).generate(msgs[0], sp)
    assert prune(tmp_path, {("s1", 0)}) == 1
    assert sorted(p.name for p in (tmp_path / "inflight").iterdir()) == [Journal(tmp_path, "s1", 0).dir.name]
    Journal(tmp_path, "s1", 0).clear()
    assert not (tmp_path / "inflight").exists()


async def test_a_reply_holding_a_key_in_use_is_replayed_and_the_calls_after_it_too(tmp_path, monkeypatch):
    """The journal stores replies redacted: the request that follows a replayed reply carries ``[REDACTED]`` where
    the original carried the key, and is still recognised as the recorded one (compared on the redacted form), so
    a resume pays for no call twice (issue 55, item 7)."""
    from agent.backends.base import SamplingParams
    from agent.backends.scripted import ScriptedBackend
    from agent.redact import register_key_var
    from agent.run.journal import Journal, JournaledBackend

    monkeypatch.setenv("MMCF_TEST_API_KEY", "zq-journal-5f4e3d2c1b")
    register_key_var("MMCF_TEST_API_KEY")
    sp = SamplingParams(seed=3)
    replies = ["<think>\nhm\n</think>\n\nthe key is zq-journal-5f4e3d2c1b", "second", "third"]

    async def unit(backend):
        msgs = [{"role": "user", "content": "q"}]
        for _ in range(3):
            out = await backend.generate(msgs, sp)
            msgs = [*msgs, {"role": "assistant", "content": out.text}, {"role": "user", "content": "go on"}]
        return msgs

    await unit(JournaledBackend(ScriptedBackend(list(replies), model="m"), Journal(tmp_path, "s1", 0)))
    assert b"zq-journal-5f4e3d2c1b" not in b"".join(p.read_bytes() for p in (tmp_path / "inflight").rglob("*.json"))
    again = JournaledBackend(ScriptedBackend(["asked again"] * 3, model="m"), Journal(tmp_path, "s1", 0))
    await unit(again)
    assert again.replayed == 3  # every call answered from the journal: none paid twice


async def test_a_refused_call_takes_no_place_in_the_journal(tmp_path):
    """``--protocol release`` goes on after a request the server refuses (agent/methods/mmcontextfold_release.py):
    the refusal is not journaled, so a resume sends it again (refused again) and replays the calls after it."""
    from agent.backends.base import RequestRefused, SamplingParams
    from agent.backends.scripted import ScriptedBackend
    from agent.run.journal import Journal, JournaledBackend

    class Refusing(ScriptedBackend):
        async def generate(self, messages, sampling=None):
            if messages[0]["content"] == "bad":
                raise RequestRefused("chat completion: http://x answered HTTP 400: cannot identify image file")
            return await super().generate(messages, sampling)

    sp = SamplingParams(seed=1)
    asks = [[{"role": "user", "content": c}] for c in ("q0", "bad", "q1")]

    async def run(backend):
        got = []
        for m in asks:
            try:
                got.append((await backend.generate(m, sp)).text)
            except RequestRefused:
                got.append(None)
        return got

    first = await run(JournaledBackend(Refusing(["one", "two"], model="m"), Journal(tmp_path, "s", 0)))
    assert first == ["one", None, "two"] and len(Journal(tmp_path, "s", 0).entries) == 2
    again = JournaledBackend(Refusing(["live"] * 2, model="m"), Journal(tmp_path, "s", 0))
    assert await run(again) == ["one", None, "two"] and again.replayed == 2
