"""Shared fixtures: the tiny Qwen3.5 (built once per session), a loopback SGLang, the shared data."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MMCF_SHARED_DIR", REPO.parent / "shared"))


def have_local_extra() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    if not have_local_extra():
        pytest.skip("needs the 'local' extra (torch, transformers)")
    from agent.backends.tiny_model import ensure_tiny_model

    cached = os.environ.get("MMCF_TINY_MODEL_DIR")
    return ensure_tiny_model(cached or tmp_path_factory.mktemp("tiny") / "tiny-qwen35", quiet=True)


@pytest.fixture(scope="session")
def local_backends(tiny_model_dir):
    from agent.backends.local import LocalBackend

    return {m: LocalBackend(tiny_model_dir, logprob_mode=m) for m in ("raw", "scaled")}


@pytest.fixture
def fake_sglang(tiny_model_dir):
    from tests.fakes.sglang_server import FakeSGLang

    with FakeSGLang(tokenizer_dir=str(tiny_model_dir)) as srv:
        yield srv


@pytest.fixture
def red_image(tmp_path) -> Path:
    from PIL import Image

    p = tmp_path / "red.png"
    Image.new("RGB", (120, 90), (200, 30, 30)).save(p)
    return p


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared data not found at {SHARED}")
    return SHARED


@pytest.fixture
def live_web(monkeypatch):
    """The live tools pointed at tests/fakes/web_apis.py (Serper search and Lens, Jina Reader, Serper scrape),
    with fake keys; ``web.log`` lists every request the fake APIs received."""
    from tests.fakes.web_apis import FakeWeb

    with FakeWeb() as web:
        monkeypatch.setenv("SERPER_API_KEY", "sk-fake")
        monkeypatch.setenv("JINA_API_KEY", "jina-fake")
        monkeypatch.setenv("MMCF_SERPER_BASE", web.url)
        monkeypatch.setenv("MMCF_SERPER_SCRAPE_BASE", web.url + "/scrape")
        monkeypatch.setenv("MMCF_JINA_BASE", web.url)
        monkeypatch.setenv("MMCF_LENS_URL_TEMPLATE", "https://images.example/{sha256}")
        yield web
