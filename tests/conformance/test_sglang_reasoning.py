"""Our think segmentation agrees with SGLang's own ``ReasoningParser("qwen3")`` on a corpus of outputs."""
from __future__ import annotations

import pytest

from agent.backends.base import TokenArrays
from agent.backends.think import mark_think, split_think

# (text, prompt pre-filled <think>)
CORPUS = [
    ("Let me look.\n</think>\n\nThe answer is 42.", True),                        # complete
    ("Thinking about it and then the budget ran", True),                          # truncated, no </think>
    ("<think>\nexplicit open\n</think>\nanswer", False),                           # the model opened it
    ("I should search.\n<tool_call>\n{\"name\": \"search\"}\n</tool_call>", True),  # line-starting tool call, no </think>
    ("plan first <tool_call>{\"name\": \"visit\"}</tool_call>", True),              # tool call mid-line, no </think>
    ("<think>a<think>b</think>c", False),                                          # nested
    ("<think><think>double open</think>x", True),
    ("Plain answer without any tags.", False),                                     # thinking off
    ("", True),                                                                    # empty
    ("</think>answer at once", True),                                              # empty reasoning
    ("why </think> so <tool_call>{}</tool_call>", True),                            # </think> wins over <tool_call>
    ("Hello <think>mid</think> tail", False),                                      # <think> mid-text
    ("truncated right at a tag <tool_", True),                                     # partial tag
    ("two calls\n<tool_call>a</tool_call>\n<tool_call>b</tool_call>", True),
]


def _norm(x):
    return (x or "").strip()


@pytest.mark.parametrize("text,forced", CORPUS)
def test_split_think_matches_sglang(sglang, text, forced):
    res = sglang.ask("reasoning", text=text, force_reasoning=forced)
    assert res["ok"], res
    assert split_think(text, forced) == (res["reasoning"] or "", res["normal"] or "")  # exactly, whitespace too


@pytest.mark.parametrize("text,forced", CORPUS)
def test_mark_think_tokens_are_sglangs_reasoning(sglang, text, forced, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    tokens = mark_think(TokenArrays(ids, [tok.decode([i]) for i in ids], [-0.1] * len(ids),
                                    [[i] for i in ids], [[-0.1]] * len(ids)), forced)
    res = sglang.ask("reasoning", text=text, force_reasoning=forced)
    think = "".join(t.text for t in tokens if t.think)
    assert _norm(think) == _norm(res["reasoning"])
    # the answer is everything after the segment, and no think token follows an answer token
    flags = [t.think for t in tokens]
    assert flags == sorted(flags, reverse=True) or not any(flags) or text.startswith("<think>") or "<think>" in text
