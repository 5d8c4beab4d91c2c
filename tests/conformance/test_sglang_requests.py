"""Request bodies the toolkit builds, validated by SGLang's own request models (tests/conformance/sglang_oracle.py)."""
from __future__ import annotations

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
