"""Parsers for SGLang's and OpenAI's logprob wire formats (pure functions, unit-tested on real bodies).

SGLang native (``/generate`` ``meta_info``, and chat ``choices[0].meta_info`` when the request sets
``return_meta_info``): each logprob is a triple ``[logprob, token_id, text_or_null]``; a top list
is a list of such triples or ``null`` (e.g. ``input_top_logprobs[0]``).

OpenAI chat: ``choices[0].logprobs.content[] = {token, logprob, bytes, top_logprobs: [{token,
logprob, bytes}]}`` with no token ids. SGLang's chat path deduplicates alternatives by decoded
text, so fewer than k can come back; the count is kept per token.
"""
from __future__ import annotations

import binascii
import math
from itertools import chain
from operator import itemgetter
from typing import Any, Callable

import numpy as np
from pybase64 import b64decode

from ..jsonio import loads
from .base import LOGPROB_FLOOR, BackendError, BadReply, TokenArrays, TokenLogprob, TopLogprob

__all__ = ["decode_generate_reply", "tokens_from_triples", "arrays_from_triples", "flat_top_arrays", "arrays_from_flat", "tokens_from_chat_logprobs", "finish_reason_of",
           "check_values", "MAX_TOKEN_ID", "POSITIVE_ROUNDING"]

_chain, _first, _second, _third = chain.from_iterable, itemgetter(0), itemgetter(1), itemgetter(2)

#: Token ids are stored as 32-bit integers: anything at or above this is refused, whatever the vocabulary.
MAX_TOKEN_ID = 2**31 - 1
#: A log-softmax is <= 0; float rounding can leave its largest value a hair above (ours: 1e-5 nats).
POSITIVE_ROUNDING = 1e-5
#: The top-k probabilities of one distribution sum to at most 1; float32 log-softmax rounding can add a little
#: (ours: 1e-3, far above 20 float32 roundings, far below any list that is not one distribution).
TOP_MASS_ROUNDING = 1e-3


def decode_generate_reply(body: bytes) -> Any:
    """Parse a ``/generate`` reply: ``{"text": …, "meta_info": {…}}`` with the meta fields it has (None ones left
    out, as if absent). Anything else (an error body, no ``meta_info``) is returned as parsed, so the checked path
    sees it as it is and names what is wrong."""
    r = loads(body)
    if isinstance(r, dict) and isinstance(r.get("meta_info"), dict):
        r["meta_info"] = {k: v for k, v in r["meta_info"].items() if v is not None}
    return r


def _unbase64(s: str) -> bytes:
    return b64decode(s, validate=True)  # strict: a character outside the alphabet is refused


#: The dtypes SGLang's flat base64 arrays may carry (its ``*_flat_b64_dtype`` markers), as little-endian numpy types.
_FLAT_DTYPES = {"float32": "<f4", "float16": "<f2", "float64": "<f8", "int32": "<i4", "int64": "<i8"}


