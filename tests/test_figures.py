"""What each figure draws (analysis/figures/): every legend entry names an artist that shows something, the axes
contain all the data and end at it, markers at 0 % and 100 % are drawn whole, and the intervals are SciPy's BCa
bootstrap."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.lines import Line2D
from scipy.stats import bootstrap

from analysis.estimators.stats import bootstrap_ci, removal_summary, summarise_by
from analysis.figures import fig1_tool_calls, fig2_combined, fig2a_grounding, fig2b_entropy, fig2b_kl, fig2c_removal
from analysis.figures.context import fig4_context

NONE = ("None", "none", "", " ", None)


def _area(poly: np.ndarray) -> float:
    x, y = poly[:, 0], poly[:, 1]
    return 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))


def shows_something(h) -> bool:
    """Does this legend handle's artist draw anything on its axis?"""
    if isinstance(h, BarContainer):
        return any(p.get_height() != 0 and p.get_width() > 0 for p in h.patches)
    if isinstance(h, ErrorbarContainer):
        return any(len(c.get_segments()) and any(np.ptp(np.asarray(s), axis=0).max() > 0 for s in c.get_segments())
                   for c in h.lines[2])
    if (h.get_alpha() or 1) == 0 or not h.get_visible():
        return False
    if isinstance(h, Line2D):
        x, y = np.asarray(h.get_xdata(), float), np.asarray(h.get_ydata(), float)
        drawn = h.get_linestyle() not in NONE or h.get_marker() not in NONE
        return drawn and bool(np.isfinite(x).any() and np.isfinite(y).any())
    if isinstance(h, PolyCollection):
        return any(_area(p.vertices) > 1e-9 for p in h.get_paths())
    if isinstance(h, PathCollection):
        return len(h.get_offsets()) > 0
    raise AssertionError(f"no check for a legend handle of type {type(h).__name__}")


def _data_points(ax):
    """(x, y, clipped) arrays of everything drawn in data coordinates."""
    out = []
    for ln in ax.lines:
        if ln.get_transform() != ax.transData:  # axhline / axvline: in axes coordinates
            continue
        x, y = np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float)
        out.append((x, y, ln.get_clip_on() and ln.get_marker() not in NONE))
    for c in ax.collections:
        if isinstance(c, PolyCollection):
            for p in c.get_paths():
                out.append((p.vertices[:, 0], p.vertices[:, 1], False))
        elif isinstance(c, PathCollection):
            o = np.asarray(c.get_offsets(), float)
            out.append((o[:, 0], o[:, 1], c.get_clip_on()))
        elif isinstance(c, LineCollection):
            for s in c.get_segments():
                s = np.asarray(s, float)
                out.append((s[:, 0], s[:, 1], False))
    for p in ax.patches:
        x0, y0 = p.get_xy()
        out.append((np.array([x0, x0 + p.get_width()]), np.array([y0, y0 + p.get_height()]), False))
    return out


def check_drawing(fig, *, step_axes: int = 0):
    """Every drawn axis: its legend entries show something; the limits contain all data; markers at a limit are
    not clipped; the first ``step_axes`` axes' x range ends at the data (within a bar's half width + margin)."""
    axes = [a for a in fig.findobj(Axes) if a.axison]
    assert axes
    for i, ax in enumerate(axes):
        handles, labels = ax.get_legend_handles_labels()
        for h, lab in zip(handles, labels):
            assert shows_something(h), f"legend entry {lab!r} draws nothing"
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        pts = _data_points(ax)
        xs = np.concatenate([p[0][np.isfinite(p[0])] for p in pts] or [np.zeros(0)])
        for x, y, clipped in pts:
            ok = np.isfinite(x) & np.isfinite(y)
            assert ((x[ok] >= x0 - 1e-9) & (x[ok] <= x1 + 1e-9)).all(), (ax.get_title(), x[ok], (x0, x1))
            assert ((y[ok] >= y0 - 1e-9) & (y[ok] <= y1 + 1e-9)).all(), (ax.get_title(), y[ok], (y0, y1))
            if clipped:  # a clipped marker needs room: 1 % of the axis on each side
                pad = 0.01 * (y1 - y0)
                assert ((y[ok] > y0 + pad) & (y[ok] < y1 - pad)).all(), f"a marker is clipped in {ax.get_title()!r}"
        if i < step_axes and len(xs):
            assert x1 - xs.max() <= 0.61, f"{ax.get_title()!r}: the x axis runs to {x1}, the data ends at {xs.max()}"


def _grounding_steps():
    rows = []
    for t in range(1, 7):
        for j in range(10):  # Image-Derived never occurs: no legend entry for it
            rows.append({"sample_id": f"s{j}", "trial": 0, "step": t,
                         "category": "Image Needed" if j < 10 - 2 * t else "Text Only"})
    return pd.DataFrame(rows)


