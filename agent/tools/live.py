"""Live retrieval tools (paper §4.1, B.2, E.3): Serper search, Google Lens via Serper, Jina Reader.

    provider = LiveProvider.from_env(lens_url=LensURL(template="https://host/{benchmark}/{filename}"))
    provider.require(["search", "visit", "lens_search"])     # fails at start if a key is missing

Keys come from the environment (``SERPER_API_KEY``, ``JINA_API_KEY``) and never appear in any
observation, record or error message. Every request has a timeout and bounded retries; how many, what a failure
reads as and what a page shows follow the protocol's :class:`~agent.tools.policy.ToolPolicy`.
Google Lens needs a *public* URL for the image: a URL template, or an upload to an S3-compatible
bucket with a presigned URL (``pip install 'mmcf-toolkit[s3]'``); with neither, lens_search returns
a clear error observation.
"""
from __future__ import annotations

import base64
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import httpx
from PIL import Image

from ..errors import HarnessError, UsageError
from ..http import HTTPError, make_client, request_json, requote_uri
from ..images import ImageError, load_image
from ..redact import register_key_var, register_secret
from .formatting import FAILED_VISIT, format_lens, format_search, format_visit, looks_blocked
from .policy import DEFAULT_TOOLS, RELEASE_SCRAPE_MARKERS, ToolPolicy, release_blocked
from .registry import RegisteredImage

__all__ = ["LiveProvider", "LensURL", "ProviderResult", "MissingKeyError", "require_live_tools"]


#: What the release sends with every Serper search and Lens request (``utils/search_tools.py:64``, ``:150``).
LOCATION = "United States"
#: The release's Jina Reader headers: markdown, links and images stripped (``utils/search_tools.py:249-253``;
#: ``X-Retain-imgs`` is spelled so there).
JINA_HEADERS = {"X-Md-Link-Style": "discarded", "X-Retain-imgs": "none", "X-Return-Format": "markdown"}
#: Lens result images downloaded per call: up to 10 from the first 30 results (``utils/search_tools.py:177``, ``:200``).
LENS_IMAGES = 10


class MissingKeyError(UsageError, RuntimeError):
    """A run needs an API key that is not in the environment."""


@dataclass
class ProviderResult:
    observation: str
    raw: object = None
    ok: bool = True
    transient: bool = False
    paid_calls: int = 0


@dataclass
class LensURL:
    """How a query image gets the public URL Google Lens needs."""

    template: str | None = None            # e.g. "https://host/{benchmark}/{filename}" ({sha256} too)
    s3_bucket: str | None = None
    s3_prefix: str = "mmcf-lens/"
    s3_endpoint_url: str | None = None
    expires_s: int = 3600

    @classmethod
    def from_env(cls) -> "LensURL":
        return cls(template=os.environ.get("MMCF_LENS_URL_TEMPLATE"), s3_bucket=os.environ.get("MMCF_LENS_S3_BUCKET"),
                   s3_endpoint_url=os.environ.get("MMCF_LENS_S3_ENDPOINT"))

    @property
    def configured(self) -> bool:
        return bool(self.template or self.s3_bucket)

    def url_for(self, img: RegisteredImage) -> str:
        if self.template:
            return self.template.format(benchmark=img.benchmark, filename=img.filename, sha256=img.sha256)
        if self.s3_bucket:
            try:
                import boto3  # noqa: PLC0415 - the optional s3 extra
            except ImportError as e:
                raise RuntimeError("S3 upload for Lens needs boto3: pip install 'mmcf-toolkit[s3]'") from e
            for var in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):  # what boto3 signs with: never written
                register_key_var(var)
            s3 = boto3.client("s3", endpoint_url=self.s3_endpoint_url)
            ext = img.image.mime.split("/")[-1]
            key = f"{self.s3_prefix}{img.sha256}.{ext}"
            s3.put_object(Bucket=self.s3_bucket, Key=key, Body=img.image.data, ContentType=img.image.mime)
            return s3.generate_presigned_url("get_object", Params={"Bucket": self.s3_bucket, "Key": key},
                                             ExpiresIn=self.expires_s)
        raise RuntimeError("no public image URL configured")


