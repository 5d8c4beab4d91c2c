"""What a run is: its configuration, the units it runs, its header, and its trial seeds."""
from __future__ import annotations

import os
import secrets
import sys
import time
from dataclasses import dataclass, field, replace

from serving.endpoints import launched_logprob_mode

from ..backends import make_backend
from ..backends.base import DEFAULT_TOP_LOGPROBS, BackendError, SamplingParams
from ..backends.tiny_model import is_tiny_model
from ..benchmarks import load_selection
from ..choices import EMBEDDED_MAX_TOKENS, PROCESS_CONCURRENCY, SERVED_MAX_TOKENS
from ..errors import ConfigError
from ..http import RetryPolicy
from ..methods import Budgets, MethodSpec
from ..methods.common import WEBWATCHER_OBSERVATION_IMAGES
from ..methods.mmcontextfold_release import CALL_CAP, MAX_BRANCH_TURNS, MAX_ROUNDS
from ..methods.unload import SCORING_BACKENDS, UnloadPolicy
from ..paths import file_sha256
from ..redact import public_url, safe_argv
from ..rundir import RunDir, RunError, versions
from ..tools import TOOL_POLICIES
from ..trajectory import SCHEMA_VERSION

__all__ = ["ConfigError", "EMBEDDED_MAX_TOKENS", "SERVED_MAX_TOKENS", "PROCESS_CONCURRENCY", "RunConfig", "make_backends", "header_for",
           "resolve_logprob_mode",
           "select_samples", "all_units", "auto_processes", "trial_seeds"]


#: What the release asks for on every call (``max_completion_tokens``, utils/search_backbone_model.py:118).
RELEASE_MAX_TOKENS = 8192


