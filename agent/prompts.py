"""Every prompt the toolkit sends, as module constants, with where each one comes from.

The MM-ContextFold prompts (E.1-E.4), the judge (E.5) and the grounding annotator (E.6, E.7) are
copied verbatim from the paper's appendix E. The paper's text extraction flattened their line
breaks; they are restored here at the markdown structure (headings, numbered and bulleted items,
tags) and the extraction's ‘…‘ quotes are restored to backticks. ``tests/test_prompts.py`` checks
that, whitespace and those quotes aside, each constant equals the paper's text word for word.

Prompts the paper does not print are ours and say so: the ReAct system prompt (WebWatcher-style
JSON ``<tool_call>`` grammar, paper B.2 / C.1), the direct-inference prompt, the correction
re-prompt, the branch-budget summarise constraint and the image-caption tool list.

Placeholders are ``{name}``; fill them with :func:`fill` (the prompts contain JSON braces, so
``str.format`` cannot be used).
"""
from __future__ import annotations

import re

__all__ = [
    "fill", "SYSTEM", "MAIN", "CONTINUATION", "FORCE_ANSWER", "BRANCH", "BRANCH_CAPTION_ONLY", "branch_prompt", "INIT", "JUDGE",
    "GROUNDING_PASS1", "GROUNDING_PASS2", "REACT_SYSTEM", "REACT_USER", "DIRECT_SYSTEM", "CORRECTION",
    "BRANCH_SUMMARISE", "NO_INIT_IMAGE_CONTEXT", "PAPER_PROMPTS",
]


def fill(template: str, **values) -> str:
    """Replace ``{name}`` for the given names only (JSON braces in the template are left alone)."""
    def sub(m):
        key = m.group(1)
        return str(values[key]) if key in values else m.group(0)
    out = re.sub(r"\{([a-z_]+)\}", sub, template)
    missing = [k for k in re.findall(r"\{([a-z_]+)\}", template) if k not in values]
    if missing:
        raise KeyError(f"prompt placeholders not filled: {missing}")
    return out


# --------------------------------------------------------------------------- paper, appendix E.1
SYSTEM = ("You are a research agent that answers questions by planning and executing focused subtasks. "
          "You operate in two states: MAIN (planner) or BRANCH (executor).")

# --------------------------------------------------------------------------- paper, appendix E.2
MAIN = """**STATE: MAIN** -- You are the research strategist.

## Workflow
1. Analyze the question and image descriptions
2. Identify what information is still missing
3. Create a focused subtask to gather it
4. Review subtask results, then create another subtask or answer
5. Keep a global round budget in mind; when budget is low, request a synthesis-focused subtask or provide the best calibrated answer.

## Creating a Subtask
Output ONE subtask per response. The executor (BRANCH) will inherit your full context and can use web search, page reading, and reverse image search.
<subtask>
{"description": "3-5 word summary", "prompt": "Clear task prompt with objectives. State what to search for, what specific information to extract, and what to return.", "assigned_images": ["<image_0>"]}
</subtask>

**`assigned_images` guide:**
- Only assign images that the subtask **directly needs** (e.g., for reverse image search, reading text/numbers, identifying visual details).
- For pure text-based research (e.g., searching a name or fact), use an empty list [] -- no images needed.
- Each image is only loaded inside the BRANCH that receives it, keeping context focused.

## Answering
When evidence is sufficient:
<answer>your final answer</answer>

## Image Context
{image_context}

## Question
{question}"""

# E.2, continuation prompt (after each branch returns)
CONTINUATION = """## Subtask [{description}] completed
{return_message}

---
Review the findings above. Then take **exactly one** action:

**Option A -- Create another subtask:**
<subtask>
{"description": "...", "prompt": "...", "assigned_images": [...]}
</subtask>

**Option B -- Provide your final answer:**
<answer>your final answer</answer>"""

# E.2, force-answer prompt (T_max reached)
FORCE_ANSWER = """Maximum research rounds reached. You MUST provide your best answer now based on all evidence gathered.
<answer>your final answer</answer>"""

