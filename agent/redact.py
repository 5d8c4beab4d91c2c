"""What must never be written or printed: the credentials this process puts to use, in every form they travel.

Standard library only (the serving scripts run it with a bare ``python3``).

A credential is registered where it is put to use, never guessed from an environment variable's name:

- the value of a variable named by ``--api-key-env`` / ``--judge-api-key-env`` (:func:`register_key_var`, called by
  the OpenAI-compatible backend that sends it);
- the tool keys a run sends (``SERPER_API_KEY``, ``JINA_API_KEY``, the S3 secret: agent/tools/live.py);
- the user name and password in an endpoint URL (``http://alice:pw@host``: :func:`register_url`, called by every
  backend given such a URL), as httpx sends them: ``alice:pw`` and its base64 (``Authorization: Basic …``).

Each is registered with the forms it travels in (the value, its base64; for a URL, the password as written and
percent-decoded, ``user:password`` and its base64), so a server that echoes a header back is caught whatever it
echoed. Purely numeric values and values shorter than :data:`MIN_CHARS` are never treated as secrets (they would
rewrite numbers and words everywhere); the compound ``user:password`` forms always are.

Records are redacted as typed values, before they are serialised (:func:`redact_obj`, used by every writer:
agent.http.dumps_record, agent.rundir.common.write_json): what is written always parses, and nothing edits bytes
after serialisation. Every command's console passes :func:`redact_console` through :class:`RedactingStream`
(installed by agent/cli.py's argument parser).
"""
from __future__ import annotations

import base64
import json
import logging
import os
import re
from urllib.parse import unquote, urlsplit, urlunsplit

log = logging.getLogger(__name__)

__all__ = ["REDACTED", "MIN_CHARS", "CREDENTIALS", "Credentials", "register_secret", "register_key_var", "register_url", "secrets", "redact",
           "redact_obj", "redact_console", "redact_token_texts", "RedactingStream", "is_host", "public_url",
           "safe_argv", "has_credentials", "exempt"]

REDACTED = "[REDACTED]"
#: A bare value shorter than this is never redacted on its own (it would match ordinary words and numbers).
MIN_CHARS = 6


class Credentials:
    """The forms of every credential in use, and one compiled pattern that finds them (longest first)."""

    def __init__(self):
        self.forms: set[str] = set()
        self.exempt: set[str] = set()
        self._pattern: re.Pattern | None = None

    def add(self, *forms: str) -> None:
        new = {f for f in forms if f and f not in self.exempt} - self.forms
        if new:
            self.forms |= new
            self._pattern = None

    def drop(self, value: str) -> bool:
        self.exempt.add(value)
        if value in self.forms:
            self.forms.discard(value)
            self._pattern = None
            return True
        return False

    def clear(self) -> None:
        self.forms, self.exempt, self._pattern = set(), set(), None

    @property
    def pattern(self) -> re.Pattern | None:
        if self._pattern is None and self.forms:
            self._pattern = re.compile("|".join(re.escape(f) for f in sorted(self.forms, key=len, reverse=True)))
        return self._pattern


#: The credentials this process uses (``CREDENTIALS.clear()`` forgets them: a notebook between runs, the tests).
CREDENTIALS = Credentials()


def _is_secret_like(value: str) -> bool:
    v = value.strip()
    if len(v) < MIN_CHARS:
        return False
    try:  # a number (131072, 1e-3, 0.85) is never a credential: redacting it would rewrite every count
        float(v)
        return False
    except ValueError:
        return True


def _b64_forms(value: str) -> set[str]:
    raw = value.encode("utf-8", "surrogatepass")
    std = base64.b64encode(raw).decode()
    return {std, std.rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("=")}


def register_secret(value: str | None) -> None:
    """Redact ``value`` (and its base64) from everything this process writes or prints from now on."""
    if not value or not _is_secret_like(value):
        return
    forms = {value, *_b64_forms(value)}
    escaped = json.dumps(value)[1:-1]
    if escaped != value:  # as a JSON text shows it (the console prints JSON)
        forms.add(escaped)
    CREDENTIALS.add(*forms)


def register_key_var(name: str | None) -> None:
    """The value of environment variable ``name`` is a credential in use (``--api-key-env`` and the like)."""
    if name:
        register_secret(os.environ.get(name))


def register_url(url: str | None) -> None:
    """The user name and password of ``url`` (``http://alice:pw@host``) are credentials in use: registered as
    httpx sends them (``alice:pw`` and its base64, the ``Authorization: Basic`` value) and as written."""
    try:
        p = urlsplit(url or "")
        user, password = p.username, p.password
    except ValueError:
        return
    if not (user or password):
        return
    for u, pw in {(user or "", password or ""), (unquote(user or ""), unquote(password or ""))}:
        pair = f"{u}:{pw}"
        CREDENTIALS.add(pair, *_b64_forms(pair))
        register_secret(pw)


