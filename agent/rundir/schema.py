"""``python -m agent.rundir schema --out DIR``: the run record's JSON Schemas, one file per record kind.

    python -m agent.rundir schema --out schemas/
    # schemas/header.schema.json, result.schema.json, grade.schema.json, token.schema.json,
    # entropy_step.schema.json, grounding_label.schema.json, removal_outcome.schema.json, teacher_forced_token...

Made from the record's models (agent/record/), so another tool can read and check a run without the toolkit: any
JSON Schema (2020-12) validator takes ``header.json`` against ``header.schema.json``, each line of
``results.jsonl`` against ``result.schema.json``, each line of ``judge-*.jsonl`` against ``grade.schema.json``.
"""
from __future__ import annotations

import logging

from ..cli import done
from ..record import SCHEMAS, write_schemas

log = logging.getLogger(__name__)

__all__ = ["schema_command"]


def schema_command(a) -> int:
    """``python -m agent.rundir schema`` once its arguments parse (agent/rundir/cli.py holds its flags)."""
    try:
        paths = write_schemas(a.out)
    except OSError as e:
        log.error(f"error: {e.filename or a.out}: cannot write the schemas ({e.strerror or e})")
        return 2
    print(f"{len(paths)} schemas ({', '.join(SCHEMAS)}) in {a.out}")
    done([str(p) for p in paths], "validate a run with any JSON Schema validator, e.g. python -m jsonschema")
    return 0
