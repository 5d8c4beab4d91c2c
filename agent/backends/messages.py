"""OpenAI-format chat messages with image parts: loading, hashing, encoding, recording.

An image part is ``{"type": "image_url", "image_url": {"url": REF}}`` (or ``{"type": "image",
"image": REF}``) where REF is a local path, a ``file://`` URL, a ``data:`` URI or an http(s) URL.
Images are identified by the sha256 of their bytes; each image is read and encoded once per
process (a small cache keyed by path, size and mtime), so a 20-call trajectory does not re-encode
its query image 20 times.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import io
import mimetypes
import os
import re
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote, urlparse

import httpx
from PIL import Image, UnidentifiedImageError

__all__ = [
    "ImageError",
    "ImageData",
    "load_image",
    "image_ref",
    "is_image_part",
    "iter_image_parts",
    "message_image_hashes",
    "record_messages",
    "strip_images",
    "strip_query_images",
    "query_image_flags",
    "QUERY_IMAGE_ID",
    "part_sha256",
    "to_openai_messages",
    "split_text_and_images",
    "text_of",
]


class ImageError(ValueError):
    """An image part that cannot be used: missing/unreadable file, not an image, bad data URI."""


@dataclass(frozen=True)
class ImageData:
    sha256: str
    data: bytes
    mime: str
    source: str
    width: int
    height: int

    def data_uri(self) -> str:
        return _data_uri(self)

    def pil(self):
        img = Image.open(io.BytesIO(self.data))
        img.load()
        return img.convert("RGB") if img.mode not in ("RGB", "L") else img


class _ByteLRU:
    """A dict bounded by the bytes of its values, least recently used out first (callers hold ``_lock``)."""

    def __init__(self, budget: int):
        self.items: "OrderedDict" = OrderedDict()
        self.budget, self.bytes = budget, 0

    def get(self, key):
        hit = self.items.get(key)
        if hit is None:
            return None
        self.items.move_to_end(key)
        return hit[0]

    def put(self, key, value, nbytes: int) -> None:
        old = self.items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self.items[key] = (value, nbytes)
        self.bytes += nbytes
        self.trim(keep=1)

    def pop(self, key) -> None:
        old = self.items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]

    def trim(self, keep: int = 0) -> None:
        """Evict the least recently used until within budget (``keep``: the newest entries never evicted)."""
        while self.bytes > self.budget and len(self.items) > keep:
            _, (_, n) = self.items.popitem(last=False)
            self.bytes -= n


#: The image caches' memory bound (MB, both together; MMCF_IMAGE_CACHE_MB, agent.run --image-cache-mb). Ours:
#: every distinct image read stayed in memory twice (its bytes and its base64 data URI), +1.6 MB of RSS per
#: 322 KB JPEG, never released: ~2.8 GB per runner process over the release's 1,727 samples (issue 24). A
#: sample's images are read again at each of its calls, so a few hundred MB holds every image of the samples in
#: flight; an evicted image is read and encoded again if it comes back (its hash is the same).
DEFAULT_IMAGE_CACHE_MB = 512


def _cache_budget() -> int:
    try:
        mb = float(os.environ.get("MMCF_IMAGE_CACHE_MB", DEFAULT_IMAGE_CACHE_MB))
    except ValueError:
        mb = DEFAULT_IMAGE_CACHE_MB
    return max(0, int(mb * 2**20))


_lock = threading.Lock()
_by_key = _ByteLRU(_cache_budget() // 2)    # (path, size, mtime[, inode]) -> ImageData
_uri_by_sha = _ByteLRU(_cache_budget() // 2)  # sha256 -> data URI


def set_image_cache_mb(mb: float) -> None:
    """Bound the image caches to ``mb`` MB in all (0: no caching beyond the current request)."""
    budget = max(0, int(mb * 2**20))
    with _lock:
        for c in (_by_key, _uri_by_sha):
            c.budget = budget // 2
            c.trim()
    os.environ["MMCF_IMAGE_CACHE_MB"] = str(mb)  # worker processes inherit it


def forget_images(shas) -> None:
    """Drop these images (by content hash) from both caches now: a probe calls it when the last trajectory it has
    in flight that sends them is done, since no later request will (ours: otherwise a probe's RSS grew with every
    distinct image until the caches' bound, +0.75 MB per ~330 KB photo: 794 MB at 3,000 teacher-forced steps, and
    by our extrapolation ~1.1 GB at paper scale; 634 MB at 3,000 with this, scripts/bench_probe_http.py)."""
    shas = set(shas)
    if not shas:
        return
    with _lock:
        for sha in shas:
            _uri_by_sha.pop(sha)
        for key in [k for k, (img, _) in _by_key.items.items() if img.sha256 in shas]:
            _by_key.pop(key)


def image_shas(messages: list[dict]):
    """The content hashes of the stored images a call's messages send (``Run.sendable_messages`` keeps them)."""
    for m in messages:
        c = m.get("content")
        if isinstance(c, list):
            for p in c:
                if isinstance(p, dict) and p.get("sha256"):
                    yield p["sha256"]


