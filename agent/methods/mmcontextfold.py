"""MM-ContextFold (paper §3.3, B.3, appendix E.1-E.4) and its ablations (§4.3).

    python -m agent.run --method mmcontextfold [--variant image-caption|no-init|no-image-in-branch|image-in-main] ...

1. Initialization cycle: one call per query image (that image only + E.4); the descriptions become
   the main state's image context.
2. Main state (text only): E.1 system + E.2 prompt; each response is one ``<subtask>`` or ``<answer>``.
   After a branch returns, the E.2 continuation prompt carries its return message.
3. Branch state: inherits the main context (text), then the E.3 prompt with the subtask's prompt and
   only the assigned images; one ``<tool_call>`` per response; ``return`` folds a message back and
   the branch context is discarded. At most B_max calls; the last allowed call carries the
   summarise constraint, and if it still does not return, its visible text is folded back.
4. Budgets: every init, main, branch and correction call counts toward T_max; the T_max-th call is
   a main call with the force-answer prompt. Malformed outputs get the correction re-prompt, which
   counts toward B_max (in a branch) and T_max.

Variants (§4.3, Table 2), what each branch call renders (``tests/test_agents.py`` checks every call):

- ``image-caption``: init descriptions only; branches get no pixels at all (no query image, no Lens
  result image) and no lens_search.
- ``no-init``: skips the initialization cycle, "leaving the agent in the main state planning only with the
  image identifiers" (§4.3); branches still load their assigned images, as in the default.
- ``no-image-in-branch``: branches "rely solely on textualized results from initialization" "without
  direct pixel access" (§4.3): no image part in any branch call, Lens result images included (Lens often
  returns copies of the query image); lens_search by identifier still runs and its text stays.
- ``image-in-main``: the raw images sit in the main context, and so are inherited by every branch.
"""
from __future__ import annotations

import re

from ..choices import VARIANTS, Variant
from ..parsing import ActionError, parse_init_description, strip_answer_tags
from ..prompts import (
    BRANCH_SUMMARISE,
    CONTINUATION,
    FORCE_ANSWER,
    INIT,
    MAIN,
    NO_INIT_IMAGE_CONTEXT,
    SYSTEM,
    branch_prompt,
    fill,
)
from ..trajectory import EventView
from .common import Episode, Turn, assistant_message, chat, correction_text, image_parts, with_note

__all__ = ["run_mmcontextfold", "VARIANTS"]



async def _init_cycle(ep: Episode) -> str:
    descriptions, parsed = {}, {}
    for img in ep.registry.images:
        if ep.remaining <= 1:  # keep the last call for the force-answer
            break
        # the prompt first, then the image (release utils/search_backbone_model.py:83-106)
        msgs = [chat("system", SYSTEM), chat("user", [{"type": "text", "text": INIT}, *image_parts([img], "high")])]
        out, ev = await ep.llm(msgs, state="init", parent="init")
        obj, text = parse_init_description(out.visible or out.reasoning)
        ep.traj.settle(ev, action={"kind": "describe", "image_id": img.image_id, "parsed": obj is not None})
        descriptions[img.image_id], parsed[img.image_id] = _description(img.image_id, obj, text), obj is not None
    ep.traj.init_end(descriptions, parsed)
    missing = [r.image_id for r in ep.registry.images if r.image_id not in descriptions]
    blocks = list(descriptions.values())
    blocks += [f"{k}: [Query Image] (not described: call budget exhausted)" for k in missing]
    return "\n\n".join(blocks) if blocks else "No query images."


def _description(image_id: str, obj: dict | None, text: str) -> str:
    """One image's block in the main state's image context, as the release writes it
    (``pipelines/pipeline_mmcontextfold.py:124-138``): the E.4 fields indented under ``[Query Image]``, else the
    reply's first 200 characters."""
    if obj is not None:
        return f"{image_id}: [Query Image]\n  Content: {obj.get('summary', '')}\n  Source: {obj.get('source_hint', '')}"
    return f"{image_id}: [Query Image] {(text or '(no description)')[:200]}"


def _no_init_context(ep: Episode) -> str:
    ids = ep.registry.ids
    return fill(NO_INIT_IMAGE_CONTEXT, n=len(ids), ids=", ".join(ids)) if ids else "No query images."


async def run_mmcontextfold(ep: Episode, *, variant: Variant | str = Variant.FULL) -> tuple[str, str]:
    if variant not in VARIANTS:
        raise ValueError(f"unknown MM-ContextFold variant {variant!r}; choose from {VARIANTS[1:]}")
    variant = Variant(variant)
    image_context = _no_init_context(ep) if variant is Variant.NO_INIT else await _init_cycle(ep)
    main_text = fill(MAIN, image_context=image_context, question=ep.sample.question)
    first = [{"type": "text", "text": main_text}, *image_parts(ep.registry.images, "high")] if variant is Variant.IMAGE_IN_MAIN \
        else main_text
    base = [chat("system", SYSTEM), chat("user", first)]
    turns: list[Turn] = []
    correction = False
    n_branch = 0

    def main_messages(extra=None) -> list[dict]:
        msgs = ep.turns(base, turns)
        if extra is not None:  # the main call that opened a branch: its output (and reasoning) is inherited
            msgs.append(assistant_message(extra.text, extra.reasoning, ep.history_reasoning))
        return msgs

    while ep.remaining > 0:
        forced = ep.remaining == 1
        # the force-answer prompt is a user turn of its own after the model's last reply (release
        # pipelines/pipeline_mmcontextfold.py:522-523); only a main state with no reply of its own yet gets it
        # straight after its prompt
        msgs = main_messages()
        if forced and not (turns and turns[-1].reply == FORCE_ANSWER):
            msgs.append(chat("user", FORCE_ANSWER))
        out, ev, act = await ep.act(msgs, ("answer",) if forced else ("subtask", "answer"),
                                    check=lambda a: _known_images(ep, a), state="main", correction=correction,
                                    forced=forced)
        if isinstance(act, ActionError):
            if forced:
                break
            turns.append(Turn(out.text, out.reasoning, FORCE_ANSWER if ep.remaining == 1 else correction_text(act)))
            correction = ep.remaining > 1
            continue
        correction = False
        if act.kind == "answer":
            return "ok", act.answer
        if ep.remaining == 1:  # no call left for a branch: the force-answer follows this reply (as in the release)
            turns.append(Turn(out.text, out.reasoning, FORCE_ANSWER))
            continue
        n_branch += 1
        message = await _branch(ep, f"b{n_branch}", act.subtask, main_messages(out), ev, variant)
        turns.append(Turn(out.text, out.reasoning,
                          fill(CONTINUATION, description=act.subtask["description"], return_message=message)))
    return "no_answer", ""


