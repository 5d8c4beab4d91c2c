"""The array paths that replaced per-token objects: wire -> TokenArrays, the vectorised KL, chunked entropy,
the HTTP client pool. Each is checked against a plain reference implementation."""
from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pytest

from agent.backends.base import TokenArrays, top_id_matrix, top_matrix
from agent.backends.wire import tokens_from_triples
from analysis.estimators import entropy as E
from analysis.estimators import influence as I


def _triples(rng, n=40, k=5, vocab=500):
    out, tops = [], []
    for _ in range(n):
        lp = np.sort(np.log(rng.dirichlet(np.ones(k + 3))[:k]))[::-1]
        ids = rng.choice(vocab, k, replace=False)
        tops.append([[float(a), int(b), None] for a, b in zip(lp, ids)])
        out.append([float(lp[0]), int(ids[0]), None])
    return out, tops


def test_wire_to_arrays_matches_the_checked_path():
    rng = np.random.default_rng(0)
    out, tops = _triples(rng)
    texts = {i: f"<t{i}>" for i in range(500)}
    fast = tokens_from_triples(out, tops, decode=texts.__getitem__)
    assert isinstance(fast, TokenArrays)
    ragged = [r[:-1] if i == 3 else r for i, r in enumerate(tops)]  # one short list: the checked path
    slow = tokens_from_triples(out, ragged, decode=texts.__getitem__)
    assert isinstance(slow, TokenArrays) and slow.counts[3] == 4  # one representation, whatever the path
    for i in (0, 7, 39):
        a, b = fast[i], slow[i]
        assert (a.id, a.text, a.logprob) == (b.id, b.text, b.logprob)
        assert [t.id for t in a.top] == [t.id for t in b.top] and [t.logprob for t in a.top] == [t.logprob for t in b.top]
    assert np.array_equal(top_matrix(fast, 5), np.array([[t[0] for t in r] for r in tops]))
    assert np.array_equal(top_id_matrix(fast, 6)[:, 5], np.full(40, -1))  # padded to k
    # unsorted, null, NaN: never the fast path (the checked path sorts or names the problem)
    bad = [list(r) for r in tops]
    bad[2] = list(reversed(bad[2]))
    sorted_back = tokens_from_triples(out, bad)  # unsorted: the checked path sorts it
    assert np.array_equal(sorted_back.top_logprobs, fast.top_logprobs)
    assert tokens_from_triples(out, [None] + tops[1:]).counts[0] == 0


def _kl_reference(ids_p, lps_p, ids_q, lps_q):
    def side(ids, lps):
        return {int(i): math.exp(min(lp, 0.0)) for i, lp in zip(ids, lps) if i >= 0 and np.isfinite(lp)}
    p, q = side(ids_p, lps_p), side(ids_q, lps_q)
    union = sorted(set(p) | set(q))

    def dist(d):
        tail = max(0.0, 1.0 - sum(d.values()))
        share = tail / (len([u for u in union if u not in d]) + 1)
        v = np.array([d.get(u, share) for u in union] + [share])
        return v / v.sum() if v.sum() > 0 else v
    P, Q = dist(p), dist(q)
    m = P > 0
    return float(np.sum(P[m] * (np.log(P[m]) - np.log(np.maximum(Q[m], 1e-300)))))


def test_vectorised_kl_equals_the_definition():
    """400 rows: two chunks of analysis.estimators.influence._KL_CHUNK, the first with absent entries (the masked path), the
    second without (the path without masks)."""
    assert I._KL_CHUNK < 400
    rng = np.random.default_rng(1)
    n, k = 400, 20
    def rows():
        g = rng.gamma(0.3, size=(n, 40))
        p = g / g.sum(1, keepdims=True)
        o = np.argsort(-p, axis=1)[:, :k]
        return o.astype(np.int64), np.log(np.take_along_axis(p, o, 1))
    ip, lp = rows()
    iq, lq = rows()
    iq[:50], lq[:50] = ip[:50], lp[:50]          # identical rows: 0
    lp[5, 18:], ip[5, 18:] = np.nan, -1          # padding
    iq[7] = -1                                    # a side without ids
    got = I.kl_union_tail_rows(ip, lp, iq, lq)
    ref = np.array([_kl_reference(ip[i], lp[i], iq[i], lq[i]) for i in range(n)])
    same = [i for i in range(50) if i not in (5, 7)]
    assert np.allclose(got, ref, atol=1e-12) and np.allclose(got[same], 0, atol=1e-12)
    assert I.kl_union_tail(ip[9], lp[9], iq[9], lq[9]) == pytest.approx(ref[9], abs=1e-12)


