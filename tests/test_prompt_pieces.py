"""A run records the token ids it sent, by message piece (agent/backends/pieces.py), and the probes send those very
ids again: against the loopback SGLang with the tiny model's real tokenizer and chat template."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from agent.backends.pieces import (
    PieceBook,
    lend_pieces,
    pack_pieces,
    piece_digest,
    tokenizer_fingerprint,
    unpack_pieces,
)
from agent.backends.sglang_native import SGLangBackend
from agent.rundir import load_run
from agent.rundir.sidecar import encode, read_prompt_pieces
from probes.entropy import main as entropy_main
from serving.fakes.policy import agent_policy
from serving.fakes.sglang_server import FakeSGLang
from tests.records import record_react_run


def _pieces(rng, n):
    return {piece_digest(f"piece {i} {rng.random()}"): rng.integers(0, 250_000, int(rng.integers(1, 3000)),
                                                                      dtype=np.int32) for i in range(n)}


def test_prompt_pieces_pack_round_trip_and_a_malformed_record_is_refused():
    rng = np.random.default_rng(0)
    pieces = _pieces(rng, 40)
    back = unpack_pieces(pack_pieces(pieces))
    assert list(back) == list(pieces)
    assert all(back[d].dtype == np.int32 and np.array_equal(back[d], pieces[d]) for d in pieces)
    assert unpack_pieces(pack_pieces({})) == {}
    blob = pack_pieces(pieces)
    head, body = blob.rsplit(b":", 1)[0], blob.split(b":", 3)[3]
    for bad, why in ((blob[:-7], "corrupt"), (b"2" + blob[1:], "format"), (blob.replace(b":40:", b":41:", 1), "corrupt|header says|lengths add"),
                     (b"1:x:y:" + body, "malformed header"), (b"nothing", "malformed header")):
        with pytest.raises(ValueError, match=why):
            unpack_pieces(bad)
    assert head  # (the header is text, the body zstd)
    with pytest.raises(ValueError, match="16 bytes"):
        pack_pieces({b"short": np.zeros(3, np.int32)})


def test_a_shared_piece_stays_lent_until_its_last_trajectory_gives_it_back(tiny_model_dir):
    rng = np.random.default_rng(1)
    a, b = _pieces(rng, 3), _pieces(rng, 2)
    shared = next(iter(a))
    b[shared] = a[shared]
    book = PieceBook()
    ta, tb = book.lend(a), book.lend(b)
    assert len(book) == 5
    book.give_back(ta)
    assert len(book) == 3 and book.get(shared) is a[shared]
    book.give_back(tb)
    assert len(book) == 0 and book.get(shared) is None
    book.give_back(tb)  # twice: nothing happens
    # several servers of one model (a Spread): every one of them is lent the pieces, and gives them back
    from agent.backends.spread import Spread

    servers = [SGLangBackend(f"http://127.0.0.1:{p}", str(tiny_model_dir)) for p in (1, 2)]
    fp = tokenizer_fingerprint(tiny_model_dir)
    assert fp and all(s.fingerprint == fp for s in servers)
    lent, give_back = lend_pieces(Spread(servers), fp, a)
    assert lent and all(len(s.book) == 3 for s in servers)
    assert servers[0].book is servers[1].book and servers[0].book._refs[shared] == 1  # one book, lent once
    give_back()
    assert all(len(s.book) == 0 for s in servers)
    assert lend_pieces(Spread(servers), "0" * 64, a)[0] is False  # another tokenizer's pieces: never lent
    assert all(len(s.book) == 0 for s in servers)


def test_the_sidecar_keeps_a_lines_prompt_pieces_beside_its_tokens(tmp_path):
    rng = np.random.default_rng(2)
    tokens = {1: {"id": np.array([5, 6], np.int32), "text": np.array(["a", "b"], dtype=object),
                  "logprob": np.array([-0.1, -0.2], np.float32), "think": np.array([True, False]),
                  "top_ids": np.array([[5, 7], [6, 8]], np.int32),
                  "top_logprobs": np.array([[-0.1, -2.0], [-0.2, -3.0]], np.float32),
                  "exact_entropy": np.full(2, np.nan, np.float32)}}
    pieces = _pieces(rng, 5)
    (tmp_path / "with.parquet").write_bytes(encode(tokens, 2, prompt=("ab" * 32, pieces)))
    (tmp_path / "without.parquet").write_bytes(encode(tokens, 2))
    fp, got = read_prompt_pieces(tmp_path / "with.parquet")
    assert fp == "ab" * 32 and list(got) == list(pieces) and all(np.array_equal(got[d], pieces[d]) for d in pieces)
    assert read_prompt_pieces(tmp_path / "without.parquet") == (None, {})
    from agent.rundir.sidecar import decode

    a, b = decode(tmp_path / "with.parquet"), decode(tmp_path / "without.parquet")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f") for k in a)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tiny_model_dir):
    """A ReAct run recorded through SGLang's native API, with the generation requests the server received."""
    out = tmp_path_factory.mktemp("pieces") / "r"
    bodies = record_react_run(out, tiny_model_dir, limit=4)
    sent = [tuple(b["input_ids"]) for b in bodies if "input_ids" in b]
    assert len(sent) == len([b for b in bodies if (b.get("sampling_params") or {}).get("max_new_tokens")])
    return out, set(sent)


