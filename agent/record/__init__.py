"""The run record as typed models (pydantic v2): what every command writes and reads, and its published schema.

    from agent.record import ResultLine, RunHeader, Grade, SCHEMAS, write_schemas
    ResultLine.model_validate(line)            # a line as the writer writes it, checked
    write_schemas("schemas/")                  # one JSON Schema per record kind (python -m agent.rundir schema)

The models are the documentation of the record (docs/trajectory.md points here): a field they do not name is
refused, so the schema and the code cannot drift apart. The writers validate every header, line, grade and probe
row against them before it is written (agent/rundir/writer.py, agent/judge, probes/); ``agent.rundir check``
validates every line of a run. Foundations layer: pydantic only.
"""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ValidationError

from ..errors import HarnessError
from .events import EVENT_TYPES, Action, Event, LlmCall, Sampling, ToolCall, Usage
from .grade import GRADES, Grade
from .header import RunHeader
from .line import SCHEMA_VERSION, STATUSES, CallSummary, LineSummary, Message, ResultLine
from .probes import EntropyStep, GroundingLabel, GroundingStep, RemovalOutcome, TeacherForcedToken
from .tokens import TokenRecord

__all__ = ["RunHeader", "ResultLine", "LineSummary", "CallSummary", "Message", "Event", "EVENT_TYPES", "Action", "LlmCall",
           "ToolCall", "Usage", "Sampling", "Grade", "GRADES", "EntropyStep", "GroundingLabel", "GroundingStep",
           "RemovalOutcome", "TeacherForcedToken", "TokenRecord", "SCHEMAS", "SCHEMA_VERSION", "STATUSES",
           "write_schemas", "schema_of", "SchemaError", "validate"]

#: Every record kind a run holds, by the name of its schema file (``<kind>.schema.json``).
SCHEMAS: dict[str, type[BaseModel]] = {
    "header": RunHeader, "result": ResultLine, "summary": LineSummary, "grade": Grade, "token": TokenRecord,
    "entropy_step": EntropyStep, "grounding_label": GroundingLabel, "removal_outcome": RemovalOutcome,
    "teacher_forced_token": TeacherForcedToken,
}


def schema_of(kind: str) -> dict:
    """The JSON Schema (draft 2020-12) of one record kind, with its ``$id`` and ``title``."""
    model = SCHEMAS[kind]
    schema = model.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": f"{kind}.schema.json", **schema}


def write_schemas(out_dir) -> list[Path]:
    """One ``<kind>.schema.json`` per record kind into ``out_dir`` (created); the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind in SCHEMAS:
        p = out / f"{kind}.schema.json"
        p.write_text(json.dumps(schema_of(kind), indent=2, ensure_ascii=False) + "\n")
        paths.append(p)
    return paths


class SchemaError(HarnessError, ValueError):
    """A record that does not match its model: named with where it is and the first field that is wrong."""


def validate(kind: str, obj, where: str):
    """``obj`` (a dict, or JSON bytes) as its ``kind``'s model; :class:`SchemaError` unless it is a valid record."""
    model = SCHEMAS[kind]
    try:
        if isinstance(obj, (bytes, str)):
            return model.model_validate_json(obj)
        return model.model_validate(obj)
    except ValidationError as e:
        err = e.errors()[0]
        at = ".".join(str(x) for x in err.get("loc", ())) or "(the record)"
        got = f" (got {str(err['input'])[:60]!r})" if "input" in err and not isinstance(err["input"], dict) else ""
        raise SchemaError(f"{where}: not a valid {kind} record ({e.error_count()} problem(s); first: {at}: "
                          f"{err.get('msg')}{got})") from None
