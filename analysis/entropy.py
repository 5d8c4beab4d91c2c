"""Entropy of next-token distributions from top-k log-probabilities (paper §3.2.2, B.4).

    from analysis.entropy import grouped_tail_entropy
    H = grouped_tail_entropy(top_logprobs)        # (..., k) -> (...), nats

Everything here is in nats and vectorised with numpy; nothing loops over tokens in Python.
"""
from __future__ import annotations

import numpy as np

__all__ = ["grouped_tail_entropy", "exact_entropy_from_logprobs", "tail_mass", "think_segment_entropy",
           "step_entropies", "kl_union_tail"]


def tail_mass(top_logprobs) -> np.ndarray:
    """Probability mass outside the top-k, ``1 - sum(exp(logprob_i))`` clipped at 0. Shape (...)."""
    lp = np.asarray(top_logprobs, dtype=np.float64)
    p = np.exp(np.nan_to_num(lp, nan=-np.inf, neginf=-np.inf))
    return np.clip(1.0 - p.sum(axis=-1), 0.0, 1.0)


def grouped_tail_entropy(top_logprobs) -> np.ndarray:
    """Grouped-tail entropy H = -sum_i p_i log p_i - p_rest log p_rest, in nats.

    ``top_logprobs`` has shape ``(..., k)``: the log-probabilities of the k most likely tokens at
    each position (any order). Entries that are NaN or -inf count as absent (probability 0), so
    a ragged top-k (e.g. a chat server that deduplicated alternatives by text) can be padded with
    NaN. ``p_rest = 1 - sum_i p_i`` is the mass of all other tokens, treated as *one* bin and
    clipped at 0 when rounding makes the top-k sum exceed 1; 0 log 0 = 0.

    Returns shape ``(...)``.

    This is a **lower bound** on the exact full-vocabulary entropy of the same distribution:
    merging the tail tokens into one bin can only remove entropy (grouping property of the
    Shannon entropy), so ``exact >= grouped`` with equality only when the tail holds at most one
    token. It is the estimator of the paper (appendix B.4) and is computed identically for both
    sides of every ΔH comparison.
    """
    lp = np.asarray(top_logprobs)
    # float32 input (as stored in the record) is computed in float32 with float64 sums: twice as fast,
    # |error| ~1e-7 nats per token; anything else in float64.
    lp = lp.astype(np.float32 if lp.dtype in (np.float32, np.float16) else np.float64, copy=False)
    if lp.ndim == 0:
        raise ValueError("top_logprobs must have a last axis of size k (got a scalar)")
    lp = np.where(np.isnan(lp), -np.inf, lp)
    lp = np.minimum(lp, 0.0)  # a logprob can exceed 0 only by rounding
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        plogp = np.where(p > 0.0, p * lp, 0.0)
    rest = np.clip(1.0 - p.sum(axis=-1, dtype=np.float64), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rest_term = np.where(rest > 0.0, rest * np.log(np.where(rest > 0.0, rest, 1.0)), 0.0)
    return -plogp.sum(axis=-1, dtype=np.float64) - rest_term


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


def step_entropies(run):
    """One row per (sample, trial, LLM call) of a run: step, state, images in context, H(τ_t).

    ``run`` is :func:`agent.rundir.load_run`'s result. Columns: sample_id, trial, benchmark,
    paper_category, step (the call index), state, n_images (all pixels in context), n_query_images,
    n_think, H, H_exact, gap.
    """
    import pandas as pd

    rows = []
    for line in run.lines:
        tok = run.tokens(line, ["call", "think", "top_logprobs", "exact_entropy"])
        if not tok:
            continue
        e = think_segment_entropy(tok["call"], tok["top_logprobs"], tok["think"], tok.get("exact_entropy"))
        by_call = {int(c): i for i, c in enumerate(e["call"])}
        for c in line.get("calls", []):
            i = by_call.get(c["index"])
            rows.append({"sample_id": line["sample_id"], "trial": line["trial"], "benchmark": line["benchmark"],
                         "paper_category": line.get("paper_category"), "step": c["index"], "state": c["state"],
                         "n_images": c["n_images"], "n_query_images": c.get("n_query_images", 0), "n_think": int(e["n_think"][i]) if i is not None else 0,
                         "H": float(e["H"][i]) if i is not None else np.nan,
                         "H_exact": float(e["H_exact"][i]) if i is not None else np.nan,
                         "gap": float(e["gap"][i]) if i is not None else np.nan})
    return pd.DataFrame(rows)


def kl_union_tail(ids_p, lps_p, ids_q, lps_q) -> float:
    """KL(P || Q) in nats between two top-k lists of one position, on the union of their supports + a tail bin.

    Each side's known probabilities are its top-k; a union token missing from one side's top-k gets
    an even share of that side's tail mass (1 - sum of its top-k), shared with one "rest" bin that
    holds everything else. Both sides are then normalised distributions over the same bins, so the
    value is finite. It approximates the KL of the full distributions and is exact when both top-k
    lists cover the same tokens and the tails are equal. NaN / -1 padding is ignored.
    """
    def side(ids, lps):
        d = {}
        for i, lp in zip(ids, lps):
            if i is not None and i >= 0 and np.isfinite(lp):
                d[int(i)] = float(np.exp(min(lp, 0.0)))
        return d

    p, q = side(ids_p, lps_p), side(ids_q, lps_q)
    union = sorted(set(p) | set(q))

    def dist(d):
        tail = max(0.0, 1.0 - sum(d.values()))
        missing = [u for u in union if u not in d]
        share = tail / (len(missing) + 1)
        vec = np.array([d.get(u, share) for u in union] + [share], dtype=np.float64)
        return vec / vec.sum() if vec.sum() > 0 else vec

    P, Q = dist(p), dist(q)
    mask = P > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(P[mask] * (np.log(P[mask]) - np.log(np.maximum(Q[mask], 1e-300)))))


