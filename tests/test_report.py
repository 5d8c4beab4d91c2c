"""Every figure and table from a small fixture: a scripted ReAct run, its probes, judged runs."""
from __future__ import annotations

import json
import re

from agent.backends.scripted import ScriptedBackend
from agent.judge import Grader, judge_run
from agent.run import RunConfig, run
from analysis.report import main as report_main
from probes.entropy import probe_run
from probes.grounding import annotate_run
from probes.removal import removal_probe
from tests.test_probe_removal import sees_image_policy


def annotator(messages):
    text = messages[0]["content"][-1]["text"]
    n = len(re.findall(r"^### Step \d+", text, flags=re.M))
    key = "image_info_used" if "image_info_used" in text.split("## Output Format")[-1] else None
    arr = [{"step": i, "image_needed": i == 1, **({key: i <= 2} if key else {}), "reason": "r"} for i in range(1, n + 1)]
    return "</think>" + json.dumps(arr)


async def test_report_makes_every_figure_and_table(tmp_path):
    cfg = dict(limit=4, t_max=8, progress=False, trials=2)
    react = tmp_path / "react"
    await run(RunConfig(method="react", out=str(react), **cfg), [], backends=[ScriptedBackend([sees_image_policy] * 500)])
    await run(RunConfig(method="react", out=str(tmp_path / "rm2"), remove_images_from_step=2, **cfg), [],
              backends=[ScriptedBackend([sees_image_policy] * 500)])
    await run(RunConfig(method="direct", out=str(tmp_path / "direct"), **cfg), [],
              backends=[ScriptedBackend(["<think>k</think><answer>1911</answer>"] * 50)])
    unjudged = tmp_path / "unjudged"
    await run(RunConfig(method="direct", out=str(unjudged), **cfg), [],
              backends=[ScriptedBackend(["<answer>x</answer>"] * 50)])
    for rd in ("react", "rm2", "direct"):
        await judge_run(tmp_path / rd, judge="exact", progress=False)
    b = ScriptedBackend([sees_image_policy] * 2000)
    await probe_run(react, backend=b, progress=False)
    await removal_probe(react, [1, 2, 3, 4, 5], backend=b, grader=Grader("exact"), progress=False)
    await annotate_run(react, backend=ScriptedBackend([annotator] * 100), progress=False)
    out = tmp_path / "figs"
    rc = report_main(["--react", str(react), "--runs", str(tmp_path / "direct"), str(react), str(unjudged),
                      "--removal-runs", str(react), str(tmp_path / "rm2"), "--out", str(out)])
    assert rc == 0
    for f in ("fig1_tool_calls", "fig2a_grounding", "fig2b_entropy", "fig2c_removal", "fig2", "fig4_context"):
        assert (out / f"{f}.png").stat().st_size > 5000 and (out / f"{f}.pdf").exists(), f
    for t in ("table1_accuracy", "table3_removal", "table4_cost"):
        assert (out / f"{t}.md").exists() and (out / f"{t}.csv").exists(), t
    t1 = (out / "table1_accuracy.md").read_text()
    assert "exact-match" in t1 and "react" in t1 and "direct" in t1 and "demo (n=4)" in t1
    assert "100.0 ± 0.0" in t1  # ReAct sees the image when answering in this fixture
    t3 = (out / "table3_removal.md").read_text()
    assert "react-removal@2" in t3 and "0.0 ± 0.0" in t3
    t4 = (out / "table4_cost.csv").read_text()
    assert "working context" in t4 and "search calls" in t4
    rep = json.loads((out / "report.json").read_text())
    assert any("unjudged" in m and "agent.judge" in m for m in rep["missing"])


def test_reproduce_figure2_demo_runs_the_chain(tmp_path, tiny_model_dir):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    out = tmp_path / "fig2"
    env = {**os.environ, "PYTHON": sys.executable, "MMCF_TINY_MODEL_DIR": str(tiny_model_dir)}
    r = subprocess.run(["bash", "scripts/reproduce_figure2.sh", "--demo", "--limit", "2", "--steps", "1..2",
                        "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RANDOMLY INITIALISED" in r.stdout
    figs = out / "figures"
    for f in ("fig1_tool_calls", "fig2", "fig2b_entropy", "fig2c_removal", "fig4_context"):
        assert (figs / f"{f}.png").exists(), f
    assert (out / "probes" / "grounding" / "summary.json").exists()  # ran; the random model's labels are invalid
    assert (out / "judge-exact.jsonl").exists() and (figs / "table1_accuracy.md").exists()


def _by_question(messages):
    q = json.dumps(messages)
    return "<answer>" + ("1911" if "q1?" in q else "Lyon" if "q2?" in q else "1998") + "</answer>"


async def test_table5_by_number_of_query_images(tmp_path):
    import shutil

    from agent.tools.demo_world import ensure_demo_world
    from analysis.tables import table5

    demo = ensure_demo_world() / "demo"
    bench = tmp_path / "mmsearch_plus"
    shutil.copytree(demo / "imgs", bench / "imgs")
    rows = [{"id": "a", "query": "q1?", "query_images": ["kestrel_logo.png"], "answer": "1911"},
            {"id": "b", "query": "q2?", "query_images": ["valdoria_flag.png"], "answer": "Marsel"},
            {"id": "c", "query": "q3?", "query_images": ["rivermoor_crest.png", "rivermoor_stadium.png"], "answer": "1998"}]
    (bench / "data_unified.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    await run(RunConfig(method="direct", out=str(tmp_path / "run"), benchmark=str(bench), progress=False), [],
              backends=[ScriptedBackend([_by_question] * 3)])
    await judge_run(tmp_path / "run", judge="exact", progress=False)
    t = table5([tmp_path / "run"])
    assert list(t.columns) == ["method", "1 image (n=2)", "2 images (n=1)"]
    assert t.iloc[0]["1 image (n=2)"] == "50.0" and t.iloc[0]["2 images (n=1)"] == "100.0"