def require_live_tools(tools, *, serper_key=None, jina_key=None, lens_url: LensURL | None = None,
                       policy: ToolPolicy = DEFAULT_TOOLS) -> None:
    """Raise :class:`MissingKeyError` naming what ``tools`` need and the environment lacks (defaults: from env)."""
    need = set(tools)
    serper_key = serper_key if serper_key is not None else os.environ.get("SERPER_API_KEY")
    jina_key = jina_key if jina_key is not None else os.environ.get("JINA_API_KEY")
    lens_url = lens_url or LensURL.from_env()
    if need & {"search", "lens_search"} and not serper_key:
        raise MissingKeyError("SERPER_API_KEY is not set: search and lens_search need a Serper key "
                              "(or run with the offline tool world: --tools offline)")
    if "visit" in need and not (jina_key or serper_key):
        raise MissingKeyError("visit needs JINA_API_KEY (Jina Reader) or SERPER_API_KEY (scrape fallback)")
    if "visit" in need and policy.release_markers and not jina_key:  # the release always reads through Jina first
        raise MissingKeyError("--protocol release reads pages through Jina Reader, then Serper scrape, as the "
                              "release does: set JINA_API_KEY")
    if "lens_search" in need and not lens_url.configured:
        raise MissingKeyError("lens_search needs a public URL for each query image: set MMCF_LENS_URL_TEMPLATE "
                              "(e.g. https://host/{benchmark}/{filename}) or MMCF_LENS_S3_BUCKET")