def flat_top_arrays(meta: dict, side: str, where: str):
    """SGLang's flat top-logprob format (0.5.23: ``return_flat_raw_top_logprobs`` with ``_b64``; the nested
    ``{side}_top_logprobs`` list is then absent): ``(values (rows, k) float64, ids (rows, k) int64, null_prefix)``,
    or None when the reply carries no flat fields (a server that ignored the request, or fell back to the nested
    lists, which SGLang does for ragged rows). Covered position i, alternative j is row i - null_prefix; the
    ``null_prefix`` leading positions have no top list. The values are the server's float32 logprobs, exactly as
    the nested lists print them (float32 -> float64 is exact), so both formats give the same arrays (tested on
    SGLang's real front end). Anything inconsistent (a missing half, a length that is not the shape, an unknown
    dtype) is refused naming the field."""
    pre = f"{side}_top_logprobs"
    b64 = meta.get(f"{pre}_val_flat_b64") is not None or meta.get(f"{pre}_idx_flat_b64") is not None
    plain = meta.get(f"{pre}_val_flat") is not None or meta.get(f"{pre}_idx_flat") is not None
    if not (b64 or plain):
        return None
    shape, null_prefix = meta.get(f"{pre}_shape"), meta.get(f"{pre}_null_prefix", 0)
    if (not isinstance(shape, (list, tuple)) or len(shape) != 2 or not all(type(x) is int and x >= 0 for x in shape)
            or type(null_prefix) is not int or null_prefix < 0):
        raise BadReply(f"{where}: flat top logprobs with shape {shape!r} and null prefix {null_prefix!r}; refusing "
                       "the reply")
    rows, k = shape
    out = []
    for part, kind in (("val", "float"), ("idx", "int")):
        if b64:
            data, dt = meta.get(f"{pre}_{part}_flat_b64"), meta.get(f"{pre}_{part}_flat_b64_dtype")
            np_dt = _FLAT_DTYPES.get(dt) if isinstance(dt, str) else None
            if not isinstance(data, str) or np_dt is None or np.dtype(np_dt).kind != kind[0]:
                raise BadReply(f"{where}: {pre}_{part}_flat_b64 is {type(data).__name__} with dtype {dt!r}; refusing "
                               "the reply")
            try:
                raw = _unbase64(data)
            except (binascii.Error, ValueError):
                raise BadReply(f"{where}: {pre}_{part}_flat_b64 is not base64; refusing the reply") from None
            if len(raw) != rows * k * np.dtype(np_dt).itemsize:
                raise BadReply(f"{where}: {pre}_{part}_flat_b64 holds {len(raw)} bytes, not the {rows} x {k} {dt} of its "
                               "shape; refusing the reply")
            a = np.frombuffer(raw, dtype=np_dt)
        else:
            v = meta.get(f"{pre}_{part}_flat")
            try:
                a = np.asarray(v, dtype=np.float64 if kind == "float" else np.int64)
            except (TypeError, ValueError, OverflowError):
                raise BadReply(f"{where}: {pre}_{part}_flat is not a list of numbers; refusing the reply") from None
            if a.ndim != 1 or a.size != rows * k:
                raise BadReply(f"{where}: {pre}_{part}_flat holds {a.size} values, not the {rows} x {k} of its shape; "
                               "refusing the reply")
        out.append(a.reshape(rows, k).astype(np.float64 if kind == "float" else np.int64))
    return out[0], out[1], null_prefix


def _texts_of(texts: list, ids: np.ndarray, decode, decode_many) -> list:
    """The tokens' texts: the wire's where it sent them, else decoded from the ids by the tokenizer."""
    if None not in texts:  # a C-level scan, not a generator over the tokens
        return texts
    if decode_many is not None:
        return decode_many(ids.tolist())
    if decode is not None:
        return [decode(i) for i in ids.tolist()]
    return ["" if x is None else x for x in texts]


def arrays_from_flat(token_lps: list, val: np.ndarray, idx: np.ndarray, *, decode=None, decode_many=None) -> TokenArrays:
    """A scoring's tokens from its ``[logprob, id, text]`` triples and the flat top-k arrays of the same positions
    (:func:`flat_top_arrays`): the arrays the nested lists give (rows sorted best first, as SGLang's are; a row that
    is not is sorted here, as the checked path sorts). Malformed triples raise ``BackendError`` naming them."""
    n = len(token_lps)
    try:
        try:  # the columns by C-level iteration; a null logprob (NaN for the checks to name) takes the slow way
            lps = np.fromiter(map(_first, token_lps), np.float64, n)
        except TypeError:
            lps = np.array([_num(t[0], "token logprob") for t in token_lps], dtype=np.float64)
        ids = np.fromiter(map(_second, token_lps), np.int64, n)
        try:
            texts = list(map(_third, token_lps))
        except IndexError:  # a [logprob, id] pair without its text
            texts = [t[2] if len(t) > 2 else None for t in token_lps]
    except (TypeError, ValueError, IndexError, OverflowError, BackendError):
        bad = next((t for t in token_lps if not isinstance(t, (list, tuple)) or len(t) < 2), token_lps[:1])
        raise BadReply(f"expected [logprob, token_id, text], got {str(bad)[:80]}") from None
    if val.shape[1] > 1 and (np.diff(val, axis=1) > 0).any():
        order = np.argsort(-val, axis=1, kind="stable")
        val, idx = np.take_along_axis(val, order, 1), np.take_along_axis(idx, order, 1)
    texts = _texts_of(texts, ids, decode, decode_many)
    return TokenArrays(ids, texts, lps, idx, val, decode=decode)