def token_influence(with_tokens, without_tokens, think) -> dict[str, np.ndarray | float]:
    """The images' influence on each token of one step, from its top-k under two contexts (same tokens).

    ``with_tokens`` / ``without_tokens``: the step's tokens (objects with ``.top``: ids and logprobs) scored
    with and without the query images; ``think``: the step's think mask. Returns per think token ``dH`` (the
    grouped-tail entropy with minus without) and ``kl`` (:func:`kl_union_tail`, KL(with ‖ without)), their
    positions ``pos`` in the step, and the means over think tokens ``dH_mean``, ``kl_mean``, ``H_with``,
    ``H_without`` (NaN when the step has no think token). The entropy probe's teacher-forced mode and the
    adaptive image release (``agent.release``) both use it, so their numbers are the same quantity.
    """
    from agent.backends.base import top_matrix

    think = np.asarray(think, dtype=bool)
    if len(with_tokens) != len(without_tokens) or len(with_tokens) != len(think):
        raise ValueError(f"token_influence: {len(with_tokens)} tokens with, {len(without_tokens)} without, "
                         f"{len(think)} think flags")
    k = max([len(t.top_logprobs()) for t in (*with_tokens, *without_tokens)] or [1])
    hw = grouped_tail_entropy(top_matrix(list(with_tokens), k))
    ho = grouped_tail_entropy(top_matrix(list(without_tokens), k))
    pos = np.flatnonzero(think)
    kl = np.array([kl_union_tail(with_tokens[i].top_ids(), with_tokens[i].top_logprobs(),
                                 without_tokens[i].top_ids(), without_tokens[i].top_logprobs()) for i in pos],
                  dtype=np.float64)
    dH = (hw - ho)[pos]
    mean = (lambda a: float(np.mean(a)) if len(a) else float("nan"))
    return {"pos": pos.astype(np.int32), "dH": dH, "kl": kl, "H_with": mean(hw[pos]), "H_without": mean(ho[pos]),
            "dH_mean": mean(dH), "kl_mean": mean(kl), "per_token_H_with": hw, "per_token_H_without": ho}
