"""What must never be written or printed: the values of the keys in use and a URL's credentials.

Standard library only (the serving scripts run it with a bare ``python3``). Every record line and text file the
toolkit writes passes :func:`redact_bytes` (agent.http.dumps_record, agent.rundir's writes); every command's
console passes :func:`redact` through :class:`RedactingStream` (installed by agent/cli.py's argument parser).
"""
from __future__ import annotations

import json
import os
import re
from urllib.parse import urlsplit, urlunsplit

#: Environment variables whose values are secrets: never written anywhere (redacted from error texts).
SECRET_ENV = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)
_AUTH = re.compile(r"(?i)((?:proxy-)?authorization|x-api-key|api[_-]?key|access[_-]?token|bearer)"
                   r"(\\?[\"']?\s*[:=]?\s*\\?[\"']?\s*(?:bearer\s+|basic\s+)?)([A-Za-z0-9._~+/=-]{6,})")


def secrets() -> list[str]:
    """The values that must appear in nothing the toolkit writes or prints: those of every secret-looking
    environment variable and of every variable named as holding a key (``--api-key-env`` and the like), longest
    first (a key that contains another is replaced whole)."""
    vals = {v for k, v in os.environ.items() if v and len(v) >= 6 and (SECRET_ENV.search(k) or k in KEY_VARS)}
    return sorted(vals, key=len, reverse=True)


_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)([^/\s:@\"']*):([^/\s@\"']+)@")


def redact(text):
    """``text`` with the values of secret environment variables and ``Authorization``-like values replaced."""
    if not isinstance(text, str) or not text:
        return text
    for v in secrets():
        if v in text:
            text = text.replace(v, "[REDACTED]")
    if "@" in text:  # a URL's password (http://user:pass@host), wherever a URL is printed
        text = _URL_PASSWORD.sub(r"\1\2:[REDACTED]@", text)
    return _AUTH.sub(lambda m: m.group(1) + m.group(2) + "[REDACTED]", text)


def redact_token_texts(texts: list) -> list:
    """Per-token texts (a sidecar's ``text`` column) with every secret value the tokens spell together removed:
    the first token overlapping an occurrence reads ``[REDACTED]``, the others of it read empty. Compressed, the
    column's characters can sit side by side in the file, so the joined text must hold no secret either. The ids
    and logprobs are left as they are (what the probes score)."""
    vals = secrets()
    joined = "".join(t or "" for t in texts) if vals else ""
    spans = [(m.start(), m.start() + len(v)) for v in vals for m in re.finditer(re.escape(v), joined)]
    if not spans:
        return texts
    out, pos = list(texts), 0
    for i, t in enumerate(texts):
        n = len(t or "")
        hit = [a for a, b in spans if pos < b and a < pos + n]
        if hit:
            out[i] = "[REDACTED]" if any(a >= pos for a in hit) else ""
        pos += n
    return out


def redact_bytes(data: bytes) -> bytes:
    """UTF-8 text or JSON bytes with every secret value replaced, as written and as JSON escapes it (a value
    holding ``"``, ``\\`` or ``/``). The one redaction every record passes where it is written."""
    for v in secrets():
        for form in {v.encode(), json.dumps(v)[1:-1].encode(), json.dumps(v)[1:-1].replace("/", "\\/").encode()}:
            if form in data:
                data = data.replace(form, b"[REDACTED]")
    return data


class RedactingStream:
    """A console stream (stdout, stderr) whose every write passes :func:`redact`: a key a server sent back is
    never printed. Installed once per process by the commands' argument parser (agent/cli.py)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, s):
        return self._stream.write(redact(s) if isinstance(s, str) else s)

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


#: Variables the user named as holding a key (``--api-key-env`` and friends): redacted whatever their name.
KEY_VARS: set = set()


def register_key_var(name: str | None) -> None:
    """Redact this variable's value from everything the toolkit writes or prints, whatever its name."""
    if name:
        KEY_VARS.add(name)


def public_url(url: str) -> str:
    """The URL without credentials (``http://user:pass@host`` -> ``http://host``): what records may hold."""
    if not isinstance(url, str) or "@" not in url:
        return url
    try:
        p = urlsplit(url)
    except ValueError:
        return url
    if not (p.username or p.password):
        return url
    host = p.hostname or ""
    netloc = host + (f":{p.port}" if p.port else "")
    return urlunsplit((p.scheme, netloc, p.path, p.query, p.fragment))


def safe_argv(argv) -> list[str]:
    """A command line fit for a record or a printed hint: URLs without credentials (also inside ``--flag=URL``),
    secret values redacted."""
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
