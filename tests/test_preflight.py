"""`python -m agent.preflight`: everything a chain of commands needs, checked before the first starts."""
from __future__ import annotations

import pytest

from agent.identity import same_model
from agent.preflight import main as preflight_main
from serving.fakes.sglang_server import FakeSGLang


def test_every_missing_key_is_listed(monkeypatch, capsys):
    for v in ("SERPER_API_KEY", "JINA_API_KEY", "OPENROUTER_API_KEY", "MMCF_LENS_URL_TEMPLATE", "MMCF_LENS_S3_BUCKET"):
        monkeypatch.delenv(v, raising=False)
    assert preflight_main(["--tools", "live", "--judge-api-key-env", "OPENROUTER_API_KEY"]) == 2
    err = capsys.readouterr().err
    assert "SERPER_API_KEY" in err and "OPENROUTER_API_KEY" in err and "2 problem(s)" in err


@pytest.mark.model
def test_sglang_server_must_serve_the_weights_of_model_dir(tiny_model_dir, capsys):
    with FakeSGLang(model_name="/models/Qwen3.5-27B", tokenizer_dir=str(tiny_model_dir)) as srv:
        assert preflight_main(["--backend", "sglang", "--endpoint", srv.url, "--model-dir", str(tiny_model_dir)]) == 2
        assert "serves the weights '/models/Qwen3.5-27B'" in capsys.readouterr().err
    with FakeSGLang(model_name=f"/models/{tiny_model_dir.name}", tokenizer_dir=str(tiny_model_dir)) as srv:
        assert preflight_main(["--backend", "sglang", "--endpoint", srv.url, "--model-dir", str(tiny_model_dir),
                               "--benchmark", "demo"]) == 0
        assert "preflight: ok" in capsys.readouterr().out


def test_same_model_rule():
    a = {"served_model": "qwen3.5-27b", "weights": "/models/Qwen3.5-27B", "fingerprint": None}
    assert same_model(a, {**a, "weights": "/other/place/Qwen3.5-27B"}) is None
    assert "Qwen3.5-9B" in same_model(a, {"served_model": "qwen3.5-9b", "weights": "/models/Qwen3.5-9B"})
    local = {"served_model": "tiny", "weights": "/a/tiny", "fingerprint": "abc"}
    assert same_model(local, {**local, "weights": "/moved/tiny"}) is None  # moved, same fingerprint
    assert same_model(local, {**local, "fingerprint": "def"}) is not None
