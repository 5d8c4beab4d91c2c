"""The benchmark scripts' own logic that a wrong figure could hide in (the timings themselves are not tested)."""
from __future__ import annotations

import base64
import zipfile

import pytest

from scripts.bench_tokenize import read_ranks, tokenizer_from_ranks


def _ranks_file(path, extra):
    ranks = {bytes([i]): i for i in range(256)}
    for t in extra:
        ranks[t] = len(ranks)
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    return ranks


def test_a_tokenizer_built_from_tiktoken_ranks_merges_as_the_ranks_say(tmp_path):
    """scripts/bench_tokenize.py's Qwen-vocabulary tokenizer: every token of the ranks is reachable by merges in
    rank order, ids are the ranks, the pre-tokenizer splits words as Qwen's does, and it decodes back."""
    ranks = _ranks_file(tmp_path / "q.tiktoken", [b"th", b"the", b" c", b" ca", b" cat", b"at", b"ab", b"bc"])
    tok = tokenizer_from_ranks(read_ranks(tmp_path / "q.tiktoken"))
    ids = tok("the cat sat", add_special_tokens=False)["input_ids"]
    # "the" and " cat" are tokens; " sat" is " ", "s", "at" (no " s" token; "at" merges)
    assert ids == [ranks[b"the"], ranks[b" cat"], ranks[b" "], ranks[b"s"], ranks[b"at"]]
    assert tok.decode(ids) == "the cat sat"
    # the lower rank merges first: "abc" is "ab" + "c", not "a" + "bc"
    assert tok("abc", add_special_tokens=False)["input_ids"] == [ranks[b"ab"], ranks[b"c"]]
    # the wheel that ships the file is read as well
    with zipfile.ZipFile(tmp_path / "w.whl", "w") as z:
        z.write(tmp_path / "q.tiktoken", "dashscope/resources/qwen.tiktoken")
    assert read_ranks(tmp_path / "w.whl") == ranks


def test_bad_rank_files_are_refused_naming_them(tmp_path):
    (tmp_path / "bad.tiktoken").write_bytes(b"IQ== 0\nnot-a-line\n")
    with pytest.raises(SystemExit, match="line 2"):
        read_ranks(tmp_path / "bad.tiktoken")
    with pytest.raises(SystemExit, match="no such file"):
        read_ranks(tmp_path / "missing.tiktoken")
    (tmp_path / "short.tiktoken").write_bytes(b"IQ== 0\n")
    with pytest.raises(SystemExit, match="not a byte-level BPE"):
        read_ranks(tmp_path / "short.tiktoken")
