"""One bounded-retry JSON-over-HTTP helper, shared by the model backends and the live tools.

Retries (with exponential backoff and ``Retry-After``) on 429, 5xx, timeouts and connection
errors, at most ``retries`` times; any other 4xx and a malformed JSON body raise at once with a
message naming the endpoint. Secrets in headers never appear in messages.
"""
from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any, Callable

import httpx

__all__ = ["HTTPError", "RetryPolicy", "request_json"]

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class HTTPError(RuntimeError):
    """A request that failed for good (non-retryable status, retries exhausted, malformed body)."""

    def __init__(self, msg: str, status: int | None = None, body: str | None = None):
        super().__init__(msg)
        self.status = status
        self.body = body


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 4
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    timeout_s: float = 600.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.max_backoff_s)
            except ValueError:
                pass
        base = min(self.backoff_s * (2 ** attempt), self.max_backoff_s)
        return base * (0.5 + random.random() / 2)


try:  # orjson parses a top-20 logprob reply several times faster than the stdlib
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a core dependency; keep working without it
    _orjson = None


def loads(data: bytes):
    return _orjson.loads(data) if _orjson is not None else json.loads(data)


def dumps(obj, *, sort_keys: bool = False) -> bytes:
    """Compact UTF-8 JSON (orjson when installed); non-finite floats become null."""
    if _orjson is not None:
        opt = _orjson.OPT_SERIALIZE_NUMPY | (_orjson.OPT_SORT_KEYS if sort_keys else 0)
        return _orjson.dumps(obj, option=opt, default=_default)
    return json.dumps(obj, sort_keys=sort_keys, ensure_ascii=False, separators=(",", ":"), default=_default).encode()


def _default(o):
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def make_client(**kw) -> httpx.AsyncClient:
    """An AsyncClient that keeps a connection per concurrent request alive.

    httpx keeps only 20 idle connections by default: with 64 samples in flight the other 44 would be
    closed after every reply and reopened for the next request.
    """
    kw.setdefault("limits", httpx.Limits(max_connections=1024, max_keepalive_connections=1024, keepalive_expiry=60))
    return httpx.AsyncClient(**kw)


async def request_json(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    json_body: Any = None,
    params: dict | None = None,
    headers: dict | None = None,
    policy: RetryPolicy = RetryPolicy(),
    what: str = "request",
    parse: bool = True,
    on_retry: Callable[[int, str], None] | None = None,
) -> Any:
    """Send a request and return its parsed JSON (or text when ``parse=False``)."""
    last, last_status = "no attempt", None
    for attempt in range(policy.retries + 1):
        try:
            if json_body is not None:
                hdrs = {"Content-Type": "application/json", **(headers or {})}
                r = await client.request(method, url, content=dumps(json_body), params=params, headers=hdrs,
                                         timeout=policy.timeout_s)
            else:
                r = await client.request(method, url, params=params, headers=headers, timeout=policy.timeout_s)
        except (httpx.TimeoutException, httpx.TransportError) as e:
            last = f"{e.__class__.__name__}: {e}" if str(e) else e.__class__.__name__
            retry_after, last_status = None, None
        else:
            if r.status_code < 400:
                if not parse:
                    return r.text
                try:
                    return loads(r.content)
                except ValueError:  # json.JSONDecodeError and orjson.JSONDecodeError are ValueErrors
                    snippet = r.text[:200].replace("\n", " ")
                    raise HTTPError(f"{what}: {url} returned malformed JSON (status {r.status_code}): {snippet!r}",
                                    r.status_code, r.text) from None
            body = r.text[:500]
            if r.status_code not in RETRY_STATUS:
                raise HTTPError(f"{what}: {url} answered HTTP {r.status_code}: {body}", r.status_code, body)
            last, last_status = f"HTTP {r.status_code}: {body[:200]}", r.status_code
            retry_after = r.headers.get("retry-after")
        if attempt < policy.retries:
            if on_retry:
                on_retry(attempt + 1, last)
            await asyncio.sleep(policy.delay(attempt, retry_after))
    raise HTTPError(f"{what}: {url} failed after {policy.retries + 1} attempts; last error: {last}", last_status)
