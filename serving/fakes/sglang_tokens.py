"""The SGLang fake's tokens: its tokenizer (the tiny model's, or one id per character), the image placeholders'
expansion, and the planted top-k logprobs of every position in SGLang's wire formats (triples, flat arrays)."""
from __future__ import annotations

import math
import struct

IMAGE_EXPANSION = 4  # tokens per image placeholder (unknown to the client, as on a real server)
ALT_STEP = 104_729  # a prime: j x it (mod the ordinary ids) walks distinct ids


class Tok:
    """Tokenizer wrapper: the tiny model's real tokenizer (and processor) when given, else one id per character."""

    def __init__(self, tok_dir: str | None, alternatives_vocab: int | None = None):
        self.hf = self.proc = None
        if tok_dir:
            from transformers import AutoTokenizer

            self.hf = AutoTokenizer.from_pretrained(tok_dir)
            try:
                from transformers import AutoProcessor

                self.proc = AutoProcessor.from_pretrained(tok_dir)
            except Exception:  # noqa: BLE001 - a tokenizer-only directory: fixed expansion
                self.proc = None
        self.image_pad = self.encode("<|image_pad|>")[0] if self.hf else 9001
        # a generation that stops by itself ends with the model's EOS, which SGLang returns as the last output token
        # (in output_ids, its logprobs and completion_tokens), as its real front end does (serving/fakes/standin.py
        # showed it; the fake left it out before). Only with a real tokenizer (one id per character has none).
        self.eos = self.encode("<|im_end|>")[0] if self.hf else None
        self._n_cache: dict[int, int] = {}
        # the alternatives' ids: near the chosen one among the first 600 (the tests' planted lists), or, with
        # ``alternatives_vocab`` (the benches: Qwen3.5's 248,320), spread over every ordinary id of that vocabulary,
        # the special tokens' ids skipped
        self.spread = None
        if alternatives_vocab:
            added = sorted(self.hf.added_tokens_decoder) if self.hf else [alternatives_vocab]
            lo, hi = added[0], added[-1] + 1
            span = alternatives_vocab - (hi - lo)
            if math.gcd(span, ALT_STEP) != 1 or span < 20:
                raise ValueError(f"--alternatives-vocab {alternatives_vocab}: no spread of distinct ids over it")
            self.spread = (lo, hi, span)

    def alternative(self, t, j):
        """The ``j``-th alternative's id (j >= 1) of chosen token ``t``: ints or numpy arrays; distinct from ``t``
        and from each other for j < 20."""
        if self.spread is None:
            return (t + 7 * j) % 600 + 1
        import numpy as np

        lo, hi, span = self.spread
        o = np.where(t >= hi, t - (hi - lo), np.minimum(t, lo))  # the chosen token's place among the ordinary
        x = (o + j * ALT_STEP) % span
        out = np.where(x >= lo, x + (hi - lo), x)
        return int(out) if np.ndim(out) == 0 else out

    CHUNK0 = 0x200000  # without a tokenizer, very long texts come as 100-character tokens (ids from here on)

    def encode(self, text: str) -> list[int]:
        if self.hf:
            return self.hf(text, add_special_tokens=False)["input_ids"]
        if len(text) > 16384:
            if not hasattr(self, "_chunks"):
                self._chunks: list[str] = []
            ids = []
            for i in range(0, len(text), 100):
                self._chunks.append(text[i:i + 100])
                ids.append(self.CHUNK0 + len(self._chunks) - 1)
            return ids
        return [ord(c) for c in text]

    def decode_all(self, ids: list[int]) -> str:
        """A prompt's text from its ids (what a reply policy reads when the request came as ids)."""
        if self.hf:
            return self.hf.decode(list(ids), skip_special_tokens=False)
        return "".join(self.decode(i) for i in ids)

    def decode(self, i: int) -> str:
        if self.hf:
            return self.hf.decode([i], skip_special_tokens=False)
        if i >= self.CHUNK0:
            return self._chunks[i - self.CHUNK0]
        return chr(i) if i < 0x110000 else "?"

    def image_tokens(self, data_uri: str) -> int:
        """How many tokens one image placeholder becomes: the processor's image_grid_thw / merge_size² (as
        SGLang's Qwen-VL processing does), or IMAGE_EXPANSION without a processor."""
        if self.proc is None:
            return IMAGE_EXPANSION
        key = hash(data_uri)
        if key not in self._n_cache:
            import base64
            import io

            from PIL import Image

            img = Image.open(io.BytesIO(base64.b64decode(data_uri.split(",", 1)[1]))).convert("RGB")
            g = self.proc.image_processor(images=[img])["image_grid_thw"][0].tolist()
            merge = int(getattr(self.proc.image_processor, "merge_size", 2))
            self._n_cache[key] = int(g[0] * g[1] * g[2]) // (merge * merge)
        return self._n_cache[key]


