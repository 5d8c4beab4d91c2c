"""Think segmentation: the tokens strictly inside <think>…</think>, whatever the template pre-filled."""
from __future__ import annotations

import numpy as np

from agent.backends.base import TokenArrays
from agent.backends.think import mark_think, mark_think_by_text, split_think
from analysis.estimators.entropy import think_segment_entropy


def toks(*texts):
    return TokenArrays(range(len(texts)), texts, [-0.1] * len(texts), [[i] for i in range(len(texts))],
                       [[-0.1]] * len(texts))


def mask(tokens):
    return tokens.think.tolist()


def test_prefilled_think_with_closing_tag():
    t = mark_think(toks("Let", " me", " see", "</think>", "\n\n", "Paris"), starts_in_think=True)
    assert mask(t) == [True, True, True, False, False, False]


def test_no_closing_tag_means_everything_is_think():
    assert mask(mark_think(toks("a", "b", "c"), starts_in_think=True)) == [True, True, True]


def test_explicit_open_tag_is_not_think_itself():
    t = mark_think(toks("<think>", "\n", "x", "</think>", "y"), starts_in_think=False)
    assert mask(t) == [False, True, True, False, False]


def test_tags_with_surrounding_whitespace_are_tags():
    t = mark_think(toks(" <think>", "x", "</think>\n", "y"), starts_in_think=False)
    assert mask(t) == [False, True, False, False]


def test_no_thinking_call_has_an_empty_segment_and_is_excluded():
    t = mark_think(toks("Paris", "."), starts_in_think=False)
    assert not any(mask(t))
    out = think_segment_entropy(np.array([1, 1]), np.full((2, 3), np.log(1 / 3)), np.array(mask(t)))
    assert out["n_think"][0] == 0 and np.isnan(out["H"][0])


def test_only_the_first_think_block_is_reasoning():
    # as SGLang's qwen3 parser: the first </think> ends the reasoning; a later block is answer text
    t = mark_think(toks("a", "</think>", "b", "<think>", "c", "</think>", "d"), starts_in_think=True)
    assert mask(t) == [True, False, False, False, False, False, False]
    assert split_think("a</think>b<think>c</think>d", True) == ("a", "b<think>c</think>d")


def test_a_tool_call_without_closing_think_ends_the_reasoning():
    t = mark_think(toks("I", " search", "\n", "<tool_call>", "{}", "</tool_call>"), starts_in_think=True)
    assert mask(t) == [True, True, True, False, False, False]
    assert split_think("I search\n<tool_call>{}</tool_call>", True) == ("I search\n", "<tool_call>{}</tool_call>")


def test_mark_by_reasoning_text():
    t = mark_think_by_text(toks("Let", " me", " see", "Paris"), "Let me see")
    assert mask(t) == [True, True, True, False]


def test_split_think():
    # nothing stripped, as SGLang's parser sends them (the Qwen3.5 template trims both when it renders history)
    assert split_think("<think>\nhmm\n</think>\n\nParis", starts_in_think=False) == ("\nhmm\n", "\n\nParis")
    assert split_think("hmm\n</think>\nParis", starts_in_think=True) == ("hmm\n", "\nParis")
    assert split_think("still thinking", starts_in_think=True) == ("still thinking", "")
    assert split_think("Paris", starts_in_think=False) == ("", "Paris")


def _token_by_token(texts, starts_in_think):
    """The rules of agent/backends/think.py applied one token at a time (the spec the joined-text search follows)."""
    full = "".join(texts)
    inside = starts_in_think or "<think>" in full
    out = [False] * len(texts)
    if not inside:
        return out
    implicit_close, leading = "</think>" not in full, True
    for i, text in enumerate(texts):
        t = text.strip()
        if t == "<think>" and leading:
            continue
        leading = False
        if t == "</think>":
            break
        if implicit_close and "<tool_call>" in text:
            break
        out[i] = True
    return out


def test_the_joined_text_search_gives_the_token_by_token_mask():
    """Random token streams rich in tags, tags split over tokens, tags inside longer tokens, empty tokens."""
    from agent.backends.think import think_mask_of

    rng = np.random.default_rng(0)
    vocab = ["<think>", " <think>", "</think>", "</think>\n", "</", "think>", "<tool_call>", "x<tool_call>y", "<tool",
             "_call>", "a", " b", "", "\n", "<", "think", "x</think>"]
    for _ in range(3000):
        texts = [vocab[i] for i in rng.integers(0, len(vocab), rng.integers(0, 12))]
        for start in (False, True):
            assert think_mask_of(texts, start).tolist() == _token_by_token(texts, start), (texts, start)
