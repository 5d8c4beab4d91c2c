"""One bounded-retry JSON-over-HTTP helper, shared by the model backends and the live tools.

Retries (with exponential backoff and ``Retry-After``) on 429, 5xx, timeouts and connection
errors, at most ``retries`` times; any other 4xx and a malformed JSON body raise at once with a
message naming the endpoint. Secrets in headers never appear in messages.

Two clients move the bytes, one per kind of server, both answering ``request(method, url, content=, params=,
headers=, timeout=)`` with a :class:`Reply` and raising :class:`NoReply` when none came: the tools' httpx
(:class:`ClientPool`, made by :func:`make_client`) and the model servers' aiohttp (agent/model_http.py, with the
liveness check of :class:`Liveness`).
"""
from __future__ import annotations

import asyncio
import codecs
import random
import ssl
import string
import time
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import quote, urljoin, urlsplit

import httpx

from .errors import HarnessError
from .jsonio import PartsJSON, dumps_parts, loads
from .redact import public_url, redact

__all__ = ["HTTPError", "ServerDown", "NoReply", "Reply", "Liveness", "RetryPolicy", "LIVENESS_TIMEOUT_S", "request_json",
           "require_alive", "make_client", "ClientPool", "requote_uri", "reply_cap", "ReplyTooLarge", "REPLY_BYTES_PER_ENTRY"]

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class HTTPError(HarnessError, RuntimeError):
    """A request that failed for good (non-retryable status, retries exhausted, malformed body).

    Its message and body are redacted (:func:`redact`) and name the URL without credentials."""

    def __init__(self, msg: str, status: int | None = None, body: str | None = None):
        super().__init__(redact(msg))
        self.status = status
        self.body = redact(body)


class ServerDown(HTTPError):
    """A server that stopped answering: a request got no reply (refused, reset, or no complete reply within its
    deadline) and the server's liveness URL did not answer either. Nothing sent to it afterwards can succeed, so
    the command ends (every finished output kept) rather than wait on each request in turn."""


