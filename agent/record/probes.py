"""The probes' rows (paper §3.2): one model per row kind each probe writes.

- :class:`EntropyStep`: one probed step of the entropy probe (``probes/entropy-<mode>/steps.jsonl``; §3.2.2, B.4);
- :class:`GroundingLabel`: one annotated trajectory of the grounding probe (``probes/grounding/labels.jsonl``;
  §3.2.1, E.6), with its :class:`GroundingStep` labels;
- :class:`RemovalOutcome`: one (trajectory, k) of the step-k removal replays (``probes/removal/outcomes.csv``;
  §3.2.3);
- :class:`TeacherForcedToken`: one token of a teacher-forced step (``probes/entropy-teacher-forced/tokens/``).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, NonNegativeInt, PositiveInt

from .base import Derived, Record

__all__ = ["EntropyStep", "GroundingStep", "GroundingLabel", "RemovalOutcome", "TeacherForcedToken"]


class EntropyStep(Derived):
    """The think-segment entropy of one step with the query images present and removed (nats; grouped tail over
    the top-20, B.4), and its bounds."""

    sample_id: str
    trial: NonNegativeInt
    benchmark: str
    paper_category: str | None
    category: str | None
    step: PositiveInt
    state: str
    n_images: NonNegativeInt
    n_query_images: NonNegativeInt
    n_tokens: NonNegativeInt
    n_think: NonNegativeInt
    mode: Literal["regenerate", "teacher-forced"]
    semantics: str | None
    model: str | None
    H_with: float | None
    H_without: float | None
    H_high_with: float | None = None
    H_high_without: float | None = None
    H_exact_with: float | None = None
    H_exact_without: float | None = None
    kl_with_without: float | None = Field(None, description="teacher-forced: mean KL(with || without), nats")
    n_think_without: NonNegativeInt
    fork: dict[str, Any] = Field(description="per-side entropy histograms of the think tokens (forking tokens)")
    agg: dict[str, list[float | None]] | None = Field(
        None, description="each aggregation of the step's per-token entropies, [with, without] (analysis/estimators/entropy.py "
                          "AGGREGATIONS; the robustness of ΔH, analysis/robustness.py)")
    regenerated_text: str | None = None
    prompt_tokens: NonNegativeInt | None = None
    cached_tokens: NonNegativeInt | None = None
    latency_s: float | None = None
    dH: float | None = Field(description="H_with - H_without (nats)")
    vocab: PositiveInt | None = None
    dH_low: float | None = None
    dH_high: float | None = None
    dH_exact: float | None = None
    gap_with: float | None = None


class GroundingStep(Record):
    step: PositiveInt
    tool: str | None
    image_needed: bool
    image_info_used: bool
    category: Literal["Image Needed", "Image-Derived", "Text Only"]
    reason_1: str
    reason_2: str


class GroundingLabel(Derived):
    """A trajectory's steps labelled by the two passes of E.6 (ok), or why it could not be (invalid)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    sample_id: str
    trial: NonNegativeInt
    benchmark: str
    paper_category: str | None
    n_steps: NonNegativeInt
    status: Literal["ok", "invalid"]
    retried: NonNegativeInt | None = None
    errors: list[str]
    steps: list[GroundingStep]
    pass_: Literal[1, 2] | None = Field(None, alias="pass", description="which pass failed")


class RemovalOutcome(Derived):
    sample_id: str
    trial: NonNegativeInt
    k: PositiveInt
    benchmark: str
    paper_category: str | None
    original_correct: bool
    replay_correct: bool | None = Field(description="null: the replay ended in error or timeout (a missing pair)")
    replayed: bool = Field(description="false: the original ended before step k and keeps its outcome")
    replay_status: str
    error: str | None
    replay_sha256: str | None = Field(None, description="the line_sha256 of the replay's result line (none when "
                                                        "the original ended before step k)")


class TeacherForcedToken(Record):
    """One think token of a teacher-forced step: its ΔH and KL, and the top-5 alternatives under both contexts."""

    step: PositiveInt
    pos: NonNegativeInt = Field(description="the token's position in its call, as in the run's sidecar")
    dH: float
    kl: float
    w_ids: list[int]
    w_lp: list[float]
    o_ids: list[int]
    o_lp: list[float]