@dataclass
class RunConfig:
    method: str
    out: str
    benchmark: str = "demo"
    protocol: str = "paper"                # paper | release (agent/methods/mmcontextfold_release.py)
    variant: str = ""
    remove_images_from_step: int | None = None
    image_unload: str = "keep"            # keep | adaptive (agent/methods/unload.py)
    unload_signal: str | None = None
    unload_threshold: str | float | None = None
    unload_patience: int | None = None
    trials: int = 1
    concurrency: int = 8
    limit: int | None = None
    sample_ids: list[str] | None = None
    selection: str | None = None           # a selection file (python -m agent.benchmarks subset --random-per-benchmark)
    backend: str = "local"
    endpoints: list[str] = field(default_factory=list)
    model: str | None = None
    model_dir: str | None = None
    logprob_mode: str | None = None        # None: the launcher's record for the endpoints, else SGLang's default
    logprob_mode_source: str | None = None  # launcher | flag | default (resolve_logprob_mode)
    server: str = "sglang"
    api_key_env: str | None = None
    temperature: float = 0.2
    top_p: float = 0.95
    max_tokens: int | None = None
    top_logprobs: int = DEFAULT_TOP_LOGPROBS
    seed: int | None = None
    thinking: bool = True
    t_max: int = 20
    b_max: int = 5
    history_reasoning: str = "keep"
    observation_images: int = WEBWATCHER_OBSERVATION_IMAGES
    tools: str = "offline"
    world: str | None = None
    tool_cache: str | None = None
    cache_mode: str = "readwrite"
    live_fallback: bool = False
    timeout: float | None = None
    retry_errors: bool = False
    force: bool = False
    allow_unverified_server: bool = False
    progress: bool = True
    token_precision: str = "float32"
    processes: int | str = "auto"
    max_consecutive_errors: int = 10
    allow_missing_images: bool = False
    skip_bad_rows: bool = False            # --skip-bad-rows: run the manifest's rows that parse (header: manifest_problems)
    max_image_mb: float | None = None
    request_timeout: float = 600.0
    shard: tuple[int, int] | None = None   # --shard I/N: this run directory holds part I of N (agent/rundir/merge.py)
    worker: tuple[int, int] | None = None  # internal: worker process i of n in a --processes run
    job_keys: list | None = None           # internal: the parent's job list ([sample id, trial], in order)

    def __post_init__(self):
        # the flags checked together once, when the config is made (ConfigError names what cannot go together)
        self._method_spec = self._validated_spec()

    def spec(self) -> MethodSpec:
        """What the run runs: the method and its settings, validated when the config was made."""
        return self._method_spec

    @property
    def embedded(self) -> bool:
        return self.backend == "local" and not self.model_dir

    @property
    def tiny_weights(self) -> bool:
        """The model is the embedded tiny one, in process or served (a real engine on a CPU serves it): it never
        writes an answer, so its calls get the embedded default length."""
        return self.embedded or is_tiny_model(self.model_dir)

    def _validated_spec(self) -> MethodSpec:
        if self.processes != "auto" and (not isinstance(self.processes, int) or self.processes < 1):
            raise ConfigError(f"--processes must be auto or an integer >= 1, not {self.processes!r}")
        if self.concurrency < 1 or self.trials < 1:
            raise ConfigError("--processes, --concurrency and --trials must be >= 1")
        unload = None
        if self.image_unload not in ("keep", "adaptive"):
            raise ConfigError(f"--image-unload must be keep or adaptive, not {self.image_unload!r}")
        if self.image_unload == "adaptive":
            if self.backend not in SCORING_BACKENDS:
                raise ConfigError(f"--image-unload adaptive scores every step without the images (teacher-forced); "
                                 f"--backend {self.backend} cannot score a fixed continuation. Use one that can: "
                                 f"{', '.join(SCORING_BACKENDS)} (sglang = SGLang's native /generate with --model-dir)")
            unload = UnloadPolicy.from_args(self.unload_signal, self.unload_threshold, self.unload_patience)
        elif any(v is not None for v in (self.unload_signal, self.unload_threshold, self.unload_patience)):
            raise ConfigError("--unload-signal / --unload-threshold / --unload-patience need --image-unload adaptive")
        if self.protocol == "release":
            self._check_release_protocol()
            return MethodSpec(self.method, budgets=Budgets(CALL_CAP, MAX_BRANCH_TURNS), protocol="release")
        if self.protocol != "paper":
            raise ConfigError(f"--protocol must be paper or release, not {self.protocol!r}")
        return MethodSpec(self.method, self.variant, self.remove_images_from_step, Budgets(self.t_max, self.b_max),
                          self.history_reasoning, self.observation_images, unload)

    def _check_release_protocol(self) -> None:
        """What --protocol release cannot combine with: it is the release's MM-ContextFold, over chat completions,
        with the release's sampling and budgets."""
        if self.method != "mmcontextfold" or self.variant or self.image_unload != "keep":
            raise ConfigError("--protocol release is the authors' released MM-ContextFold: --method mmcontextfold, "
                             "no --variant or --image-unload")
        if self.backend == "sglang":
            raise ConfigError("--protocol release sends chat completions, as the release does: use --backend openai "
                             "--server sglang for an SGLang server (its native /generate renders the prompt itself)")
        fixed = {"--temperature": (self.temperature, 0.2), "--top-p": (self.top_p, 0.95),
                 "--max-tokens": (self.max_tokens, None), "--t-max": (self.t_max, 20), "--b-max": (self.b_max, 5),
                 "--history-reasoning": (self.history_reasoning, "keep")}
        given = [k for k, (v, default) in fixed.items() if v != default]
        if given:
            raise ConfigError(f"--protocol release fixes {', '.join(given)} as the release does (T 0.0, top-p 1.0, "
                             f"{RELEASE_MAX_TOKENS} tokens, {MAX_ROUNDS} main rounds, branches of {MAX_BRANCH_TURNS} "
                             "turns, content-only history): drop them")

    def sampling(self, trial: int = 0) -> SamplingParams:
        if self.protocol == "release":  # utils/search_backbone_model.py:116-122: T 0, top-p 1, 8192; no seed
            return SamplingParams(temperature=0.0, top_p=1.0, max_tokens=RELEASE_MAX_TOKENS,
                                  top_logprobs=self.top_logprobs, seed=None, enable_thinking=None)
        mt = self.max_tokens or (EMBEDDED_MAX_TOKENS if self.tiny_weights else SERVED_MAX_TOKENS)
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, max_tokens=mt,
                              top_logprobs=self.top_logprobs, seed=None if self.seed is None else self.seed + trial,
                              enable_thinking=self.thinking)


