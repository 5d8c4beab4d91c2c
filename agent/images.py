"""Images the agents send: loaded once from a path, URL or data URI, checked (size, decodable), identified by
the sha256 of their bytes, and kept in a bounded in-memory cache shared by every backend.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import mimetypes
import os
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx
from PIL import Image, UnidentifiedImageError

from .errors import UsageError
from .jsonio import PartsString


class ImageError(UsageError, ValueError):
    """An image part that cannot be used: missing/unreadable file, not an image, bad data URI."""


class NotAnImage(ImageError):
    """Bytes that were read but are no image any decoder here opens (an empty file, a text file named ``.jpg``)."""


@dataclass(frozen=True)
class FileRef:
    """The file an image was read from, as it was then: its bytes are read again from it when they are needed,
    hashed as they are read, and refused (:class:`ImageError`) unless they are the bytes its sha256 names."""

    path: str
    size: int

    def read(self, sha256: str, n: int):
        """The file's bytes ``n`` at a time; the last piece comes only once all of them have been hashed and found
        to be the image's, so a file changed since it was read never goes out whole (no reply can answer it)."""
        try:
            f = open(self.path, "rb")
        except OSError as e:
            raise ImageError(f"{self.path}: image file not found or unreadable ({e.strerror})") from None
        h, held, total = hashlib.sha256(), None, 0
        with f:
            while chunk := f.read(n):
                total += len(chunk)
                if total > self.size:
                    break
                h.update(chunk)
                if held is not None:
                    yield held
                held = chunk
        if total != self.size or h.hexdigest() != sha256:
            raise ImageError(f"{self.path}: the image file changed after it was read and hashed; refusing to send "
                             "bytes its recorded sha256 does not name")
        if held is not None:
            yield held


@dataclass(frozen=True)
class ImageData:
    sha256: str
    #: the bytes, where they are held (a data URI, a download); None for a file's image, read again from ``file``
    content: bytes | None
    mime: str
    source: str
    width: int
    height: int
    #: False for a file read as bytes that are no image (``load_image(..., undecodable_ok=True)``): it has a hash and
    #: bytes to send, no pixels, and ``width``/``height`` 0.
    decoded: bool = True
    file: FileRef | None = None

    @property
    def data(self) -> bytes:
        """The image's bytes (a file's read again and checked against its sha256: ours, so that no photo is held
        between the requests that send it; hundreds of trajectories are in flight in a probe; docs/performance.md)."""
        if self.content is not None:
            return self.content
        assert self.file is not None
        return b"".join(self.file.read(self.sha256, self.file.size or 1))

    @property
    def nbytes(self) -> int:
        return len(self.content) if self.content is not None else self.file.size  # type: ignore[union-attr]

    def chunks(self, n: int):
        """The bytes ``n`` at a time (a file's read and checked as they go, never whole: :meth:`FileRef.read`)."""
        if self.content is not None:
            view = memoryview(self.content)
            for i in range(0, len(view), n):
                yield view[i:i + n]
            return
        assert self.file is not None
        yield from self.file.read(self.sha256, n)

    def data_uri(self) -> str:
        return _data_uri(self)

    def sent_data_uri(self) -> "SentDataURI":
        """The data URI as a request body carries it, written from the image's bytes as it is sent."""
        return SentDataURI(self)

    def pil(self):
        if not self.decoded:
            raise NotAnImage(f"{self.source}: not a readable image (it has no pixels to decode)")
        img = Image.open(io.BytesIO(self.data))
        img.load()
        return img.convert("RGB") if img.mode not in ("RGB", "L") else img