def exempt(*values) -> None:
    """Values the run records as what they are (the served model's name, a path): never treated as secrets, even
    if a key variable happens to hold one. Says so when a registered value is dropped."""
    for v in values:
        if isinstance(v, str) and v and CREDENTIALS.drop(v):
            log.warning(f"warning: a key in use equals {v!r}, which the run records as a name or path: it is not "
                        "redacted")


def secrets() -> list[str]:
    """Every registered form, longest first."""
    return sorted(CREDENTIALS.forms, key=len, reverse=True)


def redact(text):
    """``text`` with every registered credential replaced by ``[REDACTED]`` (anything else unchanged)."""
    pat = CREDENTIALS.pattern
    if pat is None or not isinstance(text, str) or not text:
        return text
    return pat.sub(REDACTED, text)


def redact_obj(obj):
    """``obj`` (dicts, lists, tuples, strings, numbers, arrays) with every string redacted (:func:`redact`), keys
    included; the object itself when nothing needs it. What every writer applies before serialising."""
    pat = CREDENTIALS.pattern
    if pat is None:
        return obj
    return _walk(obj, pat)


def _walk(o, pat: re.Pattern):
    if isinstance(o, str):
        return pat.sub(REDACTED, o) if pat.search(o) else o
    if isinstance(o, dict):
        return {(_walk(k, pat) if isinstance(k, str) else k): _walk(v, pat) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_walk(v, pat) for v in o]
    return o


#: What the console also hides: a URL's password wherever a URL is printed, and ``Authorization``-like values
#: (a server's error text quoting a header). Console only: records are redacted from the registry alone.
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)([^/\s:@\"']*):([^/\s@\"']+)@")
_AUTH = re.compile(r"(?i)((?:proxy-)?authorization|x-api-key|api[_-]?key|access[_-]?token)"
                   r"(\\?[\"']?\s*[:=]\s*\\?[\"']?\s*(?:bearer\s+|basic\s+)?|\s+(?:bearer|basic)\s+)"
                   r"([A-Za-z0-9._~+/=-]{6,})|\b((?-i:Bearer|Basic))(\s+)([A-Za-z0-9._~+/=-]{6,})")


def redact_console(text):
    """:func:`redact`, plus URL passwords and ``Authorization``-like values: what a console line may show."""
    if not isinstance(text, str) or not text:
        return text
    text = redact(text)
    if "@" in text:
        text = _URL_PASSWORD.sub(r"\1\2:" + REDACTED + "@", text)
    return _AUTH.sub(lambda m: (m.group(1) + m.group(2) if m.group(1) else m.group(4) + m.group(5)) + REDACTED, text)


def redact_token_texts(texts: list) -> list:
    """Per-token texts (a sidecar's ``text`` column) with every credential the tokens spell together removed:
    the first token overlapping an occurrence reads ``[REDACTED]``, the others of it read empty. Compressed, the
    column's characters can sit side by side in the file, so the joined text must hold no secret either. The ids
    and logprobs are left as they are (what the probes score)."""
    pat = CREDENTIALS.pattern
    if pat is None:
        return texts
    joined = "".join(t or "" for t in texts)
    spans = [(m.start(), m.end()) for m in pat.finditer(joined)]
    if not spans:
        return texts
    out, pos = list(texts), 0
    for i, t in enumerate(texts):
        n = len(t or "")
        hit = [a for a, b in spans if pos < b and a < pos + n]
        if hit:
            out[i] = REDACTED if any(a >= pos for a in hit) else ""
        pos += n
    return out


class RedactingStream:
    """A console stream (stdout, stderr) whose every write passes :func:`redact_console`: a key a server sent back
    is never printed. Installed once per process by the commands' argument parser (agent/cli.py)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, s):
        return self._stream.write(redact_console(s) if isinstance(s, str) else s)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def is_host(url: str, host: str) -> bool:
    """Whether ``url`` is https on exactly ``host`` (parsed, never a substring: ``http://127.0.0.1/openrouter.ai/``
    is not OpenRouter): the test before a key is sent to the host it belongs to."""
    try:
        p = urlsplit(url or "")
    except ValueError:
        return False
    return p.scheme == "https" and (p.hostname or "").lower() == host.lower()


def public_url(url: str) -> str:
    """The URL without credentials (``http://user:pass@host`` -> ``http://host``): what records may hold."""
    if not isinstance(url, str) or "@" not in url:
        return url
    try:
        p = urlsplit(url)
        port = p.port
    except ValueError:
        return url
    if not (p.username or p.password):
        return url
    netloc = (p.hostname or "") + (f":{port}" if port else "")
    return urlunsplit((p.scheme, netloc, p.path, p.query, p.fragment))


def safe_argv(argv) -> list[str]:
    """A command line fit for a record or a printed hint: URLs without credentials (also inside ``--flag=URL``),
    registered credentials redacted."""
    out = []
    for a in argv or []:
        a = str(a)
        if "=" in a and a.startswith("--") and "@" in a:
            k, v = a.split("=", 1)
            a = f"{k}={public_url(v)}"
        out.append(redact(public_url(a)))
    return out


def has_credentials(url: str) -> bool:
    try:
        p = urlsplit(url or "")
    except ValueError:
        return False
    return bool(p.username or p.password)