def resolve_logprob_mode(cfg: RunConfig) -> RunConfig:
    """Which distribution the servers' output logprobs describe (raw vs scaled differ at T != 1, and
    ``/server_info`` cannot say): the launcher's record of the endpoints where it started them (serving/endpoints.py),
    else ``--logprob-mode``, else SGLang's default (scaled); the source is recorded. Refused: endpoints launched with
    different modes, or a ``--logprob-mode`` the launcher's record contradicts."""
    if cfg.logprob_mode_source:
        return cfg
    launched = {e: launched_logprob_mode(e) for e in cfg.endpoints} if cfg.backend in ("sglang", "vllm", "openai") else {}
    known = {m for m in launched.values() if m}
    if len(known) > 1:
        raise ValueError("the endpoints were launched with different logprob modes ("
                         + ", ".join(f"{public_url(e)}: {m}" for e, m in launched.items() if m) + "): one run, one mode")
    if known:
        mode = known.pop()
        if cfg.logprob_mode and cfg.logprob_mode != mode:
            raise ValueError(f"--logprob-mode {cfg.logprob_mode}, but the launcher started "
                             f"{', '.join(public_url(e) for e, m in launched.items() if m)} with --logprob-mode {mode} "
                             "(serving/launch_qwen35.sh): drop --logprob-mode, or relaunch")
        return replace(cfg, logprob_mode=mode, logprob_mode_source="launcher")
    if cfg.logprob_mode:
        return replace(cfg, logprob_mode_source="flag")
    # vLLM's output logprobs are raw under its default --logprobs-mode (agent/backends/vllm.py); SGLang's scaled
    return replace(cfg, logprob_mode="raw" if cfg.backend == "vllm" else "scaled", logprob_mode_source="default")


def make_backends(cfg: RunConfig) -> list:
    if cfg.backend == "local":
        return [make_backend("local", model_dir=cfg.model_dir, logprob_mode=cfg.logprob_mode)]
    if cfg.backend == "scripted":
        return [make_backend("scripted")]
    if not cfg.endpoints:
        raise BackendError(f"--backend {cfg.backend} needs --endpoint URL (repeat it for several servers)")

    policy = RetryPolicy(timeout_s=cfg.request_timeout)
    wire = {"wire": "release" if cfg.protocol == "release" else "full"} if cfg.backend == "openai" else {}
    return [make_backend(cfg.backend, endpoint=e, model=cfg.model, model_dir=cfg.model_dir, logprob_mode=cfg.logprob_mode,
                         server=cfg.server, api_key_env=cfg.api_key_env, policy=policy, **wire) for e in cfg.endpoints]