class ImageUsers:
    """Which stored images the trajectories a probe has in flight send: when the last one sending an image is
    done, the image leaves the process's image caches (:func:`forget_images`; ours). A probe takes each trajectory
    once, so an image no trajectory in flight sends is rarely needed again (another trial of the same sample reads
    it again); without this the caches filled to their bound (512 MB by default) over a long probe. One event
    loop's tasks use it (no lock)."""

    def __init__(self):
        self.users: dict[str, int] = {}

    def use(self, mine: set, shas) -> None:
        """The trajectory whose images are ``mine`` sends these (each counted once per trajectory)."""
        for sha in shas:
            if sha not in mine:
                mine.add(sha)
                self.users[sha] = self.users.get(sha, 0) + 1

    def done(self, mine: set) -> None:
        gone = []
        for sha in mine:
            n = self.users.get(sha, 1) - 1
            if n > 0:
                self.users[sha] = n
            else:
                self.users.pop(sha, None)
                gone.append(sha)
        forget_images(gone)


def image_cache_stats() -> dict:
    with _lock:
        return {"images": len(_by_key.items), "image_bytes": _by_key.bytes, "uris": len(_uri_by_sha.items),
                "uri_bytes": _uri_by_sha.bytes, "budget_bytes": _by_key.budget + _uri_by_sha.budget}


def _data_uri(img: ImageData) -> str:
    with _lock:
        uri = _uri_by_sha.get(img.sha256)
    if uri is None:
        uri = f"data:{img.mime};base64," + base64.b64encode(img.data).decode("ascii")
        with _lock:
            _uri_by_sha.put(img.sha256, uri, len(uri))
    return uri


def _validate(data: bytes, source: str) -> tuple[str, int, int]:
    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt = (im.format or "PNG").lower()
            w, h = im.size
            im.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ImageError(f"{source}: not a readable image ({e.__class__.__name__}: {e})") from None
    mime = {"jpeg": "image/jpeg", "jpg": "image/jpeg", "png": "image/png", "webp": "image/webp",
            "gif": "image/gif", "bmp": "image/bmp"}.get(fmt, mimetypes.types_map.get("." + fmt, "image/png"))
    return mime, w, h


#: The largest image the toolkit reads (default 20 MB; MMCF_MAX_IMAGE_MB overrides, as do the CLIs' --max-image-mb).
DEFAULT_MAX_IMAGE_MB = 20


def max_image_bytes() -> int:
    try:
        return int(float(os.environ.get("MMCF_MAX_IMAGE_MB", DEFAULT_MAX_IMAGE_MB)) * 2**20)
    except ValueError:
        return DEFAULT_MAX_IMAGE_MB * 2**20


