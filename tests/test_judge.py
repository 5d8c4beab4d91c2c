"""The judge: reply parsing on real-looking outputs, NOT_ATTEMPTED shortcuts, resumability, Table 1 numbers."""
from __future__ import annotations

import asyncio
import json
import re

import pytest

from agent.backends.scripted import ScriptedBackend
from agent.judge import accuracy_table, exact_grade, judge_run, parse_grade, read_grades
from agent.judge import main as judge_main
from agent.prompts import JUDGE
from agent.record import Grade
from agent.run import RunConfig, run
from agent.rundir.grades import latest_grades
from serving.fakes.sglang_server import FakeSGLang


@pytest.mark.parametrize("reply,grade,extracted", [
    ("Extracted: 1911\nGrade: A", "CORRECT", "1911"),
    ("Extracted: Lyon\nGrade: B", "INCORRECT", "Lyon"),
    ("Extracted: I don't know\nGrade: C", "NOT_ATTEMPTED", "I don't know"),
    ("**Extracted:** Marsel\n**Grade:** A", "CORRECT", "Marsel"),
    ("Extracted: 87 m\nGrade: CORRECT", "CORRECT", "87 m"),
    ("Extracted: 1997\nGrade: INCORRECT", "INCORRECT", "1997"),   # INCORRECT contains CORRECT: must not match it
    ("Extracted: -\nGrade: NOT_ATTEMPTED", "NOT_ATTEMPTED", "-"),
    ("Extracted: x\nGrade: B (INCORRECT)", "INCORRECT", "x"),
    ("Extracted: x\nGrade: A.", "CORRECT", "x"),
    ("<think>The gold is 1911... Grade: B?</think>\nExtracted: 1911\nGrade: A", "CORRECT", "1911"),
    ("Extracted: x\nGrade: A (INCORRECT)", "UNPARSED", "x"),          # contradictory
    ("Extracted: x\nGrade: A\nGrade: B", "UNPARSED", "x"),            # two grades
    ("Extracted: x\nGrade: D", "UNPARSED", "x"),
    ("The prediction matches the gold target.", "UNPARSED", None),   # no grade at all: never a silent INCORRECT
    ("", "UNPARSED", None),
    ("B", "INCORRECT", None),
])
def test_parse_grade(reply, grade, extracted):
    assert parse_grade(reply) == (grade, extracted)


def test_exact_grade():
    assert exact_grade("It was founded in 1911.", "1911") == "CORRECT"
    assert exact_grade("19115", "1911") == "INCORRECT"
    assert exact_grade("Ilse Morrow, at the Aldgate Museum of Art", "Ilse Morrow; Aldgate Museum of Art") == "CORRECT"
    assert exact_grade("Ilse Morrow", "Ilse Morrow; Aldgate Museum of Art") == "INCORRECT"
    assert exact_grade("  ", "x") == "NOT_ATTEMPTED"
    assert exact_grade("anything", "") == "UNPARSED"
    assert exact_grade("Zürich", "zurich") == "CORRECT"


def answer_policy(messages):
    q = json.dumps(messages)
    if "observatory" in q:
        return "<think>k</think><answer>It was founded in 1911.</answer>"   # correct
    if "flag" in q:
        return "<think>k</think><answer>Lyon</answer>"                      # wrong
    if "painted" in q:
        return "<think>k</think><answer>garble</answer>"                    # the judge will garble its reply
    if "publisher" in q:
        return "<think>k</think>no answer tag at all"                      # malformed until forced -> no_answer
    return "<think>k</think><answer>1998 and 87</answer>"


def judge_reply(req):
    prompt = req["messages"][0]["content"]
    gold = re.search(r"Gold target: (.*)", prompt).group(1)
    pred = re.search(r"Predicted answer: (.*)", prompt).group(1)
    if pred == "garble":
        return "</think>I am not sure how to grade this."
    return f"</think>Extracted: {pred}\nGrade: {'A' if gold in pred else 'B'}"


async def _make_run(tmp_path, trials=2):
    await run(RunConfig(method="react", out=str(tmp_path / "run"), trials=trials, t_max=3, progress=False),
              [], backends=[ScriptedBackend([answer_policy] * 200)])
    return tmp_path / "run"


