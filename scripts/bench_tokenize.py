"""What tokenising a teacher-forced step's new text costs: the embedded tokenizer against a Qwen vocabulary.

    python scripts/bench_tokenize.py [--qwen-ranks PATH] [--model-dir DIR] [--steps 200] [--rounds 3]

A teacher-forced step sends the conversation so far twice (with and without the query images); the client
tokenises only the step's new message pieces, once for both (agent/backends/sglang_native.py ``prompt_ids``): the
previous step's reasoning (~900 tokens) and its tool observation (~4,000 characters), ~8K characters in all, as
scripts/bench_data.py writes them. This is the largest part of the step's client CPU in
``scripts/bench_probe_http.py --mode teacher-forced``, measured there with the embedded tokenizer (a 628-token
vocabulary). This bench says whether that tokenizer makes the part look cheaper or dearer than a real one would:
each tokenizer tokenises the same steps' pieces the way the probe does (``encode_batch_fast``, no special tokens),

- **cold**: each step's text once, in order (the tokenizer's word cache holds only earlier steps' words: a run);
- **warm**: the same step's text again (its words all cached: the bench's in-process floor),

on the bench's synthetic text (random letter strings from its fake vocabulary: nearly every word new) and on
English prose (windows of this README, code spans and numbers included), printing ms per step, µs per
character and tokens per step, and each tokenizer's cold time over the embedded one's. Each round has new text
and runs the tokenizers in turn on it, the first one alternating (this machine's speed drifts within a minute),
so the ratios are paired per round.

``--qwen-ranks PATH``: Qwen's byte-level BPE ranks in tiktoken format, ``qwen.tiktoken`` (151,643 tokens: the
ordinary tokens of Qwen2's and Qwen3's tokenizers; Qwen3.5's has 248,320, which no file here has). Nothing is
downloaded by this script; the file ships inside the ``dashscope`` wheel on PyPI:

    pip download --no-deps dashscope==2.0.2 -d /tmp/ds      # PATH = /tmp/ds/dashscope-2.0.2-py3-none-any.whl

PATH may be the wheel or the extracted file. From the ranks a tokenizer is built the way transformers converts a
tiktoken vocabulary (``TikTokenConverter``: every split of a token into two tokens is a merge, ordered by the
token's rank), with Qwen3.5's pre-tokenizer regex and NFC normaliser (transformers' ``Qwen3_5Tokenizer``); it is
checked to decode back to the text it tokenised. ``--model-dir DIR``: also a real model directory's tokenizer (on
a GPU node, the Qwen3.5 model the probe runs with).
"""
from __future__ import annotations

import argparse
import base64
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))


def read_ranks(path: Path) -> dict[bytes, int]:
    """{token bytes: rank} from a ``.tiktoken`` file (one ``base64 rank`` per line) or a wheel holding one."""
    path = Path(path)
    if not path.exists():
        raise SystemExit(f"--qwen-ranks {path}: no such file")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if n.endswith("qwen.tiktoken")]
            if not names:
                raise SystemExit(f"--qwen-ranks {path}: a zip without a qwen.tiktoken inside")
            data = z.read(names[0])
    else:
        data = path.read_bytes()
    ranks = {}
    for i, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            tok, rank = line.split()
            ranks[base64.b64decode(tok, validate=True)] = int(rank)
        except ValueError:
            raise SystemExit(f"--qwen-ranks {path}: line {i} is not 'base64 rank': {line[:80]!r}") from None
    if len(ranks) < 256:
        raise SystemExit(f"--qwen-ranks {path}: {len(ranks)} ranks, not a byte-level BPE vocabulary")
    return ranks


