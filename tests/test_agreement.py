"""Two judges of one run (agent.judge --judge-name, agent.judge agree): kept apart, compared by Cohen's kappa, the
confusion matrix and the accuracy difference with a paired bootstrap CI; what cannot be compared is refused."""
from __future__ import annotations

import json
import re

import pytest

from agent.backends.scripted import ScriptedBackend
from agent.judge import judge_run
from agent.judge import main as judge_main
from agent.judge.agreement import agreement, cohen_kappa
from agent.rundir import RunError


def test_cohen_kappa_by_hand():
    C, I = "CORRECT", "INCORRECT"
    # p_o = 3/4; p_e = 1/2 * 1/4 + 1/2 * 3/4 = 1/2; kappa = (3/4 - 1/2) / (1 - 1/2) = 1/2
    assert cohen_kappa([C, C, I, I], [C, I, I, I]) == pytest.approx(0.5)
    assert cohen_kappa([C, I], [C, I]) == pytest.approx(1.0)
    assert cohen_kappa([C, C], [C, C]) is None  # chance agreement 1: undefined, not 1


def _copy_exact(messages):
    """A judge that decides as exact match would: CORRECT when the gold answer is the response."""
    text = messages[-1]["content"] if isinstance(messages[-1]["content"], str) else str(messages[-1]["content"])
    gold = re.search(r"Gold target: (.*)", text).group(1).strip()
    resp = re.search(r"Predicted answer: (.*)", text).group(1).strip()
    return "Extracted: x\nGrade: " + ("A" if gold.lower() == resp.lower() else "B")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A direct-inference run answering "Marsel" to every question (right for one demo sample of six) over two
    trials, graded by exact match."""
    import asyncio

    from agent.run import RunConfig
    from agent.run import run as run_async

    run = tmp_path_factory.mktemp("agree") / "run"
    asyncio.run(run_async(RunConfig(method="direct", out=str(run), limit=6, trials=2, seed=1, progress=False), [],
                          backends=[ScriptedBackend(["<answer>Marsel</answer>"] * 50)]))
    assert judge_main([str(run), "--judge", "exact", "--no-progress"]) == 0
    return run


async def test_a_second_judge_is_kept_apart_and_compared(graded, capsys):

    await judge_run(graded, judge="llm", backend=ScriptedBackend([_copy_exact] * 50, model="judge-twin"),
                    name="twin", progress=False)
    await judge_run(graded, judge="llm", backend=ScriptedBackend(["Extracted: x\nGrade: A"] * 50, model="yes-man"),
                    name="yesman", progress=False)
    assert (graded / "judge-twin.jsonl").exists() and (graded / "judge-yesman.jsonl").exists()
    exact = [json.loads(x) for x in (graded / "judge-exact.jsonl").read_text().splitlines()]
    n_correct = sum(r["grade"] == "CORRECT" for r in exact)
    assert 0 < n_correct < len(exact) == 12
    # the same decisions: kappa 1, no difference, a CI of [0, 0]
    twin = agreement(graded, "exact", "twin")
    assert twin["all"]["kappa"] == pytest.approx(1.0) and twin["all"]["accuracy_diff"] == 0.0
    assert twin["all"]["diff_ci95"] == [0.0, 0.0]
    # a judge that calls everything correct agrees no better than chance: kappa 0
    rep = agreement(graded, "exact", "yesman")
    a = rep["all"]
    assert a["units"] == 12 and a["kappa"] == pytest.approx(0.0, abs=1e-12)
    assert a["confusion"]["CORRECT"]["CORRECT"] == n_correct
    assert a["confusion"]["INCORRECT"]["CORRECT"] + a["confusion"]["NOT_ATTEMPTED"]["CORRECT"] == 12 - n_correct
    assert a["accuracy_diff"] == pytest.approx(100.0 * n_correct / 12 - 100.0)
    lo, hi = a["diff_ci95"]
    assert lo <= a["accuracy_diff"] <= hi < 0
    assert sum(b["units"] for b in rep["benchmarks"].values()) == 12
    # the command writes the report beside the run
    assert judge_main(["agree", str(graded), "--judges", "exact", "yesman"]) == 0
    out = capsys.readouterr().out
    assert "Cohen's kappa" in out and "| All | 12 | 0.000 |" in out
    assert json.loads((graded / "judge-agreement-exact-vs-yesman.json").read_text())["all"]["units"] == 12
    # more than two judges: name them
    assert judge_main(["agree", str(graded)]) == 2
    assert "name two with --judges" in capsys.readouterr().err


async def test_what_cannot_be_compared_is_refused(graded, tmp_path):
    import shutil

    run = tmp_path / "r"
    shutil.copytree(graded, run)
    await judge_run(run, judge="llm", backend=ScriptedBackend(["Grade: B"] * 50, model="nay"), name="nay",
                    progress=False)
    lines = (run / "judge-nay.jsonl").read_text().splitlines()
    (run / "judge-nay.jsonl").write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(RunError, match="graded different units .*1 graded by exact only"):
        agreement(run, "exact", "nay")
    rep = agreement(run, "exact", "nay", common_only=True)
    assert rep["all"]["units"] == 11 and rep["left_out"] == {"exact": 1, "nay": 0}
    # a grade edited since it was written (its seal no longer matches): refused, naming the file and line
    recs = [json.loads(x) for x in lines[1:]]
    recs[0]["answer_key"] = "0" * 16
    (run / "judge-nay.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    with pytest.raises(RunError, match=r"judge-nay.jsonl: line\(s\) 1, 2, .* changed since written"):
        agreement(run, "exact", "nay", common_only=True)
    # the same judge under two names is nothing to compare
    shutil.copy(run / "judge-exact.jsonl", run / "judge-exact2.jsonl")
    with pytest.raises(RunError, match="same judge"):
        agreement(run, "exact", "exact2")
    # a judge file's own refusal: the old behaviour names the way to keep both
    (run / "judge-nay.jsonl").write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(RunError, match="--judge-name"):
        await judge_run(run, judge="llm", backend=ScriptedBackend(["Grade: A"] * 50, model="other"), name="nay",
                        progress=False)
