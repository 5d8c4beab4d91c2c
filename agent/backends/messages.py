"""OpenAI-format chat messages with image parts: loading, hashing, encoding, recording.

An image part is ``{"type": "image_url", "image_url": {"url": REF}}`` (or ``{"type": "image",
"image": REF}``) where REF is a local path, a ``file://`` URL, a ``data:`` URI or an http(s) URL.
Images are identified by the sha256 of their bytes; each image is read and encoded once per
process (a small cache keyed by path, size and mtime), so a 20-call trajectory does not re-encode
its query image 20 times.
"""
from __future__ import annotations

import copy
import os
import re
from typing import Any, Iterator

from ..images import ImageData, ImageError, declared_type, forget_images, load_image

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


def to_openai_messages(messages: list[dict], base_dir=None, *, type_by_name: bool = False) -> list[dict]:
    """Messages for an OpenAI-compatible server: local images become (cached) data URIs, their type read from the
    bytes (ours: what the image is), or with ``type_by_name`` as the release sends a file: typed from its name
    (:func:`agent.images.declared_type`), and sent whether or not its bytes are an image (the server answers)."""
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
                url = ref if ref.startswith(("http://", "https://", "data:")) else \
                    load_image(ref, base_dir=base_dir, undecodable_ok=type_by_name).data_uri()
                if type_by_name and not ref.startswith(("http://", "https://", "data:")):
                    url = f"data:{declared_type(ref)};base64," + url.split(",", 1)[1]
                if ref.startswith("data:"):
                    load_image(ref)  # validate early, with a clear error
                iu = p.get("image_url")
                detail = iu.get("detail") if isinstance(iu, dict) else None
                parts.append({"type": "image_url", "image_url": {"url": url, **({"detail": detail} if detail else {})}})
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
