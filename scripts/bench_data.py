"""Paper-shaped synthetic data for the benchmarks (ours): top-20 token rows and whole ReAct trajectories.

    from bench_data import RowPool, write_run
    pool = RowPool(seed=0)                               # distinct rows, drawn per token
    write_run(root, n_trajectories=5087, pool=pool)      # through the toolkit's own writer

What "realistic" means here, and why (each choice is ours; no real top-20 record of a Qwen3.5 run was
available where this was written):

- **top-20 ids** are 20 *distinct* ids per position (as every real top-k list is), drawn without replacement
  from a Zipf(s = 1.1) law over token-frequency ranks mapped through a fixed random permutation of a
  248,320-token vocabulary (Qwen3.5's), so frequent alternatives recur across positions as real ones do
  (" the", ",", newline) while their numeric ids are spread over the vocabulary. ``--ids uniform`` draws
  them uniformly instead (the worst case for storage).
- **top-20 logprobs** are the 20 largest of a Dirichlet(α) over 64 outcomes with α log-uniform in
  [0.02, 2] per position (peaked to flat), as float32: every row distinct, full-precision mantissas.
- **the chosen token** is the top-1 alternative 85 % of the time, one of alternatives 2–5 12 %, and outside
  the top-20 3 % (its own id and logprob), as sampling at T = 0.2 / top-p 0.95 roughly gives.
- **lines** are written by the toolkit itself (``Trajectory`` + ``RunDir.append``): a ReAct trajectory of
  ``calls`` steps, each with ~``tokens`` generated tokens (90 % think), its reasoning text (the think
  tokens' texts) kept in the history, a ~4 KB tool observation per step and one query image: ~150 KB per
  line at 10 x 1,000, the paper's size.

Rows come from a pool of 2^19 distinct rows drawn with replacement per position (generating 50 M fresh
Dirichlet rows would take longer than the benchmark itself): within one trajectory of 10,000 positions
about 1 % of rows repeat, too few to help the compressor measurably.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VOCAB = 248_320
K = 20
#: The special tokens' ids [lo, hi) that recorded and planted ids skip (None: none); set by :func:`bench_model`.
SPECIALS: tuple[int, int] | None = None


def ordinary(ids: np.ndarray) -> np.ndarray:
    """``ids`` with those that fall on a special token moved onto ordinary ones."""
    if SPECIALS is None:
        return ids
    lo, hi = SPECIALS
    return np.where((ids >= lo) & (ids < hi), (ids - lo) % max(lo, 1), ids)


def bench_model(tiny: str, dst: Path, vocab: int = VOCAB) -> str:
    """The tiny model's directory with a tokenizer of ``vocab`` ids laid out as Qwen3.5's (248,320: the ordinary
    tokens, then the special ones), for the benches: its own ordinary tokens, synthetic ones up to the specials
    (1-4 letters, two in three after a space), its special tokens moved to the top of the vocabulary with every
    config id that names one, and ``vocab_size`` in config.json; no weights (a stand-in serves it). Sets
    :data:`VOCAB` and :data:`SPECIALS`. Its texts are not the pool's (the pool's are the recorded ones)."""
    import json
    import shutil

    global SPECIALS, VOCAB
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in Path(tiny).iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copyfile(f, dst / f.name)
    tj = json.loads((dst / "tokenizer.json").read_text())
    table, added = tj["model"]["vocab"], tj["added_tokens"]
    lo = min(a["id"] for a in added)
    if len(table) != lo or sorted(a["id"] for a in added) != list(range(lo, lo + len(added))):
        raise SystemExit(f"{tiny}: not the layout bench_model expects (ordinary ids, then the specials)")
    top = vocab - len(added)  # where the specials go
    letters, n, i = "abcdefghijklmnopqrstuvwxyz", len(table), 0
    while n < top:
        word, x = "", i
        while True:  # i in base 26: every word distinct
            word, x = letters[x % 26] + word, x // 26 - 1
            if x < 0:
                break
        text = ("\u0120" if i % 3 else "") + word  # Ġ: the byte-level BPE's space
        i += 1
        if text not in table:
            table[text] = n
            n += 1
    moved = {a["id"]: a["id"] - lo + top for a in added}
    for a in added:
        a["id"] = moved[a["id"]]
    (dst / "tokenizer.json").write_text(json.dumps(tj))
    for name in ("config.json", "generation_config.json"):
        if (dst / name).exists():
            cfg = _moved_ids(json.loads((dst / name).read_text()), moved)
            if name == "config.json":
                cfg["vocab_size"] = vocab
                if isinstance(cfg.get("text_config"), dict):
                    cfg["text_config"]["vocab_size"] = vocab
            (dst / name).write_text(json.dumps(cfg, indent=2))
    VOCAB, SPECIALS = vocab, (top, vocab)
    return str(dst)


def _moved_ids(cfg, moved: dict):
    """Every ``*_id`` / ``*_ids`` value of a config (nested) that names a moved special token, moved."""
    if isinstance(cfg, dict):
        return {k: (_moved_ids(v, moved) if isinstance(v, (dict, list)) and not k.endswith(("_id", "_ids")) else
                    ([moved.get(x, x) for x in v] if isinstance(v, list) else moved.get(v, v))
                    if k.endswith(("_id", "_ids")) and not isinstance(v, dict) else v) for k, v in cfg.items()}
    return [_moved_ids(v, moved) for v in cfg] if isinstance(cfg, list) else cfg


class RowPool:
    """A pool of realistic, distinct top-k rows (ids, logprobs) and a fake vocabulary of token texts."""

    def __init__(self, seed: int = 0, n_rows: int = 1 << 19, k: int = K, ids: str = "zipf", zipf_s: float = 1.1):
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.k = k
        perm = rng.permutation(VOCAB).astype(np.int64)
        if ids == "uniform":
            top = np.empty((n_rows, k), dtype=np.int64)
            for s in range(0, n_rows, 1 << 15):  # distinct per row: argpartition of random keys
                m = min(n_rows, s + (1 << 15)) - s
                top[s:s + m] = np.argpartition(rng.random((m, VOCAB), dtype=np.float32), k, axis=1)[:, :k] \
                    if m * VOCAB < (1 << 28) else np.stack([rng.choice(VOCAB, k, replace=False) for _ in range(m)])
        else:
            r = np.arange(1, VOCAB + 1, dtype=np.float64) ** -zipf_s
            cdf = np.cumsum(r / r.sum())
            top = np.empty((n_rows, k), dtype=np.int64)
            m = 3 * k
            for s in range(0, n_rows, 1 << 15):
                e = min(n_rows, s + (1 << 15))
                c = np.sort(np.minimum(np.searchsorted(cdf, rng.random((e - s, m))), VOCAB - 1), axis=1)
                uniq = np.ones_like(c, dtype=bool)
                uniq[:, 1:] = c[:, 1:] != c[:, :-1]
                prio = rng.random(c.shape)
                prio[~uniq] = 2.0
                pick = np.argpartition(prio, k, axis=1)[:, :k]
                rows = np.take_along_axis(c, pick, axis=1)
                short = np.flatnonzero(uniq.sum(axis=1) < k)  # rare: fewer than k distinct draws
                for i in short:
                    got = list(dict.fromkeys(c[i].tolist()))
                    while len(got) < k:
                        x = int(min(np.searchsorted(cdf, rng.random()), VOCAB - 1))
                        if x not in got:
                            got.append(x)
                    rows[i] = got[:k]
                top[s:e] = rows
            top = perm[top]
        self.top_ids = ordinary(top).astype(np.int32)
        alpha = np.exp(rng.uniform(np.log(0.02), np.log(2.0), size=(n_rows, 1)))
        lp = np.empty((n_rows, k), dtype=np.float32)
        for s in range(0, n_rows, 1 << 16):
            e = min(n_rows, s + (1 << 16))
            g = rng.gamma(np.broadcast_to(alpha[s:e], (e - s, 64)))
            p = g / g.sum(axis=1, keepdims=True)
            lp[s:e] = np.log(np.maximum(-np.sort(-p, axis=1)[:, :k], 1e-38))
        self.top_logprobs = lp
        letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
        lens = rng.integers(1, 8, size=VOCAB)
        self.vocab = [(" " if i % 3 else "") + letters[rng.integers(0, 26, int(n))].tobytes().decode()
                      for i, n in enumerate(lens)]

    def sample(self, n: int) -> dict[str, np.ndarray]:
        """Arrays of ``n`` generated tokens: ids, texts, logprobs, top_ids, top_logprobs (the chosen per the
        module's law)."""
        rng = self.rng
        rows = rng.integers(0, len(self.top_ids), size=n)
        ti, tl = self.top_ids[rows], self.top_logprobs[rows]
        u = rng.random(n)
        at = np.where(u < 0.85, 0, rng.integers(1, 5, size=n))
        ids = ti[np.arange(n), at].astype(np.int64)
        lps = tl[np.arange(n), at].astype(np.float64)
        out = u > 0.97
        ids[out] = ordinary(rng.integers(0, VOCAB, size=int(out.sum())))
        lps[out] = tl[out, -1] - rng.exponential(1.0, size=int(out.sum())).astype(np.float32)
        texts = [self.vocab[i] for i in ids.tolist()]
        return {"ids": ids, "texts": texts, "logprobs": lps, "top_ids": ti.astype(np.int64),
                "top_logprobs": tl.astype(np.float64)}


def output(pool: RowPool, n: int, think_share: float = 0.9, *, semantics=None, model: str = "bench-model"):
    """A :class:`ModelOutput` of ``n`` tokens (TokenArrays), its first ``think_share`` inside the think segment."""
    from agent.backends.base import LogprobSemantics, ModelOutput, TokenArrays, Usage

    a = pool.sample(n)
    think = np.zeros(n, dtype=bool)
    think[: int(n * think_share)] = True
    toks = TokenArrays(a["ids"], a["texts"], a["logprobs"], a["top_ids"], a["top_logprobs"], think)
    reasoning = "".join(a["texts"][: int(n * think_share)])
    return ModelOutput(text='<tool_call>\n{"name": "search", "arguments": {"query": "q", "goal": "g"}}\n</tool_call>',
                       reasoning=reasoning, tokens=toks, finish_reason="stop", usage=Usage(4000, n),
                       semantics=semantics or LogprobSemantics("scaled", 0.2), backend="bench", model=model)


def bench_image(root: Path) -> Path:
    from PIL import Image

    p = root / "query.png"
    if not p.exists():
        Image.new("RGB", (64, 48), (40, 90, 160)).save(p)
    return p


def photo_image(root: Path, i: int, kb: int = 320) -> Path:
    """A distinct JPEG of about ``kb`` KB (noise over a gradient at 1024 x 768: a real photo's size and
    pixel count; the content differs per ``i``, so every sample has its own image as in the benchmarks)."""
    from PIL import Image

    p = root / "photos" / f"q{i}.jpg"
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(1000 + i)
        base = np.linspace(0, 255, 1024, dtype=np.float32)[None, :, None] * np.ones((768, 1, 3), np.float32)
        amp = float(np.clip(kb / 320 * 18, 2, 120))  # more noise, more bytes (calibrated: 18 -> ~320 KB)
        px = np.clip(base + rng.normal(0, amp, (768, 1024, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(px).save(p, quality=90)
    return p


def english_windows(rng):
    """``take(n)``: a random window of ~``n`` characters of English prose (this repository's README.md, cut at
    word boundaries): the ``text="english"`` option of :func:`write_run`."""
    corpus = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())

    def take(n: int) -> str:
        a = int(rng.integers(0, max(1, len(corpus) - n - 1)))
        a = corpus.find(" ", a) + 1
        return corpus[a:a + n]
    return take


def write_run(root: Path, n_trajectories: int, pool: RowPool, *, calls: int = 10, tokens: int = 1000,
              observation_chars: int = 4000, precision: str = "float32", progress: bool = True,
              model: str = "bench-model", distinct_images: bool = False, text: str = "synthetic",
              prompts=None) -> dict:
    """A ReAct run directory written by the toolkit's own writer; returns counts and sizes. ``distinct_images``:
    one ~320 KB photo-sized JPEG per trajectory (:func:`photo_image`) instead of one small image for all.

    ``text``: what the history's texts are. ``"synthetic"`` (the default): each reasoning is the texts of its
    tokens' ids in the pool's fake vocabulary of random letter strings, and each observation random words of it,
    so nearly every word is new to a tokenizer's word cache. ``"english"``: the reasoning and the observation are
    windows of English prose of the same lengths (this repository's README, code spans and numbers included; the
    recorded ids and their logprobs are unchanged, so the reasoning is not their decode). Which is cheaper to
    tokenise depends on the tokenizer: with the embedded one's 628-token vocabulary the English measured slower.

    ``prompts``: an ``SGLangBackend`` (no server needed) whose tokenizer and chat template make each call's prompt
    ids by message piece, recorded in the sidecars as a run through ``--backend sglang`` records them
    (agent/backends/pieces.py); None: no prompt ids recorded (a run through the chat path, or an older one)."""
    if text not in ("synthetic", "english"):
        raise ValueError(f"text must be 'synthetic' or 'english', not {text!r}")
    from agent.backends.base import SamplingParams
    from agent.benchmarks import Sample
    from agent.rundir import RunDir
    from agent.tools.toolbox import ToolResult
    from agent.trajectory import SCHEMA_VERSION, Trajectory

    root = Path(root)
    rd = RunDir(root, precision)
    ident = {"backend": "bench", "served_model": model, "weights": None, "fingerprint": None}
    sampling = SamplingParams(max_tokens=4096).to_dict()
    rd.write_header({"schema_version": SCHEMA_VERSION, "method": "react", "variant": "", "label": "react",
                     "benchmark": "bench", "benchmark_path": None, "budgets": {"t_max": 20, "b_max": 5}, "trials": 1,
                     "sampling": sampling, "model": ident,
                     "backend": {"kind": "bench", "endpoints": [], "model": model, "model_dir": None,
                                 "logprob_mode": "scaled", "server": "sglang", "embedded_tiny_model": False,
                                 "api_key_env": None},
                     "tools": {"provider": "offline", "world": None, "cache": None, "cache_mode": "readwrite",
                               "live_fallback": False},
                     "history_reasoning": "keep", "observation_images": 5, "versions": {}}, force=True)
    img = bench_image(root)
    rng = pool.rng
    words = pool.vocab
    english = english_windows(rng) if text == "english" else None
    system = "You are a research assistant that answers questions about images by searching the web. " * 20
    n_tok = 0
    for i in range(n_trajectories):
        if distinct_images:
            img = photo_image(root, i)
        s = Sample(id=f"s{i}", query=f"Question {i}: what is shown in the image, and when was it made?",
                   query_images=[img.relative_to(root).as_posix()], answer="1911", benchmark="bench", line=i, image_dir=str(root),
                   category="c", paper_category=("Atomic factuality", "Dynamic information-seeking",
                                                 "Visual deep research")[i % 3])
        traj = Trajectory(s, 0, "react")
        traj.query_hashes = [_sha(img)]
        msgs = [{"role": "system", "content": system},
                {"role": "user", "content": [{"type": "text", "text": "<image_0>"},
                                             {"type": "image_url", "image_url": {"url": str(img)}},
                                             {"type": "text", "text": s.question}]}]
        for c in range(calls):
            n = int(rng.integers(tokens // 2, tokens * 3 // 2 + 1))
            out = output(pool, n, model=model)
            if english is not None:
                out.reasoning = english(len(out.reasoning))
            if prompts is not None:  # what the runner's SGLang backend tokenised and sent for this call
                out.prompt_pieces = (prompts.fingerprint,
                                     prompts.prompt_pieces(prompts.render(msgs, {"enable_thinking": True})[0]))
            ev = traj.llm_call(msgs, out, state="react", sampling=sampling)
            traj.settle(ev, action={"kind": "tool_call", "name": "search", "args": {"query": "q", "goal": "g"}})
            obs = english(observation_chars) if english is not None else \
                "".join(words[j] for j in rng.integers(0, len(words), observation_chars // 4))[:observation_chars]
            traj.tool_call(ev, ToolResult("search", {"query": "q", "goal": "g"}, obs, True, False))
            msgs = msgs + [{"role": "assistant", "content": out.text, "reasoning_content": out.reasoning},
                           {"role": "user", "content": f"<tool_response>\n{obs}\n</tool_response>"}]
            n_tok += n
        line = traj.to_line("ok", "1911")
        rd.append(traj, line)
        if progress and (i + 1) % max(1, n_trajectories // 20) == 0:
            print(f"  wrote {i + 1}/{n_trajectories} trajectories", file=sys.stderr, flush=True)
    side = sum(p.stat().st_size for p in (root / "tokens").iterdir())
    return {"trajectories": n_trajectories, "tokens": n_tok, "sidecar_bytes": side,
            "results_bytes": (root / "results.jsonl").stat().st_size}


_SHA: dict = {}


def _sha(p: Path) -> str:
    import hashlib

    if p not in _SHA:
        _SHA[p] = hashlib.sha256(p.read_bytes()).hexdigest()
    return _SHA[p]
