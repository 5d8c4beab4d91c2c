"""What every method shares: the episode (one sample, one trial), its budget, and message helpers.

An :class:`Episode` owns the backend, the toolbox, the image registry and the trajectory record.
``await ep.llm(messages, state=...)`` is the only way a method calls the model (it counts the call
against T_max and records it); ``await ep.tool(ev, name, args)`` the only way it calls a tool.
Messages are always rebuilt from the recorded turns (a projection); image removal is that same
projection passed through :func:`agent.backends.messages.strip_images`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..backends.base import ModelOutput, SamplingParams
from ..backends.messages import strip_images
from ..parsing import Action, ActionError
from ..prompts import CORRECTION, fill
from ..tools.registry import ImageRegistry, RegisteredImage
from ..tools.toolbox import TOOL_NAMES, ToolResult
from ..trajectory import Trajectory

__all__ = ["Budgets", "Episode", "BudgetExceeded", "image_parts", "with_suffix", "tool_response", "correction_text",
           "strip_images", "chat", "with_turns"]


@dataclass(frozen=True)
class Budgets:
    """The paper's budgets (§4.1): T_max LLM calls in total (every call counts), B_max steps per branch."""

    t_max: int = 20
    b_max: int = 5

    def __post_init__(self):
        if self.t_max < 2 or self.b_max < 1:
            raise ValueError(f"budgets too small: t_max={self.t_max} (>= 2), b_max={self.b_max} (>= 1)")

    def to_dict(self) -> dict:
        return {"t_max": self.t_max, "b_max": self.b_max}


class BudgetExceeded(RuntimeError):
    """A method tried to call the model past T_max (a bug in the method, never the model's fault)."""


def image_parts(images: list[RegisteredImage]) -> list[dict]:
    """Each image after its text identifier: ``<image_0>`` then the pixels (removal drops only the pixels)."""
    parts = []
    for r in images:
        parts.append({"type": "text", "text": r.image_id})
        parts.append({"type": "image_url", "image_url": {"url": str(r.path)}})
    return parts


def chat(role: str, content) -> dict:
    return {"role": role, "content": content}


def with_turns(base: list[dict], turns: list[tuple[str, str]]) -> list[dict]:
    """``base`` followed by the recorded turns: (assistant output, the user message that answered it)."""
    msgs = list(base)
    for assistant, user in turns:
        msgs += [chat("assistant", assistant), chat("user", user)]
    return msgs


def with_suffix(messages: list[dict], suffix: str) -> list[dict]:
    """A copy of ``messages`` whose last (user) message ends with ``suffix`` (force-answer, summarise)."""
    out = list(messages)
    last = dict(out[-1])
    c = last["content"]
    last["content"] = c + "\n\n" + suffix if isinstance(c, str) else [*c, {"type": "text", "text": "\n\n" + suffix}]
    out[-1] = last
    return out


def tool_response(observation: str) -> str:
    return f"<tool_response>\n{observation}\n</tool_response>"


def correction_text(err: ActionError) -> str:
    return fill(CORRECTION, error=str(err))


class Episode:
    def __init__(self, sample, trial: int, *, backend, toolbox, sampling: SamplingParams, traj: Trajectory,
                 budgets: Budgets = Budgets(), allowed_tools=TOOL_NAMES):
        self.sample = sample
        self.trial = trial
        self.backend = backend
        self.toolbox = toolbox
        self.sampling = sampling
        self.traj = traj
        self.budgets = budgets
        self.allowed_tools = tuple(allowed_tools)
        self.registry = ImageRegistry.from_paths(sample.image_paths, sample.benchmark)
        traj.query_hashes = [r.sha256 for r in self.registry.images]

    @property
    def used(self) -> int:
        return self.traj.n_calls

    @property
    def remaining(self) -> int:
        return self.budgets.t_max - self.traj.n_calls

    async def llm(self, messages: list[dict], *, state: str, branch: str | None = None, correction: bool = False,
                  forced: bool = False, parent: str | None = None) -> tuple[ModelOutput, dict]:
        if self.remaining <= 0:
            raise BudgetExceeded(f"{self.sample.id}: call {self.used + 1} exceeds T_max={self.budgets.t_max}")
        out = await self.backend.generate(messages, self.sampling)
        ev = self.traj.llm_call(messages, out, state=state, branch=branch, correction=correction, forced=forced,
                                parent=parent, sampling=self.sampling.to_dict())
        return out, ev

    @staticmethod
    def accept(ev: dict, act: Action) -> None:
        ev["action"] = {"kind": act.kind, **({"name": act.name, "args": act.args} if act.kind == "tool_call" else {}),
                        **({"answer": act.answer} if act.kind == "answer" else {}),
                        **({"subtask": act.subtask} if act.kind == "subtask" else {})}

    @staticmethod
    def reject(ev: dict, err: Exception) -> None:
        ev["action_error"] = str(err)

    async def tool(self, ev: dict, name: str, args: dict) -> ToolResult:
        if name in TOOL_NAMES and name not in self.allowed_tools:
            res = ToolResult(name, dict(args), f"Tool '{name}' is not available here. Available tools: "
                             f"{', '.join(self.allowed_tools)}.", False, False)
        else:
            res = await self.toolbox.call(name, args, self.registry)
        self.traj.tool_call(ev, res)
        return res
