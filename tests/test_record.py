"""The run record's typed models (agent/record/) and their published JSON Schemas: every kind of record a real run
writes validates against the schema files with a standard validator, and a record that does not is refused by
the writer and reported by ``check``."""
from __future__ import annotations

import json

import jsonschema
import pytest

from agent.judge import main as judge_main
from agent.record import SCHEMAS, SchemaError, validate
from agent.run import main as run_main
from agent.rundir import check_run
from agent.rundir.cli import main as rundir_main
from agent.rundir.lines import seal


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Real runs of every agent on the scripted model (the adaptive image unloading and a removal replay included),
    graded; and the schema files the command writes."""
    root = tmp_path_factory.mktemp("record")
    made = []
    for name, args in (("react", ["--method", "react"]), ("mmcf", ["--method", "mmcontextfold"]),
                       ("release", ["--method", "mmcontextfold", "--protocol", "release"]),
                       ("agentfold", ["--method", "agentfold"]), ("contextfold", ["--method", "contextfold"]),
                       ("direct", ["--method", "direct"]), ("adaptive", ["--method", "react", "--image-unload",
                                                                         "adaptive"])):
        out = root / name
        assert run_main([*args, "--backend", "scripted", "--limit", "3", "--out", str(out), "--no-progress"]) == 0
        assert judge_main([str(out), "--judge", "exact", "--no-progress"]) in (0, 1)
        made.append(out)
    assert rundir_main(["schema", "--out", str(root / "schemas")]) == 0
    return made, root / "schemas"


def _validator(schemas, kind):
    schema = json.loads((schemas / f"{kind}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_schema_command_writes_one_schema_per_record_kind(runs):
    _, schemas = runs
    assert sorted(p.name for p in schemas.iterdir()) == sorted(f"{k}.schema.json" for k in SCHEMAS)


def test_every_header_line_and_grade_of_real_runs_validates_with_a_standard_validator(runs):
    made, schemas = runs
    header, result, grade = (_validator(schemas, k) for k in ("header", "result", "grade"))
    n = 0
    for run in made:
        header.validate(json.loads((run / "header.json").read_text()))
        for raw in (run / "results.jsonl").read_bytes().splitlines():
            result.validate(json.loads(raw))
            n += 1
        for raw in (run / "judge-exact.jsonl").read_bytes().splitlines():
            grade.validate(json.loads(raw))
    assert n == 3 * len(made)
    kinds = {e["type"] for run in made for raw in (run / "results.jsonl").read_bytes().splitlines()
             for e in json.loads(raw)["events"]}
    assert {"llm_call", "tool_call", "branch_begin", "branch_end", "init_end", "unload_probe",
            "final_answer"} <= kinds  # every event kind was checked against its schema


def test_a_record_that_does_not_match_its_model_is_refused_before_it_is_written(runs, tmp_path):
    made, schemas = runs
    line = json.loads((made[0] / "results.jsonl").read_bytes().splitlines()[0])
    with pytest.raises(SchemaError, match="status"):
        validate("result", {**line, "status": "fine"}, "test")
    with pytest.raises(SchemaError, match="unknown_field"):
        validate("result", {**line, "unknown_field": 1}, "test")
    with pytest.raises(jsonschema.ValidationError):  # the published schema says the same
        _validator(schemas, "result").validate({**line, "status": "fine"})


def test_check_reports_a_sealed_line_that_does_not_match_the_schema(runs, tmp_path):
    import shutil

    made, _ = runs
    run = tmp_path / "run"
    shutil.copytree(made[0], run)
    res = run / "results.jsonl"
    lines = [json.loads(x) for x in res.read_bytes().splitlines()]
    lines[1]["events"][0]["type"] = "telepathy"  # a crafted run: sealed again, so only the schema tells
    res.write_bytes(b"".join(seal(ln) + b"\n" for ln in lines))
    (run / "results.index.jsonl").unlink()
    rep = check_run(run)
    assert not rep.intact and [n for n, _ in rep.invalid] == [2] and "events.0" in rep.invalid[0][1]


class _Watched(list):
    """A trajectory's event list that keeps a copy of each event as it was appended."""

    def __init__(self):
        super().__init__()
        self.as_appended: list[dict] = []

    def append(self, ev):
        self.as_appended.append(json.loads(json.dumps(ev)))
        super().append(ev)


@pytest.mark.parametrize("method", [["--method", "react"], ["--method", "mmcontextfold"],
                                    ["--method", "mmcontextfold", "--protocol", "release"],
                                    ["--method", "agentfold"], ["--method", "contextfold"], ["--method", "direct"],
                                    ["--method", "react", "--image-unload", "adaptive"]])
def test_every_agent_creates_each_event_whole(method, tmp_path, monkeypatch):
    """No event changes after it was appended: each call's action or action_error is part of it from the start."""
    from agent import trajectory

    watched: list[_Watched] = []
    init = trajectory.Trajectory.__init__

    def watching_init(self, *a, **kw):
        init(self, *a, **kw)
        self._events = _Watched()
        watched.append(self._events)

    monkeypatch.setattr(trajectory.Trajectory, "__init__", watching_init)
    out = tmp_path / "run"
    assert run_main([*method, "--backend", "scripted", "--limit", "3", "--out", str(out), "--no-progress"]) == 0
    events = [e for w in watched for e in w]
    assert events and any("action" in e for e in events)
    for w in watched:
        assert [json.loads(json.dumps(e)) for e in w] == w.as_appended


def test_an_event_view_is_read_only_and_a_call_is_settled_once():
    from agent.backends.base import LogprobSemantics, ModelOutput, TokenArrays, Usage
    from agent.benchmarks.manifest import Sample
    from agent.trajectory import Trajectory

    traj = Trajectory(Sample(id="q", query="Which city?", query_images=[], answer="x", benchmark="b", line=1),
                      trial=0, method="react")
    out = ModelOutput("<answer>x</answer>", "", TokenArrays.empty(), "stop", Usage(), LogprobSemantics("raw"),
                      "scripted", "m")
    call = traj.llm_call([{"role": "user", "content": "q"}], out, state="react")
    with pytest.raises(TypeError):
        call["action"] = {"kind": "answer"}  # type: ignore[index]
    traj.settle(call, action={"kind": "answer", "answer": "x"})
    with pytest.raises(RuntimeError, match="already recorded"):
        traj.settle(call, error="late")
    second = traj.llm_call([{"role": "user", "content": "q2"}], out, state="react")
    traj.final_answer(second, "x")  # the next event appends the open call as it is
    with pytest.raises(RuntimeError, match="already recorded"):
        traj.settle(second, action={"kind": "answer", "answer": "x"})
    assert [(e["type"], e.get("action")) for e in traj.events] == [
        ("llm_call", {"kind": "answer", "answer": "x"}), ("llm_call", None), ("final_answer", None)]
