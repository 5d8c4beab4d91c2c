"""How many tokens an image becomes in a Qwen-VL prompt, from the image's size and the model's processor config.

    grid = VisionGrid.from_model_dir("/models/Qwen3.5-27B")   # reads processor_config.json / preprocessor_config.json
    grid.tokens(width=1024, height=768)                        # the placeholder's expanded length (one image)

The rule is the Qwen2-VL image processor's (transformers ``models/qwen2_vl/image_processing_qwen2_vl.py``,
used by Qwen2.5-VL, Qwen3-VL and Qwen3.5, and by SGLang's server through the same processor): the image is
resized to ``smart_resize(h, w, factor=patch_size * merge_size, min_pixels, max_pixels)`` (both sides
multiples of the factor, the pixel count clamped to the range, the aspect kept), cut into ``patch_size``
patches (one temporal frame for a still image), and every ``merge_size x merge_size`` patches become one
token: ``(h' / patch) * (w' / patch) / merge²``. Computing it needs only the image's stored width and height
(no pixel is decoded) and no torch: the HTTP probes use it to place the scored tokens after the images
(``logprob_start_len``) without importing the processor (~0.5 GB of memory).
Tested against the real processor on many sizes (tests/test_vision_grid.py). A processor this module does
not recognise is refused (:class:`UnknownProcessor`); the caller then asks the processor itself.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import HarnessError

__all__ = ["VisionGrid", "UnknownProcessor", "smart_resize"]

#: Image processors whose resize rule is Qwen2-VL's smart_resize (transformers' class names).
_QWEN_VL = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil")


class UnknownProcessor(HarnessError, ValueError):
    """The model's processor config is missing or not a Qwen-VL image processor this module can follow."""


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize target: both sides multiples of ``factor``, ``min_pixels <= h * w <= max_pixels``
    (as far as the factor allows), the aspect ratio kept as closely as possible. The same arithmetic as
    transformers' ``smart_resize`` (Python's round: half to even), so the counts agree to the token."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class VisionGrid:
    patch_size: int = 16
    merge_size: int = 2
    min_pixels: int = 65536          # Qwen3-VL / Qwen3.5's processor defaults ("shortest_edge")
    max_pixels: int = 16777216       # ("longest_edge")
    do_resize: bool = True

    @classmethod
    def from_config(cls, cfg: dict, where: str = "processor config") -> "VisionGrid":
        """From an image processor's config dict (``processor_config.json``'s ``image_processor`` or a
        ``preprocessor_config.json``): ``size.shortest_edge`` / ``longest_edge`` (transformers 5) or the older
        ``min_pixels`` / ``max_pixels``."""
        kind = cfg.get("image_processor_type")
        if kind not in _QWEN_VL:
            raise UnknownProcessor(f"{where}: image processor {kind!r} is not a Qwen-VL one ({', '.join(_QWEN_VL)})")
        size = cfg.get("size") or {}
        lo = cfg.get("min_pixels", size.get("shortest_edge", size.get("min_pixels")))
        hi = cfg.get("max_pixels", size.get("longest_edge", size.get("max_pixels")))
        if lo is None or hi is None:
            raise UnknownProcessor(f"{where}: no pixel range (size.shortest_edge / longest_edge or min/max_pixels)")
        return cls(patch_size=int(cfg.get("patch_size", 14)), merge_size=int(cfg.get("merge_size", 2)),
                   min_pixels=int(lo), max_pixels=int(hi), do_resize=bool(cfg.get("do_resize", True)))

    @classmethod
    def from_model_dir(cls, model_dir) -> "VisionGrid":
        d = Path(model_dir)
        for name, key in (("processor_config.json", "image_processor"), ("preprocessor_config.json", None)):
            p = d / name
            if p.is_file():
                try:
                    cfg = json.loads(p.read_text())
                except (OSError, ValueError) as e:
                    raise UnknownProcessor(f"{p}: unreadable ({e})") from None
                cfg = cfg.get(key) if key else cfg
                if isinstance(cfg, dict):
                    return cls.from_config(cfg, str(p))
        raise UnknownProcessor(f"{d}: no processor_config.json or preprocessor_config.json with an image processor")

    def tokens(self, width: int, height: int) -> int:
        """The number of tokens one still image of this size becomes."""
        factor = self.patch_size * self.merge_size
        if self.do_resize:
            h, w = smart_resize(int(height), int(width), factor, self.min_pixels, self.max_pixels)
        else:
            h, w = int(height), int(width)
        return (h // self.patch_size) * (w // self.patch_size) // (self.merge_size * self.merge_size)
