"""Request bodies the toolkit builds, validated by SGLang's own request models (tests/conformance/sglang_oracle.py)."""
from __future__ import annotations

import pytest

from agent.backends.base import SamplingParams
from agent.backends.openai_compat import OpenAIBackend
from agent.methods.common import Turn, with_turns


def _history():
    base = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Question: q"}]
    return with_turns(base, [Turn("<tool_call>\n{}\n</tool_call>", "I should search.", "<tool_response>\nobs\n</tool_response>")])


def test_oracle_is_the_pinned_sglang(sglang):
    assert sglang.version == "0.5.23"


def test_chat_history_with_reasoning_content_is_accepted(sglang):
    b = OpenAIBackend("http://127.0.0.1:1", model="m", server="sglang")
    body = b._payload(_history(), SamplingParams())
    res = sglang.ask("chat", body=body)
    assert res["ok"], res
    assistant = [m for m in res["messages"] if m["role"] == "assistant"]
    assert assistant and assistant[0]["reasoning_content"] == "I should search."


def _msgs(img=None):
    content = ([{"type": "text", "text": "<image_0>"}, {"type": "image_url", "image_url": {"url": str(img)}}] if img else [])
    return [{"role": "system", "content": "sys"},
            {"role": "user", "content": [*content, {"type": "text", "text": "Question: what is it?"}]}]


@pytest.mark.parametrize("with_image", [False, True])
@pytest.mark.parametrize("thinking", [True, False])
def test_native_generate_bodies_are_valid_sglang_requests(sglang, tiny_model_dir, red_image, with_image, thinking):
    from agent.backends.sglang_native import SGLangBackend

    b = SGLangBackend("http://127.0.0.1:1", str(tiny_model_dir))
    body, prompt, _ = b.generate_payload(_msgs(red_image if with_image else None),
                                         SamplingParams(enable_thinking=thinking, seed=3))
    res = sglang.ask("generate", body=body, vocab_size=len(b.tok))
    assert res["ok"], res
    s = res["sampling"]
    # what SGLang will sample with: exactly the paper's settings, nothing left to a server default
    assert (s["temperature"], s["top_p"], s["min_p"], s["repetition_penalty"]) == (0.2, 0.95, 0.0, 1.0)
    assert s["top_k"] == 1 << 30 and s["sampling_seed"] == 3 and s["skip_special_tokens"] is False
    assert res["return_logprob"] and res["top_logprobs_num"] == 20 and res["n_images"] == (1 if with_image else 0)
    assert prompt.endswith("<think>\n") == thinking


@pytest.mark.parametrize("with_image", [False, True])
def test_native_score_bodies_are_valid_sglang_requests(sglang, tiny_model_dir, red_image, with_image):
    from agent.backends.base import Continuation
    from agent.backends.sglang_native import SGLangBackend

    b = SGLangBackend("http://127.0.0.1:1", str(tiny_model_dir))
    body, ids, _, _ = b.score_payload(_msgs(red_image if with_image else None), Continuation(text="It is red."))
    res = sglang.ask("generate", body=body, vocab_size=len(b.tok))
    assert res["ok"], res
    assert res["sampling"]["max_new_tokens"] == 0 and res["sampling"]["top_k"] == 1  # greedy: nothing is sampled
    # token ids always, the images beside them (SGLang expands them: tests/conformance/test_sglang_frontend.py)
    assert res["has_input_ids"] and not res["has_text"] and bool(body.get("image_data")) == with_image
    assert res["logprob_start_len"] == body["logprob_start_len"] >= 0


@pytest.mark.parametrize("with_image", [False, True])
@pytest.mark.parametrize("thinking", [True, False])
def test_chat_bodies_are_valid_sglang_requests(sglang, red_image, with_image, thinking):
    b = OpenAIBackend("http://127.0.0.1:1", model="qwen3.5-27b", server="sglang")
    body = b._payload(_msgs(red_image if with_image else None), SamplingParams(enable_thinking=thinking, seed=3))
    res = sglang.ask("chat", body=body)
    assert res["ok"], res
    assert (res["top_k"], res["min_p"], res["repetition_penalty"], res["seed"]) == (-1, 0.0, 1.0, 3)
    assert res["logprobs"] is True and res["top_logprobs"] == 20 and res["return_meta_info"] is True
    assert res["chat_template_kwargs"] == {"enable_thinking": thinking}
    parts = res["messages"][1]["content"]
    assert any(p.get("type") == "image_url" for p in parts) == with_image