def load_image(ref: str | os.PathLike, *, base_dir: str | os.PathLike | None = None, fetch_urls: bool = False) -> ImageData:
    """Read and validate an image reference; raises :class:`ImageError` naming it on failure.

    Only regular files are read, and never more than :func:`max_image_bytes`."""
    ref = os.fspath(ref)
    if ref.startswith("data:"):
        try:
            header, b64 = ref.split(",", 1)
            if ";base64" not in header:
                raise ValueError("not base64")
            if len(b64) * 3 // 4 > max_image_bytes():
                raise ValueError(f"over the image size limit of {max_image_bytes() / 2**20:g} MB")
            data = base64.b64decode(b64, validate=False)
        except (ValueError, base64.binascii.Error) as e:
            raise ImageError(f"malformed data URI image ({e})") from None
        mime, w, h = _validate(data, "data URI image")
        return ImageData(hashlib.sha256(data).hexdigest(), data, mime, "data-uri", w, h)
    if ref.startswith(("http://", "https://")):
        if not fetch_urls:
            raise ImageError(f"{ref}: an http(s) image URL; the SGLang native backend needs a local file or a data URI "
                             "(download the image first). The openai backend passes URLs to the server as they are; "
                             "the local backend downloads them")

        try:
            r = httpx.get(ref, timeout=30, follow_redirects=True)
            r.raise_for_status()
        except httpx.HTTPError as e:
            raise ImageError(f"{ref}: could not download image ({e})") from None
        if len(r.content) > max_image_bytes():
            raise ImageError(f"{ref}: over the image size limit of {max_image_bytes() / 2**20:g} MB")
        mime, w, h = _validate(r.content, ref)
        return ImageData(hashlib.sha256(r.content).hexdigest(), r.content, mime, ref, w, h)
    path = Path(unquote(urlparse(ref).path) if ref.startswith("file://") else ref)
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    try:
        st = path.stat()
    except OSError as e:
        raise ImageError(f"{path}: image file not found or unreadable ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ImageError(f"{path}: not a regular file (a device, directory or pipe is never read as an image)")
    cap = max_image_bytes()
    if st.st_size > cap:
        raise ImageError(f"{path}: {st.st_size / 2**20:.1f} MB, over the image size limit of {cap / 2**20:g} MB "
                         "(MMCF_MAX_IMAGE_MB / --max-image-mb)")
    fast = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)  # the same file as last time: no path resolution
    with _lock:
        hit = _by_key.get(fast)
    if hit is not None:
        return hit
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    with _lock:
        hit = _by_key.get(key)
    if hit is not None:
        with _lock:
            _by_key.put(fast, hit, len(hit.data))
        return hit
    try:
        with open(path, "rb") as f:
            data = f.read(cap + 1)  # never more than the limit, whatever the file claims to be
    except OSError as e:
        raise ImageError(f"{path}: cannot read image ({e.strerror})") from None
    if len(data) > cap:
        raise ImageError(f"{path}: over the image size limit of {cap / 2**20:g} MB")
    mime, w, h = _validate(data, str(path))
    img = ImageData(hashlib.sha256(data).hexdigest(), data, mime, str(path), w, h)
    with _lock:
        _by_key.put(key, img, len(data))
        _by_key.put(fast, img, len(data))  # counted twice: the bound is conservative
    return img


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in ("image_url", "image")


def image_ref(part: dict) -> str:
    """The reference string of an image part (path, data URI or URL)."""
    if part.get("type") == "image":
        ref = part.get("image") or part.get("url") or part.get("path")
    else:
        iu = part.get("image_url")
        ref = iu.get("url") if isinstance(iu, dict) else iu
    if not isinstance(ref, (str, os.PathLike)) or not str(ref):
        raise ImageError(f"image part without a usable reference: {str(part)[:200]}")
    return os.fspath(ref)


def _parts(msg: dict) -> list:
    c = msg.get("content")
    if c is None:
        return []
    if isinstance(c, str):
        return [{"type": "text", "text": c}]
    return list(c)


def iter_image_parts(messages: list[dict]) -> Iterator[dict]:
    for m in messages:
        for p in _parts(m):
            if is_image_part(p):
                yield p


def text_of(msg: dict) -> str:
    """Concatenated text parts of a message."""
    return "".join(p.get("text", "") for p in _parts(msg) if isinstance(p, dict) and p.get("type") == "text")


def _image_of(part: dict, base_dir=None) -> ImageData:
    return load_image(image_ref(part), base_dir=base_dir)


def message_image_hashes(messages: list[dict], base_dir=None) -> list[str]:
    """sha256 of every image in the messages, in order (URLs are recorded as 'url:<url>')."""
    out = []
    for p in iter_image_parts(messages):
        ref = image_ref(p)
        out.append("url:" + ref if ref.startswith(("http://", "https://")) else _image_of(p, base_dir).sha256)
    return out


