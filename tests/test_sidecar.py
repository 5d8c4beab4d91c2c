"""The token sidecar (agent/rundir/sidecar.py): lossless round trips of format 2, and format-1 files still read."""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent.rundir import sidecar


def _tokens(rng, calls=(1, 2, 3), k=20, vocab=248_000):
    out = {}
    for c in calls:
        n = int(rng.integers(1, 300))
        g = rng.gamma(0.3, size=(n, 64))
        lp = np.log(-np.sort(-(g / g.sum(1, keepdims=True)), axis=1)[:, :k]).astype(np.float32)
        ids = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(n)]).astype(np.int32)
        chosen = ids[:, 0].copy()
        clp = lp[:, 0].copy()
        off = rng.random(n) < 0.1                     # sampled outside the top list: id and logprob of their own
        chosen[off] = vocab + rng.integers(0, 1000, off.sum())
        clp[off] = -9.5
        other = (~off) & (rng.random(n) < 0.2)        # sampled the 2nd alternative
        chosen[other], clp[other] = ids[other, 1], lp[other, 1]
        out[c] = {"id": chosen, "logprob": clp, "think": rng.random(n) < 0.8, "top_ids": ids, "top_logprobs": lp,
                  "text": np.array([f"t{i}" for i in chosen], dtype=object),
                  "exact_entropy": np.full(n, np.nan, np.float32)}
    # a chat server: fewer alternatives at one position, no ids at all
    out[calls[-1]]["top_logprobs"][0, 15:] = np.nan
    out[calls[-1]]["top_ids"][0, 15:] = -1
    return out


def _concat(tokens, name):
    return np.concatenate([tokens[c][name] for c in sorted(tokens)])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_format2_round_trip_is_exact(tmp_path, seed):
    rng = np.random.default_rng(seed)
    tok = _tokens(rng)
    p = tmp_path / "s.parquet"
    p.write_bytes(sidecar.encode(tok, 20))
    got = sidecar.decode(p)
    for name in ("id", "think", "top_ids", "text"):
        assert np.array_equal(got[name], _concat(tok, name)), name
    for name in ("logprob", "top_logprobs", "exact_entropy"):  # bit for bit, NaN padding included
        assert np.array_equal(got[name].view(np.int32), _concat(tok, name).astype(np.float32).view(np.int32)), name
    assert np.array_equal(got["call"], np.repeat(sorted(tok), [len(tok[c]["id"]) for c in sorted(tok)]))
    # a subset of columns reads only what it needs, and agrees
    sub = sidecar.decode(p, ["logprob", "call"])
    assert set(sub) == {"logprob", "call"} and np.array_equal(sub["logprob"], got["logprob"], equal_nan=True)
    ids = sidecar.decode(p, ["id"])["id"]  # the chosen ids alone: picked from the ranks, not the mapped matrix
    assert np.array_equal(ids, _concat(tok, "id")) and np.array_equal(sidecar.decode(p, ["top_ids", "id"])["id"], ids)
    with pytest.raises(ValueError, match="no column"):
        sidecar.decode(p, ["release_kl"])


def test_undelta_is_the_wrapping_running_sum():
    rng = np.random.default_rng(5)
    d = rng.integers(-(2**31), 2**31, size=(257, 20), dtype=np.int64).astype(np.int32)
    assert np.array_equal(sidecar._undelta(d), np.cumsum(d, axis=1, dtype=np.int32))
    assert sidecar._undelta(np.zeros((0, 20), np.int32)).shape == (0, 20)


def test_ids_without_a_top_list_and_float16(tmp_path):
    rng = np.random.default_rng(3)
    tok = _tokens(rng, calls=(1,))
    tok[1]["top_ids"][:] = -1                       # a chat server gives no ids
    p = tmp_path / "s.parquet"
    p.write_bytes(sidecar.encode(tok, 20, "float16"))
    got = sidecar.decode(p)
    assert np.array_equal(got["id"], tok[1]["id"]) and (got["top_ids"] == -1).all()
    assert np.array_equal(sidecar.decode(p, ["id"])["id"], tok[1]["id"])
    assert np.allclose(got["top_logprobs"], tok[1]["top_logprobs"], rtol=2e-3, equal_nan=True)
    assert np.array_equal(got["logprob"], tok[1]["logprob"])  # the chosen logprob stays float32


def test_format1_files_still_read(tmp_path):
    """Sidecars written before format 2: raw columns, no metadata."""
    n, k = 5, 3
    t = pa.table({"call": np.ones(n, np.int16), "pos": np.arange(n, dtype=np.int32), "id": np.arange(n, dtype=np.int32),
                  "logprob": np.full(n, -0.5, np.float32), "think": np.ones(n, bool),
                  "top_ids": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * k, dtype=np.int32)), k),
                  "top_logprobs": pa.FixedSizeListArray.from_arrays(pa.array(np.full(n * k, -1.0, np.float32)), k),
                  "exact_entropy": np.full(n, np.nan, np.float32)})
    buf = io.BytesIO()
    pq.write_table(t, buf)
    p = tmp_path / "old.parquet"
    p.write_bytes(buf.getvalue())
    got = sidecar.decode(p)
    assert got["top_ids"].shape == (n, k) and got["top_ids"][1, 0] == 3 and (got["top_logprobs"] == -1.0).all()
    assert np.array_equal(sidecar.decode(p, ["id"])["id"], np.arange(n))


def test_frequent_ids_get_small_ranks():
    ids = np.array([[5, 9, 7], [9, 5, 3], [9, 2, -1]], dtype=np.int32)
    ranks, d = sidecar.rank_ids(ids)
    assert d[0] == 9 and d[1] == 5 and ranks[2, 2] == -1
    assert np.array_equal(np.where(ranks >= 0, d[np.maximum(ranks, 0)], -1), ids)
