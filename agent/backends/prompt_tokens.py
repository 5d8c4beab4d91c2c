"""A prompt as token ids, for the backends that send ids (SGLang's native ``/generate``, vLLM's completions):
tokenised by message piece (each piece once, or taken from what a run recorded), the number of tokens each image
placeholder becomes on the server, and token ids decoded back to their texts.

A mixin of :class:`agent.backends.sglang_native.SGLangBackend` and :class:`agent.backends.vllm.VLLMBackend`;
:meth:`PromptTokens.setup_prompt_tokens` makes the state it uses.
"""
from __future__ import annotations

import hashlib
import weakref
from pathlib import Path
from typing import Callable

import numpy as np
import orjson

from ..jsonio import PartsJSON
from .base import BackendError, model_vocab_size
from .local import load_chat_renderer
from .pieces import PieceBook, piece_digest, tokenizer_fingerprint
from .vision import UnknownProcessor, VisionGrid

#: Where a rendered prompt is cut for :meth:`SGLangBackend.prompt_ids` (before each message's start token).
_IM_START = "<|im_start|>"
#: Message pieces remembered per backend sharing a tokenizer (ours: ~2 new per step, so 4,096 cover the last steps of every
#: trajectory in flight at the probes' 128 per server; a piece is its text and 4 bytes per id: ~10 KB).
_PIECE_CACHE = 4096


def piece_encoder(tok):
    """A prompt piece's ids: the tokenizer's own Rust ``encode_batch_fast`` (tokenizers >= 0.21: the same ids
    without the character offsets; less CPU than ``tok(piece)``, which also builds a BatchEncoding; ours,
    tested equal), or ``tok(piece)`` for a tokenizer without it."""
    fast = getattr(getattr(tok, "_tokenizer", None), "encode_batch_fast", None)
    if fast is not None and getattr(tok, "is_fast", False):
        return lambda piece: fast([piece], add_special_tokens=False)[0].ids
    return lambda piece: tok(piece, add_special_tokens=False)["input_ids"]


def joined_ids(pieces: list) -> np.ndarray:
    """The pieces' ids as one int32 array."""
    return np.concatenate([ids for _, ids in pieces]) if pieces else np.zeros(0, np.int32)


def json_len(ids: np.ndarray) -> int:
    """The length of ``ids`` written as JSON numbers with commas between them (no brackets), without writing them."""
    if not len(ids):
        return 0
    if int(ids.min()) < 0:  # never a token id: written to be counted, so the length stays exact
        return len(orjson.dumps(ids, option=orjson.OPT_SERIALIZE_NUMPY)) - 2
    return 2 * len(ids) - 1 + sum(int(np.count_nonzero(ids >= 10 ** k)) for k in range(1, 10))


class JsonIds(PartsJSON):
    """Token ids as the JSON array a request body carries, written from the arrays that hold them (a prompt's
    message pieces, then the continuation) as the body is sent: no joined array and no body text is held while the
    request is in flight (ours: the ids as JSON are ~7 bytes each, ~0.4 MB for a 60,000-token prompt, in every
    request in flight; docs/performance.md). ``lengths``: each array's :func:`json_len`, where already known."""

    CHUNK = 1 << 14  # ids serialised at a time
    PART = 1 << 16   # bytes handed to the socket at a time: a prompt's many short pieces are not a write each

    def __init__(self, arrays: list[np.ndarray], lengths: list[int | None] | None = None):
        self.arrays = [np.ascontiguousarray(a, dtype=np.int32) for a in arrays]
        known = lengths or [None] * len(self.arrays)
        self.lengths = [json_len(a) if n is None else n for a, n in zip(self.arrays, known)]

    def __len__(self) -> int:
        return sum(len(a) for a in self.arrays)

    def ids(self) -> np.ndarray:
        """The ids as one array."""
        return np.concatenate(self.arrays) if self.arrays else np.zeros(0, np.int32)

    def nbytes(self) -> int:
        filled = sum(1 for a in self.arrays if len(a))
        return 2 + sum(self.lengths) + max(filled - 1, 0)

    def parts(self):
        buf, size, sep = [b"["], 1, b""
        for a in self.arrays:
            for i in range(0, len(a), self.CHUNK):
                text = orjson.dumps(a[i:i + self.CHUNK], option=orjson.OPT_SERIALIZE_NUMPY)
                buf += [sep, memoryview(text)[1:-1]]  # the numbers without their brackets
                size, sep = size + len(text) - 2 + len(sep), b","
                if size >= self.PART:
                    yield b"".join(buf)
                    buf, size = [], 0
        buf.append(b"]")
        yield b"".join(buf)


