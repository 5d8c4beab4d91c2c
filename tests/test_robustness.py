"""Beyond the paper (issue 85): ΔH under every aggregation, a verdict per step, and which signal predicts a correct
answer. Planted data: a ΔH that flips sign under one aggregation, an agreement that predicts the grade; both found.
The demo pipeline's tables and panel: tests/test_report.py::test_reproduce_figure2_demo_draws_every_panel."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from analysis.estimators.entropy import (
    AGGREGATIONS,
    EDGE_TOKENS,
    aggregate_entropies,
    top20_exact_entropy,
    trimmed_mean,
)
from analysis.robustness import predictor_table, robustness, verdicts


def test_each_aggregation_is_what_it_says():
    from scipy.stats import entropy, trim_mean

    rng = np.random.default_rng(3)
    H = rng.random(100)
    think = np.arange(100) < 70  # the thinking, then the answer
    top = np.log(rng.dirichlet(np.ones(21), 100)[:, :20])
    got = aggregate_entropies(H, think, top)
    h = H[:70]
    assert got["mean"] == pytest.approx(h.mean()) and got["median"] == pytest.approx(np.median(h))
    assert got["trimmed"] == pytest.approx(trim_mean(h, 0.1)) and got["max"] == pytest.approx(h.max())
    assert got["first"] == pytest.approx(h[:EDGE_TOKENS].mean()) and got["last"] == pytest.approx(h[-EDGE_TOKENS:].mean())
    assert got["whole"] == pytest.approx(H.mean())
    p = np.exp(top[:70])
    assert got["top20_exact"] == pytest.approx(np.mean([entropy(r / r.sum()) for r in p]))
    assert top20_exact_entropy(top[:1])[0] == pytest.approx(entropy(np.exp(top[0]) / np.exp(top[0]).sum()))
    none = aggregate_entropies(H, np.zeros(100, bool), top)
    assert np.isnan(none["mean"]) and none["whole"] == pytest.approx(H.mean())
    for n in (1, 2, 9, 10, 11, 19, 20, 21, 137):  # the trimmed mean is scipy's at every length and cut
        x = rng.random(n)
        for cut in (0.0, 0.1, 0.25, 0.5):
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # scipy's mean of nothing (n even, cut 0.5)
                want = trim_mean(x, cut)
            np.testing.assert_allclose(trimmed_mean(x, cut), want, rtol=1e-12, atol=1e-15, equal_nan=True)


def _steps(flip_step: int | None):
    """Three steps of 40 trajectories: ΔH clearly below 0 at step 1, above at 2 and 3 under the paper's mean; at
    ``flip_step`` the median (only) says the opposite."""
    rng = np.random.default_rng(0)
    rows = []
    for step, mu in ((1, -0.3), (2, 0.3), (3, 0.2)):
        for i in range(40):
            d = {a: mu + rng.normal(0, 0.05) for a in AGGREGATIONS}
            if step == flip_step:
                d["median"] = -mu + rng.normal(0, 0.05)
            rows.append({"sample_id": f"s{i}", "trial": 0, "step": step, "paper_category": ["A", "B"][i % 2],
                         "dH": d["mean"], **{f"dH_agg_{a}": v for a, v in d.items()}})
    return pd.DataFrame(rows)


def test_a_sign_that_flips_under_one_aggregation_is_found_and_named():
    ver = verdicts(robustness(_steps(flip_step=2))).set_index("step")
    assert ver.loc[1, "holds"] and ver.loc[3, "holds"]
    assert not ver.loc[2, "holds"] and ver.loc[2, "sign_flips"] == "median"
    assert "the sign flips under median" in ver.loc[2, "verdict"] and "holds under all" in ver.loc[1, "verdict"]
    rob = robustness(_steps(flip_step=None))
    assert verdicts(rob)["holds"].all() and set(rob["category"]) == {"All", "A", "B"}
    row = rob[(rob.step == 1) & (rob.category == "All") & (rob.aggregation == "mean")].iloc[0]
    assert row.n == 40 and row.ci_low < row["mean"] < row.ci_high < 0 and row.significant


def test_a_probe_without_aggregations_is_refused_naming_the_rerun():
    from agent.rundir import RunError

    with pytest.raises(RunError, match="rerun python -m probes.entropy"):
        robustness(_steps(None).drop(columns=["dH_agg_max"]))


def test_an_agreement_that_predicts_the_grade_is_found_and_one_trial_says_it_cannot_be():
    rng = np.random.default_rng(1)
    rows = []
    for s in range(30):
        agree = s % 2 == 0  # the trials agree on half the samples, and those are the ones answered right
        for t in range(3):
            rows.append({"model": "m", "benchmark": "b", "sample_id": f"s{s}", "trial": t, "correct": agree,
                         "agreement": 1.0 if agree else 0.0, "think_entropy": rng.random(), "dH": rng.normal()})
    p = predictor_table(pd.DataFrame(rows)).set_index("predictor")
    a = p.loc["agreement across trials"]
    assert a.auroc == 1.0 and a.ci_low == pytest.approx(1.0) and a.n == 90 and not a.note
    h = p.loc["mean think entropy (-H)"]
    assert 0.3 < h.auroc < 0.7 and h.ci_low < 0.5 < h.ci_high  # noise: no signal, and the CI says so
    one = pd.DataFrame(rows)
    one = one[one.trial == 0].assign(agreement=np.nan)
    note = predictor_table(one).set_index("predictor").loc["agreement across trials", "note"]
    assert "one trial per sample: agreement cannot be computed" in note
