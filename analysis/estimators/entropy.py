"""Entropy of next-token distributions from top-k log-probabilities (paper §3.2.2, B.4).

    from analysis.estimators.entropy import grouped_tail_entropy
    H = grouped_tail_entropy(top_logprobs)        # (..., k) -> (...), nats

Everything here is in nats and vectorised with numpy; nothing loops over tokens in Python.
"""
from __future__ import annotations

import numpy as np

__all__ = ["grouped_tail_entropy", "grouped_tail_entropy_reference", "entropy_bounds", "entropy_high", "entropy_histogram", "forking_threshold",
           "forking_stats", "exact_entropy_from_logprobs", "tail_mass", "think_segment_entropy", "AGGREGATIONS",
           "EDGE_TOKENS", "TRIM", "top20_exact_entropy", "trimmed_mean", "aggregate_entropies"]


def tail_mass(top_logprobs) -> np.ndarray:
    """Probability mass outside the top-k, ``1 - sum(exp(logprob_i))`` clipped at 0. Shape (...)."""
    lp = np.asarray(top_logprobs, dtype=np.float64)
    p = np.exp(np.nan_to_num(lp, nan=-np.inf, neginf=-np.inf))
    return np.clip(1.0 - p.sum(axis=-1), 0.0, 1.0)


def grouped_tail_entropy_reference(top_logprobs) -> np.ndarray:
    """B.4's grouped-tail entropy as the paper writes it, plainly: with p_i = exp(logprob_i) over the top-k and the
    rest of the vocabulary as one bin p_rest = 1 - sum_i p_i (clipped at 0),

        H = - sum_i p_i log p_i  -  p_rest log p_rest          (nats; 0 log 0 = 0; NaN / -inf: absent, p = 0)

    The reference :func:`grouped_tail_entropy` (the fast kernel the probes use) is held equal to
    (tests/test_entropy.py); float64 throughout."""
    lp = np.asarray(top_logprobs, dtype=np.float64)
    lp = np.where(np.isnan(lp), -np.inf, np.minimum(lp, 0.0))  # absent entries; a logprob > 0 is rounding
    p = np.exp(lp)
    p_rest = np.clip(1.0 - p.sum(axis=-1), 0.0, 1.0)

    def plogp(q):
        return np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0)
    return -plogp(p).sum(axis=-1) - plogp(p_rest)


