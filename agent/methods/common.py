"""What every method shares: the episode (one sample, one trial), its budget, and message helpers.

An :class:`Episode` owns the backend, the toolbox, the image registry and the trajectory record.
``await ep.llm(messages, state=...)`` is the only way a method calls the model (it counts the call
against T_max and records it); ``await ep.tool(ev, name, args)`` the only way it calls a tool.
Messages are always rebuilt from the recorded turns (a projection); image removal is that same
projection passed through :func:`agent.backends.messages.strip_images`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..backends.base import BackendError, ModelOutput, SamplingParams
from ..backends.messages import strip_images
from ..choices import HISTORY_REASONING, WEBWATCHER_OBSERVATION_IMAGES
from ..errors import HarnessError
from ..parsing import Action, ActionError, parse_action
from ..prompts import CORRECTION, fill
from ..tools.formatting import format_lens_branch
from ..tools.live import LENS_IMAGES
from ..tools.registry import ImageRegistry, RegisteredImage
from ..tools.toolbox import TOOL_NAMES, ToolResult, lens_results
from ..trajectory import EventView, Trajectory

__all__ = ["Budgets", "Episode", "BudgetExceeded", "ServedModelChanged", "Turn", "image_parts", "with_suffix", "with_note",
           "tool_reply", "correction_text",
           "strip_images", "chat", "with_turns", "assistant_message", "HISTORY_REASONING", "WEBWATCHER_OBSERVATION_IMAGES"]



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


class BudgetExceeded(HarnessError, RuntimeError):
    """A method tried to call the model past T_max (a bug in the method, never the model's fault)."""


class ServedModelChanged(BackendError):
    """A reply named another model than the one the run recorded (a router mixing backends, a redeployed
    server): the unit ends ``error``, never a trajectory of two models."""


def image_parts(images: list[RegisteredImage], detail: str | None = None) -> list[dict]:
    """Each image after its text identifier: ``<image_0>`` then the pixels (removal drops only the pixels).
    ``detail``: the OpenAI ``detail`` field (MM-ContextFold sends ``"high"``, as the release does)."""
    parts = []
    for r in images:
        url = {"url": str(r.path), **({"detail": detail} if detail else {})}
        parts.append({"type": "text", "text": r.image_id})
        parts.append({"type": "image_url", "image_url": url})
    return parts


def chat(role: str, content) -> dict:
    return {"role": role, "content": content}


@dataclass(frozen=True)
class Turn:
    """One recorded step of a multi-turn context: the assistant's output and the user message that answered it."""

    text: str            # the visible output
    reasoning: str       # its think text
    reply: object        # the user message that followed (text, or parts when it carries images)


def assistant_message(text: str | None, reasoning: str | None, history_reasoning: str = "keep") -> dict:
    """An assistant turn for the history; with ``keep`` the reasoning rides along as ``reasoning_content``.
    The texts are recorded as they arrived and cleaned here, as the next prompt is built (ours: surrounding
    whitespace dropped, as Qwen3.5's chat template trims both when it renders them, so every template and
    backend path sees the same; null as ""; docs/fidelity.md)."""
    if history_reasoning == "keep":
        return {"role": "assistant", "content": (text or "").strip(), "reasoning_content": (reasoning or "").strip()}
    return chat("assistant", (text or "").strip())


def with_turns(base: list[dict], turns: list[Turn], history_reasoning: str = "keep") -> list[dict]:
    """``base`` followed by the recorded turns (a projection: nothing is edited in place)."""
    msgs = list(base)
    for t in turns:
        msgs += [assistant_message(t.text, t.reasoning, history_reasoning), chat("user", t.reply)]
    return msgs


def with_suffix(messages: list[dict], suffix: str) -> list[dict]:
    """A copy of ``messages`` whose last (user) message ends with ``suffix`` (force-answer, summarise)."""
    out = list(messages)
    last = dict(out[-1])
    c = last["content"]
    last["content"] = c + "\n\n" + suffix if isinstance(c, str) else [*c, {"type": "text", "text": "\n\n" + suffix}]
    out[-1] = last
    return out


def tool_reply(observation: str, images: list | tuple = (), *, images_after: bool = False, detail: str | None = None):
    """The user message carrying a tool's observation, with the tool's result images (retrieved, not query).

    Ours, after WebWatcher's loop (agent_eval.py: ``<tool_response>``, the result images, the text,
    ``</tool_response>``): the images sit inside the ``<tool_response>`` wrapper, each after a label, so
    the message still counts as a tool response (not a new user query) for the chat template.
    ``images_after``: the release's branch Lens layout instead (``pipeline_mmcontextfold.py:305-308``): the text,
    which names the images ``<result#1>``…, then the images in that order, unlabelled, still inside the wrapper.
    ``detail``: the OpenAI ``detail`` field of each image (MM-ContextFold sends ``"high"`` for every image, as the
    release does, ``utils/search_backbone_model.py:100``).
    """
    if not images:
        return f"<tool_response>\n{observation}\n</tool_response>"
    pixels = [{"type": "image_url", "image_url": {"url": str(path), **({"detail": detail} if detail else {})}}
              for path in images]
    if images_after:
        return [{"type": "text", "text": f"<tool_response>\n{observation}\n"}, *pixels,
                {"type": "text", "text": "\n</tool_response>"}]
    parts: list[dict] = [{"type": "text", "text": "<tool_response>\n"}]
    for i, px in enumerate(pixels, 1):
        parts += [{"type": "text", "text": f"[result image {i}]"}, px]
    parts.append({"type": "text", "text": f"\n{observation}\n</tool_response>"})
    return parts


def with_note(messages: list[dict], note: str) -> list[dict]:
    """``messages`` with ``note`` added to the last (user) message, inside its ``<tool_response>`` wrapper when it
    is a tool response, so that it still counts as one for the chat template (which decides whose reasoning is
    rendered); otherwise at its end, like :func:`with_suffix`. The release appends its turn warnings to the
    observation the same way (``pipeline_mmcontextfold.py:284-296``)."""
    out = list(messages)
    last = dict(out[-1])
    c, end = last["content"], "\n</tool_response>"
    if isinstance(c, str) and c.startswith("<tool_response>") and c.endswith(end):
        last["content"] = c[:-len(end)] + "\n\n" + note + end
    elif isinstance(c, list) and c and c[-1].get("type") == "text" and c[-1]["text"].endswith(end):
        last["content"] = [*c[:-1], {"type": "text", "text": c[-1]["text"][:-len(end)] + "\n\n" + note + end}]
    else:
        return with_suffix(messages, note)
    out[-1] = last
    return out


def correction_text(err: ActionError) -> str:
    return fill(CORRECTION, error=str(err))


class Episode:
    def __init__(self, sample, trial: int, *, backend, toolbox, sampling: SamplingParams, traj: Trajectory,
                 budgets: Budgets = Budgets(), allowed_tools=TOOL_NAMES, history_reasoning: str = "keep",
                 observation_images: int = WEBWATCHER_OBSERVATION_IMAGES, served_model: str | None = None):
        if history_reasoning not in HISTORY_REASONING:
            raise ValueError(f"history_reasoning must be one of {HISTORY_REASONING}, got {history_reasoning!r}")
        self.sample = sample
        self.trial = trial
        self.backend = backend
        self.toolbox = toolbox
        self.sampling = sampling
        self.traj = traj
        self.budgets = budgets
        self.allowed_tools = tuple(allowed_tools)
        self.history_reasoning = history_reasoning
        self.observation_images = int(observation_images)
        self.served_model = served_model  # every reply must name it (when the reply names a model at all)
        self.registry = ImageRegistry.from_paths(sample.image_paths, sample.benchmark,
                                                 undecodable_ok=bool(sample.extra.get("undecodable_images")))
        traj.query_hashes = [r.sha256 for r in self.registry.images]

    @property
    def query_hashes(self) -> list[str]:
        return self.traj.query_hashes

    def turns(self, base: list[dict], turns: list[Turn]) -> list[dict]:
        return with_turns(base, turns, self.history_reasoning)

    def observation(self, res: ToolResult, images: int | None = None, *, images_after: bool = False,
                    detail: str | None = None):
        """The user message carrying a tool result (with up to ``images`` result images, default
        ``observation_images``; 0 for a context that must see no pixels at all; ``detail`` as :func:`tool_reply`)."""
        n = self.observation_images if images is None else int(images)
        return tool_reply(res.observation, [p for _, p in res.images[:n]], images_after=images_after, detail=detail)

    @property
    def used(self) -> int:
        return self.traj.n_calls

    @property
    def remaining(self) -> int:
        return self.budgets.t_max - self.traj.n_calls

    async def llm(self, messages: list[dict], *, state: str, branch: str | None = None, correction: bool = False,
                  forced: bool = False, parent: str | None = None) -> tuple[ModelOutput, EventView]:
        if self.remaining <= 0:
            raise BudgetExceeded(f"{self.sample.id}: call {self.used + 1} exceeds T_max={self.budgets.t_max}")
        out = await self.backend.generate(messages, self.sampling)
        if self.served_model and out.model and out.model != self.served_model:
            raise ServedModelChanged(f"call {self.used + 1}: the reply names model {out.model!r}, but this run records "
                                     f"{self.served_model!r} (a router mixing backends, or a redeployed server?)")
        ev = self.traj.llm_call(messages, out, state=state, branch=branch, correction=correction, forced=forced,
                                parent=parent, sampling=self.sampling.to_dict())
        return out, ev

    async def act(self, messages: list[dict], kinds: tuple[str, ...], *, check=None,
                  **call) -> tuple[ModelOutput, EventView, Action | ActionError]:
        """One decision (paper B.3): a call (``call``: :meth:`llm`'s keywords), its reply parsed as one of ``kinds``
        (``check(action)`` may refuse it too, raising ActionError), the call recorded with its action or with why it
        was refused, and an answer recorded as the trajectory's final answer. Returns the output, the call's event
        and the action, or the error the method turns into a correction."""
        out, ev = await self.llm(messages, **call)
        try:
            action = parse_action(out.text, kinds)
            if check is not None:
                check(action)
        except ActionError as e:
            self.reject(ev, e)
            return out, ev, e
        self.accept(ev, action)
        if action.kind == "answer":
            self.traj.final_answer(ev, action.answer, forced=call.get("forced", False))
        return out, ev, action

    def accept(self, ev: EventView, act: Action) -> None:
        """Record call ``ev`` with the action parsed from its reply."""
        self.traj.settle(ev, action={
            "kind": act.kind, **({"name": act.name, "args": act.args} if act.kind == "tool_call" else {}),
            **({"answer": act.answer} if act.kind == "answer" else {}),
            **({"subtask": act.subtask} if act.kind == "subtask" else {})})

    def reject(self, ev: EventView, err: Exception) -> None:
        """Record call ``ev`` as unusable, with why."""
        self.traj.settle(ev, error=str(err))

    async def tool(self, ev: EventView, name: str, args: dict, *, images: int | None = None,
                   branch_lens: bool = False, lens_label: str | None = None) -> ToolResult:
        """Run a tool; ``images``: how many result images its observation shows (recorded; default
        ``observation_images``). ``branch_lens``: a Lens result is shown as the release shows it inside an
        MM-ContextFold branch (:func:`agent.tools.formatting.format_lens_branch`, up to ``LENS_IMAGES`` images),
        naming the image ``lens_label`` (default: the id in ``args``)."""
        if name in TOOL_NAMES and name not in self.allowed_tools:
            res = ToolResult(name, dict(args), f"Tool '{name}' is not available here. Available tools: "
                             f"{', '.join(self.allowed_tools)}.", False, False)
        else:
            res = await self.toolbox.call(name, args, self.registry)
        if branch_lens and name == "lens_search" and res.ok:
            found = lens_results(res.raw)[:LENS_IMAGES]
            res = replace(res, observation=format_lens_branch(lens_label or str(args.get("image_id", "")), found,
                                                              self.toolbox.tools.missing_title),
                          images=[(r["sha256"], r["path"]) for r in found])
            images = len(found)
        self.traj.tool_call(ev, res, self.observation_images if images is None else int(images))
        return res
