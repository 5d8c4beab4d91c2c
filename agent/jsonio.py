"""The one JSON codec of the toolkit: what every record, request body and reply goes through.

    dumps(obj) -> bytes         compact UTF-8 JSON (orjson; numpy values as theirs; non-finite floats null)
    dumps_parts(obj) -> list    the same bytes as pieces, each PartsJSON value left for the sender to write
    dumps_record(obj) -> bytes  the same, its strings redacted first (agent/redact.py): what a record file gets
    loads(bytes)                orjson, or the standard library for what orjson refuses (an escaped lone surrogate)
    scrub(text)                 lone surrogates replaced, where model text enters the toolkit
"""
from __future__ import annotations

import json
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator

import orjson

from .redact import redact_obj

__all__ = ["loads", "dumps", "dumps_parts", "dumps_record", "scrub", "PartsJSON", "PartsString"]


class PartsJSON(ABC):
    """A JSON value written from parts, so that a request body need not hold it whole while its request is in flight
    (a prompt's token ids: ~7 bytes of JSON an id, ~0.4 MB for a 60,000-token prompt). :func:`dumps_parts` leaves
    it for the sender (agent.http writes it part by part into the socket); :func:`dumps` writes it whole.
    Implementations: agent.backends.prompt_tokens.JsonIds and :class:`PartsString`."""

    @abstractmethod
    def nbytes(self) -> int:
        """The total length of :meth:`parts`."""

    @abstractmethod
    def parts(self) -> Iterator[bytes]:
        """Its JSON text in order, as UTF-8 bytes."""

    def whole(self) -> bytes:
        return b"".join(self.parts())


class PartsString(PartsJSON):
    """A JSON string value written from parts (an image's base64 data URI: ~0.5 MB a photo, in every request in
    flight): :meth:`parts` are its characters without the quotes, ASCII with nothing to escape. Its one
    implementation is agent.images.SentDataURI."""

    def __str__(self) -> str:
        return self.whole().decode("ascii")


def loads(data: bytes):
    """Parse JSON with orjson. A body orjson refuses but the JSON grammar allows — a JSON-escaped lone surrogate
    such as ``"\\ud800"`` in a model's output — is parsed by the standard library instead."""
    try:
        return orjson.loads(data)
    except ValueError:
        return json.loads(data)


def dumps(obj, *, sort_keys: bool = False, int_keys: bool = False) -> bytes:
    """Compact UTF-8 JSON (orjson; numpy values as their Python values); non-finite floats become null.
    ``int_keys``: dict keys may be ints (written as strings, as the json module writes them).

    Strings holding lone surrogates (not encodable as UTF-8) are written as JSON escapes (``\\ud800``),
    so a record never fails to write because of what a model emitted."""
    opt = (orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_SORT_KEYS if sort_keys else 0)
           | (orjson.OPT_NON_STR_KEYS if int_keys else 0))
    try:
        data = orjson.dumps(obj, option=opt, default=_default)
    except TypeError:  # "str is not valid UTF-8: surrogates not allowed"
        data = json.dumps(_plain(obj), sort_keys=sort_keys, ensure_ascii=True, separators=(",", ":"),
                          allow_nan=False, default=_default).encode()
    return data


def dumps_parts(obj) -> list:
    """:func:`dumps` of ``obj`` as its pieces in order: ``bytes``, and each :class:`PartsJSON` value left whole
    (a :class:`PartsString` between the bytes that hold its quotes), so a sender writes the same bytes without
    holding them all at once.
    Ours: each such value is serialised as a placeholder (a NUL-delimited random nonce and its index, which no other
    string carries) and the bytes split there."""
    found: list = []
    nonce = os.urandom(8).hex()

    def mark(o):
        if isinstance(o, PartsJSON):
            found.append(o)
            return f"\x00{nonce}{len(found) - 1}\x00"
        return _default(o)
    try:
        data = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY, default=mark)
    except TypeError:  # a lone surrogate: the standard library writes it, every value whole
        return [dumps(obj)]
    out: list = []
    for i, value in enumerate(found):
        head, data = data.split(f'"\\u0000{nonce}{i}\\u0000"'.encode(), 1)
        quote = b'"' if isinstance(value, PartsString) else b""  # a string's quotes stay with the bytes around it
        out += [head + quote, value]
        data = quote + data if quote else data
    out.append(data)
    return [x for x in out if not isinstance(x, bytes) or x]


def dumps_record(obj) -> bytes:
    """:func:`dumps` of ``obj`` with its strings redacted first (agent/redact.py): what a record file gets (a run
    line, its index entry, a probe's step), so that no key in use that a server echoed is written."""
    return dumps(redact_obj(obj))


def _plain(o):
    """``o`` with numpy keys and non-finite floats made plain, for the standard library's encoder."""
    if isinstance(o, dict):
        return {(k.item() if hasattr(k, "item") else k): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    if hasattr(o, "tolist"):
        return _plain(o.tolist())
    if isinstance(o, PartsJSON):
        return str(o) if isinstance(o, PartsString) else loads(o.whole())
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


def scrub(text):
    """``text`` with lone surrogates (from a JSON-escaped ``\\ud800`` in a reply) replaced by U+FFFD; valid
    pairs are kept. Model text is scrubbed where it enters the toolkit, so tokenizers, caches and records
    never see an unencodable string."""
    if not isinstance(text, str):
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _default(o):
    if isinstance(o, PartsJSON) and not isinstance(o, PartsString):
        return orjson.Fragment(o.whole())  # its JSON as it is
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)