def grouped_tail_entropy(top_logprobs, compute=None) -> np.ndarray:
    """Grouped-tail entropy H = -sum_i p_i log p_i - p_rest log p_rest, in nats.

    ``top_logprobs`` has shape ``(..., k)``: the log-probabilities of the k most likely tokens at
    each position (any order). Entries that are NaN or -inf count as absent (probability 0), so
    a ragged top-k (e.g. a chat server that deduplicated alternatives by text) can be padded with
    NaN. ``p_rest = 1 - sum_i p_i`` is the mass of all other tokens, treated as *one* bin and
    clipped at 0 when rounding makes the top-k sum exceed 1; 0 log 0 = 0.

    Returns shape ``(...)``. ``compute``: the float type of the arithmetic (default: float32 for float32 /
    float16 input, else float64); ``compute=np.float32`` on float64 input gives exactly what converting the
    input to float32 first would, without the converted copy.

    This is a **lower bound** on the exact full-vocabulary entropy of the same distribution:
    merging the tail tokens into one bin can only remove entropy (grouping property of the
    Shannon entropy), so ``exact >= grouped`` with equality only when the tail holds at most one
    token. It is the estimator of the paper (appendix B.4) and is computed identically for both
    sides of every ΔH comparison.
    """
    lp = np.asarray(top_logprobs)
    if lp.ndim == 0:
        raise ValueError("top_logprobs must have a last axis of size k (got a scalar)")
    # float32 / float16 input (as stored in the record) is computed in float32 — |error| < 1e-6 nats per token
    # against float64 (tests/test_entropy.py) — anything else in float64. Chunks of rows with in-place ufuncs and the
    # row sums as a matrix-vector product: a few cache-sized temporaries, no full-size ones.
    dt = np.dtype(compute) if compute is not None else np.float32 if lp.dtype in (np.float32, np.float16) else np.float64
    k = lp.shape[-1]
    x = lp.reshape(-1, k)
    n = x.shape[0]
    if n == 0 or k == 0:
        return np.zeros(lp.shape[:-1])
    chunk = min(n, _CHUNK_ROWS)
    a = np.empty((chunk, k), dtype=dt)
    p = np.empty_like(a)
    ones = _ONES.get((k, dt)) if (k, dt) in _ONES else _ONES.setdefault((k, dt), np.ones(k, dtype=dt))
    parts = []
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        pp = p if e - s == chunk else p[: e - s]
        xs = x[s:e]
        ok = xs.max() <= 0.0  # the usual case (NaN anywhere fails it): no clamping needed
        if ok and xs.dtype == dt:  # no copy at all
            aa = xs
        else:
            aa = a if e - s == chunk else a[: e - s]
            if ok:  # a plain converting copy is faster than a converting minimum
                np.copyto(aa, xs, casting="unsafe")
            else:
                np.minimum(xs, 0.0, out=aa, casting="unsafe")  # a logprob can exceed 0 only by rounding
        np.exp(aa, out=pp)
        sp = pp @ ones
        with np.errstate(invalid="ignore"):  # 0 * -inf at padded entries: fixed below
            np.multiply(pp, aa, out=pp)
            spl = pp @ ones
        if not np.isfinite(spl).all():  # rows with NaN / -inf padding: an absent alternative has probability 0
            bad = ~np.isfinite(spl)
            r = aa[bad].astype(np.float64)
            r[np.isnan(r)] = -np.inf
            pr = np.exp(r)
            with np.errstate(invalid="ignore"):
                sp[bad] = pr.sum(axis=1)
                spl[bad] = np.where(pr > 0.0, pr * r, 0.0).sum(axis=1)
        rest = np.clip(1.0 - sp.astype(np.float64), 0.0, 1.0)
        # rest * log(rest), with 0 log 0 = 0 (log of a tiny positive number times 0 is 0); in float32 arithmetic
        # the log is taken in float32 (rest itself stays float64: 1 - sum loses nothing more): it moves the
        # term by < 1e-7 of its value, and is the cheaper log (docs/performance.md)
        if dt == np.float32:
            lr = np.log(np.maximum(rest, 1e-30).astype(np.float32))
        else:
            lr = np.log(np.maximum(rest, 1e-300))
        parts.append(-spl - rest * lr)
    out = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return out.astype(np.float64, copy=False).reshape(lp.shape[:-1])


#: Rows per chunk of :func:`grouped_tail_entropy` (4k x 20 float32 = 328 KB per temporary: two fit in L2).
_CHUNK_ROWS = 1 << 12
_ONES: dict = {}


def exact_entropy_from_logprobs(logprobs) -> np.ndarray:
    """Exact entropy of full (normalised) log-probability vectors, shape (..., V) -> (...)."""
    lp = np.asarray(logprobs, dtype=np.float64)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        return -np.where(p > 0.0, p * lp, 0.0).sum(axis=-1)


def think_segment_entropy(call, top_logprobs, think, exact=None) -> dict[str, np.ndarray]:
    """Per call: H(τ_t) = mean grouped entropy over the call's think tokens (paper §3.2.2, B.4).

    ``call`` (n,) is each token's call index, ``top_logprobs`` (n, k), ``think`` (n,) bool (strictly
    inside ``<think>…</think>``; answer tokens and the tags are excluded), ``exact`` (n,) optional
    full-vocabulary entropies (NaN where unknown). Returns arrays over the sorted unique calls:
    ``call``, ``n_think``, ``H`` (NaN for a call with no think tokens: excluded from means, and
    counted through ``n_think == 0``), ``H_exact`` and ``gap`` = H_exact - H (>= 0) where exact is known.
    """
    call = np.asarray(call)
    think = np.asarray(think, dtype=bool)
    calls, inv = np.unique(call, return_inverse=True)
    h = grouped_tail_entropy(top_logprobs)
    n = np.bincount(inv, weights=think, minlength=len(calls))
    s = np.bincount(inv, weights=np.where(think, h, 0.0), minlength=len(calls))
    with np.errstate(invalid="ignore", divide="ignore"):
        H = np.where(n > 0, s / np.where(n > 0, n, 1), np.nan)
    out = {"call": calls, "n_think": n.astype(int), "H": H}
    if exact is not None:
        ex = np.asarray(exact, dtype=np.float64)
        ok = think & np.isfinite(ex)
        ne = np.bincount(inv, weights=ok, minlength=len(calls))
        se = np.bincount(inv, weights=np.where(ok, ex, 0.0), minlength=len(calls))
        with np.errstate(invalid="ignore", divide="ignore"):
            He = np.where((ne == n) & (n > 0), se / np.where(ne > 0, ne, 1), np.nan)
        out["H_exact"], out["gap"] = He, He - H
    return out


