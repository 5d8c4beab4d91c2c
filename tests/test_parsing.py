"""Action parsing on the outputs models really produce (and get wrong)."""
from __future__ import annotations

import pytest

from agent.parsing import ActionError, parse_action, parse_init_description
from tests.records import recorded_lines


@pytest.mark.parametrize("text,kind,detail", [
    ('<tool_call>\n{"name": "search", "arguments": {"query": "x", "goal": "g"}}\n</tool_call>', "tool_call", ("search", {"query": "x", "goal": "g"})),
    ('<tool_call>{"name": "return", "parameters": {"message": "found"}}</tool_call>', "tool_call", ("return", {"message": "found"})),
    ('<tool_call>```json\n{"name": "visit", "arguments": {"url": "u"}}\n```</tool_call>', "tool_call", ("visit", {"url": "u"})),
    ('<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"q\\"}"}</tool_call>', "tool_call", ("search", {"query": "q"})),
    ('<tool_call>{"name": "search", "arguments": {"query": "q"}} trailing words</tool_call>', "tool_call", ("search", {"query": "q"})),
    ("Reasoning first.\n<answer> 1911 </answer>", "answer", "1911"),
])
def test_valid_actions(text, kind, detail):
    act = parse_action(text)
    assert act.kind == kind
    assert ((act.name, act.args) if kind == "tool_call" else act.answer) == detail


def test_subtask():
    act = parse_action('<subtask>\n{"description": "find club", "prompt": "Identify it.", "assigned_images": ["<image_0>"]}\n</subtask>',
                       ("subtask", "answer"))
    assert act.subtask == {"description": "find club", "prompt": "Identify it.", "assigned_images": ["<image_0>"]}
    # an explicitly empty list is a text-only branch
    act = parse_action('<subtask>{"description": "d", "prompt": "Search the name.", "assigned_images": []}</subtask>',
                       ("subtask",))
    assert act.subtask["assigned_images"] == []


@pytest.mark.parametrize("body,msg", [  # B.3: missing action fields get the correction re-prompt, never a default
    ('{"prompt": "Search the name.", "description": "d"}', "missing 'assigned_images'"),
    ('{"prompt": "Search the name.", "assigned_images": null, "description": "d"}', '"assigned_images" must be a list'),
    ('{"prompt": "Search the name.", "assigned_images": []}', "missing 'description'"),
    ('{"description": "d", "assigned_images": []}', "missing 'prompt'"),
    ('{"description": " ", "prompt": "p", "assigned_images": []}', 'non-empty "description"'),
])
def test_subtask_missing_fields_are_malformed(body, msg):
    with pytest.raises(ActionError, match=msg):
        parse_action(f"<subtask>{body}</subtask>", ("subtask",))


def test_tool_call_without_arguments_is_malformed():
    with pytest.raises(ActionError, match='no "arguments"'):
        parse_action('<tool_call>{"name": "search"}</tool_call>', ("tool_call",))
    act = parse_action('<tool_call>{"name": "search", "arguments": {}}</tool_call>', ("tool_call",))
    assert act.args == {}  # explicitly empty: valid (the tool then reports what it misses)
    assert parse_action('<tool_call>{"name": "return", "parameters": {"message": "m"}}</tool_call>').args == {"message": "m"}


@pytest.mark.parametrize("text,allowed,msg", [
    ("I think the answer is Paris.", ("tool_call", "answer"), "no action found"),
    ("<tool_call>{\"name\": \"search\"", ("tool_call", "answer"), "not closed"),
    ("<answer>a</answer><answer>b</answer>", ("tool_call", "answer"), "2 <answer>"),
    ('<tool_call>{"name": "search", "arguments": {}}</tool_call><answer>x</answer>', ("tool_call", "answer"), "exactly one"),
    ("<tool_call>{'name': 'search'}</tool_call>", ("tool_call",), "not valid JSON"),
    ('<tool_call>["search"]</tool_call>', ("tool_call",), "must be a JSON object"),
    ('<tool_call>{"arguments": {"query": "q"}}</tool_call>', ("tool_call",), 'no "name"'),
    ('<tool_call>{"name": "search", "arguments": ["q"]}</tool_call>', ("tool_call",), "must be a JSON object"),
    ("<answer>  </answer>", ("answer",), "empty"),
    ('<subtask>{"description": "d"}</subtask>', ("subtask",), '"prompt"'),
    ('<subtask>{"description": "d", "prompt": "p", "assigned_images": "<image_0>"}</subtask>', ("subtask",), "must be a list"),
    ("<answer>x</answer>", ("subtask",), "no action found"),  # an answer where only a subtask is allowed
])
def test_malformed_actions(text, allowed, msg):
    with pytest.raises(ActionError, match=msg):
        parse_action(text, allowed)


def test_init_description():
    obj, text = parse_init_description('Sure.\n{"summary": "a red logo", "source_hint": "website"}')
    assert obj["summary"] == "a red logo" and text == '{"summary": "a red logo", "source_hint": "website"}'
    obj, text = parse_init_description("A red logo with a bird.")
    assert obj is None and text == "A red logo with a bird."


DEEP = "[" * 50_000 + "]" * 50_000  # a model's runaway brackets: 50,000 levels overflow Python's JSON parser


@pytest.mark.parametrize("body", [
    '{"name": "search", "arguments": {"query": ' + DEEP + '}}',
    '{"name": "search", "arguments": ' + '{"a": ' * 65 + '1' + '}' * 65 + '}',  # parses, but deeper than 64
])
def test_deeply_nested_json_is_a_malformed_action(body):
    """Issue 68: a model's output nested beyond MAX_NESTING is a parse failure (a correction for the model), never an
    internal RecursionError."""
    with pytest.raises(ActionError, match="nested deeper than 64 levels"):
        parse_action(f"<tool_call>{body}</tool_call>")
    assert parse_init_description("{" + '"summary": ' + DEEP + "}")[0] is None


@pytest.mark.parametrize("method", ["react", "agentfold", "mmcontextfold"])
@pytest.mark.parametrize("retry", [False, True])
async def test_a_unit_with_runaway_nesting_ends_as_a_parse_failure_not_an_error(tmp_path, method, retry):
    """The unit goes on through the correction re-prompt (paper B.3) and ends as any malformed output does, with
    ``--retry-errors`` too; nothing is a harness error."""
    from agent.backends.scripted import ScriptedBackend
    from agent.run import RunConfig, run

    deep = "[" * 5_000 + "]" * 5_000  # beyond Python's JSON parser too, at a tenth of DEEP's tokens to score
    bad = '<think>\nx\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": ' + deep + '}}\n</tool_call>'
    if method == "mmcontextfold":
        bad = '<think>\nx\n</think>\n\n<subtask>\n{"description": "d", "prompt": ' + deep + ', "assigned_images": []}\n</subtask>'
    cfg = RunConfig(method=method, out=str(tmp_path / "run"), limit=1, t_max=3, progress=False, retry_errors=retry)
    for _ in range(2 if retry else 1):
        await run(cfg, [], backends=[ScriptedBackend([bad] * 40 + ["<answer>x</answer>"] * 10)])
    (line,) = recorded_lines(tmp_path / "run")
    assert line["status"] != "error", line.get("error")
    # told to the model: a correction (ReAct, MM-ContextFold) or the tool's error reply (AgentFold, as released)
    assert "nested deeper than 64 levels" in str([line["events"], line["messages"]])