class SentDataURI(PartsString):
    """An image's base64 data URI written into a request body as it is sent, 48 KB of the image at a time: neither
    the URI (4/3 of the image), the body holding it, nor (for a file) the image itself is ever whole in memory, for
    each request in flight (ours: a probe keeps 128-384 trajectories in flight, each with a ~0.5 MB photo URI;
    docs/performance.md)."""

    CHUNK = 3 * 2**14  # a multiple of 3: each chunk's base64 ends without padding, so the chunks concatenate

    def __init__(self, img: ImageData):
        self.img = img
        self.head = f"data:{img.mime};base64,".encode("ascii")

    def nbytes(self) -> int:
        return len(self.head) + 4 * ((self.img.nbytes + 2) // 3)

    def parts(self):
        yield self.head
        for chunk in self.img.chunks(self.CHUNK):
            yield base64.b64encode(chunk)


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


#: The image caches' memory bound (MB, both together; MMCF_IMAGE_CACHE_MB, agent.run --image-cache-mb; ours): what
#: is held is the images that came as bytes (a data URI, a download) and the base64 data URIs the chat paths build
#: (a file's image is only its hash, size and path: its bytes are read again when sent), so without a bound every
#: such image a process ever met would stay (docs/performance.md). An evicted image is read and encoded again if
#: it comes back.
DEFAULT_IMAGE_CACHE_MB = 512


def _cache_budget() -> int:
    try:
        mb = float(os.environ.get("MMCF_IMAGE_CACHE_MB", DEFAULT_IMAGE_CACHE_MB))
    except ValueError:
        mb = DEFAULT_IMAGE_CACHE_MB
    return max(0, int(mb * 2**20))


_lock = threading.Lock()
#: What the cache counts for a file's image: the entry itself (its bytes are read again from the file when sent).
_FILE_ENTRY_BYTES = 1024
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
    in flight that sends them is done, since no later request will (ours: otherwise a probe's memory grows with
    every distinct image until the caches' bound; docs/performance.md)."""
    shas = set(shas)
    if not shas:
        return
    with _lock:
        for sha in shas:
            _uri_by_sha.pop(sha)
        for key in [k for k, (img, _) in _by_key.items.items() if img.sha256 in shas]:
            _by_key.pop(key)


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
    except Image.DecompressionBombError as e:  # PIL's own limit on pixels: a few KB can claim gigabytes
        raise ImageError(f"{source}: too many pixels to read safely ({e})") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise NotAnImage(f"{source}: not a readable image ({e.__class__.__name__}: {e})") from None
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


def declared_type(name: str) -> str:
    """The type the release declares for an image file: guessed from its name, ``image/jpeg`` when that guess is no
    image type (``utils/search_backbone_model.py`` ``get_image_mime_type``: a PNG named ``d.jpg`` is sent as JPEG)."""
    guess, _ = mimetypes.guess_type(str(name))
    return guess if guess and guess.startswith("image/") else "image/jpeg"


def load_image(ref: str | os.PathLike, *, base_dir: str | os.PathLike | None = None, fetch_urls: bool = False,
               undecodable_ok: bool = False) -> ImageData:
    """Read and validate an image reference; raises :class:`ImageError` naming it on failure.

    Only regular files are read, and never more than :func:`max_image_bytes`. ``undecodable_ok``: a file whose
    bytes are no image comes back with ``decoded=False``, typed by its name (:func:`declared_type`), as the
    release reads and sends any file (``--protocol release --allow-missing-images``; ours elsewhere: refused)."""
    ref = os.fspath(ref)
    if ref.startswith("data:"):
        try:
            header, b64 = ref.split(",", 1)
            if ";base64" not in header:
                raise ValueError("not base64")
            if len(b64) * 3 // 4 > max_image_bytes():
                raise ValueError(f"over the image size limit of {max_image_bytes() / 2**20:g} MB")
            data = base64.b64decode(b64, validate=False)
        except (ValueError, binascii.Error) as e:
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
    return _as_asked(_load_file(path), undecodable_ok)


def _load_file(path: Path) -> ImageData:
    """A regular file's image, from the cache when the file is unchanged; bytes that are no image come back
    ``decoded=False`` (cached too: :func:`_as_asked` refuses them to a caller that wants pixels)."""
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
            _by_key.put(fast, hit, _FILE_ENTRY_BYTES)
        return hit
    try:
        with open(path, "rb") as f:
            data = f.read(cap + 1)  # never more than the limit, whatever the file claims to be
    except OSError as e:
        raise ImageError(f"{path}: cannot read image ({e.strerror})") from None
    if len(data) > cap:
        raise ImageError(f"{path}: over the image size limit of {cap / 2**20:g} MB")
    # the file as read: what its bytes are read again from, and refused from once it is another
    ref = FileRef(str(path), len(data))
    try:
        mime, w, h = _validate(data, str(path))
        img = ImageData(hashlib.sha256(data).hexdigest(), None, mime, str(path), w, h, file=ref)
    except NotAnImage:
        img = ImageData(hashlib.sha256(data).hexdigest(), None, declared_type(path.name), str(path), 0, 0, False, ref)
    with _lock:
        _by_key.put(key, img, _FILE_ENTRY_BYTES)
        _by_key.put(fast, img, _FILE_ENTRY_BYTES)
    return img


def _as_asked(img: ImageData, undecodable_ok: bool) -> ImageData:
    if not img.decoded and not undecodable_ok:
        _validate(img.data, img.source)  # raises NotAnImage with the decoder's own words
    return img