def entropy_bounds(top_logprobs, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds, in nats, on the exact full-vocabulary entropy at each position, from its top-k.

    ``top_logprobs``: ``(..., k)`` log-probabilities of the k most likely tokens (NaN / -inf = absent, as in
    :func:`grouped_tail_entropy`); ``vocab``: the model's vocabulary size V (its output rows; a larger V only
    loosens the upper bound). Returns ``(low, high)``, each of shape ``(...)``.

    Derivation (ours; the paper's B.4 estimator is the lower one). Let p_1 >= … >= p_m be the listed
    probabilities (m <= k valid entries), r = 1 - Σ p_i the tail mass (clipped at 0) and q_1 … q_{V-m} the
    unlisted tokens' probabilities: Σ q_j = r and, since the list holds the m most likely tokens, every
    q_j <= p_m. The exact entropy is H = S + T with S = -Σ p_i log p_i (known) and T = -Σ q_j log q_j.

    - Lower: each q_j <= r, so -log q_j >= -log r and T >= -r log r. H_low = S - r log r is the grouped-tail
      estimate (:func:`grouped_tail_entropy`): the tail merged into one bin.
    - Upper: -x log x is concave, so for a fixed sum T is largest when the q_j are equal, q_j = r / (V - m):
      T <= -r log(r / (V - m)) (Jensen). Equal shares are allowed by the constraint whenever r / (V - m) <= p_m,
      which holds for any true top-m list (otherwise the tail could not hold r). Where rounded inputs break
      it, the share is capped at p_m (T <= -r log p_m, the tail at its most even), so the bound never uses an
      impossible distribution. H_high = S - r log(min(r / (V - m), p_m)).

    Both are equal when the tail is empty (r = 0) or holds one token (V = m + 1); the gap H_high - H_low =
    r log(r / share) grows with the tail mass, ~r log(V - m) for a large vocabulary. Tested
    against exact entropies of random and peaked distributions (tests/test_entropy.py): never violated.
    """
    lp = np.asarray(top_logprobs, dtype=np.float64)
    if lp.ndim == 0:
        raise ValueError("top_logprobs must have a last axis of size k (got a scalar)")
    if int(vocab) <= 0:
        raise ValueError(f"vocab must be a positive vocabulary size, not {vocab}")
    valid = np.isfinite(lp)
    if lp.size and lp.shape[-1] and valid.all():  # the usual case: every alternative listed
        return _bounds_full(lp, int(vocab))
    p = np.where(valid, np.exp(np.minimum(np.where(valid, lp, 0.0), 0.0)), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        s_known = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(axis=-1)
        r = np.maximum(0.0, 1.0 - p.sum(axis=-1))
        m = valid.sum(axis=-1)
        rest = np.maximum(int(vocab) - m, 0)
        p_min = np.where(valid, p, np.inf).min(axis=-1, initial=np.inf)
        share = np.where(rest > 0, r / np.maximum(rest, 1), r)
        share = np.minimum(share, np.where(np.isfinite(p_min), p_min, share))
        low = s_known - np.where(r > 0, r * np.log(np.where(r > 0, r, 1.0)), 0.0)
        high = s_known - np.where((r > 0) & (share > 0), r * np.log(np.where(share > 0, share, 1.0)), 0.0)
    return low, np.maximum(high, low)


def _bounds_full(lp: np.ndarray, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`entropy_bounds` where every entry is finite (m = k everywhere): the same arithmetic without the
    masks (ours: faster, docs/performance.md; equal values, tested)."""
    k = lp.shape[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.exp(np.minimum(lp, 0.0))
        t = p * np.log(p)
        if not p.all():  # an underflowed probability: 0 log 0 = 0
            t[p == 0.0] = 0.0
        s_known = -t.sum(axis=-1)
        r = np.maximum(0.0, 1.0 - p.sum(axis=-1))
        rest = max(vocab - k, 0)
        share = r / rest if rest > 0 else r
        share = np.minimum(share, p.min(axis=-1))
        rl = np.where(r > 0, r * np.log(np.where(r > 0, r, 1.0)), 0.0)
        low = s_known - rl
        high = s_known - np.where((r > 0) & (share > 0), r * np.log(np.where(share > 0, share, 1.0)), 0.0)
    return low, np.maximum(high, low)


def entropy_high(lp: np.ndarray, low: np.ndarray, vocab: int) -> np.ndarray:
    """:func:`entropy_bounds`' upper bound from the grouped-tail entropy ``low`` of the same rows (already computed,
    :func:`grouped_tail_entropy`; float32 input gives it to ~1e-6, so the bound too):
    H_high = H_low + r (log r - log share), the same quantity with one exp and no log over the (n, k) entries
    (ours: faster, docs/performance.md; equal to ~1e-15, tested). Rows with an absent entry take
    :func:`entropy_bounds` itself."""
    lp = np.asarray(lp, dtype=np.float64)
    if not (lp.ndim == 2 and lp.size and np.isfinite(lp).all()):
        return entropy_bounds(lp, vocab)[1]
    k = lp.shape[-1]
    r = np.maximum(0.0, 1.0 - np.exp(np.minimum(lp, 0.0)).sum(axis=-1))
    rest = max(int(vocab) - k, 0)
    share = np.minimum(r / rest if rest > 0 else r, np.exp(np.minimum(lp.min(axis=-1), 0.0)))
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.where((r > 0) & (share > 0), r * (np.log(np.where(r > 0, r, 1.0)) - np.log(np.where(share > 0, share, 1.0))), 0.0)
    return np.maximum(low + gap, low)


#: Entropy bins for the forking-token statistics (nats): 0.05 wide up to 12 (everything above in the last).
FORK_BIN = 0.05
FORK_BINS = 240
#: The share of think tokens that are "forking": the highest-entropy 20 % over the whole run (arXiv 2506.01939).
FORK_SHARE = 0.20


def entropy_histogram(H, dH=None) -> dict:
    """One step's per-token entropies as a sparse histogram: ``{"bin": [...], "n": [...], "sum": [...]}`` (bins of
    :data:`FORK_BIN` nats), plus ``"dsum"`` (the sum of ``dH`` per bin of ``H``) when given. Stored per step, so
    the run-wide forking threshold can be applied after the probe without keeping every token (ours)."""
    H = np.asarray(H, dtype=np.float64)
    ok = np.isfinite(H)
    H = H[ok]
    idx = np.minimum((np.maximum(H, 0.0) / FORK_BIN).astype(np.int64), FORK_BINS - 1)
    n = np.bincount(idx, minlength=FORK_BINS)
    sm = np.bincount(idx, weights=H, minlength=FORK_BINS)
    nz = np.flatnonzero(n)
    out = {"bin": nz.tolist(), "n": n[nz].tolist(), "sum": np.round(sm[nz], 6).tolist()}
    if dH is not None:
        d = np.asarray(dH, dtype=np.float64)[ok]
        out["dsum"] = np.round(np.bincount(idx, weights=d, minlength=FORK_BINS)[nz], 6).tolist()
    return out


def forking_threshold(hists, share: float = FORK_SHARE) -> tuple[int, float]:
    """The run-wide forking threshold from the steps' with-images histograms: the lowest bin whose tokens and
    those above hold at least ``share`` of all think tokens. Returns (bin index, its lower edge in nats)."""
    total = np.zeros(FORK_BINS)
    for h in hists:
        if h:
            np.add.at(total, np.asarray(h["bin"], dtype=np.int64), np.asarray(h["n"], dtype=np.float64))
    if total.sum() == 0:
        return FORK_BINS, float("nan")
    above = np.cumsum(total[::-1])[::-1]  # tokens in this bin and above
    j = int(np.flatnonzero(above >= share * total.sum()).max())
    return j, j * FORK_BIN


def forking_stats(h: dict | None, j: int) -> tuple[int, int, float, float]:
    """(tokens, forking tokens, their summed entropy, their summed dH) of one histogram at threshold bin ``j``."""
    if not h:
        return 0, 0, 0.0, float("nan")
    b = np.asarray(h["bin"], dtype=np.int64)
    n = np.asarray(h["n"], dtype=np.float64)
    top = b >= j
    d = float(np.asarray(h["dsum"])[top].sum()) if "dsum" in h else float("nan")
    return int(n.sum()), int(n[top].sum()), float(np.asarray(h["sum"])[top].sum()), d




#: The aggregations of a step's per-token entropies the robustness analysis compares (ours, issue 85): the paper's
#: mean over the think tokens (B.4), and what a careful reader would try instead. ``first`` / ``last``: the
#: first / last :data:`EDGE_TOKENS` think tokens; ``top20_exact``: each token's entropy over its top-20 alone,
#: renormalised (no tail bin); ``whole``: the grouped-tail mean over every generated token, not only the thinking.
AGGREGATIONS = ("mean", "median", "trimmed", "first", "last", "max", "top20_exact", "whole")
#: How many think tokens the ``first`` / ``last`` aggregations keep (ours).
EDGE_TOKENS = 32
#: The share cut from each end by the ``trimmed`` mean (ours; scipy.stats.trim_mean's proportiontocut).
TRIM = 0.1


def top20_exact_entropy(top_logprobs) -> np.ndarray:
    """Each position's entropy over its top-k alone, renormalised to sum to 1 (no tail bin), in nats."""
    lp = np.asarray(top_logprobs, dtype=np.float64)
    p = np.exp(np.nan_to_num(lp, nan=-np.inf, neginf=-np.inf))
    s = p.sum(axis=-1, keepdims=True)
    q = np.divide(p, s, out=np.zeros_like(p), where=s > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(q > 0, -q * np.log(q), 0.0)
    return terms.sum(axis=-1)


def trimmed_mean(h: np.ndarray, cut: float) -> float:
    """The mean of ``h`` without its ``int(cut * len(h))`` lowest and highest values: scipy.stats.trim_mean's
    definition (tested equal to it), without its argument handling, ~0.1 ms a call on every probed step (ours;
    docs/performance.md)."""
    n = len(h)
    low = int(cut * n)
    if low >= n - low:  # nothing left (scipy: NaN, or an error past one half)
        return float("nan")
    return float(np.partition(h, (low, n - low - 1))[low:n - low].mean())


def aggregate_entropies(H, think, top_logprobs=None) -> dict[str, float]:
    """One side of a step, every :data:`AGGREGATIONS` of its per-token grouped-tail entropies ``H`` (all generated
    tokens, in order) over the think tokens (``think``, a boolean mask); NaN where it is undefined (no think token;
    ``top20_exact`` without the top-k)."""
    H = np.asarray(H, dtype=np.float64)
    t = np.asarray(think, dtype=bool)
    h = H[t]
    nan = float("nan")
    if not len(h):
        return {a: (float(H.mean()) if a == "whole" and len(H) else nan) for a in AGGREGATIONS}
    out = {"mean": float(h.mean()), "median": float(np.median(h)), "trimmed": trimmed_mean(h, TRIM),
           "first": float(h[:EDGE_TOKENS].mean()), "last": float(h[-EDGE_TOKENS:].mean()), "max": float(h.max()),
           "whole": float(H.mean())}
    out["top20_exact"] = float(top20_exact_entropy(np.asarray(top_logprobs)[t]).mean()) if top_logprobs is not None \
        else nan
    return out
