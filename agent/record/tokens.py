"""A token record: one row of a run's token sidecar (``tokens/<key>.parquet``, agent/rundir/sidecar.py).

The sidecar is Parquet, read by any Parquet reader; this model says what one row holds, for the published schema
(``token.schema.json``) and for readers that take rows one at a time.
"""
from __future__ import annotations

from pydantic import Field, NonNegativeInt, PositiveInt

from .base import Record

__all__ = ["TokenRecord"]


class TokenRecord(Record):
    call: PositiveInt = Field(description="the result line's call (events[i].index of an llm_call)")
    pos: NonNegativeInt = Field(description="the token's position in that call's completion")
    id: NonNegativeInt | None = Field(description="the token id (null: the server gave no ids)")
    text: str | None
    logprob: float | None = Field(description="its log-probability (null: none returned)")
    think: bool = Field(description="inside the reasoning (<think>...</think>)")
    top_ids: list[int] | None = Field(description="the top-k alternatives' ids, most likely first")
    top_logprobs: list[float] | None = Field(description="their log-probabilities")
    exact_entropy: float | None = Field(description="the full-vocabulary entropy, where the local backend computed it")
    unload_kl: float | None = Field(None, description="the adaptive image unloading's per-token KL (when probed)")
    unload_dH: float | None = Field(None, description="the adaptive image unloading's per-token ΔH (when probed)")
