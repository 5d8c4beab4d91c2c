"""The probe bench's parts of a step (scripts/bench_probe.py): the floor, the same exchange through each asynchronous
client, and the probe's own work with its replies served from memory, each on a real bench run
scored by the loopback SGLang stand-in."""
from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import bench_data  # noqa: E402
import bench_probe  # noqa: E402

pytestmark = pytest.mark.slow  # seconds of set-up each on a busy 2-core machine: the full suite runs it, the quick loop not


@pytest.fixture(scope="module")
def bench_model(tiny_model_dir, tmp_path_factory):
    """The tiny model with Qwen3.5's 248,320-id vocabulary, as scripts/bench_probe.py builds it."""
    vocab, specials = bench_data.VOCAB, bench_data.SPECIALS
    try:
        yield bench_data.bench_model(str(tiny_model_dir), tmp_path_factory.mktemp("bench-model")), bench_data.SPECIALS
    finally:
        bench_data.VOCAB, bench_data.SPECIALS = vocab, specials


@pytest.fixture
def scored_run(tmp_path, bench_model, monkeypatch):
    from agent.backends.sglang_native import SGLangBackend
    from serving.fakes.sglang_server import FakeSGLang

    model, specials = bench_model
    monkeypatch.setattr(bench_data, "SPECIALS", specials)
    monkeypatch.setattr(bench_data, "VOCAB", 248_320)
    with FakeSGLang(tokenizer_dir=model, model_name=model, reply=bench_probe.tiny_reply(model, 120),
                    alternatives_vocab=bench_data.VOCAB) as srv:
        bench_data.write_run(tmp_path / "run", 2, bench_data.RowPool(seed=0, n_rows=1 << 12), calls=3, tokens=120,
                             progress=False, prompts=SGLangBackend(srv.url, model))
        yield tmp_path / "run", srv.url, model


def test_the_bench_model_has_qwen35s_vocabulary_and_its_alternatives_span_it(scored_run):
    """The bench's alternatives over a real vocabulary's size (issue 84): the recorded ids and the stand-in's
    alternatives spread over all 248,320 ids, never on a special token; the specials at the top, as Qwen3.5's."""
    from agent.backends.base import Continuation, model_vocab_size, top_id_matrix
    from agent.backends.local import load_chat_renderer
    from agent.backends.sglang_native import SGLangBackend
    from agent.rundir import load_run

    root, url, model = scored_run
    tok = load_chat_renderer(model)
    assert model_vocab_size(model) == len(tok) == 248_320 and bench_data.SPECIALS == (248_300, 248_320)
    assert tok.convert_tokens_to_ids("<|image_pad|>") >= 248_300 and tok("the image")["input_ids"][0] < 608
    run = load_run(root)
    recorded = run.tokens(run.lines[0], ["top_ids"])["top_ids"]
    assert recorded.max() > 100_000 and not ((recorded >= 248_300) & (recorded < 248_320)).any()
    line = run.full(run.index[0])
    ev = run.call_event(line, 1)
    ids = [int(i) for i in run.tokens(line, ["call", "id"])["id"][run.tokens(line, ["call"])["call"] == ev.index]]

    async def score():
        b = SGLangBackend(url, model)
        try:
            return await b.score(run.sendable_messages(line, ev), Continuation(ids=ids), top_logprobs=20)
        finally:
            await b.aclose()
    alts = top_id_matrix(asyncio.run(score()).tokens, 20)[:, 1:]
    assert alts.max() > 100_000 and len(np.unique(alts)) > 1_000 and not ((alts >= 248_300) & (alts < 248_320)).any()


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
