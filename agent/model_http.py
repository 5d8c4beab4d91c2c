"""The HTTP client for model servers (SGLang, vLLM, smg, an OpenAI-compatible API): aiohttp.

    client = ModelClient()
    reply = await client.request("POST", url, content=body, headers=h, timeout=600)   # -> agent.http.Reply
    await client.aclose()

Model servers get their own client because their exchanges are the toolkit's largest and most frequent: a probe
step sends two ~0.35 MB scoring requests and reads two ~0.25 MB replies, 128 or 256 of them in flight. Measured
against the plainest exchange of the same bytes (the standard library's ``http.client``, one request at a time:
docs/performance.md), aiohttp costs ~1.1x that floor where httpx's asynchronous client costs ~2x, and aiohttp's
connection pool takes a connection in constant time where httpcore checks every pooled connection on each request
(why the tools' :class:`agent.http.ClientPool` splits httpx into small clients). The tools keep httpx (agent.http):
few, small requests, where its redirect and cookie handling is what they need.

Everything a request must keep is done by :func:`agent.http.request_json`, the same for both clients: bounded
retries, the whole-request deadline, redirects followed by hand (keys never cross origins), the liveness check
that ends a command when a server is down, redaction. This module only moves bytes: a request body given in pieces
is written piece by piece with its length (no chunked encoding), the whole reply is read, and a request that gets
no reply raises :class:`agent.http.NoReply`.
"""
from __future__ import annotations

import asyncio
import urllib.request
from urllib.parse import urlsplit

import aiohttp

from .errors import ToolkitError
from .http import HTTPError, Liveness, NoReply, Reply, ReplyTooLarge
from .redact import public_url

__all__ = ["ModelClient"]

#: Connections kept per client (ours): one per request in flight at the defaults (128 per server, 256 over two),
#: with room for a user's higher --concurrency; aiohttp's own default (100) would queue the rest.
MAX_CONNECTIONS = 1024
#: How long an idle connection is kept (ours): a probe's requests to one server follow one another closely.
KEEPALIVE_S = 60.0


class ModelClient(Liveness):
    """One aiohttp session (and its connection pool) per event loop, made on first use. ``trust_env``: proxies
    from the environment (``HTTP_PROXY``, ``NO_PROXY``), as httpx reads them, looked up once per origin (ours:
    aiohttp's own ``trust_env`` reads ~/.netrc in a thread on every request, much of its CPU a request, and would
    send that file's credentials); a URL's ``user:password`` is sent as Basic auth, as httpx sends it
    (agent/redact.py registers both forms)."""

    def __init__(self, *, trust_env: bool = True):
        super().__init__()
        self.trust_env = trust_env
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proxies: dict[tuple, str | None] = {}

    def _proxy(self, url: str) -> str | None:
        """The environment's proxy for ``url``'s origin (None: none, or ``NO_PROXY`` names it)."""
        where = urlsplit(url)
        key = (where.scheme, where.netloc)
        if key not in self._proxies:
            found = urllib.request.getproxies_environment() if self.trust_env else {}
            proxy = found.get(where.scheme) or found.get("all")
            if proxy and urllib.request.proxy_bypass_environment(where.hostname or "", found):
                proxy = None
            self._proxies[key] = proxy
        return self._proxies[key]

    async def _current(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is not None and self._loop is loop:
            return self._session
        old, self._session, self._loop = self._session, None, loop
        self.new_loop()
        if old is not None:  # made in a loop that has ended: its connections are gone with it, the session closed here
            await old.close()
        connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_S)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True)
        return self._session

    async def request(self, method: str, url: str, *, content=None, params: dict | None = None,
                      headers: dict | None = None, timeout: float | None = None, max_bytes: int | None = None) -> Reply:
        """The whole reply to one request (no redirect followed); :class:`NoReply` when none came (refused, reset,
        cut short, or not complete within ``timeout`` seconds); :class:`ReplyTooLarge` as soon as it is longer than
        ``max_bytes`` (its Content-Length, else the bytes read so far)."""
        session = await self._current()
        try:
            async with session.request(method, url, data=content, params=params, headers=headers,
                                       allow_redirects=False, proxy=self._proxy(url),
                                       timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                if max_bytes is None:
                    body = await r.read()
                else:
                    body = await _read_capped(r, max_bytes, f"{method} {public_url(url)}")
                return Reply(r.status, r.headers, body, str(r.url))
        except aiohttp.InvalidURL as e:
            raise HTTPError(f"{method} {e}: not a URL a request can be sent to") from None
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:  # (aiohttp's timeouts are TimeoutErrors)
            if isinstance(e.__cause__, ToolkitError):  # the body refused as it was written (an image file that
                raise e.__cause__ from None            # changed): ours, not the server's, and never asked again
            raise NoReply(f"{e.__class__.__name__}: {e}" if str(e) else e.__class__.__name__,
                          isinstance(e, asyncio.TimeoutError)) from None

    async def aclose(self) -> None:
        if self._session is not None:  # (a session whose loop has ended has nothing left to close but itself)
            await self._session.close()
        self._session = None


async def _read_capped(r, max_bytes: int, what: str) -> bytes:
    """A reply's body, refused (:class:`ReplyTooLarge`) once it is longer than ``max_bytes``: by its declared length
    before a byte is read, else as its chunks arrive."""
    def too_large(n: int) -> ReplyTooLarge:
        return ReplyTooLarge(f"{what}: the reply is {n:,}+ bytes, more than the {max_bytes:,} its request can be "
                             "answered with (its tokens x their alternatives); refused before it was read whole",
                             r.status)
    if r.content_length is not None and r.content_length > max_bytes:
        raise too_large(r.content_length)
    parts, n = [], 0
    async for chunk in r.content.iter_chunked(1 << 20):
        n += len(chunk)
        if n > max_bytes:
            raise too_large(n)
        parts.append(chunk)
    return b"".join(parts)
