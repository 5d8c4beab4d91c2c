"""A run's header, ``header.json``: what ran (arguments, model identity, sampling, benchmark, versions), written
before any line; its identity fields must match when the run is resumed (docs/trajectory.md)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from .base import Open, Record
from .events import Sampling

__all__ = ["RunHeader", "Budgets", "ModelIdentity", "BackendRecord", "ToolsRecord", "Selection", "ShardRecord",
           "Resume"]


class Budgets(Record):
    """T_max and B_max (paper §4.1: 20 and 5)."""

    t_max: PositiveInt
    b_max: PositiveInt


class ModelIdentity(Open):
    """Which model answered, as the preflight read it from the server (agent.preflight.model_identity)."""

    backend: str
    served_model: str | None
    weights: str | None
    fingerprint: str | None
    deterministic: bool | None = None
    server: dict[str, Any] | None = Field(None, description="the server's facts (/server_info), docs/serving.md")


class BackendRecord(Record):
    kind: str
    endpoints: list[str] = Field(description="without credentials")
    model: str | None
    model_dir: str | None
    logprob_mode: Literal["raw", "scaled"]
    logprob_mode_source: Literal["launcher", "flag", "default"] | None = Field(
        None, description="where the mode came from: the launcher's record of the endpoints, --logprob-mode, or "
                          "SGLang's default (scaled) unverified")
    server: str
    embedded_tiny_model: bool
    api_key_env: str | None = Field(description="the name of the key's variable, never its value")
    vocab_size: int | None = Field(None, description="the model's vocabulary (its logits' width), as the run's "
                                   "backend knew it; None if unknown (the viewer's exact-entropy bound)")


class ToolsRecord(Record):
    provider: str
    world: str | None
    cache: str | None
    cache_mode: str
    live_fallback: bool
    policy: Literal["default", "release"] = Field("default", description="the protocol's tool policy "
                                                  "(agent/tools/policy.py): arguments, cache, retries, failure texts")


class Selection(Record):
    limit: PositiveInt | None
    sample_ids: list[str] | None
    n_samples: NonNegativeInt
    skipped: list[str]
    selection_file: dict[str, Any] | None = None


class ShardRecord(Record):
    index: NonNegativeInt
    of: PositiveInt
    units: NonNegativeInt
    all_units: NonNegativeInt
    units_sha256: str


class Resume(Open):
    """One resume of the run (``at``, ``argv``; ``unverified_server`` when it went on with a server that could
    not say its facts), or ``omitted``: how many were left out of a long history."""

    at: float | None = None
    argv: list[str] | None = None
    unverified_server: str | None = None
    omitted: NonNegativeInt | None = None


class RunHeader(Record):
    schema_version: Literal[2]
    created: float | None = None
    argv: list[str] | None = None
    method: str
    variant: str
    label: str
    protocol: Literal["paper", "release"] = "paper"
    remove_images_from_step: PositiveInt | None = None
    budgets: Budgets
    image_unload: dict[str, Any] | None = None
    history_reasoning: Literal["keep", "drop"]
    observation_images: NonNegativeInt
    model: ModelIdentity | None
    sampling: Sampling
    trials: PositiveInt | None
    logprobs: Literal["requested", "absent"] | None = None
    benchmark: str
    benchmark_path: str | None
    benchmark_sha256: str | None = Field(None, description="sha256 of the manifest file's bytes: which rows the run "
                                         "drew from (HLE-VL: check it against WebWatcher's released file)")
    n_samples: NonNegativeInt | None = None
    backend: BackendRecord
    tools: ToolsRecord
    token_precision: Literal["float32", "float16"] | None = None
    processes: PositiveInt | Literal["auto"] | None = None
    versions: dict[str, str]
    manifest_problems: dict[str, NonNegativeInt] = {}
    selection: Selection | None = None
    seed_source: Literal["given", "drawn"] | None = None
    shard: ShardRecord | None = None
    merged_from: list[dict[str, Any]] | None = None
    merged: dict[str, Any] | None = None
    replay_of: str | None = Field(None, description="a removal replay's run directory: the run it replays")
    resumed: list[Resume] = []