def record_messages(messages: list[dict], base_dir=None) -> list[dict]:
    """A JSON-able copy of ``messages`` with every image replaced by its sha256 (never its bytes)."""
    out = []
    for m in messages:
        m2 = {k: v for k, v in m.items() if k != "content"}
        parts = []
        c = m.get("content")
        if isinstance(c, str) or c is None:
            m2["content"] = c
            out.append(m2)
            continue
        for p in c:
            if is_image_part(p):
                ref = image_ref(p)
                if ref.startswith(("http://", "https://")):
                    parts.append({"type": "image", "url": ref})
                else:
                    img = _image_of(p, base_dir)
                    src = None if ref.startswith("data:") else img.source
                    parts.append({"type": "image", "sha256": img.sha256, **({"source": src} if src else {})})
            else:
                parts.append(copy.deepcopy(p))
        m2["content"] = parts
        out.append(m2)
    return out


def part_sha256(part: dict, base_dir=None) -> str:
    """The sha256 of an image part (a recorded part carries it; otherwise the image is read, cached)."""
    if part.get("sha256"):
        return part["sha256"]
    ref = image_ref(part)
    return "url:" + ref if ref.startswith(("http://", "https://")) else _image_of(part, base_dir).sha256


#: The text part that names a query image; the image part right after it is that query image's pixels
#: (``agent.methods.common.image_parts``). Retrieved images follow ``[result image i]`` labels instead.
QUERY_IMAGE_ID = re.compile(r"\s*<image_\d+>\s*$")


def query_image_flags(content) -> list[bool]:
    """For each part of one message's content: whether it is a query image's pixels.

    Query images are identified by where they sit (an image part right after its ``<image_k>`` identifier),
    never by content: a retrieved image byte-identical to a query image entered the context as an
    observation and stays one (paper B.5 keeps retrieved images; ours, how to tell them apart)."""
    if not isinstance(content, list):
        return []
    flags, prev = [], None
    for p in content:
        flags.append(bool(is_image_part(p) and isinstance(prev, dict) and prev.get("type") == "text"
                          and QUERY_IMAGE_ID.match(prev.get("text") or "")))
        prev = p
    return flags


def strip_query_images(messages: list[dict]) -> list[dict]:
    """The same messages with the query images' pixels dropped (their ``<image_k>`` identifiers and every
    retrieved image kept): Removal@k, the removal replays and τ^IR (paper §3.2.3, B.5)."""
    out = []
    for m in messages:
        c = m.get("content")
        if isinstance(c, list):
            flags = query_image_flags(c)
            if any(flags):
                m = {**m, "content": [p for p, q in zip(c, flags) if not q]}
        out.append(m)
    return out


def strip_images(messages: list[dict], hashes=None) -> list[dict]:
    """The same messages with image parts dropped (text parts, identifiers included, kept).

    ``hashes``: drop only the images with these sha256 (the query images: Removal@k and τ^IR drop
    the query images and never retrieved ones, paper B.5); None drops every image.
    """
    drop = None if hashes is None else set(hashes)
    out = []
    for m in messages:
        c = m.get("content")
        if isinstance(c, list):
            m = {**m, "content": [p for p in c if not (is_image_part(p) and (drop is None or part_sha256(p) in drop))]}
        out.append(m)
    return out


def to_openai_messages(messages: list[dict], base_dir=None) -> list[dict]:
    """Messages for an OpenAI-compatible server: local images become (cached) data URIs."""
    out = []
    for m in messages:
        c = m.get("content")
        if not isinstance(c, list):
            out.append(dict(m))
            continue
        parts = []
        for p in c:
            if is_image_part(p):
                ref = image_ref(p)
                url = ref if ref.startswith(("http://", "https://", "data:")) else _image_of(p, base_dir).data_uri()
                if ref.startswith("data:"):
                    load_image(ref)  # validate early, with a clear error
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                parts.append(p)
        out.append({**m, "content": parts})
    return out


def split_text_and_images(messages: list[dict], base_dir=None, fetch_urls: bool = False) -> tuple[list[dict], list[ImageData]]:
    """HF-style messages (``{"type": "image"}`` placeholders) and the images in order."""
    hf, images = [], []
    for m in messages:
        parts = []
        for p in _parts(m):
            if is_image_part(p):
                images.append(load_image(image_ref(p), base_dir=base_dir, fetch_urls=fetch_urls))
                parts.append({"type": "image"})
            elif isinstance(p, dict) and p.get("type") == "text":
                parts.append({"type": "text", "text": p.get("text", "")})
        msg = {"role": m["role"], "content": parts}
        if "reasoning_content" in m:  # the chat template decides whether to render it (Qwen3.5: after the last query)
            msg["reasoning_content"] = m["reasoning_content"]
        hf.append(msg)
    return hf, images