# --------------------------------------------------------------------------- paper, appendix E.3
_TOOL_SEARCH = '{"name": "search", "description": "Perform a Google web search.", "parameters": {"query": "string", "goal": "string"}}'
_TOOL_VISIT = '{"name": "visit", "description": "Visit a URL to extract detailed content.", "parameters": {"url": "string", "goal": "string"}}'
_TOOL_LENS = '{"name": "lens_search", "description": "Perform Google Lens reverse image search.", "parameters": {"image_id": "string", "goal": "string"}}'
_TOOL_RETURN = '{"name": "return", "description": "Report findings back to MAIN.", "parameters": {"message": "string"}}'

_BRANCH_TEMPLATE = """**STATE: BRANCH** -- Execute the assigned research task.

## Available Tools
<tools>
%s
</tools>

## Response Format
Think step-by-step, then call **one tool** per response:
<tool_call>
{"name": "tool_name", "parameters": {"key": "value"}}
</tool_call>

## Rules
1. Focus exclusively on the assigned task.
2. When done, you **must** call `return` to report findings back to MAIN.
3. Budget: finish within at most 5 tool calls; if uncertainty remains, call `return` with the best-supported conclusion and explicit uncertainty.
4. Evidence policy: before `return`, try to validate the key claim with at least two independent signals (e.g., lens_search + search, or search + visit).
5. Anti-loop: do not repeat near-duplicate queries more than twice; if results are noisy, pivot strategy, then conclude.
6. Source quality: prefer official or domain-relevant sources over forums/aggregators when evidence conflicts.

## Task
{task_prompt}"""

BRANCH = _BRANCH_TEMPLATE % "\n".join([_TOOL_SEARCH, _TOOL_VISIT, _TOOL_LENS, _TOOL_RETURN])

#: Ours (derived from E.3): the Image Caption ablation (paper §4.3) runs branches with Text Retrieval
#: and Web Visit only, so lens_search is removed from the tool list; nothing else changes.
BRANCH_CAPTION_ONLY = _BRANCH_TEMPLATE % "\n".join([_TOOL_SEARCH, _TOOL_VISIT, _TOOL_RETURN])

#: E.3's budget sentence; the paper's prompt says 5 because B_max = 5 (§4.1). The B_max sweep (D.2, Table 14)
#: runs other budgets, so the number follows ``--b-max`` and nothing else of E.3 changes (ours: the paper does
#: not print the sweep's prompts; a prompt promising 5 calls under B_max = 3 would misstate the budget).
_BRANCH_BUDGET = "finish within at most 5 tool calls;"


def branch_prompt(b_max: int, *, lens: bool = True) -> str:
    """E.3 (verbatim) with the budget sentence naming ``b_max`` (``lens=False``: the Image Caption variant)."""
    template = BRANCH if lens else BRANCH_CAPTION_ONLY
    assert template.count(_BRANCH_BUDGET) == 1
    return template.replace(_BRANCH_BUDGET, f"finish within at most {int(b_max)} tool calls;")

# --------------------------------------------------------------------------- paper, appendix E.4
INIT = """Briefly describe this image for a research planner who cannot see it.
1. What the image shows (subject, type of content)
2. Any visible text or numbers
3. What type of source it appears to be from
Output as JSON: {"summary": "...", "source_hint": "..."}"""

# --------------------------------------------------------------------------- paper, appendix E.5
JUDGE = """You are grading a predicted answer against a gold target.

Task -- two steps:
1. EXTRACT: From the predicted answer, extract the core factual claim that directly answers the question. Write it as a short phrase.
2. GRADE: Compare the extracted claim with the gold target and assign exactly one grade.

Grading rules:
- CORRECT: The extracted claim is semantically equivalent to the gold target. Ignore casing, punctuation, phrasing, order, or minor typos. Hedging is acceptable if the correct answer is clearly stated.
- INCORRECT: The extracted claim contains a factual statement that contradicts the gold target (even if hedged). If correct and incorrect claims coexist, grade INCORRECT.
- NOT_ATTEMPTED: No clear factual claim is made (e.g. "I don’t know"), or only partial information is given with no contradictions.

Additional rules:
- For numbers, accept values correct to the last significant figure of the gold target.
- The prediction only needs to address what the question asks, even if the gold target contains extra detail.
- Do not penalize omission of info clearly inferable from the question.

Question: {question}
Gold target: {correct_answer}
Predicted answer: {response}

Reply in exactly this format (2 lines, nothing else):
Extracted: <core answer in a short phrase>
Grade: <A, B, or C>"""