class TokenTexts:
    """Each token id's text as ``tok.decode([id])`` gives it, decoded once and kept in a list indexed by id (ours: a
    real vocabulary's ids, ~248,000, are met over a run; a list holds no key per id and is read in one C-level pass
    a reply). Ids outside the vocabulary are decoded each time, never kept (a reply's checks refuse them)."""

    def __init__(self, tok, size: int):
        self.tok = tok
        self.texts: list = [None] * size
        rust = getattr(tok, "_tokenizer", None)
        # a fast tokenizer without clean-up decodes an id as its Rust decoder does: all the new ones in one call
        self._batch = (rust.decode_batch if rust is not None and getattr(tok, "is_fast", False)
                       and not getattr(tok, "clean_up_tokenization_spaces", False) else None)

    def __contains__(self, tid: int) -> bool:
        return 0 <= tid < len(self.texts) and self.texts[tid] is not None

    def one(self, tid: int) -> str:
        if 0 <= tid < len(self.texts):
            s = self.texts[tid]
            if s is None:
                s = self.texts[tid] = self.tok.decode([tid], skip_special_tokens=False)
            return s
        return self.tok.decode([tid], skip_special_tokens=False)

    def many(self, ids: list[int]) -> list[str]:
        t = self.texts
        a = np.asarray(ids)
        if not len(a) or a.dtype.kind not in "iu" or int(a.min()) < 0 or int(a.max()) >= len(t):
            return [self.one(int(i)) for i in ids]
        out = list(map(t.__getitem__, ids))
        if None not in out:  # the usual case once a run is under way: a C-level scan
            return out
        missing = np.unique(a[np.fromiter((x is None for x in out), bool, len(out))]).tolist()
        if self._batch is not None:
            for i, text in zip(missing, self._batch([[i] for i in missing], skip_special_tokens=False)):
                t[i] = text
        else:
            for i in missing:
                self.one(i)
        return list(map(t.__getitem__, ids))


class TokenizerState:
    """A model directory's tokenizer and what the methods below remember with it: decoded texts, message pieces,
    lent recorded pieces, image token counts. One per model directory and process, shared by every backend of it
    (:func:`tokenizer_state`)."""

    def __init__(self, tok, model_dir: str, fingerprint: str | None):
        self.tok, self.model_dir, self.fingerprint = tok, model_dir, fingerprint
        self.encode = piece_encoder(tok)
        self.vocab = model_vocab_size(model_dir)  # token ids at or above it are refused (check_values)
        self.decode_cache = TokenTexts(tok, max(self.vocab or 0, len(tok)))
        self.piece_ids: dict = {}                      # prompt_pieces: (digest, int32 ids) per message piece
        self.users: weakref.WeakSet = weakref.WeakSet()  # the backends sharing it: _PIECE_CACHE pieces each
        # pieces a run recorded, lent by a probe while their trajectory is in flight (agent/backends/pieces.py)
        self.book = PieceBook()
        self.piece_stats = {"tokenised": 0, "tokenised_chars": 0, "recorded": 0}
        self.image_tokens: dict = {}                   # image_tokens: expanded length per image sha256


