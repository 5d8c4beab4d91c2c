"""How much the query images change each think token's distribution: KL(with ‖ without) on the union of the two
top-k supports plus one tail bin (ours, teacher-forced probe; paper §3.2.2 measures the entropy difference).
"""
from __future__ import annotations

import numpy as np

from .entropy import entropy_high, grouped_tail_entropy

__all__ = ["kl_union_tail", "kl_union_tail_rows", "token_influence"]


def kl_union_tail(ids_p, lps_p, ids_q, lps_q) -> float:
    """KL(P || Q) in nats between two top-k lists of one position, on the union of their supports + a tail bin.

    Each side's known probabilities are its top-k; a union token missing from one side's top-k gets
    an even share of that side's tail mass (1 - sum of its top-k), shared with one "rest" bin that
    holds everything else. Both sides are then normalised distributions over the same bins, so the
    value is finite. It approximates the KL of the full distributions and is exact when both top-k
    lists cover the same tokens and the tails are equal. NaN / -1 padding is ignored.
    """
    def row(x, dtype, fill):
        a = np.array([fill if v is None else v for v in x], dtype=dtype).reshape(1, -1)
        return a if a.size else np.full((1, 1), fill, dtype=dtype)
    return float(kl_union_tail_rows(row(ids_p, np.int64, -1), row(lps_p, np.float64, np.nan),
                                    row(ids_q, np.int64, -1), row(lps_q, np.float64, np.nan))[0])


def kl_union_tail_rows(ids_p, lps_p, ids_q, lps_q) -> np.ndarray:
    """:func:`kl_union_tail` for every row of (n, k) id and logprob matrices at once (no Python loop). The
    matches between the two top lists are one comparison cube, summed by one product (ours). Every array is
    turned to (k, n), the rows innermost, so each comparison, product and sum over the k alternatives runs
    over contiguous rows: an (n, k, k) cube's inner loops are only k = 20 long (ours; equal to the definition to
    ~1e-15, tested). Rows where every
    entry is listed (ids >= 0, finite logprobs: a server's top-k) take a path without masks."""
    ids_p, ids_q, lps_p, lps_q = (np.asarray(x) for x in (ids_p, ids_q, lps_p, lps_q))
    if ids_p.ndim != 2 or ids_p.shape != lps_p.shape or ids_q.shape != lps_q.shape or len(ids_p) != len(ids_q):
        raise ValueError(f"kl_union_tail_rows: ids and logprobs must be (n, k) matrices with the same rows, got "
                         f"{ids_p.shape} / {lps_p.shape} and {ids_q.shape} / {lps_q.shape}")
    it = np.int32 if max(int(ids_p.max(initial=0)), int(ids_q.max(initial=0))) < 2**31 else np.int64
    return np.concatenate([_kl_chunk(ids_p[s:s + _KL_CHUNK], lps_p[s:s + _KL_CHUNK], ids_q[s:s + _KL_CHUNK],
                                     lps_q[s:s + _KL_CHUNK], it) for s in range(0, len(ids_p), _KL_CHUNK)]) \
        if len(ids_p) else np.zeros(0)


#: Rows per chunk of :func:`kl_union_tail_rows`: a chunk's transposed copies, its comparison cube (20 x 20 x 256
#: booleans, 100 KB) and float temporaries stay in cache and in memory the allocator keeps; a step's ~1,000 rows at
#: once made ~2 MB of temporaries, fresh pages from the kernel on every call (docs/performance.md).
_KL_CHUNK = 256


def _kl_chunk(ids_p, lps_p, ids_q, lps_q, it) -> np.ndarray:
    """One chunk of rows turned to (k, n) copies (order="C": a transposed copy, not a view), then the path."""
    ip, iq = ids_p.T.astype(it, order="C"), ids_q.T.astype(it, order="C")
    lp, lq = lps_p.T.astype(np.float64, order="C"), lps_q.T.astype(np.float64, order="C")
    if ip.size and iq.size and ip.min() >= 0 and iq.min() >= 0 and np.isfinite(lp).all() and np.isfinite(lq).all():
        return _kl_full(ip, lp, iq, lq)
    return _kl_masked(ip, lp, iq, lq)


