"""The one JSON codec of the toolkit: what every record, request body and reply goes through.

    dumps(obj) -> bytes         compact UTF-8 JSON (orjson; numpy values as theirs; non-finite floats null)
    dumps_record(obj) -> bytes  the same, its strings redacted first (agent/redact.py): what a record file gets
    loads(bytes)                orjson, or the standard library for what orjson refuses (an escaped lone surrogate)
    scrub(text)                 lone surrogates replaced, where model text enters the toolkit
"""
from __future__ import annotations

import json
import math

import orjson

from .redact import redact_obj

__all__ = ["loads", "dumps", "dumps_record", "scrub"]


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
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)