class LiveProvider:
    kind = "live"

    def __init__(self, *, serper_key: str | None, jina_key: str | None, lens_url: LensURL | None = None,
                 visit_max_chars: int | None = None, tools: ToolPolicy = DEFAULT_TOOLS,
                 serper_base: str = "https://google.serper.dev", scrape_base: str = "https://scrape.serper.dev",
                 jina_base: str = "https://r.jina.ai", client: httpx.AsyncClient | None = None,
                 thumbnail_dir: str | os.PathLike | None = None):
        self.serper_key, self.jina_key = serper_key, jina_key
        for key in (serper_key, jina_key):  # the keys this provider sends: never written or printed
            register_secret(key)
        self.lens_url = lens_url or LensURL()
        self.visit_max_chars = visit_max_chars
        self.tools = tools
        self.serper_base, self.scrape_base, self.jina_base = serper_base.rstrip("/"), scrape_base.rstrip("/"), jina_base.rstrip("/")
        self._client = client or make_client(follow_redirects=False)  # agent.http follows them, keys never cross origins
        self.thumbnail_dir = thumbnail_dir

    @classmethod
    def from_env(cls, **kw) -> "LiveProvider":
        """Keys from ``SERPER_API_KEY`` / ``JINA_API_KEY``; service URLs overridable (a proxy, a loopback
        stand-in in tests) with ``MMCF_SERPER_BASE``, ``MMCF_SERPER_SCRAPE_BASE``, ``MMCF_JINA_BASE``."""
        env = os.environ
        for arg, var in (("serper_base", "MMCF_SERPER_BASE"), ("scrape_base", "MMCF_SERPER_SCRAPE_BASE"),
                         ("jina_base", "MMCF_JINA_BASE")):
            if env.get(var):
                kw.setdefault(arg, env[var])
        return cls(serper_key=env.get("SERPER_API_KEY"), jina_key=env.get("JINA_API_KEY"),
                   lens_url=kw.pop("lens_url", None) or LensURL.from_env(), **kw)

    def require(self, tools) -> None:
        """Fail at start, naming the variable, when a needed key or the Lens URL configuration is missing."""
        require_live_tools(tools, serper_key=self.serper_key, jina_key=self.jina_key, lens_url=self.lens_url,
                           policy=self.tools)

    def _serper_headers(self) -> dict:
        return {"X-API-KEY": self.serper_key or "", "Content-Type": "application/json"}

    async def search(self, query) -> ProviderResult:
        """``query`` as the toolbox passes it (stripped, or as the model gave it under the release's policy)."""
        pol = self.tools
        try:
            data = await self._serper_json("/search", {"q": query, "location": LOCATION}, pol.search, "serper search")
        except (HTTPError, ValueError) as e:
            failed = (f"Search failed: {_public(e)}. Try again later or rephrase." if pol.say_api_failure
                      else format_search(query, []))  # utils/search_tools.py: _fail_result
            return ProviderResult(failed, raw={"error": _public(e)}, ok=False, transient=True, paid_calls=1)
        organic = (data.get("organic") if isinstance(data, dict) else None) or []
        if pol.python_values:  # each row as it came (a null one too): the release formats Serper's own values
            rows = list(organic[:pol.max_results])
        else:  # ours: a row that is no object (null) is not a result, and is left out
            rows = [{"title": r.get("title", ""), "link": r.get("link", ""), "snippet": r.get("snippet", "")}
                    for r in organic if isinstance(r, dict)][:pol.max_results]
        return ProviderResult(format_search(query, rows, pol.python_values), raw=data, paid_calls=1)

    async def _serper_json(self, path: str, body: dict, retry, what: str):
        """A Serper reply's JSON. Under the release's policy a body that does not parse is a failure at once (its
        ``response.json()`` after the request loop); ours asks again, like a 5xx."""
        if not self.tools.release_markers:
            return await request_json(self._client, "POST", self.serper_base + path, json_body=body,
                                      headers=self._serper_headers(), policy=retry, what=what)
        text = await request_json(self._client, "POST", self.serper_base + path, json_body=body,
                                  headers=self._serper_headers(), policy=retry, what=what, parse=False)
        return json.loads(text)

    async def lens(self, img: RegisteredImage) -> ProviderResult:
        if not self.lens_url.configured:
            return ProviderResult(f"lens_search is unavailable: no public URL is configured for {img.image_id} "
                                  "(set MMCF_LENS_URL_TEMPLATE or MMCF_LENS_S3_BUCKET). Describe the image and use search instead.",
                                  ok=False)
        try:
            url = self.lens_url.url_for(img)
        except Exception as e:  # noqa: BLE001 - an upload failure is the tool's error, shown to the agent
            return ProviderResult(f"lens_search failed to publish {img.image_id}: {e}", ok=False, transient=True)
        try:
            data = await self._serper_json("/lens", {"url": url, "num": 100, "location": LOCATION}, self.tools.lens,
                                           "serper lens")
        except (HTTPError, ValueError) as e:
            return ProviderResult(f"lens_search failed: {_public(e)}.", raw={"error": _public(e)}, ok=False,
                                  transient=True, paid_calls=1)
        data = data if isinstance(data, dict) else {}
        items = next((data[f] for f in self.tools.lens_fields if data.get(f)), None) or []
        if not self.tools.python_values:  # ours: a row that is no object (null) is not a result, and is left out
            items = [r for r in items if isinstance(r, dict)]
        rows = [{"title": r.get("title", ""), "link": r.get("link", ""), "source": r.get("source", "")}
                for r in items if isinstance(r, dict)][:10]
        if self.thumbnail_dir:
            try:
                data = {**data, "saved_thumbnails": await self._save_thumbnails(items)}
            except _ReleaseRowError as e:  # the release's AttributeError, caught around its lens search (:371-374)
                text = f"lens_search error: {e}"
                return ProviderResult(text, raw={**data, "release_error": text}, ok=False, paid_calls=1)
        return ProviderResult(format_lens(img.image_id, rows), raw=data, paid_calls=1)

    async def _save_thumbnails(self, items: list) -> list:
        """Up to ``LENS_IMAGES`` result thumbnails from the first ``3 × LENS_IMAGES`` results, each stored once by
        content hash, with the title and link of its result as they arrived (None when absent); redirects followed,
        failures skipped (release ``utils/search_tools.py:177``, ``img_download`` ``:200-240``)."""
        out_dir = Path(self.thumbnail_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        saved = []
        for rank, r in enumerate(items[:3 * LENS_IMAGES]):
            if len(saved) >= LENS_IMAGES:
                break
            if not isinstance(r, dict):  # the release's data.get(...) outside its try (img_download, :211)
                raise _ReleaseRowError(f"'{type(r).__name__}' object has no attribute 'get'")
            url = r.get("thumbnailUrl")
            if not url:
                continue
            data = await self._thumbnail(url)
            try:
                img = load_image("data:image;base64," + base64.b64encode(data).decode()) if data else None
            except ImageError:
                img = None
            if img is None:
                continue
            path = out_dir / f"{img.sha256}.{img.mime.split('/')[-1]}"
            if not path.exists():
                path.write_bytes(data)
            saved.append({"url": url, "sha256": img.sha256, "path": str(path), "rank": rank,
                          "title": r.get("title"), "link": r.get("link")})
        return saved

    async def _thumbnail(self, url: str) -> bytes | None:
        """A thumbnail's bytes, checked to be an image: as received, or re-encoded to PNG as the release saves it
        (``img.save(path, format='PNG')``, sent as ``image/png``); None when it cannot be had."""
        try:
            data = await request_json(self._client, "GET", self._wire(url), policy=self.tools.thumbnail,
                                      what="lens thumbnail", decode=bytes)
            if not self.tools.thumbnails_png:
                return data
            with Image.open(io.BytesIO(data)) as im:
                buf = io.BytesIO()
                im.save(buf, format="PNG")
            return buf.getvalue()
        except (HTTPError, OSError, ValueError):  # PIL: UnidentifiedImageError is an OSError
            return None

    async def visit(self, url) -> ProviderResult:
        """``url`` as the toolbox passes it. Ours: an http(s) URL, read through Jina Reader, else Serper scrape
        (its markdown), block pages by our markers. The release's: any value, read through Jina, else scrape (its
        whole body), block pages by its markers (``SearchTools.visit_page``)."""
        if self.tools.release_markers:
            return await self._visit_as_release(url)
        if not url.startswith(("http://", "https://")):
            return ProviderResult(FAILED_VISIT, raw={"blocked": "not an http(s) URL"}, ok=False)
        paid, why = 0, "no reader configured"
        if self.jina_key or not self.serper_key:
            paid += 1
            try:
                text = await request_json(self._client, "GET", f"{self.jina_base}/{url}", headers=self._jina_headers(),
                                          policy=self.tools.jina, what="jina reader", parse=False)
                why = looks_blocked(text)
                if why is None:
                    return ProviderResult(format_visit(url, text, self.visit_max_chars),
                                          raw={"reader": "jina", "content": text}, paid_calls=paid)
            except HTTPError as e:
                why = looks_blocked("", e.status) or _public(e)
        if self.serper_key:
            paid += 1
            try:
                data = await request_json(self._client, "POST", self.scrape_base, json_body={"url": url, "includeMarkdown": True},
                                          headers=self._serper_headers(), policy=self.tools.scrape, what="serper scrape")
                text = (data.get("markdown") or data.get("text") or "") if isinstance(data, dict) else ""
                why2 = looks_blocked(text)
                if why2 is None:
                    return ProviderResult(format_visit(url, text, self.visit_max_chars),
                                          raw={"reader": "serper-scrape", "content": text}, paid_calls=paid)
                why = why2
            except HTTPError as e:
                why = looks_blocked("", e.status) or _public(e)
        return ProviderResult(FAILED_VISIT, raw={"blocked": why}, ok=False, paid_calls=paid)

    async def _visit_as_release(self, url) -> ProviderResult:
        """``call_visit_jina`` then ``call_visit_serper``: the text stripped; an empty or marked page, or a failed
        request, falls through; the scrape's whole JSON body is what the model reads."""
        why = "no reader answered"
        try:
            text = (await request_json(self._client, "GET", self._wire(f"{self.jina_base}/{url}"),
                                       headers=self._jina_headers(), policy=self.tools.jina, what="jina reader",
                                       parse=False, text_charset=self.tools.text_charset)).strip()
            why = release_blocked(text)
            if why is None:
                return ProviderResult(text, raw={"reader": "jina", "content": text}, paid_calls=1)
        except HTTPError as e:
            why = _public(e)
        try:
            body = (await request_json(self._client, "POST", self.scrape_base, json_body={"url": url, "includeMarkdown": True},
                                       headers=self._serper_headers(), policy=self.tools.scrape, what="serper scrape",
                                       parse=False, text_charset=self.tools.text_charset)).strip()
            why = release_blocked(body, RELEASE_SCRAPE_MARKERS)
            if why is None:
                return ProviderResult(body, raw={"reader": "serper-scrape", "content": body}, paid_calls=2)
        except HTTPError as e:
            why = _public(e)
        return ProviderResult(FAILED_VISIT, raw={"blocked": why}, ok=False, paid_calls=2)

    def _wire(self, url: str) -> str:
        """A URL as it goes on the wire: re-quoted as requests sends it under the release's policy, else as given."""
        return requote_uri(url) if self.tools.requote_urls else url

    def _jina_headers(self) -> dict:
        headers = {"Authorization": f"Bearer {self.jina_key}"} if self.jina_key else {}
        return {**headers, **JINA_HEADERS}

    async def aclose(self) -> None:
        await self._client.aclose()


class _ReleaseRowError(HarnessError):
    """A result row the release's own code fails on (its exception's text is what the model reads)."""


def _public(e: Exception) -> str:
    """An error message safe to show the model (status only; never headers or keys)."""
    if not isinstance(e, HTTPError):
        return "the reply is not JSON"
    return f"HTTP {e.status}" if e.status else "the service could not be reached"