async def test_llm_judge_against_an_openai_compatible_server(tmp_path):
    rd = await _make_run(tmp_path)
    with FakeSGLang(reply=judge_reply) as srv:
        s = await judge_run(rd, endpoint=srv.url, model="judge", api_key_env=None, server="sglang", progress=False)
        bodies = list(srv.bodies)
        # resumable: a second run asks nothing
        s2 = await judge_run(rd, endpoint=srv.url, model="judge", api_key_env=None, server="sglang", progress=False)
        assert len(srv.bodies) == len(bodies)
    assert s2["overall"] == s["overall"]
    # 6 samples x 2 trials; the no_answer trajectories (publisher) are never sent to the judge
    assert len(bodies) == 10
    assert all(b["temperature"] == 0.0 and "logprobs" not in b for b in bodies)
    sent = bodies[0]["messages"][0]["content"]
    assert sent.startswith(JUDGE.split("\n")[0]) and "Reply in exactly this format" in sent
    recs = [json.loads(x) for x in (rd / "judge-llm.jsonl").read_text().splitlines()]
    by = {(r["sample_id"], r["trial"]): r for r in recs}
    assert by[("demo_1", 0)]["grade"] == "CORRECT" and by[("demo_2", 0)]["grade"] == "INCORRECT"
    assert by[("demo_3", 1)]["grade"] == "UNPARSED" and by[("demo_5", 0)]["grade"] == "NOT_ATTEMPTED"
    assert by[("demo_5", 0)]["reason"].startswith("trajectory status no_answer")
    assert by[("demo_4", 0)]["grade"] == "CORRECT" and by[("demo_6", 0)]["grade"] == "CORRECT"
    # 3 of 6 correct in each trial
    assert s["overall"]["mean"] == pytest.approx(50.0) and s["overall"]["std"] is None and s["unparsed"] == 2
    assert "identical" in s["std_refused"]  # a scripted server: both trials are one trial, no std
    md = (rd / "table1-llm.md").read_text()
    assert "demo (n=6)" in md and "50.0 ± —" in md and "2 UNPARSED" in md and "No std: the trials" in md
    assert (rd / "table1-llm.csv").exists() and (rd / "judge-llm-summary.json").exists()
    # a self-hosted judge: the facts of the server that graded (SGLang's /server_info)
    assert json.loads((rd / "judge-llm-summary.json").read_text())["judge_server"]["version"] == "0.5.23"


async def test_unparsed_grades_are_said_and_asked_again_with_retry_unparsed(tmp_path, capsys):
    """Issue 68: an UNPARSED grade is named in the command's output with the flag that asks again; a plain rerun
    asks nothing, ``--retry-unparsed`` asks the judge again for those answers only and the new grade counts."""
    rd = await _make_run(tmp_path)
    replies = {"garble": "</think>I am not sure how to grade this."}

    def judge(req):  # garbles until told otherwise
        pred = re.search(r"Predicted answer: (.*)", req["messages"][0]["content"]).group(1)
        return replies.get(pred) or judge_reply(req)

    with FakeSGLang(reply=judge) as srv:
        args = [str(rd), "--judge-endpoint", srv.url, "--judge-model", "judge", "--no-progress"]
        assert await asyncio.to_thread(judge_main, args) == 0
        err = capsys.readouterr().err
        assert "2 answer(s) graded UNPARSED" in err and f"python -m agent.judge {rd} --retry-unparsed" in err
        n = len(srv.bodies)
        assert await asyncio.to_thread(judge_main, args) == 0 and len(srv.bodies) == n  # a rerun: nothing asked
        replies["garble"] = "</think>Extracted: garble\nGrade: B"
        capsys.readouterr()
        assert await asyncio.to_thread(judge_main, [*args, "--retry-unparsed"]) == 0
        assert len(srv.bodies) == n + 2  # the two UNPARSED answers, nothing else
    err = capsys.readouterr().err
    assert "2 UNPARSED asked again" in err and "graded UNPARSED" not in err
    grades = latest_grades(rd / "judge-llm.jsonl")
    assert grades[("demo_3", 0)].grade == grades[("demo_3", 1)].grade == "INCORRECT"
    assert json.loads((rd / "judge-llm-summary.json").read_text())["unparsed"] == 0


