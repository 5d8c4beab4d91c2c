"""The in-process backend on the tiny Qwen3.5 with an image message."""
import numpy as np
import pytest

from agent.backends import BackendError, Continuation, ImageError, SamplingParams
from analysis.estimators.entropy import grouped_tail_entropy

pytestmark = pytest.mark.model


def msgs(img):
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(img)}},
                                         {"type": "text", "text": "What is in the picture?"}]}]


async def test_generation_has_20_sorted_alternatives_and_think_mask(local_backends, red_image):
    out = await local_backends["scaled"].generate(msgs(red_image), SamplingParams(max_tokens=24, seed=3))
    assert len(out.tokens) == 24 and out.finish_reason == "length"
    for t in out.tokens:
        assert len(t.top) == 20
        lps = [a.logprob for a in t.top]
        assert lps == sorted(lps, reverse=True)
        assert t.logprob <= lps[0] + 1e-6
    # the template pre-fills <think>, so generation starts inside the think segment
    assert out.tokens[0].think
    assert out.semantics.kind == "scaled" and out.semantics.temperature == pytest.approx(0.2)
    assert out.request["image_sha256"] and len(out.request["image_sha256"][0]) == 64
    # the record never holds image bytes
    assert "base64" not in str(out.request)


async def test_raw_mode_scoring_reproduces_generation(local_backends, red_image):
    b = local_backends["raw"]
    out = await b.generate(msgs(red_image), SamplingParams(max_tokens=20, seed=5))
    sc = await b.score(msgs(red_image), Continuation(ids=[t.id for t in out.tokens]))
    assert sc.semantics.kind == "raw"
    np.testing.assert_allclose([t.logprob for t in out.tokens], [t.logprob for t in sc.tokens], atol=1e-4)
    np.testing.assert_allclose(out.top_logprob_matrix(), sc.top_logprob_matrix(), atol=1e-4)
    assert [a.id for a in out.tokens[0].top] == [a.id for a in sc.tokens[0].top]


async def test_scaled_mode_equals_log_softmax_of_logits_over_T(local_backends, red_image):
    b = local_backends["scaled"]
    sp = SamplingParams(max_tokens=20, seed=7, temperature=0.7)
    out = await b.generate(msgs(red_image), sp)
    raw = await b.score(msgs(red_image), Continuation(ids=[t.id for t in out.tokens]))
    scaled = await b.score(msgs(red_image), Continuation(ids=[t.id for t in out.tokens]), temperature=0.7)
    np.testing.assert_allclose([t.logprob for t in out.tokens], [t.logprob for t in scaled.tokens], atol=1e-4)
    # ... and they are not the raw ones (the two distributions really differ)
    assert np.abs(np.array([t.logprob for t in out.tokens]) - np.array([t.logprob for t in raw.tokens])).max() > 1e-3


async def test_exact_entropy_bounds_grouped_estimate(local_backends, red_image):
    for mode, b in local_backends.items():
        out = await b.generate(msgs(red_image), SamplingParams(max_tokens=16, seed=11))
        g = grouped_tail_entropy(out.top_logprob_matrix())
        assert (np.array(out.exact_entropy) >= g - 1e-5).all(), mode
        sc = await b.score(msgs(red_image), Continuation(ids=[t.id for t in out.tokens]))
        assert (np.array(sc.exact_entropy) >= grouped_tail_entropy(sc.top_logprob_matrix()) - 1e-5).all()


async def test_scoring_a_continuation_without_images_changes_the_distribution(local_backends, red_image):
    b = local_backends["raw"]
    out = await b.generate(msgs(red_image), SamplingParams(max_tokens=12, seed=2))
    no_img = [{"role": "user", "content": [{"type": "text", "text": "What is in the picture?"}]}]
    a = await b.score(msgs(red_image), Continuation(ids=[t.id for t in out.tokens]))
    c = await b.score(no_img, Continuation(ids=[t.id for t in out.tokens]))
    assert [t.id for t in a.tokens] == [t.id for t in c.tokens]
    assert not np.allclose([t.logprob for t in a.tokens], [t.logprob for t in c.tokens])


