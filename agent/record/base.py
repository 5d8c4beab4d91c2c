"""The base of every record model: a field the model does not name is refused (the models are the schema)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Record", "Open", "Derived"]


class _Read(BaseModel):
    def as_recorded(self) -> dict:
        """The fields as the file holds them: JSON values, no default the file did not write."""
        return self.model_dump(mode="json", exclude_unset=True)


class Record(_Read):
    """A record the toolkit writes: exactly these fields (a field of another version or a typo is refused)."""

    model_config = ConfigDict(extra="forbid")


class Open(_Read):
    """A record that carries fields of a protocol we do not own (an OpenAI message's provider fields): the named
    ones are checked, the others kept as they came."""

    model_config = ConfigDict(extra="allow")


class Derived(Record):
    """A record computed from one result line (a grade, a probe's row): sealed as the line is, and naming the seal of
    the line it was computed from (agent/rundir/lines.py). The line's seal covers its sidecar's digest
    (``tokens_sha256``), so a row computed from the tokens names them too."""

    source_sha256: str | None = Field(None, description="the line_sha256 of the result line this was computed from")
    line_sha256: str | None = Field(None, description="the seal: sha256 of the row's bytes before it")