def test_a_run_records_the_ids_it_sent_by_message_piece(recorded, tiny_model_dir):
    out, sent = recorded
    run = load_run(out)
    b = SGLangBackend("http://127.0.0.1:9", str(tiny_model_dir))
    n_calls = 0
    for summary in run.index:
        line = run.full(summary)
        fp, pieces = run.prompt_pieces(line)
        assert fp == tokenizer_fingerprint(tiny_model_dir) and pieces
        for ev in (e for e in line.events if e.type == "llm_call"):
            prompt, _ = b.render(run.sendable_messages(line, ev), {"enable_thinking": True})
            ids = b.prompt_ids(prompt)
            # the ids the server was sent for this call: exactly the recorded pieces, joined, and the whole prompt's
            # ids as the real tokenizer makes them
            assert ids.tolist() == b.tok(prompt, add_special_tokens=False)["input_ids"]
            assert tuple(ids.tolist()) in sent
            digests = [d for d, _ in b.prompt_pieces(prompt)]
            assert all(d in pieces for d in digests)
            assert np.concatenate([pieces[d] for d in digests]).tolist() == ids.tolist()
            n_calls += 1
    assert n_calls >= 8


def _probe(url, tiny, run_dir, out, *extra, fidelity=False):
    return entropy_main([str(run_dir), "--backend", "sglang", "--endpoint", url, "--model-dir", str(tiny),
                         "--no-progress", "--mode", "teacher-forced", "--force", "--out", str(out),
                         *([] if fidelity else ["--skip-fidelity"]), *extra])


@pytest.mark.slow
def test_the_probe_sends_the_recorded_ids_and_tokenises_only_what_the_run_never_sent(recorded, tiny_model_dir):
    out, _ = recorded
    got, bodies = {}, {}
    for name, extra in (("recorded", []), ("retokenized", ["--retokenize"])):
        with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:
            # (the serving-fidelity check first, as a user runs it: it sends what the probe sends)
            assert _probe(srv.url, tiny_model_dir, out, out / "probes" / name, *extra, fidelity=True) == 0
            bodies[name] = sorted((tuple(b["input_ids"]), len(b.get("image_data") or []))
                                  for b in srv.bodies if "input_ids" in b)
        got[name] = pd.read_csv(out / "probes" / name / "steps.csv").sort_values(["sample_id", "trial", "step"])
        got[name + "_json"] = json.loads((out / "probes" / name / "probe.json").read_text())["prompt_ids"]
    # the same requests, byte for byte, and the same numbers
    assert bodies["recorded"] and bodies["recorded"] == bodies["retokenized"]
    cols = ["H_with", "H_without", "dH", "kl_with_without"]
    assert got["recorded"][cols].reset_index(drop=True).equals(got["retokenized"][cols].reset_index(drop=True))
    rec, re = got["recorded_json"], got["retokenized_json"]
    n_traj = got["recorded"][["sample_id", "trial"]].drop_duplicates().shape[0]
    assert rec["trajectories_with_recorded_ids"] == n_traj and rec["retokenize"] is False
    assert rec["pieces_from_the_record"] > 0
    # tokenised: each trajectory's first user message without its images, which the run never sent
    assert 0 < rec["pieces_tokenised"] <= n_traj
    assert re["pieces_from_the_record"] == 0 and re["trajectories_with_recorded_ids"] == 0
    assert re["pieces_tokenised"] > rec["pieces_tokenised"] and re["characters_tokenised"] > 2 * rec["characters_tokenised"]