def header_for(cfg: RunConfig, manifest, argv, model: dict | None = None) -> dict:
    spec = cfg.spec()
    return {
        "schema_version": SCHEMA_VERSION, "created": time.time(),
        "argv": safe_argv(list(argv) if argv is not None else sys.argv),
        "method": spec.method, "variant": spec.variant_label, "label": spec.label, "protocol": spec.protocol,
        "remove_images_from_step": spec.remove_images_from_step, "budgets": spec.budgets.to_dict(),
        "image_unload": spec.unload.to_dict() if spec.unload is not None else None,
        "history_reasoning": spec.history_reasoning, "observation_images": spec.observation_images,
        "model": model,
        "sampling": cfg.sampling().to_dict() | {"seed": cfg.seed}, "trials": cfg.trials,
        # "absent": no logprob fields were asked for (OpenRouter's default); the entropy probe refuses such a run
        "logprobs": "requested" if cfg.top_logprobs > 0 else "absent",
        "benchmark": manifest.name, "benchmark_path": str(manifest.path),
        "benchmark_sha256": file_sha256(manifest.path), "n_samples": len(manifest.samples),
        "backend": {"kind": cfg.backend, "endpoints": [public_url(e) for e in cfg.endpoints], "model": cfg.model, "model_dir": cfg.model_dir,
                    "logprob_mode": cfg.logprob_mode, "logprob_mode_source": cfg.logprob_mode_source,
                    "server": cfg.server, "embedded_tiny_model": cfg.embedded,
                    "api_key_env": cfg.api_key_env},
        "tools": {"provider": cfg.tools, "world": cfg.world, "cache": cfg.tool_cache, "cache_mode": cfg.cache_mode,
                  "live_fallback": cfg.live_fallback, "policy": TOOL_POLICIES[cfg.protocol].name},
        "token_precision": cfg.token_precision, "processes": cfg.processes, "versions": versions(),
        "manifest_problems": {p.kind: sum(q.kind == p.kind for q in manifest.problems) for p in manifest.problems},
    }


def select_samples(manifest, cfg: RunConfig) -> list:
    samples = manifest.samples
    if cfg.selection:
        ids, _ = load_selection(cfg.selection, manifest.name)
        want = set(ids)
        samples = [s for s in samples if s.id in want]
        missing = want - {s.id for s in samples}
        if missing:
            raise RunError(f"{cfg.selection}: {len(missing)} selected ids are not in {manifest.path} (first: "
                           f"{sorted(missing)[:5]}); the selection was drawn from another manifest")
    if cfg.sample_ids:
        want = set(cfg.sample_ids)
        samples = [s for s in samples if s.id in want]
        missing = want - {s.id for s in samples}
        if missing:
            raise RunError(f"{manifest.path}: sample ids not found: {sorted(missing)[:10]}")
    if cfg.limit is not None:
        samples = samples[: cfg.limit]
    return samples


def all_units(cfg: RunConfig, samples: list) -> list:
    """Every (sample, trial) unit of the run, in the runner's order (trial by trial, samples in manifest order)."""
    return [(s, t) for t in range(cfg.trials) for s in samples]




def auto_processes(cfg: RunConfig, injected: bool = False) -> int:
    """``--processes auto``: one process per :data:`PROCESS_CONCURRENCY` samples in flight, at most one per CPU;
    one where the model runs in this process (local, scripted) or the caller passed its own backends."""
    if cfg.processes != "auto":
        return int(cfg.processes)
    if injected or cfg.backend in ("local", "scripted") or cfg.worker is not None:
        return 1
    return max(1, min(os.cpu_count() or 1, -(-cfg.concurrency // PROCESS_CONCURRENCY)))


def trial_seeds(cfg: RunConfig, rd: RunDir) -> tuple[int | None, str]:
    """The run's base seed (trial t samples with seed + t) and where it came from: ``given`` (--seed), ``drawn``
    (a new run without --seed draws one and records it), or the recorded one of the run being resumed.

    Ours, why: a server started with deterministic inference samples every request that has no seed with seed 42
    (sglang/srt/sampling/sampling_batch_info.py: ``sampling_seed if not None else 42``), so trials 0, 1, 2 would be
    one trial three times and Table 1's std over "independent trials" 0.0."""
    if cfg.seed is not None:
        return cfg.seed, "given"
    if rd.header_path.exists():
        old = rd.read_header()
        seed = (old.get("sampling") or {}).get("seed")
        return seed, old.get("seed_source") or "given"

    return secrets.randbelow(2**31 - 2**20), "drawn"
