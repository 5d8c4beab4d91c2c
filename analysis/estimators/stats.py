"""Statistics for the probes: bootstrap confidence intervals, Wilcoxon signed-rank, McNemar.

    from analysis.estimators.stats import bootstrap_ci, wilcoxon_p, mcnemar_p
    lo, hi = bootstrap_ci(delta_h)            # 95% BCa bootstrap CI of the mean (scipy.stats.bootstrap), seeded
    p = wilcoxon_p(delta_h)                   # paired: H(with) - H(without) against 0
    p = mcnemar_p(correct_before, correct_after)

Every function returns NaN rather than raising when there is too little data to say anything.
"""
from __future__ import annotations

import math

import numpy as np

from agent.lazy import lazy_module

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

__all__ = ["bootstrap_ci", "wilson_ci", "wilcoxon_p", "mcnemar_p", "summarise_by", "removal_summary", "auroc",
           "auroc_ci"]


def bootstrap_ci(values, *, level: float = 0.95, reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """BCa bootstrap CI of the mean (``scipy.stats.bootstrap``, its default method; NaNs dropped, seeded);
    (nan, nan) for fewer than 2 values; a constant sample's interval is its value."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if len(x) < 2:
        return float("nan"), float("nan")
    if np.ptp(x) == 0:  # BCa is undefined on a constant sample (every resample's mean is the same)
        return float(x[0]), float(x[0])
    from scipy.stats import bootstrap  # SciPy loads on first use: a large part of every command's start otherwise

    res = bootstrap((x,), np.mean, n_resamples=reps, confidence_level=level, method="BCa",
                    rng=np.random.default_rng(seed), batch=max(1, (1 << 20) // len(x)))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def wilson_ci(successes, n, *, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval (95% by default) of a proportion, in [0, 1]; (nan, nan) for n = 0.

    Ours, for every share and accuracy a figure draws: unlike the normal interval it stays inside [0, 1] and
    is not zero-width at 0 % or 100 % (2 of 2 correct gives [0.34, 1.0], not [1.0, 1.0])."""

    n = int(n)
    if n <= 0:
        return float("nan"), float("nan")
    p = float(successes) / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def wilcoxon_p(diffs) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired differences against 0 (NaN if undefined).

    SciPy's ``wilcoxon(d, zero_method="wilcox")``. For more than 50 differences and no zero among them SciPy
    uses the normal approximation with the tie correction (no continuity correction); that case is computed
    here the same way without importing scipy.stats (1.2 s of every probe's run; ours — checked against SciPy
    in tests/test_probe_entropy.py). Everything else (small samples: exact or permutation; zeros) is SciPy's.
    """
    d = np.asarray(diffs, dtype=np.float64)
    d = d[np.isfinite(d)]
    if len(d) < 2 or np.all(d == 0):
        return float("nan")
    if len(d) > 50 and not (d == 0).any():
        return _wilcoxon_normal_p(d)

    from scipy.stats import wilcoxon  # on first use (see bootstrap_ci)

    return float(wilcoxon(d, zero_method="wilcox").pvalue)


def _wilcoxon_normal_p(d: np.ndarray) -> float:
    """The normal approximation of the signed-rank test, as SciPy computes it (average ranks, tie-corrected
    variance, no continuity correction, two-sided)."""

    a = np.abs(d)
    order = np.argsort(a, kind="mergesort")
    s = a[order]
    n = len(s)
    starts = np.r_[0, np.flatnonzero(s[1:] != s[:-1]) + 1]
    sizes = np.diff(np.r_[starts, n])
    avg = starts + (sizes + 1) / 2.0  # 1-based average rank of each group of equal magnitudes
    ranks = np.empty(n)
    ranks[order] = np.repeat(avg, sizes)
    r_plus = float(ranks[d > 0].sum())
    mn = n * (n + 1.0) * 0.25
    se = n * (n + 1.0) * (2.0 * n + 1.0)
    t = sizes.astype(np.float64)
    se = math.sqrt((se - float((t ** 3 - t).sum()) / 2) / 24)
    if se == 0:
        return float("nan")
    z = (r_plus - mn) / se
    return float(min(1.0, math.erfc(abs(z) / math.sqrt(2.0))))


def mcnemar_p(before, after) -> float:
    """Exact McNemar p-value for paired binary outcomes (binomial test on the discordant pairs)."""

    b = np.asarray(before, dtype=bool)
    a = np.asarray(after, dtype=bool)
    n01 = int((b & ~a).sum())
    n10 = int((~b & a).sum())
    if n01 + n10 == 0:
        return 1.0
    from scipy.stats import binomtest  # on first use (see bootstrap_ci)

    return float(binomtest(n01, n01 + n10, 0.5).pvalue)


def summarise_by(df, key: str, value: str, *, seed: int = 0):
    """Per value of ``key``: n, mean, 95% bootstrap CI and Wilcoxon p of ``value`` (a paired difference)."""

    rows = []
    for k, g in df.groupby(key, sort=True):
        v = g[value].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        lo, hi = bootstrap_ci(v, seed=seed)
        rows.append({key: k, "n": len(v), "mean": float(v.mean()) if len(v) else float("nan"),
                     "ci_low": lo, "ci_high": hi, "wilcoxon_p": wilcoxon_p(v)})
    return pd.DataFrame(rows)


def removal_summary(outcomes):
    """Figure 2(c)'s table from step-k removal outcomes (one row per trajectory x k; ``replay_correct`` NaN for
    a replay that failed): per paper category and overall, per k, the complete pairs ``n``, the missing
    pairs ``n_error`` (never counted as wrong), the accuracy of the originals and of the replays on the
    same complete pairs (the replays' with a 95% Wilson interval), the discordant pairs (``lost``: correct
    only with the images; ``gained``: only without) and the exact McNemar p on them."""

    rows = []
    for (cat, k), g in [*(((c, k), g) for (c, k), g in outcomes.groupby(["paper_category", "k"])),
                        *((("All", k), g) for k, g in outcomes.groupby("k"))]:
        err = g["replay_correct"].isna()
        ok = g[~err]
        before, after = ok["original_correct"].astype(bool), ok["replay_correct"].astype(bool)
        lo, hi = wilson_ci(int(after.sum()), len(ok))
        rows.append({"paper_category": cat, "k": int(k), "n": len(ok), "n_error": int(err.sum()),
                     "replayed": int(ok["replayed"].sum()),
                     "accuracy_original": 100 * before.mean() if len(ok) else float("nan"),
                     "accuracy_removed": 100 * after.mean() if len(ok) else float("nan"),
                     "removed_ci_low": 100 * lo, "removed_ci_high": 100 * hi,
                     # the paired counts behind McNemar: correct with the images, wrong without them; and back
                     "lost": int((before & ~after).sum()), "gained": int((~before & after).sum()),
                     "mcnemar_p": mcnemar_p(before, after) if len(ok) else float("nan")})
    return pd.DataFrame(rows).sort_values(["paper_category", "k"]).reset_index(drop=True)


def auroc(scores, labels) -> float:
    """The area under the ROC curve of ``scores`` for the positive ``labels`` (True): the chance that a random
    positive scores above a random negative, ties counting half (Mann-Whitney's U / (n_pos x n_neg),
    ``scipy.stats.mannwhitneyu``); NaN without both classes."""
    x = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    ok = np.isfinite(x)
    pos, neg = x[ok & y], x[ok & ~y]
    if not len(pos) or not len(neg):
        return float("nan")
    from scipy.stats import mannwhitneyu  # SciPy loads on first use

    return float(mannwhitneyu(pos, neg, alternative="two-sided").statistic) / (len(pos) * len(neg))


def auroc_ci(scores, labels, *, level: float = 0.95, reps: int = 1000, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap CI of :func:`auroc`, resampling (score, label) pairs (a resample with one class only
    is skipped); (nan, nan) when fewer than 20 resamples have both classes."""
    x = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    ok = np.isfinite(x)
    x, y = x[ok], y[ok]
    if len(x) < 2 or y.all() or not y.any():
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(reps):
        i = rng.integers(0, len(x), len(x))
        if y[i].any() and not y[i].all():
            vals.append(auroc(x[i], y[i]))
    if len(vals) < 20:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    return float(np.quantile(vals, a)), float(np.quantile(vals, 1 - a))