# --------------------------------------------------------------------------- paper, appendix E.6
GROUNDING_PASS1 = """You are analyzing a multi-step reasoning trajectory from a vision-language agent. The agent was given a question about an image and used tools (web_search, lens_search, visit) to find the answer.

Your task: For each assistant step below, determine whether the step requires direct access to the original image to obtain NEW visual information, or whether it merely reuses image-derived information that was already textualized in a previous step.

## Classification Labels

**"image_needed" = true**: This step extracts NEW information directly from the image that has NOT appeared in any previous step’s text. Examples:
- FIRST mention of what the image depicts
- Using lens_search / reverse image search on the original image
- Noticing a NEW visual detail not previously described
- Re-examining the image to verify or correct a previous observation

**"image_needed" = false**: This step does NOT require the original image. All image-related information it uses was already converted to text in earlier steps. Examples:
- Searching for an entity identified from the image in a PREVIOUS step
- Reasoning about facts retrieved from web search results
- Mentioning image content that was already fully described earlier
- The step is purely text-based: processing search results, synthesizing information, or giving a final answer

## Key Principle
Ask yourself: "If I removed the original image from this step’s input but kept all previous steps’ text output, could this step still produce the same result?" If YES -> image_needed = false.

## Question
{question}

## Steps (in chronological order)
{steps_text}

## Output Format
Return a JSON array with one object per step:
[{"step": 1, "tool": "...", "image_needed": true/false, "reason": "brief explanation (1 sentence)"}]"""

# --------------------------------------------------------------------------- paper, appendix E.7
GROUNDING_PASS2 = """Each step has already been labeled with:
image_needed: whether this step requires DIRECT access to the original image

Your additional task: for each step, determine **image_info_used** -- whether this step’s reasoning or action makes use of ANY image-derived information, regardless of whether it comes directly from the original image or was textualized in a previous step.

## Classification for image_info_used

**true**: This step uses image information in any form. Examples:
- The step directly examines the original image (image_needed=true implies this)
- The step’s search query or reasoning references something identified from the image in a previous step
- The step’s reasoning mentions visual details that came from the image

**false**: This step has NO dependency on image information whatsoever. Examples:
- The step processes purely factual web results unrelated to the image content
- The step reasons about dates, numbers, or facts that could have been in a text-only question
- The step synthesizes information that has no connection to the original image

## Key Principle
Ask yourself: "If this had been a text-only question (no image at all), could this step still appear in an equivalent reasoning trajectory?" If YES -> image_info_used = false.

## Question
{question}

## Steps (in chronological order)
{steps_text}

## Output Format
[{"step": 1, "tool": "...", "image_needed": true/false, "image_info_used": true/false, "reason": "brief explanation (1 sentence)"}]
For steps where image_needed=true, image_info_used must also be true."""

#: name -> (appendix section, constant) for the prompts taken verbatim from the paper.
PAPER_PROMPTS = {
    "E.1 system": SYSTEM, "E.2 main": MAIN, "E.2 continuation": CONTINUATION, "E.2 force-answer": FORCE_ANSWER,
    "E.3 branch": BRANCH, "E.4 init": INIT, "E.5 judge": JUDGE, "E.6 grounding pass 1": GROUNDING_PASS1,
    "E.7 grounding pass 2": GROUNDING_PASS2,
}

# =========================================================================== ours (not in the paper)
#: Ours: the ReAct baseline's system prompt. The paper runs WebWatcher's released agent (C.1) with the
#: JSON ``<tool_call>`` grammar of Table 11 and the shared tools and answer format; WebWatcher's exact
#: prompt is not printed in the paper, so this one states the same grammar and tools.
REACT_SYSTEM = """You are a research assistant that answers questions about images by searching the web.

You can call these tools:
<tools>
{"name": "search", "description": "Perform a Google web search; returns the top 10 results with titles, snippets and URLs.", "arguments": {"query": "string", "goal": "string"}}
{"name": "visit", "description": "Visit a URL to extract detailed content.", "arguments": {"url": "string", "goal": "string"}}
{"name": "lens_search", "description": "Perform Google Lens reverse image search on a query image, given its identifier such as <image_0>.", "arguments": {"image_id": "string", "goal": "string"}}
</tools>

Think step by step. In each response, either call exactly one tool:
<tool_call>
{"name": "tool_name", "arguments": {"key": "value"}}
</tool_call>
or, when you have enough evidence, give the final answer:
<answer>your final answer</answer>
Tool results come back inside <tool_response></tool_response>."""

