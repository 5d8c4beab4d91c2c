"""The paper's prompts (appendix E) are present verbatim; fill() leaves JSON braces alone."""
from __future__ import annotations

import re

import pytest

from agent import prompts


def _norm(s: str) -> str:
    s = s.replace("‘", "`").replace("’", "'")
    return " ".join(s.split())


def _paper_blocks(shared_dir):
    text = (shared_dir / "seed" / "mm-contextfold-paper.txt").read_text(encoding="utf-8")
    return [line[1:].strip() for line in text.splitlines() if line.startswith("⬇")]


def test_every_paper_prompt_is_verbatim(shared_dir):
    blocks = [_norm(b) for b in _paper_blocks(shared_dir)]
    assert len(blocks) == 9
    for name, const in prompts.PAPER_PROMPTS.items():
        assert _norm(const) in blocks, f"{name} differs from the paper"
    # and the paper's nine prompt blocks are all used
    assert sorted(blocks) == sorted(_norm(c) for c in prompts.PAPER_PROMPTS.values())


def test_caption_variant_only_drops_lens_from_the_branch_prompt():
    full, cap = prompts.BRANCH.splitlines(), prompts.BRANCH_CAPTION_ONLY.splitlines()
    assert [line for line in full if line not in cap] == [next(line for line in full if '"lens_search"' in line)]


def test_fill():
    out = prompts.fill(prompts.MAIN, image_context="<image_0>: a logo", question="When?")
    assert '{"description": "3-5 word summary"' in out and out.endswith("## Question\nWhen?")
    assert "{image_context}" not in out
    with pytest.raises(KeyError, match="question"):
        prompts.fill(prompts.MAIN, image_context="x")
    assert re.search(r"\{[a-z_]+\}", prompts.fill(prompts.BRANCH, task_prompt="t")) is None


def test_the_branch_prompt_names_the_run_s_b_max():
    assert prompts.branch_prompt(5) == prompts.BRANCH  # the paper's prompt exactly at the paper's B_max
    three = prompts.branch_prompt(3)
    assert "finish within at most 3 tool calls;" in three and "at most 5" not in three
    assert [a for a, b in zip(three.splitlines(), prompts.BRANCH.splitlines()) if a != b] == \
        [next(line for line in three.splitlines() if "at most 3 tool calls" in line)]  # nothing else changes
    assert '"lens_search"' not in prompts.branch_prompt(7, lens=False)
