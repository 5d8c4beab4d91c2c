"""The one rule for which trajectories enter the probes' analyses (paper B.1, Table 10)."""
from __future__ import annotations

from agent.record import LineSummary
from analysis.estimators.selection import REASONS, exclusion_reason, select_trajectories
from tests import records


def line(sid, status="ok", calls=(("ok", 1),), model="m", bench="b") -> LineSummary:
    """A line's summary whose calls are ``(ok | bad, query images in context)``: bad is a call without a valid
    action (the summary's ``malformed``)."""
    summary = [records.call(i, action="malformed" if kind == "bad" else "tool_call", n_query_images=nq)
               for i, (kind, nq) in enumerate(calls, 1)]
    rec = records.line(sid, status=status, model=model, benchmark=bench, calls=summary, n_calls=len(summary))
    return LineSummary.model_validate({k: v for k, v in rec.items() if k not in ("events", "messages")})


def test_each_reason_in_order():
    assert exclusion_reason(line("a")) is None
    assert exclusion_reason(line("a", status="no_answer")) is None  # a valid trajectory that did not answer
    assert exclusion_reason(line("a", status="error", calls=(("bad", 0),))) == "harness_error"
    assert exclusion_reason(line("a", status="timeout")) == "harness_error"
    assert exclusion_reason(line("a", calls=())) == "no_calls"
    assert exclusion_reason(line("a", calls=(("bad", 1), ("ok", 1)))) == "first_call_unparsed"
    assert exclusion_reason(line("a", calls=(("bad", 1),)), include_unparsed=True) is None
    assert exclusion_reason(line("a", calls=(("ok", 0), ("bad", 0)))) == "no_image_call"
    # a later unparsed call does not exclude: only an immediate parsing failure does
    assert exclusion_reason(line("a", calls=(("ok", 1), ("bad", 1)))) is None


def test_table10_layout_counts_per_model_and_benchmark():
    lines = [line("1"), line("2", status="error"), line("3", calls=(("bad", 1),)), line("4", bench="c"),
             line("5", model="n", calls=(("ok", 0),))]
    kept, t = select_trajectories(lines)
    assert [ln.sample_id for ln in kept] == ["1", "4"]
    assert list(t.columns) == ["model", "benchmark", "total", *REASONS, "kept"]
    r = t.set_index(["model", "benchmark"])
    assert r.loc[("m", "b"), "total"] == 3 and r.loc[("m", "b"), "harness_error"] == 1
    assert r.loc[("m", "b"), "first_call_unparsed"] == 1 and r.loc[("m", "b"), "kept"] == 1
    assert r.loc[("m", "All"), "total"] == 4 and r.loc[("m", "All"), "kept"] == 2
    assert r.loc[("n", "All"), "no_image_call"] == 1 and r.loc[("n", "All"), "kept"] == 0