def test_fig2a_dodges_its_intervals_and_lists_only_drawn_categories(tmp_path):
    fig = fig2a_grounding(_grounding_steps(), tmp_path / "a")
    check_drawing(fig, step_axes=1)
    ax = fig.axes[0]
    _, labels = ax.get_legend_handles_labels()
    assert "Image-Derived" not in labels and {"Image Needed", "Text Only"} <= set(labels)
    # each whisker's share named in the legend (issue 82: two whiskers a bar, one legend entry was ambiguous)
    assert {"95% Wilson CI of the Image Needed share (black, left)",
            "95% Wilson CI of the Text Only share (grey, right)"} <= set(labels)
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    xs = [np.asarray(c.lines[2][0].get_segments())[:, 0, 0] for c in bars]
    assert len(xs) == 2 and (np.abs(xs[0] - xs[1]) > 0.3).all()  # the two intervals never on one x


@pytest.mark.parametrize("width", [0.0, 3e-6, 0.4])
def test_fig2b_draws_its_bounds_as_a_band_or_a_line_never_an_invisible_entry(tmp_path, width):
    rng = np.random.default_rng(0)
    steps = pd.DataFrame({"step": np.repeat(np.arange(1, 7), 30), "dH": rng.normal(0.1, 0.3, 180)})
    s = summarise_by(steps, "step", "dH")
    s["dH_low"], s["dH_high"] = s["mean"] - width, s["mean"] + width
    fig = fig2b_entropy(s, tmp_path / "b")
    check_drawing(fig, step_axes=1)
    _, labels = fig.axes[0].get_legend_handles_labels()
    # a band too thin to see at the axis' scale (the tiny model's ~3e-6) is a line, and the legend says how thin
    (lab,) = [lab for lab in labels if "bounds" in lab]
    assert ("coincide at this scale" in lab) == (width < 0.1)
    assert ("at most 6e-06 nats apart" in lab) == (width == 3e-6)


def test_fig2b_kl_and_fig1_end_at_the_data(tmp_path):
    kl = pd.DataFrame({"step": [1, 2, 3], "kl_with_without": [0.4, 0.2, 0.05], "kl_ci_low": [0.3, 0.1, 0.0],
                       "kl_ci_high": [0.5, 0.3, 0.1], "kl_n": [12, 12, 10]})
    check_drawing(fig2b_kl(kl, tmp_path / "kl"), step_axes=1)
    calls = pd.DataFrame({"index": [1, 1, 2, 3, 4, 5, 6, 7], "tool": ["lens_search", "search", "search", "visit",
                                                                       None, "search", "visit", None]})
    fig = fig1_tool_calls(calls, tmp_path / "f1")
    check_drawing(fig, step_axes=1)
    assert fig.axes[0].get_xlim()[1] == pytest.approx(6.6)  # the last tool call is at step 6, not max_step=20


def _outcomes():
    rows = []
    for k in range(1, 6):
        for j in range(12):
            cat = ["Atomic factuality", "Dynamic information-seeking", "Visual deep research"][j % 3]
            orig = True
            rep = cat == "Atomic factuality" or (cat == "Dynamic information-seeking" and j > k)  # 100 % and 0 %
            rows.append({"sample_id": f"s{j}", "trial": 0, "k": k, "paper_category": cat, "replayed": True,
                         "original_correct": orig, "replay_correct": rep if cat != "Visual deep research" else False})
    return pd.DataFrame(rows)


def test_fig2c_bands_are_told_apart_and_markers_at_0_and_100_are_whole(tmp_path):
    rs = removal_summary(_outcomes())
    assert {0.0, 100.0} <= set(rs["accuracy_removed"])
    fig = fig2c_removal(rs, tmp_path / "c")
    check_drawing(fig)
    ax = fig.axes[0]
    # one filled band (all categories); each category's interval a bar right of each k in its colour, and the
    # original trajectories' markers left of each k, one column per category (issue 82: thin CI lines read as more
    # series, and the kept markers piled up at 100 %)
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1
    cats = [c for c in rs["paper_category"].unique() if c != "All"]
    bars = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert len(bars) == len(cats)
    for c in bars:
        xs = np.concatenate([np.asarray(seg, float)[:, 0] for seg in c.get_segments()])
        assert (np.mod(xs, 1) > 0).all() and (np.mod(xs, 1) < 0.5).all()  # right of their k
    kept = [ln for ln in ax.lines if ln.get_marker() == "D"]
    assert len(kept) == len(cats) + 1  # each category, and All
    lefts = [np.asarray(ln.get_xdata(), float) for ln in kept]
    assert all((np.mod(x, 1) > 0.5).all() for x in lefts)  # left of their k
    assert len({round(float(x[0]), 3) for x in lefts}) == len(kept)  # one column each: equal values stay apart
    for ln in ax.lines:
        if np.isin(np.asarray(ln.get_ydata(), float), [0.0, 100.0]).any():
            assert not ln.get_clip_on()
    handles, labels = ax.get_legend_handles_labels()
    assert "95% Wilson CI (removed), filled: all categories" in labels
    assert "images kept (same pairs): hollow, left of k" in labels
    assert "95% Wilson CI of each category: bars right of k" in labels


