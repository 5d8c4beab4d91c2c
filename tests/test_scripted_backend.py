"""The scripted backend implements the real protocol and lets a test plant entropies."""
import math

import numpy as np
import pytest

from agent.backends import Backend, BackendError, Continuation
from agent.backends.scripted import ScriptedBackend, uniform_top
from analysis.estimators.entropy import grouped_tail_entropy


def planted(has_images, pos):
    return [math.log(1 / 8)] * 8 if has_images else [math.log(1 / 2)] * 2


async def test_scripted_generation_think_and_planted_entropy(red_image):
    b = ScriptedBackend(["<think>look closely</think>It is red.", "<think>hmm</think>x"], top_fn=planted)
    assert isinstance(b, Backend)
    with_img = [{"role": "user", "content": [{"type": "text", "text": "<image_0>"},
                                             {"type": "image_url", "image_url": {"url": str(red_image)}},
                                             {"type": "text", "text": "what?"}]}]
    out = await b.generate(with_img)
    assert out.reasoning == "look closely" and out.text == "It is red."
    think = out.think_mask()
    assert think.any() and not think[-1]
    H = grouped_tail_entropy(out.top_logprob_matrix(20))
    assert np.allclose(H, math.log(8))
    sc = await b.score([{"role": "user", "content": "<image_0> what?"}], Continuation(text=out.full_text))
    assert np.allclose(grouped_tail_entropy(sc.top_logprob_matrix(20)), math.log(2))
    assert b.calls[0]["has_images"] and not b.calls[-1]["has_images"]
    assert "base64" not in str(b.calls)
    # only query images count: a retrieved image in a tool response (after its result label) does not
    from agent.methods.common import tool_reply

    retrieved = [{"role": "user", "content": "<image_0> what?"}, {"role": "user", "content": tool_reply("obs", [red_image])}]
    sc2 = await b.score(retrieved, Continuation(text="x"))
    assert np.allclose(grouped_tail_entropy(sc2.top_logprob_matrix(20)), math.log(2)) and not b.calls[-1]["has_images"]


async def test_script_exhaustion_is_an_error():
    b = ScriptedBackend([], top_fn=uniform_top(4))
    with pytest.raises(BackendError, match="ran out"):
        await b.generate([{"role": "user", "content": "hi"}])