async def test_score_chunking_matches_unchunked(local_backends, red_image):
    b = local_backends["raw"]
    out = await b.generate(msgs(red_image), SamplingParams(max_tokens=20, seed=9))
    cont = Continuation(ids=[t.id for t in out.tokens])
    full = await b.score(msgs(red_image), cont)
    old = b.score_chunk
    b.score_chunk = 3
    try:
        chunked = await b.score(msgs(red_image), cont)
    finally:
        b.score_chunk = old
    np.testing.assert_allclose(full.top_logprob_matrix(), chunked.top_logprob_matrix(), atol=1e-5)


async def test_bad_inputs_name_the_culprit(local_backends, tmp_path):
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    with pytest.raises(ImageError, match="notes.png"):
        await local_backends["raw"].generate(msgs(bad), SamplingParams(max_tokens=2))
    with pytest.raises(ImageError, match="missing.jpg"):
        await local_backends["raw"].generate(msgs(tmp_path / "missing.jpg"), SamplingParams(max_tokens=2))
    from agent.backends.local import LocalBackend

    with pytest.raises(BackendError, match="no-such-model"):
        LocalBackend(tmp_path / "no-such-model")


async def test_placeholders_no_image_backs_are_refused_by_name(local_backends, red_image):
    """A reply or page that wrote Qwen's vision placeholders into the text: a BackendError naming them (the runner
    and the probes record it), not transformers' StopIteration or TypeError from inside generate()."""
    b = local_backends["raw"]
    text_only = [{"role": "user", "content": [{"type": "text", "text": "a page said <|video_pad|> here"}]}]
    with pytest.raises(BackendError, match=r"1 <\|video_pad\|> placeholder"):
        await b.generate(text_only, SamplingParams(max_tokens=2))
    extra = msgs(red_image)
    extra[0]["content"].append({"type": "text", "text": "and <|image_pad|><|image_pad|>"})
    with pytest.raises(BackendError, match=r"2 <\|image_pad\|> placeholder\(s\) beyond its 1 image"):
        await b.score(extra, Continuation(ids=[b.tokenizer.convert_tokens_to_ids("a")]))
    out = await b.generate(msgs(red_image), SamplingParams(max_tokens=2, seed=1))  # one image, one placeholder: fine
    assert len(out.tokens) == 2


def _history(img):
    from agent.methods.common import Turn, with_turns

    base = [{"role": "system", "content": "You are an agent."},
            {"role": "user", "content": [{"type": "text", "text": "<image_0>"},
                                         {"type": "image_url", "image_url": {"url": str(img)}},
                                         {"type": "text", "text": "Question: what is it?"}]}]
    turns = [Turn("<tool_call>\nA\n</tool_call>", "first thought", "<tool_response>\nobservation one\n</tool_response>"),
             Turn("<tool_call>\nB\n</tool_call>", "second thought", "Your previous response could not be executed"),
             Turn("<answer>x</answer>", "third thought", "<tool_response>\nobservation three\n</tool_response>")]
    return with_turns(base, turns)


async def test_history_reasoning_is_rendered_by_the_template_after_the_last_query(local_backends, red_image, tiny_model_dir):
    """Qwen3.5's rule: reasoning shows for assistant turns after the last real user message (tool responses
    are not one); the same rendering whatever backend renders the prompt."""
    from agent.backends.sglang_native import SGLangBackend

    msgs_ = _history(red_image)
    out = await local_backends["raw"].generate(msgs_, SamplingParams(max_tokens=2, seed=1))
    prompt = out.request["prompt_text"]
    # turns 1 and 2 come before the correction (a real user message): visible text only
    assert "first thought" not in prompt and "second thought" not in prompt
    # turn 3 follows the last real user message: its reasoning is rendered inside <think>
    assert "<|im_start|>assistant\n<think>\nthird thought\n</think>\n\n<answer>x</answer><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    native = SGLangBackend("http://127.0.0.1:1", str(tiny_model_dir))
    assert native.render(msgs_, {"enable_thinking": True})[0] == prompt
    await native.aclose()
    # history_reasoning=drop: no reasoning anywhere
    from agent.methods.common import Turn, with_turns

    dropped = with_turns(msgs_[:2], [Turn("<answer>x</answer>", "third thought", "<tool_response>\nobs\n</tool_response>")],
                         history_reasoning="drop")
    out2 = await local_backends["raw"].generate(dropped, SamplingParams(max_tokens=2, seed=1))
    assert "thought" not in out2.request["prompt_text"] and "<think>\n\n</think>" in out2.request["prompt_text"]
