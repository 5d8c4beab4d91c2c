"""The base of every record model: a field the model does not name is refused (the models are the schema)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Record", "Open"]


class Record(BaseModel):
    """A record the toolkit writes: exactly these fields (a field of another version or a typo is refused)."""

    model_config = ConfigDict(extra="forbid")


class Open(BaseModel):
    """A record that carries fields of a protocol we do not own (an OpenAI message's provider fields): the named
    ones are checked, the others kept as they came."""

    model_config = ConfigDict(extra="allow")