async def _branch(ep: Episode, bid: str, subtask: dict, inherited: list[dict], main_ev: EventView,
                  variant: Variant) -> str:
    # which pixels a branch may see (§4.3): the default and w/o Init load the assigned query images; w/o Image in
    # Branch and the caption variant see none at all (no Lens result images either)
    pixels = variant.branch_sees_pixels
    result_images = None if pixels else 0
    assigned = []
    for x in subtask["assigned_images"]:
        r = ep.registry.resolve(x)
        if r is not None and r not in assigned:
            assigned.append(r)
    if variant is Variant.IMAGE_IN_MAIN:  # the inherited main context already holds every image
        loaded = []
    else:
        loaded = assigned if pixels else []
    ep.traj.branch_begin(bid, description=subtask["description"], prompt=subtask["prompt"],
                         assigned_images=[r.image_id for r in assigned],
                         assigned_hashes=[r.sha256 for r in loaded], main_call_index=main_ev["index"])
    # E.3 verbatim, its "at most 5 tool calls" following --b-max (the B_max sweep, D.2)
    template = branch_prompt(ep.budgets.b_max, lens=variant is not Variant.IMAGE_CAPTION)
    prompt = fill(template, task_prompt=subtask["prompt"])
    base = [*inherited, chat("user", [{"type": "text", "text": prompt}, *image_parts(loaded, "high")] if loaded else prompt)]
    turns: list[Turn] = []
    correction = False
    steps = 0
    last_text = last_reasoning = ""
    while True:
        if ep.remaining <= 2:  # the last two calls belong to the main state: its reply, then the force-answer
            message = last_text or last_reasoning or "Subtask not completed: the global call budget is exhausted."
            ep.traj.branch_end(bid, message=message, reason="global_budget", steps=steps)
            return message
        steps += 1
        last = steps >= ep.budgets.b_max or ep.remaining <= 3
        msgs = ep.turns(base, turns)
        if last:  # inside the observation's wrapper: it still counts as a tool response for the template
            msgs = with_note(msgs, BRANCH_SUMMARISE)
        out, ev, act = await ep.act(msgs, ("tool_call",), check=_usable_return, state="branch", branch=bid,
                                    correction=correction, forced=last)
        # what a branch without a usable return folds back: its visible text, else its reasoning (ours)
        last_text = _visible_without_calls(out.text) or last_text
        last_reasoning = (out.reasoning or "").strip() or last_reasoning
        if isinstance(act, ActionError):
            if last:
                message = last_text or last_reasoning or f"Branch ended without a usable return ({act})."
                ep.traj.branch_end(bid, message=message, reason="branch_budget", steps=steps)
                return message
            turns.append(Turn(out.text, out.reasoning, correction_text(act)))
            correction = True
            continue
        correction = False
        if act.name == "return":  # <answer> tags dropped from the findings, as the release does (:252-280)
            message = strip_answer_tags(act.args["message"])
            ep.traj.branch_end(bid, message=message, reason="return", steps=steps)
            return message
        if last:
            message = last_text or last_reasoning or "Branch budget exhausted before a return; no findings were summarised."
            ep.traj.branch_end(bid, message=message, reason="branch_budget", steps=steps)
            return message
        # with pixels, Lens results come as the release shows them: named <result#i>, the images after the text
        res = await ep.tool(ev, act.name, act.args, images=result_images, branch_lens=pixels)
        turns.append(Turn(out.text, out.reasoning, ep.observation(res, result_images if not pixels else len(res.images),
                                                                  images_after=pixels, detail="high")))


def _known_images(ep: Episode, act) -> None:
    """A subtask may assign only the query images the registry knows (else the correction re-prompt)."""
    if act.kind == "subtask":
        bad = [x for x in act.subtask["assigned_images"] if ep.registry.resolve(x) is None]
        if bad:
            raise ActionError(f"unknown image id(s) {bad} in assigned_images; the query images are "
                              f"{ep.registry.ids or 'none'}.")


def _usable_return(act) -> None:
    """A branch's ``return`` must carry a non-empty message (else the correction re-prompt)."""
    if act.name == "return":
        msg = act.args.get("message")
        if not isinstance(msg, str) or not msg.strip():
            raise ActionError('`return` needs a non-empty "message".')


def _visible_without_calls(text: str) -> str:
    return re.sub(r"<tool_call>.*?(</tool_call>|$)", "", text or "", flags=re.S).strip()