def test_exact_judge_is_labelled(tmp_path, capsys):
    rd = asyncio.run(_make_run(tmp_path, trials=1))
    assert judge_main([str(rd), "--judge", "exact", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "exact-match (offline; NOT the paper's LLM judge)" in out
    assert "exact-match" in (rd / "table1-exact.md").read_text()
    assert all("exact-match" in json.loads(x)["judge"] for x in (rd / "judge-exact.jsonl").read_text().splitlines())


def test_default_judge_needs_its_key(tmp_path, monkeypatch, capsys):
    rd = asyncio.run(_make_run(tmp_path, trials=1))
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    assert judge_main([str(rd), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "OPENROUTER_API_KEY is not set" in err and "--judge exact" in err


def test_accuracy_mean_std_over_trials_and_weighted_avg():
    recs = []
    # benchmark a: 2 samples, b: 4 samples; 3 trials
    grades = {0: ("C", "I", "C", "C", "C", "I"), 1: ("C", "C", "I", "I", "C", "I"), 2: ("I", "I", "C", "C", "C", "C")}
    for t, gs in grades.items():
        for i, g in enumerate(gs):
            recs.append(Grade(sample_id=f"s{i}", trial=t, answer_key="k", benchmark="a" if i < 2 else "b",
                              category=None, paper_category="x", method="react", variant="", answer="a", gold="a",
                              judge="t", grade="CORRECT" if g == "C" else "INCORRECT", extracted=None, reply=None,
                              reason="t"))
    s = accuracy_table(recs, label="t")
    a = s["benchmarks"]["a"]
    assert a["n"] == 2 and a["per_trial"] == [50.0, 100.0, 0.0] and a["mean"] == pytest.approx(50.0)
    assert a["std"] == pytest.approx(50.0)  # ddof=1
    assert s["overall"]["per_trial"] == pytest.approx([400 / 6, 300 / 6, 400 / 6])  # weighted by counts


def test_the_fake_records_no_request_whose_body_never_came():
    """A client killed between its headers and its body (the kill below, on a loaded machine): the fake, like a real
    server, serves and records nothing of it (it recorded ``{}``, which the test below then read as a judge call)."""
    import socket
    from urllib.parse import urlparse

    with FakeSGLang(reply=judge_reply) as srv:
        u = urlparse(srv.url)
        with socket.create_connection((u.hostname, u.port), timeout=60) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 50\r\n\r\n")
            s.shutdown(socket.SHUT_WR)  # gone before the body
            while s.recv(4096):  # the server has handled it once it closes its side
                pass
        assert srv.bodies == []


async def test_grades_land_as_they_come_and_a_torn_grades_file_is_read_past(tmp_path):
    """A kill loses no paid grade (each is appended when it comes), and a torn line or a cut multi-byte
    character in judge-llm.jsonl never crashes a later judge run: it is skipped and its unit graded again."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    rd = await _make_run(tmp_path, trials=1)
    out = rd / "judge-llm.jsonl"
    with FakeSGLang(reply=judge_reply, latency_s=0.5) as srv:  # a slow judge: the kill lands mid-run
        p = subprocess.Popen([sys.executable, "-m", "agent.judge", str(rd), "--judge-endpoint", srv.url, "--judge-model",
                              "judge", "--concurrency", "1", "--no-progress"], cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 300  # a bound, not a timing assumption: the kill waits for progress
        while time.time() < deadline and (not out.exists() or out.read_bytes().count(b"\n") < 2) and p.poll() is None:
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        asked = len(srv.bodies)
        kept = read_grades(out)
        assert len(kept) >= 2 and asked <= sum(r.reason == "llm" for r in kept) + 1  # on disk (one in flight)
        srv.latency_s = 0
        # what a kill mid-write leaves: a cut multi-byte character at the end of a torn line
        with open(out, "ab") as f:
            f.write(b'{"sample_id": "demo_9", "answer": "caf' + "é".encode()[:1])
        s = await judge_run(rd, endpoint=srv.url, model="judge", api_key_env=None, server="sglang", progress=False)
        # only the ungraded ones were asked again. Counted by question, not by request: the killed client's
        # in-flight request may reach the server's log only after `asked` was read (a loaded machine), and it
        # is for an ungraded unit too (its grade never landed)
        from agent.rundir import load_run

        lines = load_run(rd).index
        question = {ln.question: ln.sample_id for ln in lines}
        again = [question[re.search(r"Question: (.*)", b["messages"][0]["content"]).group(1)]
                 for b in list(srv.bodies)[asked:]]
        graded = {r.sample_id for r in kept if r.reason == "llm"}
        # the units a judge call grades: finished with an answer (the others are NOT_ATTEMPTED without a call)
        judged = {ln.sample_id for ln in lines if ln.status == "ok" and ln.answer.strip()}
        ungraded = judged - graded
        assert not graded & set(again) and ungraded <= set(again)
        assert len(again) <= len(ungraded) + 1
    recs = read_grades(out)
    assert len({(r.sample_id, r.trial) for r in recs}) == 6 and s["overall"]["n"] == 6
    from analysis.tables import table1

    assert len(table1([rd])) == 1  # the tables read past the torn line too


async def test_rundir_check_covers_the_judge_files(tmp_path):
    from agent.rundir import check_run

    rd = await _make_run(tmp_path, trials=1)
    await judge_run(rd, judge="exact", progress=False)
    with open(rd / "judge-exact.jsonl", "ab") as f:
        f.write(b'{"sample_id": "demo_1", "gra' + "é".encode()[:1] + b"\n")
    rep = check_run(rd)
    assert list(rep.grades) == ["judge-exact.jsonl"] and not rep.intact
    assert any("judge-exact.jsonl: line(s) 7 torn" in x for x in rep.lines())
    rep = check_run(rd, repair=True)
    assert any(r.startswith("judge-exact.jsonl: the grades that cannot be counted moved to quarantine/") for r in rep.repaired)
    assert check_run(rd).grades == {} and len(read_grades(rd / "judge-exact.jsonl")) == 6
    assert b"gra" in (rd / "quarantine" / "judge-exact.jsonl").read_bytes()


def test_a_second_judge_on_the_same_run_is_refused_while_the_first_runs(tmp_path, capsys):
    """C2: two judges at once would pay for every grade and store it twice: the second is refused at once."""
    from agent.judge import main as judge_main
    from agent.run import main as run_main
    from agent.rundir import output_lock

    run = tmp_path / "run"
    assert run_main(["--method", "react", "--backend", "scripted", "--limit", "2", "--out", str(run),
                     "--no-progress"]) == 0
    with output_lock(run, "judge", ".judge.lock"):  # as a running judge holds it
        assert judge_main([str(run), "--judge", "exact", "--no-progress"]) != 0
        assert "another judge is writing here" in capsys.readouterr().err
        assert not (run / "judge-exact.jsonl").exists()
    assert judge_main([str(run), "--judge", "exact", "--no-progress"]) == 0


async def test_a_judge_reply_cut_by_its_limit_is_asked_again_then_reported(tmp_path):
    """U9: the judge's 2,048 tokens are ours (the release has no judge); a cut reply is never silently UNPARSED."""
    rd = await _make_run(tmp_path, trials=1)

    def rambling(req):
        prompt = req["messages"][0]["content"]
        pred = re.search(r"Predicted answer: (.*)", prompt).group(1)
        tokens = 1500 if "1911" in pred else (5000 if "1998" in pred else 0)  # demo_1: long; demo_4, demo_6: endless
        return "</think>" + " z" * tokens + f"Extracted: {pred}\nGrade: A"  # " z": one token, no grade letter

    with FakeSGLang(reply=rambling) as srv:
        await judge_run(rd, endpoint=srv.url, model="judge", api_key_env=None, server="sglang", progress=False)
        limits = [b["max_tokens"] for b in srv.bodies]
    recs = {r["sample_id"]: r for r in map(json.loads, (rd / "judge-llm.jsonl").read_text().splitlines())}
    assert recs["demo_1"]["grade"] == "CORRECT" and "asked again with 8192" in recs["demo_1"]["reason"]
    assert recs["demo_6"]["grade"] == "UNPARSED" and "cut by its token limit twice (2048, then 8192)" in recs["demo_6"]["reason"]
    assert recs["demo_2"]["reason"] == "llm"
    assert limits.count(8192) == 3 and recs["demo_1"]["usage"]["completion_tokens"] > 2048


async def test_a_cut_reply_with_a_tentative_grade_in_its_reasoning_is_no_grade(tmp_path):
    """A reply cut by the token limit with empty text and one tentative "Grade: B" in its reasoning was taken as a
    grade; a cut reply is UNPARSED, whatever it holds, and asked again with more room (issue 55, item 10)."""
    rd = await _make_run(tmp_path, trials=1)

    def cut_reasoning(req):  # every reply: reasoning that never ends, one tentative grade early on
        return "Let me see.\nGrade: B\nbut let me reconsider" + " z" * 5000  # one token a character: cut at 8192

    with FakeSGLang(reply=cut_reasoning) as srv:
        await judge_run(rd, endpoint=srv.url, model="judge", api_key_env=None, server="sglang", progress=False)
        asked = [b["max_tokens"] for b in srv.bodies]
    recs = [json.loads(x) for x in (rd / "judge-llm.jsonl").read_text().splitlines()]
    answered = [r for r in recs if r["reason"] not in ("empty answer",) and not r["reason"].startswith("trajectory")]
    assert answered and all(r["grade"] == "UNPARSED" and "cut by its token limit twice" in r["reason"]
                            for r in answered)
    assert asked.count(8192) == asked.count(2048) == len(answered)