def tokenizer_from_ranks(ranks: dict[bytes, int]):
    """A transformers Qwen3.5 tokenizer (its regex and NFC) over the ranks' vocabulary and merges."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer

    byte_char = bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(byte_char[x] for x in b)

    vocab = {text(t): r for t, r in ranks.items()}
    merges = []
    for t, r in ranks.items():
        if len(t) < 2:
            continue
        splits = [(t[:i], t[i:]) for i in range(1, len(t)) if t[:i] in ranks and t[i:] in ranks]
        splits.sort(key=lambda ab: (ranks[ab[0]], ranks[ab[1]]))
        merges.extend((r, a, b) for a, b in splits)
    merges.sort(key=lambda m: m[0])
    return Qwen3_5Tokenizer(vocab=vocab, merges=[(text(a), text(b)) for _, a, b in merges])


def step_texts(n: int, kind: str, seed: int = 0) -> list[str]:
    """``n`` steps' new text as scripts/bench_data.py writes a run's history: a reasoning of ~900 tokens' texts
    and a 4,000-character observation (synthetic), or English windows of the same lengths."""
    import bench_data

    pool = bench_data.RowPool(seed=seed, n_rows=1 << 12)
    rng = np.random.default_rng(seed + 1)
    take = bench_data.english_windows(rng) if kind == "english" else None
    out = []
    for _ in range(n):
        reasoning = "".join(pool.sample(900)["texts"])
        if take is None:
            obs = "".join(pool.vocab[j] for j in rng.integers(0, len(pool.vocab), 1000))[:4000]
        else:
            reasoning, obs = take(len(reasoning)), take(4000)
        out.append(f"<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\nok<|im_end|>\n<|im_start|>user\n"
                   f"<tool_response>\n{obs}\n</tool_response><|im_end|>\n")
    return out


def measure(tok, texts: list[str]) -> dict:
    enc = tok._tokenizer.encode_batch_fast
    pieces = [t.split("<|im_start|>") for t in texts]
    pieces = [["<|im_start|>" + p for p in ps if p] for ps in pieces]
    t0 = time.process_time()
    n_tok = 0
    for ps in pieces:  # cold: each step's pieces once, in order
        for p in ps:
            n_tok += len(enc([p], add_special_tokens=False)[0].ids)
    cold = time.process_time() - t0
    t0 = time.process_time()
    for ps in pieces:  # warm: the same pieces again, each right after itself
        for p in ps:
            enc([p], add_special_tokens=False)
    warm_twice = time.process_time() - t0
    for ps in pieces[:5]:  # the tokenizer gives back the text it was given
        for p in ps:
            ids = enc([p], add_special_tokens=False)[0].ids
            if tok.decode(ids, skip_special_tokens=False) != p:
                raise SystemExit(f"{tok.name_or_path or 'the tokenizer'} does not decode back to its input")
    chars = sum(len(t) for t in texts)
    return {"cold_ms": 1000 * cold / len(texts), "warm_ms": 1000 * warm_twice / len(texts),
            "us_per_char": 1e6 * cold / chars, "tokens": n_tok / len(texts), "chars": chars / len(texts)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qwen-ranks", type=Path, help="qwen.tiktoken, or the dashscope wheel holding it")
    ap.add_argument("--model-dir", help="also a real model directory's tokenizer")
    ap.add_argument("--steps", type=int, default=200, help="steps' text per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each on new text, the tokenizers in turn")
    a = ap.parse_args(argv)
    import statistics

    from agent.backends.local import load_chat_renderer
    from agent.backends.tiny_model import SPECIAL_TOKENS, ensure_tiny_model

    toks = [("embedded (628 tokens)", load_chat_renderer(str(ensure_tiny_model(quiet=True))))]
    if a.qwen_ranks:
        t0 = time.perf_counter()
        q = tokenizer_from_ranks(read_ranks(a.qwen_ranks))
        q.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
        q.add_tokens(["<think>", "</think>", "<tool_response>", "</tool_response>"])
        toks.append((f"Qwen ranks ({len(q):,} tokens)", q))
        print(f"(built the Qwen-vocabulary tokenizer from {a.qwen_ranks} in {time.perf_counter() - t0:.1f} s)")
    if a.model_dir:
        t = load_chat_renderer(a.model_dir)
        toks.append((f"{Path(a.model_dir).name} ({len(t):,} tokens)", t))
    kinds = ("synthetic", "english")
    got: dict = {}  # (tokenizer, kind) -> one measure per round
    for r in range(a.rounds):
        for kind in kinds:
            texts = step_texts(a.steps, kind, seed=100 * r)  # new text each round: the cold pass is cold
            order = toks if r % 2 == 0 else toks[::-1]     # in turn, the first one alternating
            for name, tok in order:
                got.setdefault((name, kind), []).append(measure(tok, texts))
    print(f"{a.rounds} rounds of {a.steps} teacher-forced steps' new text (the previous step's reasoning and "
          "observation, as scripts/bench_data.py writes them), each round's text tokenised by every tokenizer in "
          "turn, as the probe does; medians over the rounds")
    print(f"{'tokenizer':<28} {'text':<10} {'chars':>6} {'tokens':>6} {'cold ms':>8} {'warm ms':>8} {'us/char':>8} "
          f"{'cold / embedded, per round':>30}")
    first = toks[0][0]
    for name, _ in toks:
        for kind in kinds:
            ms = got[(name, kind)]
            med = {k: statistics.median(m[k] for m in ms) for k in ms[0]}
            ratios = [m["cold_ms"] / b["cold_ms"] for m, b in zip(ms, got[(first, kind)])]
            print(f"{name:<28} {kind:<10} {med['chars']:>6.0f} {med['tokens']:>6.0f} {med['cold_ms']:>8.2f} "
                  f"{med['warm_ms']:>8.2f} {med['us_per_char']:>8.3f} "
                  f"{' / '.join(f'{x:.2f}' for x in ratios) + f' (median {statistics.median(ratios):.2f})':>30}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