def check_values(tokens, where: str, *, k: int | None = None, vocab: int | None = None, ids: bool = True):
    """Refuse (:class:`BadReply`) a reply whose values cannot be true, naming the field and position: a NaN,
    +inf or positive (beyond float rounding) logprob; a token id < 0, >= ``vocab`` (the model's, padded rows
    included) or beyond 32 bits; a top list shorter than ``k`` where the wire carries ids (``ids``). -inf and
    float32's lowest value (SGLang's clamp of an underflowed scaled logprob) become :data:`LOGPROB_FLOOR`,
    which every entropy / KL path reads as probability 0. Returns ``tokens`` (fixed in place)."""
    try:
        return _check_values(tokens, where, k, vocab, ids)
    except OverflowError:
        raise BadReply(f"{where}: a token id beyond 64 bits; refusing the reply") from None


def _plainly_valid(tokens: TokenArrays, k, vocab, ids: bool) -> bool:
    """The common case in a few reductions (ours: cheaper than the masks below; docs/performance.md):
    every row has all its alternatives, every logprob is <= the rounding allowance (a NaN fails that too), every
    id is in range. Anything else goes through the checks that name what is wrong."""
    tl, counts = tokens.top_logprobs, tokens.counts
    if tl.ndim != 2 or (len(counts) and int(counts.min()) != tl.shape[1]):
        return False
    if not ((tokens.logprobs <= POSITIVE_ROUNDING).all() and (tl <= POSITIVE_ROUNDING).all()):
        return False
    if ids:
        hi = min(vocab, MAX_TOKEN_ID) if vocab else MAX_TOKEN_ID
        for a in (tokens.ids, tokens.top_ids):
            if a.size and (int(a.min()) < -1 or int(a.max()) >= hi):
                return False
        if k and len(counts) and int(counts.min()) < k:
            return False
    return True


def _check_distribution(tl: np.ndarray, ti: np.ndarray, counts: np.ndarray, where: str, ids: bool) -> None:
    """A top list is alternatives of one distribution: no token twice (F2), and probabilities that sum to at most 1
    plus :data:`TOP_MASS_ROUNDING` (F4). Refused naming the position."""
    if not tl.size:
        return
    valid = np.arange(tl.shape[1])[None, :] < counts[:, None]
    mass = np.where(valid, np.exp(np.where(valid, tl, -np.inf)), 0.0).sum(axis=1)
    if (mass > 1.0 + TOP_MASS_ROUNDING).any():
        i = int(np.argmax(mass))
        raise BadReply(f"{where}: the top alternatives at position {i} have probabilities summing to {mass[i]:.4f} "
                       "(> 1: not one distribution); refusing the reply")
    if ids and ti.size:
        s = np.sort(np.where(valid, ti, -1), axis=1)
        dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
        if dup.any():
            i, j = (int(x) for x in np.argwhere(dup)[0])
            raise BadReply(f"{where}: token id {int(s[i, j])} is listed twice among the top alternatives at position "
                           f"{i}; refusing the reply")


def _check_values(tokens: TokenArrays, where, k, vocab, ids):
    if _plainly_valid(tokens, k, vocab, ids):
        _check_distribution(tokens.top_logprobs, tokens.top_ids, tokens.counts, where, ids)
    else:
        _check_irregular(tokens, where, k, vocab, ids)
    for a in (tokens.logprobs, tokens.top_logprobs):  # the known floor: -inf or float32's lowest is probability 0
        low = a <= LOGPROB_FLOOR
        if low.any():  # rare: no write pass over every reply
            a[low] = LOGPROB_FLOOR
    return tokens


