"""The agent's image registry: ``<image_k>`` identifiers -> registered query images.

Tools only ever see images through it: ``lens_search`` takes an identifier, never a path from the
model. Identifiers are accepted with or without angle brackets (``<image_0>``, ``image_0``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..images import ImageData, load_image

__all__ = ["ImageRegistry", "RegisteredImage"]


@dataclass(frozen=True)
class RegisteredImage:
    image_id: str          # "<image_0>"
    image: ImageData
    path: Path
    benchmark: str = ""
    filename: str = ""

    @property
    def sha256(self) -> str:
        return self.image.sha256


@dataclass
class ImageRegistry:
    images: list[RegisteredImage] = field(default_factory=list)

    @classmethod
    def from_paths(cls, paths: list, benchmark: str = "", *, undecodable_ok: bool = False) -> "ImageRegistry":
        """``undecodable_ok``: a file whose bytes are no image is registered by its bytes' hash (``--protocol
        release --allow-missing-images``: the release sends it, and the call that carries it fails)."""
        reg = cls()
        for i, p in enumerate(paths):
            p = Path(p)
            reg.images.append(RegisteredImage(f"<image_{i}>", load_image(p, undecodable_ok=undecodable_ok), p,
                                              benchmark, p.name))
        return reg

    @property
    def ids(self) -> list[str]:
        return [r.image_id for r in self.images]

    def resolve(self, image_id: str) -> RegisteredImage | None:
        m = re.fullmatch(r"\s*<?\s*(?:image_?|img_?)?(\d+)\s*>?\s*", str(image_id), flags=re.I)
        if not m:
            return None
        k = int(m.group(1))
        return self.images[k] if 0 <= k < len(self.images) else None

    def exact(self, image_id: str) -> RegisteredImage | None:
        """The image whose identifier is ``image_id`` exactly as written (the release's ``self.images.get(id)``)."""
        return next((r for r in self.images if r.image_id == image_id), None)

    def by_sha(self) -> dict[str, RegisteredImage]:
        return {r.sha256: r for r in self.images}
