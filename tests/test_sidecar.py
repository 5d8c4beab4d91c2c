"""The token sidecar (agent/rundir/sidecar.py): plain Parquet (format 3) that any reader sees as its true values,
lossless round trips, and files of formats 1 and 2 still read."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent.rundir import sidecar

FIXTURES = Path(__file__).parent / "fixtures"


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
def test_format3_round_trip_is_exact(tmp_path, seed):
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
    assert sidecar.schema_problems(sidecar.read_schema(p)) == []
    with pytest.raises(ValueError, match="no column"):
        sidecar.decode(p, ["unload_kl"])


def test_plain_pyarrow_reads_every_value_as_itself(tmp_path):
    """No toolkit code: ids, logprobs and the top-20 alternatives are their true values; a shorter top list is a
    shorter list, a missing logprob a null."""
    rng = np.random.default_rng(7)
    tok = _tokens(rng, calls=(4, 9))
    tok[9]["logprob"][3] = np.nan
    p = tmp_path / "s.parquet"
    p.write_bytes(sidecar.encode(tok, 20))
    t = pq.read_table(p)
    assert t.schema.field("top_ids").type == pa.list_(pa.int32())
    assert t.schema.field("top_logprobs").type == pa.list_(pa.float32())
    assert t.column("id").to_pylist() == _concat(tok, "id").tolist()
    lp = t.column("logprob").to_pylist()
    want = _concat(tok, "logprob")
    assert lp[len(tok[4]["id"]) + 3] is None
    assert [x for x in lp if x is not None] == want[~np.isnan(want)].tolist()
    tops, top_lps = t.column("top_ids").to_pylist(), t.column("top_logprobs").to_pylist()
    all_ids, all_lps = _concat(tok, "top_ids"), _concat(tok, "top_logprobs")
    for i in range(len(tops)):
        assert tops[i] == [x for x in all_ids[i].tolist() if x >= 0]
        assert top_lps[i] == [x for x in all_lps[i].tolist() if x == x]
    assert len(tops[len(tok[4]["id"])]) == 15                  # the position with 15 alternatives
    df = t.to_pandas()                                         # and pandas, with nothing of ours
    assert df["call"].tolist() == _concat({c: {"id": np.full(len(tok[c]["id"]), c)} for c in tok}, "id").tolist()


def test_float16_precision_rounds_the_alternatives_only(tmp_path):
    rng = np.random.default_rng(3)
    tok = _tokens(rng, calls=(1,))
    tok[1]["top_ids"][:] = -1                       # a chat server gives no ids
    p = tmp_path / "s.parquet"
    p.write_bytes(sidecar.encode(tok, 20, "float16"))
    got = sidecar.decode(p)
    assert np.array_equal(got["id"], tok[1]["id"]) and (got["top_ids"] == -1).all()
    assert pq.read_table(p).column("top_ids").null_count == len(tok[1]["id"])
    want = tok[1]["top_logprobs"].astype(np.float16).astype(np.float32)
    assert np.array_equal(got["top_logprobs"], want, equal_nan=True)
    assert np.array_equal(got["logprob"], tok[1]["logprob"])  # the chosen logprob stays float32


