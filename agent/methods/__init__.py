"""The agents: direct inference, ReAct (+ Removal@k), MM-ContextFold (+ ablations), and the AgentFold and
ContextFold baselines of Table 1.

    from agent.methods import MethodSpec, run_sample
    line, traj = await run_sample(MethodSpec("react"), sample, trial=0, backend=b, toolbox=tb)

``run_sample`` runs one (sample, trial) and returns its result line (see ``docs/trajectory.md``).
Harness errors (backend down, replay cache miss, unreadable image) end the sample with
``status="error"`` and are recorded; the model's and the tools' mistakes never do (they go back to
the agent as observations and count toward the budget).
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path

from ..backends.base import BackendError, ModelServerDown, SamplingParams
from ..choices import METHODS, PROTOCOLS, Variant
from ..errors import ConfigError
from ..images import ImageError
from ..tools.toolbox import TOOL_NAMES, CacheMiss
from ..trajectory import Trajectory
from .agentfold import run_agentfold
from .common import HISTORY_REASONING, WEBWATCHER_OBSERVATION_IMAGES, BudgetExceeded, Budgets, Episode
from .contextfold import run_contextfold
from .direct import run_direct
from .mmcontextfold import VARIANTS, run_mmcontextfold
from .mmcontextfold_release import run_release_protocol
from .react import run_react
from .unload import UnloadPolicy, UnloadTracker

__all__ = ["MethodSpec", "run_sample", "new_trajectory", "METHODS", "PROTOCOLS", "VARIANTS", "Budgets", "Episode"]



@dataclass(frozen=True)
class MethodSpec:
    method: str
    variant: str = ""
    remove_images_from_step: int | None = None
    budgets: Budgets = Budgets()
    history_reasoning: str = "keep"
    observation_images: int = WEBWATCHER_OBSERVATION_IMAGES
    unload: UnloadPolicy | None = None   # --image-unload adaptive (agent/methods/unload.py)
    protocol: str = "paper"                # "release": the authors' released MM-ContextFold (mmcontextfold_release.py)

    def __post_init__(self):
        if self.history_reasoning not in HISTORY_REASONING:
            raise ConfigError(f"--history-reasoning must be one of {HISTORY_REASONING}")
        if self.observation_images < 0:
            raise ConfigError("--observation-images must be >= 0")
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {METHODS}")
        if self.variant and self.method != "mmcontextfold":
            raise ConfigError("--variant applies to --method mmcontextfold only")
        if self.variant not in VARIANTS:
            raise ConfigError(f"unknown variant {self.variant!r}; choose one of {VARIANTS[1:]}")
        if self.remove_images_from_step is not None:
            if self.method != "react":
                raise ConfigError("--remove-images-from-step applies to --method react only")
            if self.remove_images_from_step < 1:
                raise ConfigError("--remove-images-from-step must be >= 1")
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"--protocol must be one of {PROTOCOLS}")
        if self.protocol == "release" and (self.method != "mmcontextfold" or self.variant):
            raise ConfigError("--protocol release applies to --method mmcontextfold (no --variant) only")
        if self.unload is not None:
            if self.method != "react":
                raise ConfigError("--image-unload adaptive applies to --method react only")
            if self.remove_images_from_step is not None:
                raise ConfigError("--image-unload adaptive and --remove-images-from-step are two removal policies; "
                                  "choose one")

    @property
    def label(self) -> str:
        if self.protocol == "release":
            return f"{self.method}@release"  # never pooled with the paper protocol's runs: another row, another label
        if self.remove_images_from_step is not None:
            return f"react-removal@{self.remove_images_from_step}"
        if self.unload is not None:
            return f"react-{self.unload.label}"
        return self.method + (f"[{self.variant}]" if self.variant else "")

    @property
    def variant_label(self) -> str:
        if self.remove_images_from_step is not None:
            return f"removal@{self.remove_images_from_step}"
        if self.unload is not None:
            return self.unload.label
        return self.variant

    def allowed_tools(self) -> tuple:
        return tuple(t for t in TOOL_NAMES if not (self.variant == Variant.IMAGE_CAPTION and t == "lens_search"))


def new_trajectory(spec: MethodSpec, sample, trial: int) -> Trajectory:
    traj = Trajectory(sample, trial, spec.method, spec.variant_label)
    if sample.extra.get("dropped_images"):  # --protocol release: ran without the images whose files are missing
        traj.extra["dropped_images"] = list(sample.extra["dropped_images"])
    if sample.extra.get("undecodable_images"):  # --protocol release: files sent although they are no image
        traj.extra["undecodable_images"] = list(sample.extra["undecodable_images"])
    return traj


HARNESS_ERRORS = (BackendError, CacheMiss, ImageError, BudgetExceeded, OSError)


async def run_sample(spec: MethodSpec, sample, trial: int, *, backend, toolbox,
                     sampling: SamplingParams | None = None, traj: Trajectory | None = None,
                     served_model: str | None = None) -> tuple[dict, Trajectory]:
    """Run one (sample, trial); pass ``traj`` to keep the partial record if the caller cancels (timeout).
    ``served_model``: the model the run recorded; a reply naming another one ends the unit ``error``."""
    traj = traj or new_trajectory(spec, sample, trial)
    try:
        ep = Episode(sample, trial, backend=backend, toolbox=toolbox, sampling=sampling or SamplingParams(),
                     traj=traj, budgets=spec.budgets, allowed_tools=spec.allowed_tools(),
                     history_reasoning=spec.history_reasoning, observation_images=spec.observation_images,
                     served_model=served_model)
        if spec.method == "direct":
            status, answer = await run_direct(ep)
        elif spec.method == "react":
            tracker = UnloadTracker(spec.unload) if spec.unload is not None else None
            if tracker is not None:  # the summary is on the line whatever happens (errors included)
                traj.extra["image_unload"] = tracker
            status, answer = await run_react(ep, remove_from=spec.remove_images_from_step, unload=tracker)
        elif spec.method == "agentfold":
            status, answer = await run_agentfold(ep)
        elif spec.method == "contextfold":
            status, answer = await run_contextfold(ep)
        elif spec.protocol == "release":
            status, answer = await run_release_protocol(ep)
        else:
            status, answer = await run_mmcontextfold(ep, variant=spec.variant)
    except ModelServerDown:  # not this unit's error: the command stops (the unit reruns on resume)
        raise
    except HARNESS_ERRORS as e:
        _finish_extra(traj)
        msg = f"{type(e).__name__}: {e}"
        traj.error(type(e).__name__, msg)
        return traj.to_line("error", "", error=msg), traj
    except Exception as e:  # noqa: BLE001 - anything unexpected ends this unit only, with the exception recorded
        where = traceback.extract_tb(e.__traceback__)[-1]
        msg = f"internal {type(e).__name__}: {e} (at {Path(where.filename).name}:{where.lineno})"
        _finish_extra(traj)
        traj.error("Internal" + type(e).__name__, msg)
        return traj.to_line("error", "", error=msg), traj
    _finish_extra(traj)
    return traj.to_line(status, answer), traj


def _finish_extra(traj: Trajectory) -> None:
    tr = traj.extra.get("image_unload")
    if isinstance(tr, UnloadTracker):
        traj.extra["image_unload"] = tr.summary()
