"""A grade: one line of ``judge-<name>.jsonl`` (agent/judge/grading.py; paper B.6, E.5)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeInt

from .base import Derived

__all__ = ["Grade", "GRADES"]

#: What a judge can say of an answer; UNPARSED is counted and shown, never silently INCORRECT.
GRADES = ("CORRECT", "INCORRECT", "NOT_ATTEMPTED", "UNPARSED")


class Grade(Derived):
    sample_id: str
    trial: NonNegativeInt
    answer_key: str = Field(description="a digest of the status, answer and gold graded: a changed answer is regraded")
    benchmark: str
    category: str | None
    paper_category: str | None
    method: str
    variant: str
    answer: str
    gold: str | None
    judge: str = Field(description="which judge: its model and endpoint, or exact match")
    grade: Literal["CORRECT", "INCORRECT", "NOT_ATTEMPTED", "UNPARSED"]
    extracted: str | None
    reply: str | None
    reason: str
    judge_served_model: str | None = Field(None, description="the model the judge's reply named")
    usage: dict[str, Any] | None = Field(None, description="the judge call's tokens (and cost), for the ledger")
    failed: bool | None = Field(None, description="the judge call itself failed: graded again on the next run")