def test_the_kl_of_fully_listed_rows_equals_the_masked_arithmetic():
    """Rows where every alternative is listed take a path without masks (analysis.estimators.influence._kl_full): the same
    values as the masked path (reached by giving one row an absent entry), also with underflowed probabilities,
    logprobs rounded above 0, lists of different lengths, identical lists and disjoint ones."""
    rng = np.random.default_rng(5)
    for trial in range(20):
        n, kp, kq = int(rng.integers(1, 200)), int(rng.integers(1, 22)), int(rng.integers(1, 22))

        def rows(k):
            g = rng.gamma(rng.uniform(0.02, 2.0), size=(n, 60))
            p = g / g.sum(1, keepdims=True)
            o = np.argsort(-p, axis=1)[:, :k]
            return o.astype(np.int64), np.log(np.maximum(np.take_along_axis(p, o, 1), 1e-320))
        ip, lp = rows(kp)
        iq, lq = rows(kq)
        if trial % 3 == 0:
            lp[rng.random(lp.shape) < 0.05] = -800.0
            lq[rng.random(lq.shape) < 0.05] = -1000.0
        if trial % 4 == 0:
            lp[:, 0], lq[:, 0] = 1e-7, 2e-7
        if trial % 5 == 0 and kp == kq:
            iq[: n // 2], lq[: n // 2] = ip[: n // 2], lp[: n // 2]
        if trial % 7 == 0:
            iq += 1000  # nothing in common
        fast = I.kl_union_tail_rows(ip, lp, iq, lq)
        ip2, lp2 = np.concatenate([ip, np.full((n, 1), -1)], 1), np.concatenate([lp, np.full((n, 1), np.nan)], 1)
        masked = I.kl_union_tail_rows(ip2, lp2, iq, lq)   # the absent entry changes nothing
        ref = np.array([_kl_reference(ip[i], lp[i], iq[i], lq[i]) for i in range(min(n, 30))])
        assert np.allclose(fast, masked, rtol=0, atol=1e-12), trial
        assert np.allclose(fast[:30], ref, rtol=1e-9, atol=1e-12), trial
    with pytest.raises(ValueError, match="matrices"):
        I.kl_union_tail_rows(np.zeros((3, 2)), np.zeros((3, 3)), np.zeros((3, 2)), np.zeros((3, 2)))


def test_chunked_entropy_across_chunk_boundaries(monkeypatch):
    rng = np.random.default_rng(2)
    lp = np.log(rng.dirichlet(np.ones(30), size=1000)[:, :20])
    lp[::97, 15:] = np.nan
    lp[5, 3] = -np.inf
    ref = []
    for row in lp:  # the definition, one row at a time, float64
        p = np.exp(row[np.isfinite(row)])
        rest = max(0.0, 1 - p.sum())
        ref.append(-(p * np.log(p)).sum() - (rest * math.log(rest) if rest > 0 else 0.0))
    monkeypatch.setattr(E, "_CHUNK_ROWS", 64)  # many chunks and a ragged last one
    assert np.allclose(E.grouped_tail_entropy(lp), ref, atol=1e-12)
    assert np.allclose(E.grouped_tail_entropy(lp.astype(np.float32)), ref, atol=2e-6)
    assert E.grouped_tail_entropy(lp.reshape(10, 100, 20)).shape == (10, 100)


def test_float32_arithmetic_on_float64_input_equals_converting_first(monkeypatch):
    """The probe computes the regenerated side in float32 straight from the reply's float64 arrays: the result
    must be exactly what the recorded side (stored as float32) would give, bit for bit."""
    rng = np.random.default_rng(4)
    lp = np.log(rng.dirichlet(np.full(40, 0.2), size=3000)[:, :20])
    lp[::101, 12:] = np.nan
    lp[7, 0] = 1e-9  # a logprob above 0 by rounding
    monkeypatch.setattr(E, "_CHUNK_ROWS", 256)
    a = E.grouped_tail_entropy(lp, compute=np.float32)
    b = E.grouped_tail_entropy(lp.astype(np.float32))
    assert np.array_equal(a, b)
    assert top_matrix(TokenArrays.from_tokens([], 20), 20, copy=False).shape == (0, 20)


def test_call_slices_match_the_definition():
    from probes.entropy.step import call_slices

    for call in (np.repeat([1, 2, 3, 5], [4, 1, 7, 2]).astype(np.int16), np.array([2, 2, 1, 1, 2], np.int16),
                 np.zeros(0, np.int16)):
        got = call_slices(call)
        assert sorted(got) == sorted(set(call.tolist()))
        for c, sel in got.items():
            assert np.array_equal(np.flatnonzero(call == c), np.arange(len(call))[sel])


def test_client_pool_spreads_requests(monkeypatch):
    import httpx

    from agent.http import ClientPool

    seen = []

    async def handler(request):
        seen.append(request.url.path)
        await asyncio.sleep(0.01)
        return httpx.Response(200, json={"ok": True})

    pool = ClientPool({"transport": httpx.MockTransport(handler)})

    async def go():
        rs = await asyncio.gather(*(pool.post(f"http://x/{i}") for i in range(20)))
        n = len(pool._clients)
        await pool.aclose()
        return rs, n
    rs, n = asyncio.run(go())
    assert all(json.loads(r.content) == {"ok": True} for r in rs) and len(seen) == 20
    assert n == 3  # 20 in flight, at most 8 per member


def test_closing_the_client_pool_under_requests_in_flight_ends_them_cleanly():
    """A run stopped by a signal closes its pool, then its requests in flight are cancelled: each ends with the
    cancellation, never an error of the pool's own bookkeeping (an IndexError once)."""
    import httpx

    from agent.http import ClientPool

    started = asyncio.Event()

    async def handler(request):
        started.set()
        await asyncio.sleep(3600)  # never answers: cancelled below

    pool = ClientPool({"transport": httpx.MockTransport(handler)})

    async def go():
        tasks = [asyncio.ensure_future(pool.post(f"http://x/{i}")) for i in range(12)]
        await started.wait()
        await pool.aclose()
        for t in tasks:
            t.cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)
    ends = asyncio.run(go())
    assert all(isinstance(e, asyncio.CancelledError) for e in ends), ends
