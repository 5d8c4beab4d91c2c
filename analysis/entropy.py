"""Entropy of next-token distributions from top-k log-probabilities (paper §3.2.2, B.4).

    from analysis.entropy import grouped_tail_entropy
    H = grouped_tail_entropy(top_logprobs)        # (..., k) -> (...), nats

Everything here is in nats and vectorised with numpy; nothing loops over tokens in Python.
"""
from __future__ import annotations

import numpy as np

__all__ = ["grouped_tail_entropy", "exact_entropy_from_logprobs", "tail_mass"]


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
    lp = np.asarray(top_logprobs, dtype=np.float64)
    if lp.ndim == 0:
        raise ValueError("top_logprobs must have a last axis of size k (got a scalar)")
    lp = np.where(np.isnan(lp), -np.inf, lp)
    lp = np.minimum(lp, 0.0)  # a logprob can exceed 0 only by rounding
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        plogp = np.where(p > 0.0, p * lp, 0.0)
    rest = np.clip(1.0 - p.sum(axis=-1), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rest_term = np.where(rest > 0.0, rest * np.log(np.where(rest > 0.0, rest, 1.0)), 0.0)
    return -plogp.sum(axis=-1) - rest_term


def exact_entropy_from_logprobs(logprobs) -> np.ndarray:
    """Exact entropy of full (normalised) log-probability vectors, shape (..., V) -> (...)."""
    lp = np.asarray(logprobs, dtype=np.float64)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        return -np.where(p > 0.0, p * lp, 0.0).sum(axis=-1)
