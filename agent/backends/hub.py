"""A model directory, or a hub id (``Qwen/Qwen3.5-27B``) found in the local Hugging Face cache — never downloaded.

    from agent.backends.hub import resolve_model_dir
    path = resolve_model_dir("Qwen/Qwen3.5-27B")      # the cached snapshot directory, or a clear BackendError

The launcher accepts hub ids for ``--model-path``; the clients (``--model-dir``, for the chat template and
processor) accept the same id when the model is in the local cache (``HF_HOME`` / ``HF_HUB_CACHE``),
resolved offline. Nothing is fetched from the network.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .base import BackendError

__all__ = ["resolve_model_dir"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model_dir(model_dir: str | os.PathLike) -> Path:
    p = Path(model_dir)
    if p.is_dir():
        return p
    s = str(model_dir)
    if not _HUB_ID.match(s):
        raise BackendError(f"{s}: model directory not found")
    try:
        from huggingface_hub import snapshot_download  # noqa: PLC0415 - optional heavy (comes with transformers)
        from huggingface_hub.constants import HF_HUB_CACHE  # noqa: PLC0415
    except ImportError:
        raise BackendError(f"{s}: not a directory, and resolving a hub id needs huggingface_hub "
                           "(pip install huggingface_hub) — or pass the weights directory") from None
    try:
        return Path(snapshot_download(s, local_files_only=True))
    except Exception:  # noqa: BLE001 - any miss: one clear message
        raise BackendError(f"{s}: not a directory, and not in the local Hugging Face cache ({HF_HUB_CACHE}); "
                           f"download it first (huggingface-cli download {s}) or pass the weights directory "
                           "(nothing is downloaded at run time)") from None