class NoReply(HarnessError):
    """An attempt that got no reply (refused, reset, cut short, past its deadline): what a client raises, whatever
    its library calls it; :func:`request_json` retries it and asks the server's liveness. Its message names the
    library's exception (``ConnectError: ...``, ``ClientConnectorError: ...``)."""

    def __init__(self, msg: str, timed_out: bool = False):
        super().__init__(redact(msg))
        self.timed_out = timed_out


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole reply, as either client read it: its status, headers (case-insensitive lookup), body and URL."""

    status_code: int
    headers: Any
    content: bytes
    url: str

    @property
    def text(self) -> str:
        """The body decoded in the charset its content type names, else UTF-8 (undecodable bytes replaced)."""
        return self.content.decode(_charset(self.headers.get("content-type", "")) or "utf-8", errors="replace")


def _charset(ctype: str) -> str | None:
    for part in ctype.split(";")[1:]:
        k, _, v = part.strip().partition("=")
        if k.lower() == "charset" and v.strip('"\' '):
            name = v.strip('"\' ')
            try:
                return codecs.lookup(name).name
            except LookupError:
                return None
    return None


#: How long a liveness check waits: SGLang's ``/health`` answers 503 after 20 s without any output from its
#: scheduler (``HEALTH_CHECK_TIMEOUT``, srt/entrypoints/http_server.py ``health_generate``); ours: 45 s.
LIVENESS_TIMEOUT_S = 45.0
#: How often a model server's liveness is asked while a request to it has no reply yet (ours): a hung scheduler
#: (SGLang's ``/health`` 503 after 20 s without output) ends the command within about this plus
#: :data:`LIVENESS_TIMEOUT_S`, not at the request's own timeout (600 s by default); a busy server answers 200 at once,
#: and one check a period serves every request in flight to it (:meth:`ClientPool.watch`).
LIVENESS_EVERY_S = 30.0


@dataclass(frozen=True)
class RetryPolicy:
    """``retries`` after the first attempt, with jittered exponential backoff (a server's ``Retry-After`` honoured);
    ``pause_s``: a fixed pause instead; ``retry_any_status``: every 4xx/5xx is retried, not only
    :data:`RETRY_STATUS` (the release's request loops, agent/tools/policy.py)."""

    retries: int = 4
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    timeout_s: float = 600.0
    pause_s: float | None = None
    retry_any_status: bool = False
    liveness_every_s: float = LIVENESS_EVERY_S
    #: ``timeout_s`` bounds each read (and the connect), not the whole transfer: the semantics of the requests
    #: library the authors' release uses (a reply that arrives slowly but steadily is kept); ours bounds the whole
    per_read: bool = False

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if self.pause_s is not None:
            return self.pause_s
        if retry_after:
            try:
                return min(float(retry_after), self.max_backoff_s)
            except ValueError:
                pass
        base = min(self.backoff_s * (2 ** attempt), self.max_backoff_s)
        return base * (0.5 + random.random() / 2)


#: The characters requests leaves as they are when it re-quotes a URL (requests/utils.py ``requote_uri``).
_URI_SAFE = "!#$%&'()*+,/:;=?@[]~"
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")


def requote_uri(uri: str) -> str:
    """A URL as the requests library puts it on the wire (requests/utils.py ``requote_uri`` and
    ``unquote_unreserved``, which the authors' release sends every URL through): percent-escapes of unreserved
    characters decoded (``%7E`` -> ``~``), then everything outside the reserved and unreserved sets quoted
    (spaces, ``|``, ``^``, non-ASCII as UTF-8). A malformed escape quotes the whole URL, ``%`` included, as requests
    does then. httpx sends a URL as given; ``--protocol release`` sends it re-quoted (tests hold this equal to
    requests' own function)."""
    parts = uri.split("%")
    for i in range(1, len(parts)):
        h = parts[i][:2]
        if len(h) == 2 and h.isalnum():
            try:
                c = chr(int(h, 16))
            except ValueError:
                return quote(uri, safe=_URI_SAFE.replace("%", ""))
            parts[i] = c + parts[i][2:] if c in _UNRESERVED else "%" + parts[i]
        else:
            parts[i] = "%" + parts[i]
    return quote("".join(parts), safe=_URI_SAFE)


def make_client(**kw) -> "ClientPool":
    """The tools' HTTP client for many concurrent requests to one server: a :class:`ClientPool` of httpx
    AsyncClients (model servers: agent/model_http.py).

    httpx keeps only 20 idle connections by default: with 64 samples in flight the other 44 would be
    closed after every reply and reopened for the next request; so each member keeps all of its own alive.
    """
    kw.setdefault("limits", httpx.Limits(max_connections=1024, max_keepalive_connections=1024, keepalive_expiry=60))
    return ClientPool(kw)


class Liveness:
    """Whether a model server is known to be down, for every request to it: its liveness URL asked at most once a
    period for all the requests waiting on it (:meth:`watch`), and the verdict kept (``down``) so that every other
    request fails at once. Per event loop, as the client's connections are."""

    def __init__(self):
        self.down: str | None = None  # why the server is known to be down (request_json's liveness check)
        self._alive_at = 0.0          # when its liveness URL last answered 200
        self._checking: asyncio.Future | None = None

    def new_loop(self) -> None:
        """The client moved to a new event loop: a check in flight belongs to the old one."""
        self._checking = None

    async def watch(self, url: str, headers: dict | None, why: str, every_s: float) -> None:
        """Raise :class:`ServerDown` if the server is down: its liveness URL asked at most once per ``every_s``
        for all the requests waiting on it (the others wait on that one check)."""
        if self.down:
            raise ServerDown(self.down)
        if time.monotonic() - self._alive_at < every_s:
            return
        if self._checking is None or self._checking.done():
            self._checking = asyncio.ensure_future(require_alive(self, url, headers, why))
        await asyncio.shield(self._checking)
        self._alive_at = time.monotonic()


class ClientPool:
    """httpx AsyncClients sharing the load, each with at most :attr:`per_client` requests in flight (ours).

    httpcore's connection pool checks every one of its connections (a ``poll`` syscall and several
    attribute lookups each) whenever a request starts or ends, so one client with hundreds of connections
    spends most of the runner's CPU there (docs/performance.md). Small pools keep that cost flat. A request goes to
    the member with the fewest in flight; members are made as needed.
    """

    per_client = 8

    def __init__(self, client_kw: dict):
        self._kw = dict(client_kw)
        if "verify" not in self._kw:  # one TLS context for all members (each is costly to make: docs/performance.md)
            self._kw["verify"] = ssl.create_default_context()
        self._clients: list[httpx.AsyncClient] = []
        self._busy: list[int] = []
        self._loop = None

    def _pick(self) -> int:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a client belongs to the event loop it was used in: a new loop, new members
            self._clients, self._busy, self._loop = [], [], loop
        if self._clients:
            i = min(range(len(self._clients)), key=self._busy.__getitem__)
            if self._busy[i] < self.per_client:
                return i
        self._clients.append(httpx.AsyncClient(**self._kw))
        self._busy.append(0)
        return len(self._clients) - 1

    async def request(self, method: str, url: str, *, content=None, params: dict | None = None,
                      headers: dict | None = None, timeout: float | None = None) -> Reply:
        """The whole reply to one request (redirects are request_json's); :class:`NoReply` when none came."""
        i = self._pick()
        # this request's member and count: aclose() or a new event loop gives the pool new lists while a request
        # may still be in flight (a run stopped by a signal closes its pool, then its requests are cancelled)
        client, busy = self._clients[i], self._busy
        busy[i] += 1
        try:
            r = await client.request(method, url, content=content, params=params, headers=headers,
                                     timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout)
        except (httpx.TimeoutException, httpx.TransportError) as e:
            raise NoReply(f"{e.__class__.__name__}: {e}" if str(e) else e.__class__.__name__,
                          isinstance(e, httpx.TimeoutException)) from None
        finally:
            busy[i] -= 1
        # httpx binds each read response's stream back to the response (a reference cycle, encode/httpx#3733): the
        # reply and the request body (images included) would stay in memory until a full collection
        r.stream = httpx.ByteStream(r.content)
        return Reply(r.status_code, r.headers, r.content, str(r.url))

    async def get(self, url: str, **kw) -> Reply:
        return await self.request("GET", url, **kw)

    async def post(self, url: str, **kw) -> Reply:
        return await self.request("POST", url, **kw)

    async def aclose(self) -> None:
        if self._loop is asyncio.get_running_loop():
            for c in self._clients:
                await c.aclose()
        self._clients, self._busy = [], []


MAX_REDIRECTS = 5
_KEY_HEADERS = ("authorization", "x-api-key")


def _origin(u: str) -> tuple:
    p = urlsplit(u)
    return (p.scheme, (p.hostname or "").lower(), p.port or (443 if p.scheme == "https" else 80))


async def _written(pieces: list):
    """A body's pieces as sent: bytes as they are, each :class:`PartsJSON` part by part."""
    for p in pieces:
        if isinstance(p, PartsJSON):
            for part in p.parts():
                yield part
        else:
            yield p


def _content(pieces: list):
    """What a client sends for a body of these pieces: its bytes, or (a value written from parts inside) a fresh stream
    of them, its length given so that no chunked encoding is used (SGLang and smg read it as a plain body)."""
    if len(pieces) == 1 and isinstance(pieces[0], bytes):
        return pieces[0], {}
    n = sum(p.nbytes() if isinstance(p, PartsJSON) else len(p) for p in pieces)
    return _written(pieces), {"Content-Length": str(n)}


#: What one logprob entry may take in a reply, as JSON at its most verbose (a token's text escaped, its bytes as a
#: list, its rank and logprob): a generous bound (ours: ~60-120 bytes seen on SGLang and vLLM).
REPLY_BYTES_PER_ENTRY = 512
#: What a reply may take beyond its logprob entries (its text, usage, meta).
REPLY_BYTES_BASE = 4 << 20


def reply_cap(positions: int, k: int) -> int:
    """The most bytes a model server's reply can hold for ``positions`` tokens with logprobs and ``k``
    alternatives each (:data:`REPLY_BYTES_PER_ENTRY` apiece, plus :data:`REPLY_BYTES_BASE`): a longer body is no
    reply to the request, refused as it arrives rather than read whole."""
    return REPLY_BYTES_BASE + max(int(positions), 0) * (max(int(k), 0) + 1) * REPLY_BYTES_PER_ENTRY


class ReplyTooLarge(HTTPError):
    """A reply longer than its request can be answered with (:func:`reply_cap`): refused, never read whole."""


async def _send_following(client, method, url, json_body, params, headers, policy, what, max_bytes=None):
    hdrs = dict(headers or {})
    origin = _origin(url)  # keys stay with the origin the caller named, across every hop
    body = dumps_parts(json_body) if json_body is not None else None
    if body is not None:
        hdrs = {"Content-Type": "application/json", **hdrs}
    cap = {"max_bytes": max_bytes} if max_bytes else {}  # a model server's client only (agent/model_http.py)
    for _ in range(MAX_REDIRECTS + 1):
        if body is not None:
            content, length = _content(body)  # each hop sends the body again: a stream is made anew
            r = await client.request(method, url, content=content, params=params, headers={**hdrs, **length},
                                     timeout=policy.timeout_s, **cap)
        else:
            r = await client.request(method, url, params=params, headers=hdrs, timeout=policy.timeout_s, **cap)
        loc = r.headers.get("location") if r.status_code in (301, 302, 303, 307, 308) else None
        if not loc:
            return r
        nxt = urljoin(r.url or url, loc)
        if _origin(nxt) != origin and any(k.lower() in _KEY_HEADERS for k in hdrs):
            raise HTTPError(f"{what}: {public_url(url)} redirected to another origin ({public_url(nxt)}); a request "
                            "carrying a key is never sent there", r.status_code)
        if r.status_code == 303 or (r.status_code in (301, 302) and method == "POST"):
            method, body, params = "GET", None, None
        url = nxt
    raise HTTPError(f"{what}: {public_url(url)}: more than {MAX_REDIRECTS} redirects", r.status_code)


async def request_json(
    client: "ClientPool | Liveness",
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
    decode: Callable[[bytes], Any] | None = None,
    liveness: str | None = None,
    text_charset: str | None = None,
    max_bytes: int | None = None,
) -> Any:
    """Send a request and return its parsed JSON (or text when ``parse=False``; ``decode(body)`` instead of the
    generic parser where the caller knows the reply's shape: it raises ValueError on a body it cannot read).

    A 200 whose body does not parse (truncated in transit, cut by a proxy) is retried like a 5xx.
    ``policy.timeout_s`` bounds the **whole** request (a reply that drips in slowly included), not each read.
    Redirects are followed here, never by the client: at most :data:`MAX_REDIRECTS`, and a request that carries
    a key (``Authorization``, ``X-API-KEY``) never follows one to another origin (httpx strips only
    ``Authorization`` there).

    ``client``: a :class:`ClientPool` (tools) or agent.model_http.ModelClient (model servers).
    ``liveness``: the server's health URL (a model server's; tools have none). When an attempt gets no reply at
    all (refused, reset, no complete reply by the deadline), it is asked once (:data:`LIVENESS_TIMEOUT_S`): a
    server that does not answer 200 there is down or hung, and :class:`ServerDown` is raised at once instead of
    retrying; the client remembers it, so every other request to that server fails at once too.

    ``text_charset`` (``parse=False``): how a reply whose content type holds "text" and names no charset is decoded
    (None: UTF-8, httpx's default; the release's HTTP library, requests, reads ISO-8859-1 there).
    ``max_bytes``: the longest reply the request can have (:func:`reply_cap`; model servers' client): a longer one
    is refused as it arrives (:class:`ReplyTooLarge`), not read whole, and not asked again."""
    last, last_status = "no attempt", None
    shown = public_url(url)
    for attempt in range(policy.retries + 1):
        if liveness and getattr(client, "down", None):  # another request found the server down meanwhile
            raise ServerDown(client.down)
        try:
            def send():  # made where it is awaited: a request cancelled before it starts leaves no coroutine
                return _send_following(client, method, url, json_body, params, headers, policy, what, max_bytes)
            if liveness and isinstance(client, Liveness):
                r = await asyncio.wait_for(_watched(send, client, liveness, headers, policy,
                                                    f"{what}: {shown} gave no reply yet"), policy.timeout_s)
            elif policy.per_read:  # the client bounds each read by timeout_s (httpx: each operation)
                r = await send()
            else:
                r = await asyncio.wait_for(send(), policy.timeout_s)
        except asyncio.TimeoutError:
            last, retry_after, last_status = f"no complete reply within {policy.timeout_s:g} s", None, None
        except NoReply as e:
            last, retry_after, last_status = str(e), None, None
        else:
            if r.status_code < 400:
                if not parse:
                    return _text_of(r, text_charset)
                try:
                    return (decode or loads)(r.content)
                except ValueError:  # json.JSONDecodeError and orjson.JSONDecodeError are ValueErrors
                    snippet = r.text[:200].replace("\n", " ")
                    last, last_status, retry_after = (f"malformed or truncated JSON (status {r.status_code}, "
                                                      f"{len(r.content)} bytes): {snippet!r}"), r.status_code, None
            else:
                body = r.text[:500]
                if r.status_code not in RETRY_STATUS and not policy.retry_any_status:
                    raise HTTPError(f"{what}: {shown} answered HTTP {r.status_code}: {body}", r.status_code, body)
                last, last_status = f"HTTP {r.status_code}: {body[:200]}", r.status_code
                retry_after = r.headers.get("retry-after")
        if liveness and last_status is None:  # no reply at all: is the server still there?
            await require_alive(client, liveness, headers, f"{what}: {shown} gave no reply ({last})")
        if attempt < policy.retries:
            if on_retry:
                on_retry(attempt + 1, last)
            await asyncio.sleep(policy.delay(attempt, retry_after))
    raise HTTPError(f"{what}: {shown} failed after {policy.retries + 1} attempts; last error: {last}", last_status)


def _text_of(r: Reply, text_charset: str | None) -> str:
    """The reply's text: in the charset it names, else UTF-8, or ``text_charset`` for a text type that names none
    (as requests' ``get_encoding_from_headers`` does with ISO-8859-1)."""
    ctype = r.headers.get("content-type", "")
    if text_charset and "text" in ctype and "charset" not in ctype.lower():
        return r.content.decode(text_charset, errors="replace")
    return r.text


async def _watched(send, client: Liveness, liveness: str, headers: dict | None, policy: RetryPolicy, why: str):
    """``send()`` awaited, the server's liveness asked every ``policy.liveness_every_s`` while it has no reply."""
    task = asyncio.ensure_future(send())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=policy.liveness_every_s)
            if done:
                return task.result()
            await client.watch(liveness, headers, why, policy.liveness_every_s)
    finally:
        if not task.done():
            # the client's own deadline is the same as the caller's: the request may still end with its NoReply
            # after the cancel lands; that ending is seen here, never logged as an exception nobody retrieved
            task.add_done_callback(_seen)
            task.cancel()
        elif not task.cancelled():
            task.exception()  # ended as this wait was cancelled (the client's deadline is the same): seen, not logged


def _seen(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


async def require_alive(client, url: str, headers: dict | None, why: str) -> None:
    """Raise :class:`ServerDown` (and remember it on a :class:`Liveness` ``client``) unless ``url`` answers 200
    within :data:`LIVENESS_TIMEOUT_S`."""
    if getattr(client, "down", None):
        raise ServerDown(client.down)
    try:
        r = await asyncio.wait_for(client.request("GET", url, headers=headers, timeout=LIVENESS_TIMEOUT_S),
                                   LIVENESS_TIMEOUT_S)
        if r.status_code == 200:
            return
        state = f"answered HTTP {r.status_code}"
    except asyncio.TimeoutError:
        state = f"did not answer within {LIVENESS_TIMEOUT_S:g} s"
    except NoReply as e:
        state = f"did not answer within {LIVENESS_TIMEOUT_S:g} s" if e.timed_out else \
            f"could not be reached ({str(e).split(':')[0]})"
    msg = redact(f"{why}, and its health check {public_url(url)} {state}: the server is down or hung. Everything "
                 "finished so far is kept; restart the server (or point at another), then rerun the same command")
    if isinstance(client, Liveness):
        client.down = msg
    raise ServerDown(msg)
