"""OpenAI-compatible and SGLang-native backends against a loopback server speaking SGLang's format."""
import json

import httpx
import pytest

from agent.backends import BackendError, Continuation, SamplingParams
from agent.backends.openai_compat import OpenAIBackend
from agent.backends.sglang_native import SGLangBackend
from agent.backends.wire import tokens_from_triples
from agent.http import RetryPolicy

FAST = RetryPolicy(retries=2, backoff_s=0.01, timeout_s=10)


def msgs(img):
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(img)}},
                                         {"type": "text", "text": "What is this?"}]}]


@pytest.fixture
def native(fake_sglang, tiny_model_dir):
    return SGLangBackend(fake_sglang.url, str(tiny_model_dir), policy=FAST)


async def test_native_generate_parses_triples_and_think(native, fake_sglang, red_image):
    out = await native.generate(msgs(red_image), SamplingParams(max_tokens=64))
    body = fake_sglang.bodies[-1]
    assert body["return_logprob"] is True and body["top_logprobs_num"] == 20
    assert body["sampling_params"]["temperature"] == 0.2 and body["sampling_params"]["top_p"] == 0.95
    assert body["image_data"][0].startswith("data:image/png;base64,")
    assert body["text"].endswith("<|im_start|>assistant\n<think>\n")
    assert out.reasoning == "Let me look at the picture."
    assert out.text == "It shows a red square."
    assert all(len(t.top) == 20 and t.id is not None for t in out.tokens)
    close = [i for i, t in enumerate(out.tokens) if t.text == "</think>"][0]
    assert all(t.think for t in out.tokens[:close]) and not any(t.think for t in out.tokens[close:])
    assert out.semantics.label() == "scaled(T=0.2)" and out.finish_reason == "stop"
    assert "base64" not in json.dumps(out.request)


async def test_native_score_takes_last_n_entries_and_verifies_ids(native, fake_sglang, red_image, tiny_model_dir):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model_dir)("It is red.", add_special_tokens=False)["input_ids"]
    sc = await native.score(msgs(red_image), Continuation(ids=ids))
    assert [t.id for t in sc.tokens] == ids and sc.semantics.kind == "raw"
    assert all(len(t.top) == 20 for t in sc.tokens)
    body = fake_sglang.bodies[-1]
    assert body["sampling_params"]["max_new_tokens"] == 0 and body["logprob_start_len"] >= 0


async def test_native_score_drift_is_an_error(native, fake_sglang, red_image, tiny_model_dir):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model_dir)("It is red.", add_special_tokens=False)["input_ids"]
    fake_sglang.faults = ["drift"]
    with pytest.raises(BackendError, match="drifted"):
        await native.score(msgs(red_image), Continuation(ids=ids))


async def test_429_then_success(native, fake_sglang, red_image):
    fake_sglang.faults = ["429", None]
    out = await native.generate(msgs(red_image), SamplingParams(max_tokens=8))
    assert out.tokens and fake_sglang.requests.count("/generate") == 2


async def test_500_until_retries_run_out(native, fake_sglang, red_image):
    fake_sglang.faults = ["500"] * 5
    with pytest.raises(BackendError, match=r"failed after 3 attempts.*HTTP 500"):
        await native.generate(msgs(red_image), SamplingParams(max_tokens=8))


async def test_malformed_json_and_client_error_are_clear(native, fake_sglang, red_image):
    fake_sglang.faults = ["malformed"]
    with pytest.raises(BackendError, match="malformed JSON"):
        await native.generate(msgs(red_image), SamplingParams(max_tokens=8))
    fake_sglang.faults = ["400"]
    with pytest.raises(BackendError, match="HTTP 400"):
        await native.generate(msgs(red_image), SamplingParams(max_tokens=8))
    assert fake_sglang.requests.count("/generate") == 2  # a 400 is not retried


async def test_unreachable_endpoint_names_it(red_image, tiny_model_dir):
    b = SGLangBackend("http://127.0.0.1:9", str(tiny_model_dir), policy=RetryPolicy(retries=1, backoff_s=0.01, timeout_s=2))
    with pytest.raises(BackendError, match="127.0.0.1:9"):
        await b.generate(msgs(red_image), SamplingParams(max_tokens=4))


async def test_chat_with_meta_info_has_ids_and_think(fake_sglang, red_image):
    b = OpenAIBackend(fake_sglang.url, policy=FAST)
    out = await b.generate(msgs(red_image), SamplingParams(max_tokens=64))
    body = fake_sglang.bodies[-1]
    assert body["model"] == "fake-qwen3.5"  # resolved from /v1/models
    assert body["logprobs"] is True and body["top_logprobs"] == 20 and body["return_meta_info"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert out.reasoning == "Let me look at the picture." and out.text == "It shows a red square."
    assert all(t.id is not None and len(t.top) == 20 for t in out.tokens)
    assert any(t.think for t in out.tokens) and not out.tokens[-1].think


async def test_chat_without_meta_info_dedupes_and_counts(fake_sglang, red_image):
    b = OpenAIBackend(fake_sglang.url, model="fake-qwen3.5", server="generic", policy=FAST)
    out = await b.generate(msgs(red_image), SamplingParams(max_tokens=64))
    assert "return_meta_info" not in fake_sglang.bodies[-1]
    counts = out.top_counts()
    assert all(1 <= c <= 20 for c in counts) and min(counts) < 20  # deduped by text
    assert all(t.id is None for t in out.tokens)
    assert any(t.think for t in out.tokens)
    with pytest.raises(BackendError, match="scoring"):
        await b.score(msgs(red_image), Continuation(text="x"))


def test_real_sglang_stream_event_parses(shared_dir):
    body = json.loads((shared_dir / "data/sglang_responses/generate_logprobs_stream_event1_sglang_pr17005.json").read_text())
    toks = tokens_from_triples(body["meta_info"]["output_token_logprobs"], body["meta_info"]["output_top_logprobs"])
    assert [t.id for t in toks] == body["output_ids"] == [16]
    assert [a.id for a in toks[0].top] == [16, 6648, 17, 11319]
    assert toks[0].logprob == toks[0].top[0].logprob
    # input side: first entry [null, id, null] and a null top list
    inp = tokens_from_triples(body["meta_info"]["input_token_logprobs"], body["meta_info"]["input_top_logprobs"])
    assert inp[0].id == 220 and inp[0].top == []


def test_real_chat_body_without_logprobs_is_a_clear_error(shared_dir):
    body = json.loads((shared_dir / "data/sglang_responses/chat_completion_reasoning_qwen3.json").read_text())
    b = OpenAIBackend("http://127.0.0.1:1", model="m", client=httpx.AsyncClient())
    with pytest.raises(BackendError, match="no logprobs"):
        b.parse(body, SamplingParams())
