"""The probe bench's parts of a step (scripts/bench_probe.py): the floor, the same exchange through each asynchronous
client, and the probe's own work with its replies served from memory, each on a real bench run
scored by the loopback SGLang stand-in."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import bench_data  # noqa: E402
import bench_probe  # noqa: E402

pytestmark = pytest.mark.slow  # seconds of set-up each on a busy 2-core machine: the full suite runs it, the quick loop not


@pytest.fixture
def scored_run(tmp_path, tiny_model_dir, monkeypatch):
    from agent.backends.base import model_vocab_size
    from agent.backends.local import load_chat_renderer
    from agent.backends.sglang_native import SGLangBackend
    from serving.fakes.sglang_server import FakeSGLang

    tiny = str(tiny_model_dir)
    with FakeSGLang(tokenizer_dir=tiny, model_name=tiny, reply=bench_probe.tiny_reply(tiny, 120)) as srv:
        # recorded ids are scored: the model's ordinary tokens only (as scripts/bench_probe.py sets it)
        monkeypatch.setattr(bench_data, "VOCAB", min([model_vocab_size(tiny), *load_chat_renderer(tiny).all_special_ids]))
        bench_data.write_run(tmp_path / "run", 2, bench_data.RowPool(seed=0, n_rows=1 << 12), calls=3, tokens=120,
                             progress=False, prompts=SGLangBackend(srv.url, tiny))
        yield tmp_path / "run", srv.url, tiny


def test_the_parts_of_a_step_are_measured_on_the_runs_own_steps(scored_run):
    root, url, tiny = scored_run
    work = bench_probe.step_requests(root, url, tiny, 2)
    assert len(work) == 6 and all(len(step) == 2 for step in work)  # 2 trajectories x 3 calls, both sides
    with_imgs, without = work[0]
    assert "image_data" in with_imgs[0] and "image_data" not in without[0]  # the query image, then none
    assert with_imgs[1] == without[1]  # the same recorded ids scored under both contexts
    fl = bench_probe.floor(work, url, tiny)
    assert fl["steps"] == 6 and fl["request_mb"] > 0 and fl["reply_mb"] > 0 and fl["ms_per_step"] > 0
    for kind in bench_probe.EXCHANGES:
        assert 0 < bench_probe.client_exchange(work, url, tiny, kind) < math.inf
    assert 0 < bench_probe.own_work(root, url, tiny, 2) < math.inf


def test_the_own_work_replays_each_reply_to_the_step_that_asked_for_it(scored_run, monkeypatch):
    """The timed pass probes the same steps in the same order as the recording pass: a reply left over, or one
    too few, would mean the probe's work was timed on other steps' replies."""
    from agent.backends.sglang_native import SGLangBackend

    root, url, tiny = scored_run
    served = []
    real = SGLangBackend.score

    async def counting(self, *a, **kw):
        served.append(kw.get("top_logprobs"))
        return await real(self, *a, **kw)
    monkeypatch.setattr(SGLangBackend, "score", counting)
    bench_probe.own_work(root, url, tiny, 2)
    assert served == [20] * 12  # the server asked once per request (6 steps x 2), in the recording pass only
