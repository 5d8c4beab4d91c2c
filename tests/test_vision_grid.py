"""The image token rule without torch (agent/backends/vision.py) against transformers' real Qwen-VL processor."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from agent.backends.vision import UnknownProcessor, VisionGrid

# sizes a user's images have: thumbnails, photos, screenshots, panoramas, sizes at the factor's rounding edges
SIZES = [(1, 1), (7, 300), (28, 28), (31, 33), (32, 32), (48, 48), (63, 65), (100, 2000), (224, 224), (255, 257),
         (320, 240), (640, 480), (800, 600), (1000, 1000), (1023, 769), (1280, 720), (1920, 1080), (2048, 1536),
         (3000, 4000), (4032, 3024), (5000, 200), (8000, 8000)]


def _processor_tokens(proc, w, h):
    from PIL import Image

    g = proc.image_processor(images=[Image.new("RGB", (w, h), (120, 30, 200))])["image_grid_thw"][0].tolist()
    merge = int(proc.image_processor.merge_size)
    return int(g[0] * g[1] * g[2]) // (merge * merge)


@pytest.mark.parametrize("overrides", [None, {"size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280},
                                             "patch_size": 14}])
def test_tokens_equal_the_real_processor(tiny_model_dir, tmp_path, overrides):
    """Qwen3.5's config (16-pixel patches, 65,536..16.7M pixels) and Qwen2.5-VL's (14-pixel, 3,136..1M)."""
    import shutil

    from transformers import AutoProcessor

    d = tmp_path / "m"
    shutil.copytree(tiny_model_dir, d)
    cfg = json.loads((d / "processor_config.json").read_text())
    if overrides:
        cfg["image_processor"].update(overrides)
        (d / "processor_config.json").write_text(json.dumps(cfg))
    proc = AutoProcessor.from_pretrained(str(d))
    grid = VisionGrid.from_model_dir(d)
    got = [grid.tokens(w, h) for w, h in SIZES if max(w, h) / min(w, h) <= 200]
    want = [_processor_tokens(proc, w, h) for w, h in SIZES if max(w, h) / min(w, h) <= 200]
    assert got == want
    assert len(set(got)) > 5  # the sizes exercise the clamps and the rounding, not one value


def test_older_config_keys_and_unknown_processors(tmp_path):
    p = tmp_path / "preprocessor_config.json"
    p.write_text(json.dumps({"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136,
                             "max_pixels": 1003520, "patch_size": 14, "merge_size": 2}))
    g = VisionGrid.from_model_dir(tmp_path)
    assert (g.patch_size, g.min_pixels, g.max_pixels) == (14, 3136, 1003520)
    assert g.tokens(28, 28) == 4  # lifted to the 3,136-pixel minimum: 56 x 56 -> 4 x 4 patches -> 4 tokens
    p.write_text(json.dumps({"image_processor_type": "LlavaNextImageProcessor"}))
    with pytest.raises(UnknownProcessor, match="LlavaNext"):
        VisionGrid.from_model_dir(tmp_path)
    p.unlink()
    with pytest.raises(UnknownProcessor, match="no processor_config"):
        VisionGrid.from_model_dir(tmp_path)


def test_scoring_with_images_imports_no_torch(tiny_model_dir, tmp_path):
    """The HTTP backend places scored tokens after an image without importing torch (a subprocess: this test
    process has torch loaded already)."""
    import subprocess

    from PIL import Image

    Image.fromarray(np.full((300, 500, 3), 90, np.uint8)).save(tmp_path / "q.png")
    code = f"""
import sys
from agent.backends.sglang_native import SGLangBackend
from agent.backends.base import Continuation
b = SGLangBackend("http://127.0.0.1:9", {str(tiny_model_dir)!r})
b.prepare("teacher-forced")
msgs = [{{"role": "user", "content": [{{"type": "image", "image": {str(tmp_path / 'q.png')!r}}}, {{"type": "text", "text": "where?"}}]}}]
payload = b.score_payload(msgs, Continuation(ids=[5, 6, 7]))[0]
print(payload["logprob_start_len"], list(b._image_tokens.values()))
print("torch" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    assert r.returncode == 0, r.stderr
    start, torch_loaded = r.stdout.split("\n")[:2]
    assert torch_loaded == "False"
    from transformers import AutoProcessor

    assert f"[{_processor_tokens(AutoProcessor.from_pretrained(str(tiny_model_dir)), 500, 300)}]" in start