def test_fig2_combined_and_fig4(tmp_path):
    rng = np.random.default_rng(1)
    steps = pd.DataFrame({"step": np.repeat(np.arange(1, 6), 20), "dH": rng.normal(0, 0.2, 100)})
    fig = fig2_combined(_grounding_steps(), summarise_by(steps, "step", "dH"), removal_summary(_outcomes()),
                        tmp_path / "f2")
    check_drawing(fig)
    n = 60
    samples = pd.DataFrame({"method": ["react"] * n + ["mmcontextfold"] * n,
                            "n_calls": rng.integers(1, 8, 2 * n), "max_prompt_tokens": rng.integers(1000, 9000, 2 * n),
                            "correct": rng.random(2 * n) < 0.5})
    fig = fig4_context(samples, tmp_path / "f4")
    check_drawing(fig, step_axes=1)  # (a): lengths end at 7, not at the last bin's 21


def test_the_interval_is_scipys_bca_bootstrap():
    x = np.random.default_rng(2).exponential(1.0, 80)
    lo, hi = bootstrap_ci(x, seed=3)
    ref = bootstrap((x,), np.mean, n_resamples=2000, method="BCa", rng=np.random.default_rng(3)).confidence_interval
    assert (lo, hi) == pytest.approx((ref.low, ref.high))
    assert lo < x.mean() < hi and bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
    assert np.isnan(bootstrap_ci([1.0])[0])


def test_fig2b_forking_and_the_release_figure(tmp_path):
    from analysis.figures import fig2b_forking, fig_unload

    st = pd.DataFrame({"step": [1, 2, 3, 4], "mean": [-0.3, -0.1, 0.0, 0.05], "ci_low": [-0.4, -0.2, -0.1, 0.0],
                       "ci_high": [-0.2, 0.0, 0.1, 0.1], "n": [20, 20, 18, 15]})
    fk = pd.DataFrame({"step": [1, 2, 3, 4], "dH_fork": [-0.2, -0.05, 0.0, 0.02], "fork_ci_low": [-0.3, -0.1, -0.05, 0.0],
                       "fork_ci_high": [-0.1, 0.0, 0.05, 0.04], "n_steps": [20, 20, 18, 15],
                       "dH_rest": [-0.1, -0.05, 0.0, 0.03], "threshold_nats": [1.2] * 4,
                       "share_fork_with": [0.2, 0.21, 0.19, 0.2], "share_fork_without": [0.25, 0.22, 0.2, 0.2]})
    check_drawing(fig2b_forking(fk, st, tmp_path / "fork"), step_axes=2)
    points = pd.DataFrame([
        {"series": "ReAct (images kept)", "image_steps": 6.0, "accuracy": 100.0, "n": 10, "k": np.nan},
        {"series": "R@k (runs)", "image_steps": 1.0, "accuracy": 40.0, "n": 10, "k": 2},
        {"series": "R@k (runs)", "image_steps": 2.0, "accuracy": 60.0, "n": 10, "k": 3},
        {"series": "adaptive", "image_steps": 2.5, "accuracy": 0.0, "n": 10, "k": np.nan, "signal": "kl",
         "threshold": 0.01, "patience": 2}])
    steps = pd.DataFrame({"policy": ["kl"] * 6, "calibrated": [True] * 6, "n_calls": [5, 6, 4, 5, 6, 7],
                          "unload_step": [2, 3, np.nan, 2, 4, 3], "paper_category": ["A", "A", "B", "B", "A", "B"]})
    check_drawing(fig_unload(points, steps, tmp_path / "rel"))


def test_counts_above_twenty_bars_at_paper_scale_never_run_together(tmp_path):
    """At the paper's scale (thousands of trajectories, 20 steps) each count above a bar or point is short (1.7k) and
    no two overlap (issue 82: "1700147112981144..." read as one number)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from analysis.figures.style import count_label

    assert [count_label(n) for n in (950, 1700, 12_345)] == ["950", "1.7k", "12k"]
    rows = [{"sample_id": f"s{j}", "trial": 0, "step": t, "category": "Image Needed" if (j + t) % 3 else "Text Only"}
            for j in range(1700) for t in range(1, 21) if t <= 1 + j % 20]
    rng = np.random.default_rng(0)
    e = pd.DataFrame({"step": np.repeat(np.arange(1, 21), 1200), "dH": rng.normal(0, 0.3, 24_000)})
    for fig in (fig2a_grounding(pd.DataFrame(rows), tmp_path / "a"), fig2b_entropy(summarise_by(e, "step", "dH"),
                                                                                 tmp_path / "b")):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        r = canvas.get_renderer()
        counts = [t for t in fig.axes[0].texts if t.get_text()[:1].isdigit()]
        assert len(counts) == 20 and any(t.get_text().endswith("k") for t in counts)
        boxes = sorted((t.get_window_extent(r) for t in counts), key=lambda b: b.x0)
        assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), "two counts overlap"