@pytest.mark.slow
def test_servers_of_one_model_share_one_tokenizer_and_a_changed_file_loads_it_again(tiny_model_dir, tmp_path):
    # a probe over several servers of one model loads its tokenizer once (~95 MB for Qwen3.5's vocabulary)
    d = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, d)
    a, b = (SGLangBackend(f"http://127.0.0.1:{p}", str(d)) for p in (1, 2))
    assert a.tok is b.tok and a._decode_cache is b._decode_cache and a._piece_ids is b._piece_ids
    assert a._decode(5) == b.tok.decode([5]) and 5 in b._decode_cache  # decoded once for both
    a.prompt_ids("<|im_start|>user\nhello<|im_end|>\n")
    assert a.piece_stats["tokenised"] == b.piece_stats["tokenised"] == 1
    # the tokenizer's files or the template changed: another tokenizer, nothing of the old one's caches
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "mmcf_test": 1}))
    c = SGLangBackend("http://127.0.0.1:3", str(d))
    assert c.tok is not a.tok and c.fingerprint != a.fingerprint and 5 not in c._decode_cache
    (d / "chat_template.jinja").write_text((d / "chat_template.jinja").read_text() + "{# changed #}")
    e = SGLangBackend("http://127.0.0.1:4", str(d))
    assert e.tok is not c.tok and e.tok.chat_template.endswith("{# changed #}")
    # a backend given its own renderer shares nothing
    f = SGLangBackend("http://127.0.0.1:5", str(d), renderer=e.tok)
    assert f._decode_cache is not e._decode_cache


def test_ids_decoded_together_are_what_the_tokenizer_decodes_one_by_one(tiny_model_dir):
    """The texts of ids a reply brings are decoded in one call: each is the tokenizer's own ``decode([id])``, for
    every id of the vocabulary (special tokens and byte pieces included), in order, repeats and cached ones too."""
    b = SGLangBackend("http://127.0.0.1:1", str(tiny_model_dir), renderer=None)
    b._decode_cache.texts[:] = [None] * len(b._decode_cache.texts)
    every = list(range(len(b.tok)))
    want = [b.tok.decode([i], skip_special_tokens=False) for i in every]
    b._decode(7)  # one already known
    ids = every[::-1] + [7, 3, 3]
    assert b._decode_many(ids) == want[::-1] + [want[7], want[3], want[3]]
    assert b._decode_cache.texts[:len(every)] == want
    assert b._decode_many([len(b._decode_cache.texts) + 3]) == [b.tok.decode([len(b._decode_cache.texts) + 3])]


