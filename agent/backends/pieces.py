"""A prompt's token ids by message piece: recorded by the run, reused by the probes (ours).

SGLang's native backend (``sglang_native.py``) sends token ids, never prompt text: it renders the messages with
the model's chat template, cuts the text before every ``<|im_start|>`` and tokenises each piece once (a special
token is split out before pre-tokenisation, so the pieces' ids are the whole prompt's). Each piece is known by a
16-byte digest of its text (:func:`piece_digest`). Every generation hands its prompt's pieces back
(``ModelOutput.prompt_pieces``); the trajectory keeps each distinct piece once and the run stores them in the
token sidecar's metadata (``agent/rundir/sidecar.py``), beside the fingerprint of the tokenizer that made them
(:func:`tokenizer_fingerprint`).

Why: the probes send the run's prompts again (the entropy probe two per step, with and without the query images)
and a step's new pieces (~8K characters: the previous step's reasoning and its tool observation) were tokenised
once more per probed step, a third of a teacher-forced step's client CPU (docs/performance.md). With the
run's pieces in a :class:`PieceBook`, a probe sends **the very ids the model was sent during the run** and
tokenises only what the run never sent (the first user message without its images). The run's client pays for
the tokenising instead, while the GPU decodes each reply, and SGLang's own front end no longer
tokenises the text.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

__all__ = ["piece_digest", "tokenizer_fingerprint", "PieceBook", "pack_pieces", "unpack_pieces", "lend_pieces"]

#: What makes a tokenizer (transformers reads these files to build it); their bytes, in this order, are hashed.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
_PACK_VERSION = b"1"


def piece_digest(text: str) -> bytes:
    """A prompt piece's identity: BLAKE2b-128 of its UTF-8 bytes (a lone surrogate kept as it is)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def tokenizer_fingerprint(model_dir) -> str | None:
    """sha256 over the tokenizer's files in ``model_dir`` (those of :data:`TOKENIZER_FILES` that exist, each with
    its name), or None without a ``tokenizer.json`` (nothing is then recorded or reused). Two model directories with
    the same files tokenise alike, e.g. the three Qwen3.5 sizes."""
    d = Path(str(model_dir)) if model_dir else None
    if d is None or not (d / "tokenizer.json").is_file():
        return None
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        p = d / name
        if p.is_file():
            h.update(name.encode() + b"\0")
            h.update(p.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


class PieceBook:
    """Recorded pieces lent to a backend while the trajectories that recorded them are in flight: digest -> ids,
    counted, so a piece two trajectories share (the system prompt, a sample's question in two trials) stays until
    the last of them gives it back; memory is the pieces of the trajectories in flight."""

    def __init__(self):
        self._ids: dict[bytes, np.ndarray] = {}
        self._refs: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, digest: bytes):
        return self._ids.get(digest)

    def lend(self, pieces: dict[bytes, np.ndarray]) -> list[bytes]:
        """Add ``pieces``; returns the digests to give back (:meth:`give_back`)."""
        ids, refs = self._ids, self._refs
        for d, a in pieces.items():
            if d in refs:
                refs[d] += 1
            else:
                ids[d], refs[d] = a, 1
        return list(pieces)

    def give_back(self, digests: list[bytes]) -> None:
        ids, refs = self._ids, self._refs
        for d in digests:
            n = refs.get(d, 0) - 1
            if n > 0:
                refs[d] = n
            elif n == 0:
                del refs[d], ids[d]


def lend_pieces(backend, fingerprint: str | None, pieces: dict[bytes, np.ndarray]):
    """Lend a trajectory's recorded pieces to ``backend`` (each server of a ``Spread``) where its tokenizer is the one
    that made them. Returns ``(lent, give_back)``: whether any backend took them, and the call that returns them."""
    lent: list[tuple[PieceBook, list[bytes]]] = []
    if pieces and fingerprint:
        for b in getattr(backend, "backends", None) or [backend]:
            book = getattr(b, "book", None)
            if (book is not None and getattr(b, "fingerprint", None) == fingerprint
                    and all(book is not other for other, _ in lent)):  # servers of one model share one book
                lent.append((book, book.lend(pieces)))

    def give_back() -> None:
        for book, digests in lent:
            book.give_back(digests)
        lent.clear()

    return bool(lent), give_back


#: zstd level of the record (ours): the plain little-endian int32 at level 3 compresses Qwen-vocabulary prompt ids
#: better than level 1 of their byte planes (which break a repeated token's bytes apart; docs/performance.md).
_ZSTD_LEVEL = 3


def pack_pieces(pieces: dict[bytes, np.ndarray]) -> bytes:
    """The pieces as bytes (sidecar metadata): ``1:<n>:<ids>:`` then zstd of the digests (16 bytes each), the
    lengths (uint32) and the ids (int32), all little-endian."""

    digests = list(pieces)
    if any(len(d) != 16 for d in digests):
        raise ValueError("a prompt piece digest is not 16 bytes")
    arrays = [np.asarray(pieces[d], dtype=np.int32).reshape(-1) for d in digests]
    lens = np.fromiter((len(a) for a in arrays), dtype="<u4", count=len(arrays))
    ids = np.concatenate(arrays).astype("<i4", copy=False) if arrays else np.zeros(0, "<i4")
    body = b"".join(digests) + lens.tobytes() + ids.tobytes()
    packed = pa.Codec("zstd", compression_level=_ZSTD_LEVEL).compress(body, asbytes=True)
    return b"%s:%d:%d:" % (_PACK_VERSION, len(digests), len(ids)) + packed


def unpack_pieces(blob: bytes) -> dict[bytes, np.ndarray]:
    """:func:`pack_pieces` undone; a blob that does not hold what its header says raises ValueError naming why."""

    try:
        version, n_raw, total_raw, body = blob.split(b":", 3)
        n, total = int(n_raw), int(total_raw)
    except ValueError:
        raise ValueError("prompt pieces: malformed header") from None
    if version != _PACK_VERSION:
        raise ValueError(f"prompt pieces: format {version!r} is not one this toolkit reads ({_PACK_VERSION!r})")
    if n < 0 or total < 0:
        raise ValueError("prompt pieces: negative counts")
    size = 20 * n + 4 * total
    try:
        raw = pa.decompress(body, decompressed_size=size, codec="zstd", asbytes=True)
    except (OSError, ValueError) as e:  # pyarrow raises OSError for corrupt zstd data
        raise ValueError(f"prompt pieces: the compressed body is corrupt ({e})") from None
    if len(raw) != size:
        raise ValueError(f"prompt pieces: {len(raw)} bytes where the header says {size}")
    lens = np.frombuffer(raw, dtype="<u4", count=n, offset=16 * n).astype(np.int64)
    if int(lens.sum()) != total:
        raise ValueError(f"prompt pieces: the lengths add to {int(lens.sum())}, not the header's {total}")
    ids = np.frombuffer(raw, dtype="<i4", offset=20 * n).astype(np.int32)  # a copy: the record's bytes can go
    ends = np.cumsum(lens)
    return {raw[16 * i: 16 * i + 16]: ids[e - m: e] for i, (m, e) in enumerate(zip(lens.tolist(), ends.tolist()))}