#: Ours: the first user turn of ReAct (and of direct inference): the images, each after its identifier.
REACT_USER = "Question: {question}"

#: Ours: direct inference (no tools), paper §4.1 baseline.
DIRECT_SYSTEM = """You are a knowledgeable assistant. Answer the question about the image(s) from your own knowledge; you cannot use any tools.
Think step by step, then give the final answer as:
<answer>your final answer</answer>"""

#: Ours: the correction re-prompt for malformed outputs (paper B.3 "Error handling" describes it; the
#: wording is not printed). The malformed output itself stays in the context as the assistant turn.
CORRECTION = """Your previous response could not be executed: {error}
Respond again with exactly one action in the required format."""

#: Ours: the constraint on a branch's last allowed call (paper B.3: "the final call is constrained to
#: summarize partial findings and terminate").
BRANCH_SUMMARISE = """Branch budget exhausted. Do not call any more tools. Call `return` now with your best-supported findings so far and the remaining uncertainty:
<tool_call>
{"name": "return", "parameters": {"message": "..."}}
</tool_call>"""

#: Ours: the image context of the w/o Init ablation (paper §4.3: "planning only with the image identifiers").
NO_INIT_IMAGE_CONTEXT = "The question comes with {n} query image(s), not described: {ids}."


# =========================================================================== baselines (ours, Table 1)
# AgentFold and ContextFold as the paper adapts them (§4.1, C.1, B.2): each keeps its context logic and
# action grammar; backbone, tools, answer format and T_max are shared. The released prompts are not
# reused (they are tied to their own tools and SFT formats); these are ours, written from the behaviour
# described in ../shared/baselines-spec.md, with the original file named as provenance.

_JSON_TOOLS = """{"name": "search", "description": "Google web search; returns the top 10 results (title, URL, snippet).", "arguments": {"query": "string", "goal": "string"}}
{"name": "visit", "description": "Read a web page.", "arguments": {"url": "string", "goal": "string"}}
{"name": "lens_search", "description": "Google Lens reverse image search on a query image, named by its identifier such as <image_0>.", "arguments": {"image_id": "string", "goal": "string"}}"""

#: Ours; provenance: AgentFold's system prompt (Alibaba-NLP/DeepResearch @f72f75d, WebAgent/AgentFold/infer.py),
#: which states the role and lists the tools but leaves the output format to fine-tuning. The format rules
#: are spelled out here because the backbones were not trained on it.
AGENTFOLD_SYSTEM = """You are a research agent that answers questions by calling tools and by managing a record of your previous steps: after every step you decide how to fold earlier steps into short summaries, so the record stays small while the facts you need survive.

Available tools:
<tools>
""" + _JSON_TOOLS + """
</tools>

Respond in this order:
1. Think step by step.
2. Unless the previous steps are EMPTY, fold them:
<compress>{"compress_range": [i, j], "compress_text": "what steps i..j established that is still needed"}</compress>
j is the id of the latest step. Use [j, j] to condense only the latest step, or [i, j] with an earlier i to merge several steps into one summary. Anything you do not keep in compress_text is gone: in particular, the query images are shown only in the first step, so write down every visual detail you may need later.
3. <motivation>why the next action</motivation>
4. Exactly one action: a tool call
<tool_call>
{"name": "tool_name", "arguments": {"key": "value"}}
</tool_call>
or, when the evidence is sufficient, the final answer:
<answer>your final answer</answer>"""

#: Ours; the user message layout follows AgentFold's (infer.py: "### Question" / "### Previous Steps").
AGENTFOLD_USER = """### Question
{question}

### Previous Steps
{memory}"""

#: Ours: how later calls name the query images whose pixels only the first call shows (paper C.1: visual
#: information survives only through textualization).
AGENTFOLD_IMAGE_IDS = "Query images (shown in step 0 only): {ids}"

#: Ours: the T_max-th call (AgentFold's last turn asks for the final answer with no tool call).
AGENTFOLD_FINAL = """This is your last step. Do not call any tool: give your best final answer now.
<answer>your final answer</answer>"""