def test_another_tokenizer_or_an_unreadable_record_never_sends_wrong_ids(recorded, tiny_model_dir, tmp_path, capsys):
    out, _ = recorded
    # a model directory whose tokenizer files differ (one harmless key more): its fingerprint is another, so the run's
    # ids are not lent; the probe tokenises itself and says so once
    other = tmp_path / "tiny-copy"
    shutil.copytree(tiny_model_dir, other)
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**cfg, "mmcf_test": 1}))
    with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name=str(other)) as srv:
        assert _probe(srv.url, other, out, out / "probes" / "other-tok") == 0
    err = capsys.readouterr().err
    assert err.count("made by another tokenizer") == 1
    summary = json.loads((out / "probes" / "other-tok" / "probe.json").read_text())["prompt_ids"]
    assert summary["pieces_from_the_record"] == 0 and summary["trajectories_with_recorded_ids"] == 0
    # a sidecar whose recorded ids are corrupt: that trajectory fails naming the file (exit 1), the others are probed
    import pyarrow.parquet as pq

    broken = tmp_path / "broken"
    shutil.copytree(out, broken, ignore=shutil.ignore_patterns("probes"))
    run = load_run(broken)
    victim = run.index[0]
    path = broken / victim.tokens_file
    blob = pq.read_metadata(path).metadata[b"mmcf.prompt_pieces"]
    data = path.read_bytes()
    at = data.index(blob)  # the record's compressed bytes damaged in place (the footer keeps its lengths)
    path.write_bytes(data[:at + len(blob) - 40] + bytes(40) + data[at + len(blob):])
    from agent.rundir import check_run
    from agent.rundir.lines import seal
    from agent.rundir.sidecar import sha256_of

    # the line keeps the damaged file's checksum (a crafted run): only the prompt ids are wrong, not the file's bytes
    res = broken / "results.jsonl"
    lines = [json.loads(x) for x in res.read_bytes().splitlines()]
    lines[0]["tokens_sha256"] = sha256_of(path.read_bytes())
    res.write_bytes(b"".join(seal(ln) + b"\n" for ln in lines))
    (broken / "results.index.jsonl").unlink()

    assert check_run(out).intact  # the run as recorded passes the deep check; the broken copy does not, naming why
    rep = check_run(broken)
    assert not rep.intact and any("unreadable prompt ids" in why for _, why in rep.sidecars)
    with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:
        # (the serving-fidelity check first: it checks the server with that trajectory tokenised, then the probe names it)
        assert _probe(srv.url, tiny_model_dir, broken, broken / "probes" / "e", fidelity=True) == 1
        err = capsys.readouterr().err
        assert "unreadable prompt ids" in err and victim.tokens_file in err and "--retokenize" in err
        steps = pd.read_csv(broken / "probes" / "e" / "steps.csv")
        assert victim.sample_id not in set(steps["sample_id"]) and len(steps) > 0
        # --retokenize reads no record: the trajectory is probed
        assert _probe(srv.url, tiny_model_dir, broken, broken / "probes" / "e2", "--retokenize") == 0


def test_the_removal_replays_send_the_runs_recorded_history(recorded, tiny_model_dir):
    """Step-k replays keep the run's history before step k: its recorded ids are sent, the same requests as with
    --retokenize."""
    from probes.removal import main as removal_main

    out, _ = recorded
    bodies, used = {}, {}
    for name, extra in (("recorded", []), ("retokenized", ["--retokenize"])):
        with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:
            assert removal_main([str(out), "--steps", "1..2", "--judge", "exact", "--backend", "sglang", "--endpoint",
                                 srv.url, "--model-dir", str(tiny_model_dir), "--no-progress", "--force",
                                 "--out", str(out / "probes" / f"removal-{name}"), *extra]) == 0
            bodies[name] = sorted(tuple(b["input_ids"]) for b in srv.bodies if "input_ids" in b)
        used[name] = json.loads((out / "probes" / f"removal-{name}" / "probe.json").read_text())["prompt_ids"]
    assert bodies["recorded"] and bodies["recorded"] == bodies["retokenized"]
    assert used["recorded"]["trajectories_with_recorded_ids"] > 0 and used["recorded"]["pieces_from_the_record"] > 0
    assert used["retokenized"]["pieces_from_the_record"] == 0
    assert used["retokenized"]["pieces_tokenised"] > used["recorded"]["pieces_tokenised"]
