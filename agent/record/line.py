"""A result line: one finished (sample, trial) of ``results.jsonl`` (docs/trajectory.md)."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, NonNegativeInt, PositiveInt

from .base import Open, Record
from .events import Event

__all__ = ["ResultLine", "LineSummary", "CallSummary", "Message", "TextPart", "ImagePart", "ToolUsage", "ImageUnloadSummary",
           "ReplayOf", "STATUSES", "SCHEMA_VERSION"]

#: The record's version (2: reasoning kept in the history, retrieved images in observations, n_query_images).
SCHEMA_VERSION = 2
#: How a unit ended: answered; budget exhausted without an answer; a harness error; ``--timeout``.
STATUSES = ("ok", "no_answer", "error", "timeout")


class TextPart(Open):
    type: Literal["text"]
    text: str


class ImagePart(Open):
    """An image as recorded: its content hash (the file is ``images/<sha256>.<ext>``), or the URL it was sent as."""

    type: Literal["image"]
    sha256: str | None = None
    url: str | None = None
    source: str | None = Field(None, description="the path it was read from, when it was a file")


class Message(Open):
    """One distinct message of the trajectory's prompts, images by content hash (never their bytes)."""

    role: str
    content: str | list[Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]] | None
    reasoning_content: str | None = None


class CallSummary(Record):
    """One LLM call in brief (``calls[i]``): what tables and the index read without the events."""

    index: PositiveInt
    state: str
    branch: str | None
    correction: bool
    forced: bool
    n_images: NonNegativeInt
    n_query_images: NonNegativeInt
    image_hashes: list[str | None]
    prompt_tokens: NonNegativeInt
    completion_tokens: NonNegativeInt
    cached_tokens: NonNegativeInt
    think_tokens: NonNegativeInt
    cost: Annotated[float, Field(ge=0)] | None = None
    n_tokens: NonNegativeInt
    latency_s: float
    finish_reason: str | None
    action: str | None
    tool: str | None


class ToolUsage(Record):
    calls: NonNegativeInt
    cached: NonNegativeInt
    paid: NonNegativeInt


class ImageUnloadSummary(Record):
    """The adaptive image unloading's policy and what it did in this trajectory (agent/methods/unload.py; ours)."""

    policy: Literal["adaptive"]
    signal: str
    threshold: float
    patience: PositiveInt
    threshold_source: str
    detect_step: int | None
    unload_step: int | None
    probes: NonNegativeInt
    scoring_calls: NonNegativeInt
    scored_tokens: NonNegativeInt
    probe_seconds: float
    influences: list[Any]


class ReplayOf(Record):
    """A step-k removal replay (probes/removal/): the recorded unit it replays and the step removed from."""

    sample_id: str
    trial: NonNegativeInt
    k: PositiveInt


class LineSummary(Record):
    """A result line without its ``events`` and ``messages``: what a run's index holds of each line (a reader lists
    thousands of lines by their summaries and reads a whole line, :class:`ResultLine`, when it needs one)."""

    schema_version: Literal[2]
    sample_id: str
    trial: NonNegativeInt
    method: str
    variant: str
    benchmark: str
    category: str | None
    paper_category: str
    question: str
    gold: str
    answer: str
    status: Literal["ok", "no_answer", "error", "timeout"]
    error: str | None
    query_images: dict[str, str] = Field(description='{"<image_0>": sha256, ...}')
    n_calls: NonNegativeInt
    n_tool_calls: NonNegativeInt
    tool_calls: dict[str, NonNegativeInt]
    tool_usage: dict[str, ToolUsage]
    generated_tokens: NonNegativeInt
    think_tokens: NonNegativeInt
    backend: str
    model: str
    started: float
    finished: float
    responses_sha: str = Field(description="sha256 of every call's visible text and reasoning")
    duration_s: float
    calls: list[CallSummary]
    tokens_file: str | None = Field(None, description="the token sidecar, relative to the run directory")
    tokens_sha256: str | None = Field(None, description="the sidecar's sha256: its bytes as written")
    endpoint: str | None = Field(None, description="the server that answered (no credentials)")
    image_unload: ImageUnloadSummary | None = None
    replay_of: ReplayOf | None = None
    dropped_images: list[str] | None = Field(None, description="query images a --protocol release unit ran without: "
                                             "their files are missing (the release's _prepare_images)")
    undecodable_images: list[str] | None = Field(None, description="query files a --protocol release unit sent as "
                                                 "the release does although they are no image (each call carrying "
                                                 "one was refused by the server: a failed call)")
    line_sha256: str | None = Field(None, description="the seal: sha256 of the line's bytes before it "
                                                       "(agent/rundir/lines.py); always the last field")

    @property
    def key(self) -> tuple[str, int]:
        """The unit it records: (sample_id, trial)."""
        return self.sample_id, self.trial


class ResultLine(LineSummary):
    """One line of ``results.jsonl``: written once, when the unit is complete; sealed by ``line_sha256``."""

    events: list[Event]
    messages: list[Message]
