"""A trajectory's events, one model per kind: the discriminated union a result line's ``events`` holds.

Every event has ``type`` (which model), ``id`` (its position in the line's list), ``parent`` (the span it belongs to:
``"init"``, a branch id such as ``"b2"``, or null) and ``t`` (unix time). Paper §3.3 / B.3 for the spans
(MM-ContextFold's init phase and branches); the release's AgentFold fold record for ``action.fold``.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, NonNegativeInt, PositiveInt

from .base import Record

__all__ = ["Usage", "Sampling", "ToolCallAction", "AnswerAction", "SubtaskAction", "DescribeAction", "Action",
           "LlmCall", "ToolCall", "BranchBegin", "BranchEnd", "InitEnd", "UnloadProbe", "FinalAnswer", "Error",
           "Event", "EVENT_TYPES"]


class Usage(Record):
    """What one LLM call cost, as the server reported it (agent.backends.base.Usage)."""

    prompt_tokens: NonNegativeInt
    completion_tokens: NonNegativeInt
    cached_tokens: NonNegativeInt
    reasoning_tokens: NonNegativeInt | None = None
    cost: Annotated[float, Field(ge=0)] | None = Field(None, description="the provider's bill for the call (USD)")
    provider: str | None = None


class Sampling(Record):
    """The sampling parameters a call was sent with (agent.backends.base.SamplingParams; paper B.1's defaults)."""

    temperature: Annotated[float, Field(ge=0)]
    top_p: Annotated[float, Field(gt=0, le=1)]
    top_k: int
    min_p: float
    repetition_penalty: float
    max_tokens: PositiveInt
    top_logprobs: NonNegativeInt
    seed: int | None = None
    stop: list[str] | None = None
    enable_thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class _Action(Record):
    raw: str | None = Field(None, description="AgentFold: the action's JSON as emitted")
    step: int | None = Field(None, description="AgentFold: its 0-based step")
    fold: dict[str, Any] | None = Field(None, description="AgentFold: {range, removed, anomaly} of the fold applied")


class ToolCallAction(_Action):
    kind: Literal["tool_call"]
    name: str | None = None
    args: dict[str, Any] | None = None


class AnswerAction(_Action):
    kind: Literal["answer"]
    answer: str
    tagged: bool | None = Field(None, description="direct: the answer came in <answer> tags")


class SubtaskAction(_Action):
    kind: Literal["subtask"]
    subtask: dict[str, Any] = Field(description="description, prompt, assigned_images (E.2's <subtask> JSON)")


class DescribeAction(_Action):
    kind: Literal["describe"]
    image_id: str
    parsed: bool


Action = Annotated[Union[ToolCallAction, AnswerAction, SubtaskAction, DescribeAction], Field(discriminator="kind")]


class _Event(Record):
    type: str  # each kind names itself (its Literal below); declared first, where the writer puts it
    id: NonNegativeInt
    parent: str | None
    t: float


class LlmCall(_Event):
    """One LLM call exactly as sent: its messages (indices into the line's ``messages``), what came back, the
    parsed action or why it was rejected. Its per-token arrays are the sidecar's rows ``call == index``."""

    type: Literal["llm_call"]
    index: PositiveInt = Field(description="1-based position among the trajectory's LLM calls: the paper's step t")
    state: Literal["react", "direct", "init", "main", "branch", "agentfold"]
    branch: str | None
    correction: bool
    forced: bool
    message_ids: list[NonNegativeInt]
    image_hashes: list[str | None]
    n_images: NonNegativeInt
    n_query_images: NonNegativeInt
    text: str | None
    reasoning: str | None
    finish_reason: str | None
    usage: Usage
    latency_s: Annotated[float, Field(ge=0)]
    n_tokens: NonNegativeInt
    think_tokens: NonNegativeInt
    semantics: str = Field(description="which distribution the logprobs describe: raw, or scaled(T=…)")
    sampling: Sampling | dict[str, Any]
    backend: str
    model: str
    top_k: NonNegativeInt
    action: Action | None = None
    action_error: str | None = None


class ToolCall(_Event):
    type: Literal["tool_call"]
    call_index: PositiveInt
    name: str
    args: dict[str, Any]
    observation: str = Field(description="exactly what the agent saw")
    ok: bool
    cache_hit: bool
    paid_calls: NonNegativeInt
    image_sha256: str | None = Field(description="lens: the query image searched")
    result_images: list[str] = Field(description="sha256 of the result images shown, in order (under images/)")


class BranchBegin(_Event):
    type: Literal["branch_begin"]
    branch: str
    description: str
    prompt: str
    assigned_images: list[str]
    assigned_hashes: list[str]
    main_call_index: int | None


class BranchEnd(_Event):
    type: Literal["branch_end"]
    branch: str
    message: str | None = Field(description="what is folded back to the main state")
    reason: str
    steps: NonNegativeInt


class InitEnd(_Event):
    type: Literal["init_end"]
    descriptions: dict[str, str | None] = Field(description="image id -> text folded into the main state")
    parsed: dict[str, bool]


class UnloadProbe(_Event):
    """The adaptive image unloading's probe of one step (agent/methods/unload.py; ours): not an LLM call of the
    agent, it does not count toward T_max."""

    type: Literal["unload_probe"]
    call_index: PositiveInt
    signal: str
    influence: float | None
    kl: float | None
    dH: float | None
    H_with: float | None
    H_without: float | None
    n_think: NonNegativeInt
    threshold: float
    below: bool
    streak: NonNegativeInt
    decision: Literal["keep", "unload"]
    unload_step: int | None
    scoring_calls: NonNegativeInt
    latency_s: float


class FinalAnswer(_Event):
    type: Literal["final_answer"]
    answer: str
    call_index: int | None
    forced: bool


class Error(_Event):
    type: Literal["error"]
    kind: str
    message: str


Event = Annotated[Union[LlmCall, ToolCall, BranchBegin, BranchEnd, InitEnd, UnloadProbe, FinalAnswer, Error],
                  Field(discriminator="type")]

#: Each event type's model, by its ``type``.
EVENT_TYPES = {"llm_call": LlmCall, "tool_call": ToolCall, "branch_begin": BranchBegin, "branch_end": BranchEnd,
               "init_end": InitEnd, "unload_probe": UnloadProbe, "final_answer": FinalAnswer, "error": Error}