#: The states in use, by model directory and the bytes of its tokenizer files and chat template: a backend holds
#: its state, and a state nobody holds is gone (ours: a probe over several servers of one model loaded one
#: tokenizer a server, ~95 MB apiece for Qwen3.5's vocabulary, each with its own caches; docs/performance.md).
_STATES: "weakref.WeakValueDictionary[tuple, TokenizerState]" = weakref.WeakValueDictionary()


def tokenizer_state(model_dir: str) -> TokenizerState:
    """The shared :class:`TokenizerState` of ``model_dir``, its tokenizer loaded (with its chat template) the first
    time, and again when the tokenizer's files or the template file changed."""
    fingerprint = tokenizer_fingerprint(model_dir)
    jinja = Path(model_dir) / "chat_template.jinja"
    template = hashlib.sha256(jinja.read_bytes()).hexdigest() if jinja.is_file() else None
    key = (str(model_dir), fingerprint, template)
    state = _STATES.get(key) if fingerprint else None  # files that cannot be told apart are never shared
    if state is None:
        state = TokenizerState(load_chat_renderer(model_dir), model_dir, fingerprint)
        if fingerprint:
            _STATES[key] = state
    return state


class PromptTokens:
    """The prompt's token ids by message piece, and the images' expanded token counts (see the module)."""

    # set by the backend that mixes this in (agent/backends/sglang_native.py)
    _image_tokens: dict
    _piece_ids: dict
    _encode: Callable
    book: dict | PieceBook
    piece_stats: dict

    def setup_prompt_tokens(self, model_dir: str, renderer=None) -> None:
        """The tokenizer of ``model_dir`` and the caches the methods below keep: those every backend of the model
        directory shares (:func:`tokenizer_state`), or, given a ``renderer``, this backend's own."""
        state = (tokenizer_state(model_dir) if renderer is None
                 else TokenizerState(renderer, model_dir, tokenizer_fingerprint(model_dir)))
        state.users.add(self)
        self._tokens_state = state
        self.tok, self._encode, self.model_dir, self.vocab = state.tok, state.encode, model_dir, state.vocab
        self._decode_cache, self._piece_ids, self._image_tokens = state.decode_cache, state.piece_ids, state.image_tokens
        self.book, self.fingerprint, self.piece_stats = state.book, state.fingerprint, state.piece_stats
        self._proc = None
        self._grid = False                             # image_tokens: the processor's resize rule (None: unknown)

    def _decode(self, tid: int) -> str:
        return self._decode_cache.one(tid)

    def _decode_many(self, ids: list[int]) -> list[str]:
        return self._decode_cache.many(ids)

    def _processor(self):
        if self._proc is None:
            try:
                from transformers import AutoProcessor  # noqa: PLC0415 - optional heavy

                self._proc = AutoProcessor.from_pretrained(str(self.model_dir))
            except Exception as e:  # noqa: BLE001 - any failure: say what is needed
                raise BackendError(f"{self.model_dir}: scoring with images needs the model's processor to place the "
                                   f"scored tokens after the images ({type(e).__name__}: {e}); install torch and "
                                   "torchvision (present on an SGLang node) or score without images") from None
        return self._proc

    def _vision_grid(self):
        """The processor's resize rule read from its config (no torch), or None when it is not a Qwen-VL one."""
        if self._grid is False:
            try:
                self._grid = VisionGrid.from_model_dir(self.model_dir)
            except UnknownProcessor:
                self._grid = None
        return self._grid

    def prepare(self, mode: str) -> None:
        """Load once, before a probe of this ``mode`` starts, what its requests will need: for teacher-forced
        scoring with images, the image token rule (agent/backends/vision.py, read from the processor's config;
        no torch), or, for a processor that rule does not know, the processor itself."""
        if mode == "teacher-forced" and self._vision_grid() is None:
            try:
                self._processor()
            except BackendError:  # said again, with the reason, if an image is scored
                pass

    def image_tokens(self, images: list) -> list[int]:
        """Each image's token count after the server expands its placeholder (Qwen-VL rule: the processor's
        ``image_grid_thw`` / merge²), remembered per image content (sha256). From the image's stored size and
        the processor config (agent/backends/vision.py: the same arithmetic, tested against the processor), or
        from the processor itself where the config is not a Qwen-VL image processor."""
        cache = self._image_tokens
        todo = [im for im in images if im.sha256 not in cache]
        if todo:
            grid = self._vision_grid()
            if grid is not None:
                for im in todo:
                    cache[im.sha256] = grid.tokens(im.width, im.height)
            else:
                proc = self._processor()
                thw = proc.image_processor(images=[im.pil() for im in todo])["image_grid_thw"]
                merge = int(getattr(proc.image_processor, "merge_size", 2))
                for im, g in zip(todo, thw.tolist()):
                    cache[im.sha256] = int(g[0]) * int(g[1]) * int(g[2]) // (merge * merge)
        return [cache[im.sha256] for im in images]

    def expanded_prompt_len(self, n_prompt: int, images: list) -> int:
        """The length in tokens of an ``n_prompt``-token prompt after the server expands each image placeholder
        (Qwen-VL rule)."""
        per_image = self.image_tokens(images)
        return n_prompt + sum(per_image) - len(per_image)

    def prompt_pieces(self, prompt: str) -> list[tuple[bytes, np.ndarray]]:
        """The rendered prompt as ``(digest, int32 ids)`` per message piece (:meth:`piece_hits`)."""
        return [(d, ids) for d, ids, _ in self.piece_hits(prompt)]

    def prompt_json(self, prompt: str, then=None) -> JsonIds:
        """The rendered prompt's ids, then ``then``'s (a continuation), as a request body writes them."""
        hits = self.piece_hits(prompt)
        arrays = [ids for _, ids, _ in hits]
        lengths: list[int | None] = [n for _, _, n in hits]
        if then is not None:
            arrays.append(np.asarray(then, dtype=np.int32))
            lengths.append(None)
        return JsonIds(arrays, lengths)

    def piece_hits(self, prompt: str) -> list[tuple[bytes, np.ndarray, int]]:
        """The rendered prompt as ``(digest, int32 ids, their JSON length)`` per message piece: the text is cut before every
        ``<|im_start|>`` (a special token, split out before the tokenizer's pre-tokenisation, so nothing merges
        across the cut and the ids are those of the whole text; tested) and each piece's ids are remembered. A
        trajectory's later steps and its with / without-images requests repeat all but their last pieces. A piece
        met for the first time is taken from :attr:`book` (the ids a run recorded for it, lent by a probe) or else
        tokenised (ours: a trajectory's prompts grow by a few pieces a step, so each piece is tokenised once)."""
        cache = self._piece_ids
        out = []
        # str.split, then the start token put back on each later piece: the same pieces as a look-ahead regex split,
        # at ~1/20 of its CPU on a 58K-character prompt (ours)
        parts = prompt.split(_IM_START)
        for j, piece in enumerate(parts):
            if j:
                piece = _IM_START + piece
            elif not piece:
                continue
            hit = cache.get(piece)
            if hit is None:
                d = piece_digest(piece)
                ids = self.book.get(d)
                stats = self.piece_stats
                if ids is None:
                    ids = np.asarray(self._encode(piece), dtype=np.int32)  # 4 bytes an id
                    stats["tokenised"] += 1
                    stats["tokenised_chars"] += len(piece)
                else:
                    stats["recorded"] += 1
                if len(cache) >= _PIECE_CACHE * max(1, len(self._tokens_state.users)):
                    cache.pop(next(iter(cache)))  # oldest first: a bounded memory
                cache[piece] = hit = (d, ids, json_len(ids))
            out.append(hit)
        return out

    def prompt_ids(self, prompt: str) -> np.ndarray:
        """The rendered prompt's token ids (:meth:`prompt_pieces` joined) as one int32 array, for a caller that wants
        them whole; a request body writes them from the pieces instead (:meth:`prompt_json`)."""
        return joined_ids(self.prompt_pieces(prompt))

