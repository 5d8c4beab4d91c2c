"""The token sidecar (agent/rundir/sidecar.py): plain Parquet (format 3) that any reader sees as its true values,
lossless round trips, and files of formats 1 and 2 still read."""
from __future__ import annotations

import io
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
    assert sidecar.sidecar_format(p) == 3
    with pytest.raises(ValueError, match="no column"):
        sidecar.decode(p, ["release_kl"])


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


@pytest.mark.parametrize("name", ["sidecar-format2.parquet", "sidecar-format2-float16.parquet"])
def test_format2_files_still_read(name):
    """Sidecars written by runs before format 3 (fixtures written by that code): every array as it was encoded."""
    exp = np.load(FIXTURES / "sidecar-format2-expected.npz")
    p = FIXTURES / name
    assert sidecar.sidecar_format(p) == 2
    got = sidecar.decode(p)
    for col in ("id", "think", "top_ids", "call"):
        assert np.array_equal(got[col], exp[col]), col
    assert got["text"].tolist() == exp["text"].tolist()
    tol = 2e-3 if "float16" in name else 0  # format 2's float16 read the chosen logprob from the rounded list too
    assert np.allclose(got["logprob"], exp["logprob"], rtol=tol, atol=0, equal_nan=True)
    assert np.allclose(got["top_logprobs"], exp["top_logprobs"], rtol=tol, atol=0, equal_nan=True)
    assert np.array_equal(sidecar.decode(p, ["id"])["id"], exp["id"])


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


def test_upgrade_rewrites_old_sidecars_as_plain_parquet(tmp_path, capsys):
    """``python -m agent.rundir upgrade``: format 1 and 2 files become format 3 with the same arrays; a second pass
    has nothing to do; a file that is not Parquet, or a directory that is not a run, is named and refused."""
    from agent.rundir.upgrade import main as upgrade

    run = tmp_path / "run"
    (run / "tokens").mkdir(parents=True)
    (run / "header.json").write_text("{}")
    for name in ("sidecar-format2.parquet", "sidecar-format2-float16.parquet"):
        (run / "tokens" / name).write_bytes((FIXTURES / name).read_bytes())
    from agent.backends.pieces import pack_pieces
    n, k = 4, 2                                 # a format-1 file (raw columns) carrying prompt pieces
    t = pa.table({"call": np.ones(n, np.int16), "pos": np.arange(n, dtype=np.int32), "id": np.arange(n, dtype=np.int32),
                  "logprob": np.full(n, -0.5, np.float32), "think": np.ones(n, bool),
                  "top_ids": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * k, dtype=np.int32)), k),
                  "top_logprobs": pa.FixedSizeListArray.from_arrays(pa.array(np.full(n * k, -1.0, np.float32)), k)})
    pieces = {b"d" * 16: np.array([5, 6, 7], np.int32)}
    with pq.ParquetWriter(run / "tokens" / "old1.parquet", t.schema) as w:
        w.write_table(t)
        w.add_key_value_metadata({b"mmcf.tokenizer": b"tok-1", b"mmcf.prompt_pieces": pack_pieces(pieces)})
    before = {p.name: sidecar.decode(p) for p in (run / "tokens").iterdir()}
    assert upgrade([str(run)]) == 0
    assert "3 sidecar(s) rewritten as plain Parquet" in capsys.readouterr().out
    fp, got_pieces = sidecar.read_prompt_pieces(run / "tokens" / "old1.parquet")
    assert fp == "tok-1" and got_pieces[b"d" * 16].tolist() == [5, 6, 7]
    for p in (run / "tokens").iterdir():
        assert sidecar.sidecar_format(p) == 3
        got, old = sidecar.decode(p), before[p.name]
        assert set(got) >= set(old) - {"chosen"}
        for col in set(old) - {"chosen"}:
            if got[col].dtype.kind == "f":
                assert np.array_equal(got[col], old[col], equal_nan=True), col
            else:
                assert got[col].tolist() == old[col].tolist(), col
        assert pq.read_table(p).column("id").to_pylist() == old["id"].tolist()   # now plain to any reader
    assert upgrade([str(run)]) == 0 and "nothing to do" in capsys.readouterr().out
    (run / "tokens" / "torn.parquet").write_bytes(b"PAR1 not really")
    assert upgrade([str(run)]) == 2 and "torn.parquet: not a readable Parquet file" in capsys.readouterr().err
    assert upgrade([str(tmp_path / "nope")]) == 2 and "not a run directory" in capsys.readouterr().err