_XML_TOOLS = """---- BEGIN FUNCTION #1: search ----
Description: Google web search; returns the top 10 results (title, URL, snippet).
Parameters:
  (1) query (string, required): the search query
  (2) goal (string, optional): what you are looking for
---- END FUNCTION #1 ----

---- BEGIN FUNCTION #2: visit ----
Description: Read a web page.
Parameters:
  (1) url (string, required): the page to read
  (2) goal (string, optional): what to extract
---- END FUNCTION #2 ----

---- BEGIN FUNCTION #3: lens_search ----
Description: Google Lens reverse image search on a query image.
Parameters:
  (1) image_id (string, required): the image identifier, such as <image_0>
  (2) goal (string, optional): what to identify
---- END FUNCTION #3 ----

---- BEGIN FUNCTION #4: branch ----
Description: MAIN only. Hand a focused subtask to a BRANCH agent that inherits this whole conversation, works on it, and reports back.
Parameters:
  (1) description (string, required): a 3-5 word summary of the subtask
  (2) prompt (string, required): what to find and what to report
---- END FUNCTION #4 ----

---- BEGIN FUNCTION #5: return ----
Description: BRANCH only. End the branch and report its findings to MAIN.
Parameters:
  (1) message (string, required): the findings, with their sources and remaining uncertainty
---- END FUNCTION #5 ----

---- BEGIN FUNCTION #6: finish ----
Description: MAIN only. Give the final answer and end the task.
Parameters:
  (1) answer (string, required): the final answer
  (2) explanation (string, required): the evidence for it
  (3) confidence (string, optional): low, medium or high
---- END FUNCTION #6 ----"""

#: Ours; provenance: FoldAgent's SEARCH_SYSTEM_PROMPT_BRANCH and PARALLEL_TOOL_PROMPT
#: (sunnweiwei/FoldAgent @cc09646, agents/prompts.py, agents/tool_spec.py): a MAIN planner that delegates
#: subtasks to branches and a BRANCH executor that reports back with return; the XML call grammar.
CONTEXTFOLD_SYSTEM = """You are a research agent working in one of two roles.

MAIN: plan how to answer the question, keep a checklist of what is known and what is missing, hand one focused subtask at a time to a branch with `branch`, combine what branches report, verify it, and finally answer with `finish`.
BRANCH: work on the subtask you were given with search, visit and lens_search, then report your findings with their sources through `return`.

You have access to these functions:

""" + _XML_TOOLS + """

To call a function, write
<function=NAME>
<parameter=KEY>
VALUE
</parameter>
</function>
You may write several search or visit calls one after another to run them together; branch, return and finish must be the last call of a response."""

#: Ours; provenance: FoldAgent's SEARCH_USER_PROMPT_BRANCH (agents/prompts.py).
CONTEXTFOLD_USER = """Question: {question}

Example of delegating a subtask:
<function=branch>
<parameter=description>identify the landmark</parameter>
<parameter=prompt>Use lens_search on <image_0> and search to identify the building in the image; report its name and location with sources.</parameter>
</function>

When you know the answer, call finish with the answer, a short explanation and your confidence.
Now you are MAIN."""

#: Ours; provenance: FoldAgent's BRANCH_MESSAGE_SEARCH (agents/prompts.py). As in the release, the task
#: reaches the branch through the inherited branch call just above this message.
CONTEXTFOLD_BRANCH = """You are now a BRANCH. Work on the subtask of the branch call shown above. You cannot branch or finish. When done, report to MAIN:
<function=return>
<parameter=message>
Findings, their sources, and what remains uncertain.
</parameter>
</function>"""

#: Ours (release: "context limit has been exceeded…"): the constraint on a branch's last allowed call.
CONTEXTFOLD_FORCED_RETURN = """Your branch budget is used up. Do not search any more: call return now with the progress made, the sources, and the pending jobs."""

#: Ours (not in the release): the last main call of the shared T_max budget.
CONTEXTFOLD_FORCE_FINISH = """The call budget is exhausted. Do not branch or search: call finish now with your best answer."""

#: Ours: the reminder after each observation (the release nudges the agent to keep working).
CONTEXTFOLD_NUDGE_MAIN = "Continue: branch the next subtask, or finish when the evidence is sufficient."
CONTEXTFOLD_NUDGE_BRANCH = "You are now in branch mode: {description}. Continue the subtask, or return your findings."
