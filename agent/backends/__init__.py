"""Model backends: one async protocol, several implementations (see ``base.py``).

    from agent.backends import make_backend, SamplingParams
    b = make_backend("local")                                   # the embedded tiny Qwen3.5
    b = make_backend("sglang", endpoint="http://h:30000", model_dir="/models/Qwen3.5-27B")
    b = make_backend("openai", endpoint="http://h:30000", model="qwen3.5-27b")
    b = make_backend("vllm", endpoint="http://h:8000", model_dir="/models/Qwen3.5-27B", logprob_mode="raw")
"""
from __future__ import annotations

from ..images import ImageError
from .base import (
    DEFAULT_TOP_LOGPROBS,
    Backend,
    BackendError,
    Continuation,
    LogprobSemantics,
    ModelOutput,
    SamplingParams,
    ScoredTokens,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from .demo_model import DemoModel
from .local import LocalBackend
from .openai_compat import OpenAIBackend
from .sglang_native import SGLangBackend
from .tiny_model import ensure_tiny_model
from .vllm import VLLMBackend

__all__ = [
    "Backend", "BackendError", "Continuation", "ImageError", "LogprobSemantics", "ModelOutput", "SamplingParams",
    "ScoredTokens", "TokenLogprob", "TopLogprob", "Usage", "DEFAULT_TOP_LOGPROBS", "make_backend", "BACKENDS",
]

#: ``scripted`` is a fake (agent/backends/demo_model.py): for demos and tests, never for numbers.
BACKENDS = ("local", "sglang", "vllm", "openai", "scripted")


def make_backend(kind: str = "local", *, endpoint: str | None = None, model: str | None = None,
                 model_dir: str | None = None, logprob_mode: str = "scaled", server: str = "sglang",
                 api_key_env: str | None = None, **kw) -> Backend:
    """Build a backend by name. ``local`` with no ``model_dir`` uses the embedded tiny Qwen3.5."""
    if kind == "local":
        return LocalBackend(model_dir or ensure_tiny_model(), logprob_mode=logprob_mode, **kw)
    if kind == "openai":
        if not endpoint:
            raise BackendError("--backend openai needs --endpoint URL")

        return OpenAIBackend(endpoint, model, server=server, logprob_mode=logprob_mode, api_key_env=api_key_env, **kw)
    if kind == "scripted":
        return DemoModel()
    if kind == "sglang":
        if not endpoint or not model_dir:
            raise BackendError("--backend sglang needs --endpoint URL and --model-dir DIR (for the chat template)")

        return SGLangBackend(endpoint, model_dir, model=model, logprob_mode=logprob_mode, **kw)
    if kind == "vllm":
        if not endpoint or not model_dir:
            raise BackendError("--backend vllm needs --endpoint URL and --model-dir DIR (for the chat template)")
        return VLLMBackend(endpoint, model_dir, model=model, logprob_mode=logprob_mode, api_key_env=api_key_env, **kw)
    raise BackendError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