def _check_irregular(tokens: TokenArrays, where, k, vocab, ids) -> None:
    """The checks that name what is wrong, for a reply that is not plainly valid."""
    counts = tokens.counts
    for name, a, cnt in (("logprob", tokens.logprobs, None), ("top logprob", tokens.top_logprobs, counts)):
        if a.ndim == 2 and cnt is not None:  # only the alternatives a row has (absent ones are NaN by design)
            valid = np.arange(a.shape[1])[None, :] < cnt[:, None]
        else:
            valid = np.ones(a.shape, dtype=bool)
        bad = valid & (np.isnan(a) | (a == np.inf) | (a > POSITIVE_ROUNDING))
        if bad.any():
            pos = np.argwhere(bad)[0]
            raise BadReply(f"{where}: {name} {float(a[tuple(pos)])!r} at position {tuple(int(x) for x in pos)}: a logprob must be "
                           "a finite number <= 0; refusing the reply")
    if ids:
        for name, a in (("token id", tokens.ids), ("top token id", tokens.top_ids)):
            hi = min(vocab, MAX_TOKEN_ID) if vocab else MAX_TOKEN_ID
            out = (a < -1) | (a >= hi)
            if out.any():
                v = int(a[out][0])
                raise BadReply(f"{where}: {name} {v} outside the vocabulary (0..{hi - 1}); refusing the reply")
        if k and len(counts) and int(counts.min()) < k:
            i = int(np.argmin(counts))
            raise BadReply(f"{where}: top list {i} has {int(counts[i])} alternatives, {k} were asked; refusing the reply")
    _check_distribution(tokens.top_logprobs, tokens.top_ids, counts, where, ids)


def _num(x: Any, where: str) -> float:
    if x is None:
        return float("nan")
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise BadReply(f"{where}: logprob {x!r} is not a number") from None
    return v


def _triple(t: Any, where: str, decode: Callable[[int], str] | None, vocab: int | None = None) -> TopLogprob:
    """One ``[logprob, token_id, text]``; an id that is no integer or lies outside the vocabulary is refused before
    anything decodes it (a malformed reply is asked again, :class:`BadReply`)."""
    if not isinstance(t, (list, tuple)) or len(t) < 2:
        raise BadReply(f"{where}: expected [logprob, token_id, text], got {str(t)[:80]}")
    try:
        tid = None if t[1] is None else int(t[1])
    except (TypeError, ValueError, OverflowError):
        raise BadReply(f"{where}: token id {str(t[1])[:40]!r} is not an integer; refusing the reply") from None
    if tid is not None and (tid < 0 or (vocab is not None and tid >= vocab)):
        raise BadReply(f"{where}: token id {tid} outside the vocabulary (0..{'?' if vocab is None else vocab - 1}); "
                       "refusing the reply")
    text = t[2] if len(t) > 2 and t[2] is not None else (decode(tid) if decode and tid is not None else "")
    return TopLogprob(tid, text, _num(t[0], where))


def arrays_from_triples(token_lps: list, top_lps: list | None, *, decode: Callable[[int], str] | None = None,
                        decode_many: Callable[[list], list] | None = None, vocab: int | None = None) -> TokenArrays | None:
    """The common case straight into arrays: every triple ``[logprob, id, text|null]`` well-formed, every top
    list of one length k and sorted best first, no NaN. None for anything else (the checked path then says
    exactly what is wrong). No Python object per token or alternative survives this function."""
    try:
        n = len(token_lps)
        lps = np.array([t[0] for t in token_lps], dtype=np.float64)
        ids = np.array([t[1] for t in token_lps], dtype=np.int64)
        texts = [t[2] for t in token_lps]
        if top_lps:
            k = len(top_lps[0])
            if k == 0 or any(r is None or len(r) != k for r in top_lps):
                return None
            # one flat list of the n*k triples, each column taken by C-level iteration (no Python loop per
            # alternative: docs/performance.md)
            flat = list(_chain(top_lps))
            tl = np.fromiter(map(_first, flat), np.float64, n * k).reshape(n, k)
            ti = np.fromiter(map(_second, flat), np.int64, n * k).reshape(n, k)
            del flat
        else:
            tl, ti = np.zeros((n, 0)), np.zeros((n, 0), dtype=np.int64)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if np.isnan(lps).any() or np.isnan(tl).any() or (ids < 0).any() or (tl.shape[1] > 1 and (np.diff(tl, axis=1) > 0).any()):
        return None
    if vocab is not None and len(ids) and (int(ids.max()) >= vocab or (ti.size and (int(ti.max()) >= vocab
                                                                                  or int(ti.min()) < 0))):
        return None  # an id outside the vocabulary: the checked path names it before anything decodes it
    texts = _texts_of(texts, ids, decode, decode_many)
    return TokenArrays(ids, texts, lps, ti, tl, decode=decode)