_LOG_TINY = float(np.log(1e-300))


def _kl_masked(ip, lp, iq, lq) -> np.ndarray:
    """:func:`kl_union_tail_rows` on (k, n) arrays: any entry may be absent (id < 0 or a NaN / -inf logprob)."""
    vp = (ip >= 0) & np.isfinite(lp)
    vq = (iq >= 0) & np.isfinite(lq)
    p = np.exp(np.minimum(np.where(vp, lp, -np.inf), 0.0))
    q = np.exp(np.minimum(np.where(vq, lq, -np.inf), 0.0))
    # invalid entries get sentinels that match nothing (P's -1, Q's -2): no mask over the cube
    ip = np.where(vp, ip, -1)
    iq = np.where(vq, iq, -2)
    same = ip[:, None, :] == iq[None, :, :]                # (kp, kq, n): P's i-th token is Q's j-th
    in_q = same.any(axis=1)                                # (kp, n): P's token listed by Q
    only_q = vq & ~same.any(axis=0)                        # (kq, n): Q's token not listed by P
    q_at_p = np.einsum("ijn,jn->in", same, q)              # Q's probability of each P token (0: unlisted)
    miss_p = only_q.sum(axis=0)
    miss_q = (vp & ~in_q).sum(axis=0)
    sp_, sq_ = p.sum(axis=0), q.sum(axis=0)
    share_p = np.maximum(0.0, 1.0 - sp_) / (miss_p + 1)
    share_q = np.maximum(0.0, 1.0 - sq_) / (miss_q + 1)
    zp = sp_ + (miss_p + 1) * share_p
    Qp = np.where(in_q, q_at_p, share_q)
    zq = np.where(only_q, q, 0.0).sum(axis=0) + np.where(vp, Qp, 0.0).sum(axis=0) + share_q
    zp = np.where(zp > 0, zp, 1.0)
    zq = np.where(zq > 0, zq, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        P = p / zp
        Q = Qp / zq
        t1 = np.where(vp & (P > 0), P * (np.log(P) - np.log(np.maximum(Q, 1e-300))), 0.0).sum(axis=0)
        Pr, Qr = share_p / zp, share_q / zq
        Qq = q / zq
        t2 = np.where(only_q & (Pr > 0), Pr * (np.log(Pr) - np.log(np.maximum(Qq, 1e-300))), 0.0).sum(axis=0)
        t3 = np.where(Pr > 0, Pr * (np.log(Pr) - np.log(np.maximum(Qr, 1e-300))), 0.0)
    return t1 + t2 + t3


def _kl_full(ip, lp, iq, lq) -> np.ndarray:
    """:func:`_kl_masked` where every entry is listed: the same arithmetic without the masks, and the logs of the
    listed probabilities taken from the logprobs (log(p / z) = lp - log z) instead of computed again."""
    kp = ip.shape[0]
    lp = np.minimum(lp, 0.0) if lp.max() > 0.0 else lp   # a logprob above 0 only by rounding
    lq = np.minimum(lq, 0.0) if lq.max() > 0.0 else lq
    p, q = np.exp(lp), np.exp(lq)
    same = ip[:, None, :] == iq[None, :, :]
    in_q = same.any(axis=1)
    only_q = ~same.any(axis=0)
    q_at_p = np.einsum("ijn,jn->in", same, q)
    miss_p = only_q.sum(axis=0)
    miss_q = kp - in_q.sum(axis=0)
    sp_, sq_ = p.sum(axis=0), q.sum(axis=0)
    share_p = np.maximum(0.0, 1.0 - sp_) / (miss_p + 1)
    share_q = np.maximum(0.0, 1.0 - sq_) / (miss_q + 1)
    zp = sp_ + (miss_p + 1) * share_p
    Qp = np.where(in_q, q_at_p, share_q)
    zq = (q * only_q).sum(axis=0) + Qp.sum(axis=0) + share_q
    zp = np.where(zp > 0, zp, 1.0)
    zq = np.where(zq > 0, zq, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        Qp /= zq
        logQ = np.log(np.maximum(Qp, 1e-300, out=Qp))
        t1 = ((p / zp) * ((lp - np.log(zp)) - logQ)).sum(axis=0)  # an underflowed p: 0 x (finite) = 0
        Pr, Qr = share_p / zp, share_q / zq
        lPr = np.log(Pr)
        lQq = np.maximum(lq - np.log(zq), _LOG_TINY)           # log max(q / zq, 1e-300)
        t2 = np.where(Pr > 0, Pr * (miss_p * lPr - (lQq * only_q).sum(axis=0)), 0.0)
        t3 = np.where(Pr > 0, Pr * (lPr - np.log(np.maximum(Qr, 1e-300))), 0.0)
    return t1 + t2 + t3


def token_influence(with_tokens, without_tokens, think, vocab: int | None = None) -> dict[str, np.ndarray | float]:
    """The images' influence on each token of one step, from its top-k under two contexts (same tokens).

    ``with_tokens`` / ``without_tokens``: the step's tokens (``top_ids`` and ``top_logprobs``, (n, k) arrays, as an
    ``agent.backends.TokenArrays`` holds them) scored
    with and without the query images; ``think``: the step's think mask. Returns per think token ``dH`` (the
    grouped-tail entropy with minus without) and ``kl`` (:func:`kl_union_tail`, KL(with ‖ without)), their
    positions ``pos`` in the step, and the means over think tokens ``dH_mean``, ``kl_mean``, ``H_with``,
    ``H_without`` (NaN when the step has no think token). The entropy probe's teacher-forced mode and the
    adaptive image unloading (``agent.methods.unload``) both use it, so their numbers are the same quantity. With
    ``vocab`` (the model's vocabulary size) also the upper entropy bounds of :func:`entropy_bounds`
    (``H_high_with`` / ``H_high_without`` and per token).
    """

    think = np.asarray(think, dtype=bool)
    if len(with_tokens) != len(without_tokens) or len(with_tokens) != len(think):
        raise ValueError(f"token_influence: {len(with_tokens)} tokens with, {len(without_tokens)} without, "
                         f"{len(think)} think flags")
    k = max(1, with_tokens.top_logprobs.shape[1], without_tokens.top_logprobs.shape[1])
    w_ids, w_lp = _columns(with_tokens.top_ids, k, -1, np.int32), _columns(with_tokens.top_logprobs, k, np.nan, np.float64)
    o_ids, o_lp = (_columns(without_tokens.top_ids, k, -1, np.int32),
                   _columns(without_tokens.top_logprobs, k, np.nan, np.float64))
    hw = grouped_tail_entropy(w_lp)
    ho = grouped_tail_entropy(o_lp)
    pos = np.flatnonzero(think)
    bounds = {}
    if vocab:  # the upper bounds too (entropy_bounds; the lower ones are hw / ho)
        bounds = {"per_token_H_high_with": entropy_high(w_lp, hw, vocab),
                  "per_token_H_high_without": entropy_high(o_lp, ho, vocab)}
        bounds["H_high_with"] = float(np.mean(bounds["per_token_H_high_with"][pos])) if len(pos) else float("nan")
        bounds["H_high_without"] = float(np.mean(bounds["per_token_H_high_without"][pos])) if len(pos) else float("nan")
    kl = kl_union_tail_rows(w_ids[pos], w_lp[pos], o_ids[pos], o_lp[pos]) \
        if len(pos) else np.zeros(0)
    dH = (hw - ho)[pos]
    mean = (lambda a: float(np.mean(a)) if len(a) else float("nan"))
    return {"pos": pos.astype(np.int32), "dH": dH, "kl": kl, "H_with": mean(hw[pos]), "H_without": mean(ho[pos]),
            "dH_mean": mean(dH), "kl_mean": mean(kl), "per_token_H_with": hw, "per_token_H_without": ho, **bounds}


def _columns(a: np.ndarray, k: int, fill, dtype) -> np.ndarray:
    """``a`` (n, m <= k) as (n, k) of ``dtype``, the missing columns ``fill`` (a server gave fewer than k)."""
    out = np.full((a.shape[0], k), fill, dtype=dtype)
    out[:, :a.shape[1]] = a
    return out
