"""The fake servers' scripted agent: what a model that acts the ReAct and MM-ContextFold grammars answers (no model)."""
from __future__ import annotations

__all__ = ["agent_policy"]


def agent_policy(req: dict) -> str:
    """The stand-in's model: two searches, then an answer (ReAct grammar); MM-ContextFold gets a subtask
    in its main state and a return in its branches."""
    text = str(req.get("messages") or req.get("text") or "")  # chat messages, or a native /generate prompt
    if "STATE: MAIN" in text and "STATE: BRANCH" not in text:
        if "completed" in text:
            return "Enough evidence.</think>\n\n<answer>1911</answer>"
        return ('Plan.</think>\n\n<subtask>\n{"description": "look", "prompt": "search it", '
                '"assigned_images": ["<image_0>"]}\n</subtask>')
    if "STATE: BRANCH" in text:
        return 'Found it.</think>\n\n<tool_call>\n{"name": "return", "parameters": {"message": "It is 1911."}}\n</tool_call>'
    if text.count("<tool_response>") >= 2:
        return "So the answer.</think>\n\n<answer>1911</answer>"
    return 'Search.</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": "kestrel", "goal": "g"}}\n</tool_call>'
