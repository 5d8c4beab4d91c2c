"""agent.rundir.frames (agent/rundir/frames.py): a run and the probes' outputs as tidy DataFrames, and the export of a run
as plain Parquet that other tools open without the toolkit."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from agent.judge import main as judge_main
from agent.run import main as run_main
from agent.rundir import RunError, frames, load_run
from agent.rundir.cli import main as rundir_main
from agent.rundir.probe_outputs import write_outputs


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    out = tmp_path_factory.mktemp("frames") / "run"
    assert run_main(["--method", "react", "--backend", "scripted", "--benchmark", "demo", "--trials", "2",
                     "--out", str(out), "--no-progress"]) == 0
    plain = tmp_path_factory.mktemp("frames") / "plain"
    assert run_main(["--method", "react", "--backend", "scripted", "--benchmark", "demo", "--limit", "2",
                     "--out", str(plain), "--no-progress"]) == 0
    assert judge_main([str(out), "--judge", "exact", "--no-progress"]) == 0
    return out, plain


def test_one_row_per_line_per_call_and_per_stored_token(judged):
    out, plain = judged
    run = load_run(out)
    res, st, tok = frames.results(out), frames.steps(out), frames.tokens(out)
    assert len(res) == len(run.index) == 12 and not res.duplicated(["sample_id", "trial"]).any()
    assert len(st) == sum(len(ln.calls) for ln in run.index) == res["n_calls"].sum()
    # a path reads only the steps' values of each summary; a loaded run gives the same frame from its full summaries
    pd.testing.assert_frame_equal(st, frames.steps(run))
    assert st.prompt_tokens.dtype.kind == "i" and st.state.notna().all() and set(st.action) >= {"answer"}
    stored = sum(len(run.tokens(ln, ["call"])["call"]) for ln in run.index)
    assert len(tok) == stored and stored > 0
    # the result's token counts are its calls' sums; the tokens' think flags agree with the steps'
    one = res.iloc[0]
    mine = st[(st.sample_id == one.sample_id) & (st.trial == one.trial)]
    assert one.prompt_tokens == mine.prompt_tokens.sum() and one.total_tokens == one.prompt_tokens + one.completion_tokens
    assert tok.groupby(["sample_id", "trial", "call"]).think.sum().sum() == st.think_tokens.sum()
    assert len(tok.top_logprobs.iloc[0]) <= 20 and tok.id.dtype.kind == "i"  # as stored: up to k alternatives
    assert list(frames.tokens(out, ["logprob"]).columns) == ["sample_id", "trial", "logprob"]
    # graded: correct is the exact judge's verdict; unjudged: NA, and grades() says how to judge
    g = frames.grades(out)
    assert len(g) == 12 and g["judge"].iloc[0].startswith("exact")
    merged = res.merge(g[["sample_id", "trial", "grade"]], on=["sample_id", "trial"])
    assert (merged.correct == (merged.grade == "CORRECT")).all()
    assert frames.results(plain)["correct"].isna().all()
    with pytest.raises(RunError, match="agent.judge"):
        frames.grades(plain)


def test_probe_outputs_read_from_the_run_or_the_probe_dir(tmp_path, judged):
    out, _ = judged
    with pytest.raises(frames.NoProbeOutput, match="probes.entropy"):
        frames.entropy(out)
    d = tmp_path / "e"
    (d / "probes" / "entropy-teacher-forced").mkdir(parents=True)
    (d / "header.json").write_text("{}")
    want = pd.DataFrame({"sample_id": ["a", "a"], "trial": [0, 0], "step": [1, 2], "dH": [-0.5, 0.1]})
    want.to_parquet(d / "probes" / "entropy-teacher-forced" / "steps.parquet")
    with pytest.raises(RunError, match="not sealed by its probe"):  # a table no probe sealed is never read
        frames.entropy(d)
    write_outputs(d / "probes" / "entropy-teacher-forced", {"steps.parquet": want})  # as the probe writes it
    got = frames.entropy(d)
    assert got.attrs["mode"] == "teacher-forced" and got.equals(want)
    assert frames.entropy(d / "probes" / "entropy-teacher-forced", mode="teacher-forced").equals(want)
    (d / "probes" / "removal").mkdir()
    write_outputs(d / "probes" / "removal", {"outcomes.csv": pd.DataFrame({"sample_id": ["a"], "trial": [0], "k": [1]})})
    assert frames.removal(d).k.tolist() == [1]
    (d / "probes" / "grounding").mkdir()
    (d / "probes" / "grounding" / "steps.parquet").write_bytes(b"not parquet")
    write_outputs(d / "probes" / "grounding", {}, files=[d / "probes" / "grounding" / "steps.parquet"])
    with pytest.raises(RunError, match="unreadable") as e:  # a damaged output is an error, not a missing panel
        frames.grounding(d)
    assert not isinstance(e.value, frames.NoProbeOutput)


def test_export_opens_in_pyarrow_pandas_duckdb_polars_and_datasets_without_the_toolkit(tmp_path, judged, capsys,
                                                                                       monkeypatch):
    import datasets
    import duckdb
    import polars as pl

    out, _ = judged
    exp = tmp_path / "exp"
    assert rundir_main(["export", str(out), str(exp)]) == 0
    assert "tokens" in capsys.readouterr().out
    run = load_run(out)
    res = pd.read_parquet(exp / "results.parquet")
    assert len(res) == 12 and set(res.correct) <= {True, False}
    tok = pq.read_table(exp / "tokens.parquet")
    assert tok.num_rows == len(frames.tokens(out))
    # the true values: a token's top list and logprob as the run recorded them
    ln = run.index[0]
    arr = run.tokens(ln)
    first = tok.filter(pq.ParquetFile(exp / "tokens.parquet").read(columns=["sample_id"]).column(0).to_numpy(
        zero_copy_only=False) == ln.sample_id).slice(0, 1).to_pylist()[0]
    assert first["top_ids"] == [i for i in arr["top_ids"][0].tolist() if i >= 0] and len(first["top_ids"]) > 1
    assert np.float32(first["logprob"]) == arr["logprob"][0]
    con = duckdb.connect()
    n, k = con.execute(f"select count(*), max(len(top_logprobs)) from '{exp}/tokens.parquet'").fetchone()
    assert n == tok.num_rows and k == max(int((r >= 0).sum()) for r in arr["top_ids"])
    acc = con.execute(f"select avg(correct::int) from '{exp}/grades.parquet'").fetchone()[0]
    assert acc == pytest.approx(frames.grades(out).correct.mean())
    # polars: the lists as lists of their types; Hugging Face datasets: each table by the card's configuration name
    ptok = pl.read_parquet(exp / "tokens.parquet")
    assert ptok.height == tok.num_rows and ptok.schema["top_ids"] == pl.List(pl.Int32)
    assert ptok.schema["top_logprobs"] == pl.List(pl.Float32) and ptok.schema["logprob"] == pl.Float32
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, frame in (("results", res), ("tokens", ptok), ("grades", frames.grades(out))):
        ds = datasets.load_dataset(str(exp), name, cache_dir=str(tmp_path / "hf"))["train"]
        assert ds.num_rows == len(frame), name
    row = datasets.load_dataset(str(exp), "tokens", cache_dir=str(tmp_path / "hf"))["train"][0]
    want = tok.slice(0, 1).to_pylist()[0]  # the file's first row, as pyarrow reads it
    assert row["top_ids"] == want["top_ids"] and len(row["top_ids"]) > 1
    assert np.float32(row["logprob"]) == np.float32(want["logprob"]) and row["sample_id"] == want["sample_id"]
    card = (exp / "README.md").read_text()
    assert card.startswith("---\nconfigs:\n- config_name: results") and '"protocol": "paper"' in card
    assert json.dumps("scripted-demo") in card
    # never over an existing directory; a missing run is named
    assert rundir_main(["export", str(out), str(exp)]) == 2 and "exists" in capsys.readouterr().err
    assert rundir_main(["export", str(tmp_path / "nope"), str(tmp_path / "x")]) == 2
    assert "not a run directory" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_a_run_wide_token_aggregate_scans_without_holding_and_agrees_with_sql_and_the_held_frame(tmp_path):
    """``think_entropy_by_step`` (a lazy scan), the duckdb recipe of docs/frames.md over ``token_files`` and the same
    numbers from ``frames.tokens`` held in memory agree; ``frames.tokens`` refuses what it would hold above max_mb,
    saying how much (issue 56)."""
    import duckdb

    from agent.run import main as run_main
    from agent.rundir import RunError, frames
    from analysis.estimators.entropy import grouped_tail_entropy

    out = tmp_path / "run"
    assert run_main(["--method", "react", "--backend", "scripted", "--limit", "4", "--out", str(out),
                     "--no-progress"]) == 0
    scan = frames.think_entropy_by_step(out, batch_rows=50)  # many batches even on a small run
    tok = frames.tokens(out, ["call", "think", "top_logprobs"], filters=[("think", "==", True)])
    k = max(map(len, tok.top_logprobs))
    m = np.full((len(tok), k), np.nan, np.float32)
    for i, x in enumerate(tok.top_logprobs):
        m[i, :len(x)] = x
    held = pd.Series(grouped_tail_entropy(m), index=tok.index).groupby(tok.call).mean()
    assert scan.step.tolist() == held.index.tolist() and np.allclose(scan.mean_H, held.values, atol=1e-5)
    assert scan.tokens.sum() == len(tok)
    files = frames.token_files(out)
    sql = duckdb.sql("""
      select call as step, avg(h_top - case when rest > 0 then rest * ln(rest) else 0 end) as mean_H, count(*) as n
      from (select call, list_sum(list_transform(top_logprobs, lambda v: -exp(v) * v)) as h_top,
                   greatest(0, 1 - list_sum(list_transform(top_logprobs, lambda v: exp(v)))) as rest
            from read_parquet($paths) where think)
      group by call order by call""", params={"paths": list(files.path)}).df()
    assert np.allclose(sql.mean_H, scan.mean_H, atol=1e-4) and sql.n.tolist() == scan.tokens.tolist()
    with pytest.raises(RunError, match=r"frames.tokens would hold ~.* MB .* over max_mb=0.001"):
        frames.tokens(out, max_mb=0.001)