def f32(x: float) -> float:
    """A float32 value as SGLang's JSON carries it (``-1.8349664211273193``: the server's logprobs are float32,
    printed as doubles), so a reply has a real one's size and parsing cost (shared/data/sglang_responses/)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def top(tid: int, k: int, pos: int, tok: Tok, with_text: bool):
    """A deterministic top-k list (best first) whose first entry is the chosen token: one distribution (its
    probabilities sum to less than 1, as a true top-k does)."""
    lps = [f32(-0.05 - 0.01 * (pos % 7) - 1e-4 * (pos % 97))] + [
        f32(-(4.0 + 0.35 * j + 0.02 * (pos % 5) + 1e-4 * (pos % 89))) for j in range(1, k)]
    ids = [tid] + [tok.alternative(tid, j) for j in range(1, k)]
    return [[lp, i, tok.decode(i) if with_text else None] for lp, i in zip(lps, ids)]


def tops_arrays(ids: list[int], k: int, tok: Tok):
    """:func:`top` for positions 1 .. n-1 at once, as (float32 values, int32 ids) of shape (n-1, k): the same
    numbers (the same float64 arithmetic, then float32), without a Python object per alternative, so the benches'
    fake spends little CPU beside the client it measures."""
    import numpy as np

    t = np.asarray(ids[1:], dtype=np.int64)[:, None]
    pos = np.arange(1, len(ids), dtype=np.int64)[:, None]
    jj = np.arange(1, k, dtype=np.int64)[None, :]
    first = -0.05 - 0.01 * (pos % 7) - 1e-4 * (pos % 97)
    rest = -(4.0 + 0.35 * jj + 0.02 * (pos % 5) + 1e-4 * (pos % 89))
    val = np.concatenate([first, rest], axis=1)[:, :k]
    idx = np.concatenate([t, tok.alternative(t, jj)], axis=1)[:, :k]
    return val, idx.astype(np.int32)


def flat_from_arrays(side: str, val, idx, null_prefix: int, b64: bool) -> dict:
    import base64

    import numpy as np

    pre = f"{side}_top_logprobs"
    val = np.asarray(val, dtype=np.float32)
    if b64:
        fields = {f"{pre}_val_flat_b64": base64.b64encode(val.tobytes()).decode(),
                  f"{pre}_idx_flat_b64": base64.b64encode(np.asarray(idx, dtype=np.int32).tobytes()).decode(),
                  f"{pre}_val_flat_b64_dtype": "float32", f"{pre}_idx_flat_b64_dtype": "int32"}
    else:
        fields = {f"{pre}_val_flat": val.reshape(-1).tolist(), f"{pre}_idx_flat": np.asarray(idx).reshape(-1).tolist()}
    return {**fields, f"{pre}_shape": [int(val.shape[0]), int(val.shape[1])], f"{pre}_null_prefix": null_prefix}


def flat_fields(side: str, tops: list, k: int, b64: bool) -> dict:
    """SGLang 0.5.23's flat top-logprob fields for nested rows (as its TokenizerManager builds them: the leading
    null rows counted, the rest a rows x k float32 / int32 array, base64 little-endian with dtype markers, or
    plain lists keeping the rows' own values)."""
    null_prefix = 0
    while null_prefix < len(tops) and not tops[null_prefix]:
        null_prefix += 1
    rows = tops[null_prefix:]
    k = len(rows[0]) if rows else k
    if b64:
        import numpy as np

        val = np.asarray([[a[0] for a in r] for r in rows], dtype=np.float32).reshape(len(rows), k)
        idx = np.asarray([[a[1] for a in r] for r in rows], dtype=np.int32).reshape(len(rows), k)
        return flat_from_arrays(side, val, idx, null_prefix, True)
    pre = f"{side}_top_logprobs"
    return {f"{pre}_val_flat": [a[0] for r in rows for a in r], f"{pre}_idx_flat": [a[1] for r in rows for a in r],
            f"{pre}_shape": [len(rows), k], f"{pre}_null_prefix": null_prefix}