def tokens_from_triples(token_lps: list, top_lps: list | None, *, decode: Callable[[int], str] | None = None,
                        where: str = "meta_info", decode_many: Callable[[list], list] | None = None,
                        k: int | None = None, vocab: int | None = None):
    """Tokens from SGLang triples; ``top_lps[i]`` may be None (no alternatives at that position).

    One parse: well-formed replies go straight into :class:`TokenArrays` (:func:`arrays_from_triples`); anything
    else is read one triple at a time, with an error naming the first bad entry. Either way the values
    are checked (:func:`check_values`: ``k`` alternatives asked, ``vocab`` the model's vocabulary size)."""
    if not isinstance(token_lps, list):
        raise BackendError(f"{where}: token logprobs missing or not a list (did the server get return_logprob?)")
    if top_lps is not None and len(top_lps) != len(token_lps):
        raise BackendError(f"{where}: {len(token_lps)} token logprobs but {len(top_lps)} top-logprob lists")
    arrays = arrays_from_triples(token_lps, top_lps, decode=decode, decode_many=decode_many, vocab=vocab)
    if arrays is not None:
        return check_values(arrays, where, k=k, vocab=vocab)
    # anything else, one triple at a time: a valid irregular reply (a null or short top list, a null logprob) is
    # read, a malformed one refused naming its first bad entry
    out = []
    for i, t in enumerate(token_lps):
        tok = _triple(t, where, decode, vocab)
        top: list = []
        if top_lps is not None and top_lps[i] is not None:
            w = f"{where}.top[{i}]"
            top = [_triple(a, w, decode, vocab) for a in top_lps[i]]
            top.sort(key=lambda a: -a.logprob if not math.isnan(a.logprob) else math.inf)
        out.append(TokenLogprob(tok.id, tok.text, tok.logprob, top))
    return check_values(TokenArrays.from_tokens(out, decode=decode), where, k=k, vocab=vocab)


def tokens_from_chat_logprobs(content: list, where: str = "logprobs.content") -> TokenArrays:
    """OpenAI chat ``logprobs.content`` as arrays: no ids on this path (-1), each top list sorted best first."""
    if not isinstance(content, list):
        raise BackendError(f"{where}: missing (did the server get logprobs=true?)")
    texts, lps, tops = [], [], []
    for i, e in enumerate(content):
        if not isinstance(e, dict) or "logprob" not in e:
            raise BackendError(f"{where}[{i}]: malformed entry {str(e)[:80]}")
        top = sorted(((_num(a.get("logprob"), f"{where}[{i}].top"), a.get("token", ""))
                      for a in (e.get("top_logprobs") or [])), key=lambda x: -x[0])
        texts.append(e.get("token", ""))
        lps.append(_num(e["logprob"], f"{where}[{i}]"))
        tops.append(top)
    k = max(map(len, tops), default=0)
    tl = np.full((len(tops), k), np.nan)
    for i, top in enumerate(tops):
        tl[i, :len(top)] = [lp for lp, _ in top]
    arrays = TokenArrays(np.full(len(texts), -1), texts, lps, np.full((len(tops), k), -1), tl,
                         counts=[len(t) for t in tops], top_texts=[[t for _, t in top] for top in tops])
    # no ids on this path, and SGLang's chat path dedupes alternatives by text (fewer than k: counted, not refused)
    return check_values(arrays, where, ids=False)


def finish_reason_of(x: Any) -> str | None:
    """SGLang native: ``{"type": "stop"|"length", ...}`` or null; OpenAI: a string."""
    if isinstance(x, dict):
        return x.get("type")
    return x
