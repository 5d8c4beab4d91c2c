"""The judge (paper B.6, appendix E.5): grade a run's answers, then accuracy in the layout of Table 1.

    python -m agent.judge RUN_DIR                                   # OpenRouter google/gemini-3-flash-preview ($OPENROUTER_API_KEY)
    python -m agent.judge RUN_DIR --endpoint http://gpu:30000 --model qwen3.5-27b
    python -m agent.judge RUN_DIR --judge exact                     # offline: normalised exact / contains match

The E.5 extract-then-grade prompt, temperature 0, 8 concurrent requests. The two-line reply is parsed
into CORRECT / INCORRECT / NOT_ATTEMPTED (textual grades or the letters A/B/C); any other reply is
UNPARSED — counted and shown, never silently INCORRECT. Trajectories that failed (status other
than ``ok``) or gave an empty answer are NOT_ATTEMPTED without calling the judge. Accuracy = CORRECT
/ all samples; mean ± std (ddof=1) over trials, per benchmark and per category; Avg. is weighted by
the number of samples. Written beside the run: ``judge-<name>.jsonl`` (resumable: a rerun grades
only what is new or whose answer changed), ``judge-<name>-summary.json``, ``table1-<name>.md/.csv``.
``--judge exact`` is labelled "exact-match (offline)" in every output: it is not the paper's judge.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import sys
import time
import unicodedata
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from ..backends.base import BackendError, ModelServerDown, SamplingParams
from ..backends.openai_compat import OpenAIBackend
from ..cli import JUDGE_ENDPOINT, JUDGE_MODEL
from ..errors import gather_all
from ..preflight import server_facts
from ..prompts import JUDGE, fill
from ..record import Grade, LineSummary, validate
from ..redact import is_host, public_url, redact
from ..rundir import RunDir, RunError, close_fragment, load_run, output_lock, write_json
from ..rundir.accuracy import accuracy_table
from ..rundir.grades import grade_file, identical_trials, read_grades
from ..rundir.lines import SOURCE_KEY, RowWriter, set_aside
from ..trajectory import responses_fingerprint  # re-exported

log = logging.getLogger(__name__)

__all__ = ["parse_grade", "exact_grade", "judge_run", "accuracy_table", "Grader", "GRADES", "identical_trials", "responses_fingerprint",
           "DEFAULT_MODEL", "read_grades", "judge_key_env"]

GRADES = ("CORRECT", "INCORRECT", "NOT_ATTEMPTED", "UNPARSED")
#: The judge's token limit per reply (ours), and the limit a reply cut by it is asked again with.
JUDGE_MAX_TOKENS, JUDGE_RETRY_TOKENS = 2048, 8192
_LETTER = {"A": "CORRECT", "B": "INCORRECT", "C": "NOT_ATTEMPTED"}
_WORD = {"CORRECT": "CORRECT", "INCORRECT": "INCORRECT", "NOT ATTEMPTED": "NOT_ATTEMPTED",
         "NOTATTEMPTED": "NOT_ATTEMPTED"}
DEFAULT_ENDPOINT, DEFAULT_MODEL = JUDGE_ENDPOINT, JUDGE_MODEL  # agent/cli.py: the one constant
DEFAULT_KEY_ENV = "OPENROUTER_API_KEY"




def judge_key_env(endpoint: str, given: str | None) -> str | None:
    """The environment variable whose key is sent to ``endpoint``: the one given, else OPENROUTER_API_KEY for
    OpenRouter only. A key is never sent to a server it was not meant for."""
    if given:
        return given
    return DEFAULT_KEY_ENV if is_host(endpoint, "openrouter.ai") else None


def _grade_token(s: str) -> str | None:
    """One grade from 'A', 'CORRECT', '**B**', 'C (NOT_ATTEMPTED)', 'INCORRECT - B'; None otherwise."""
    words = re.sub(r"[*_`\"'\[\]().:,=-]+", " ", s).upper().split()
    t = " ".join(words)
    if t in _LETTER:
        return _LETTER[t]
    if t in _WORD:
        return _WORD[t]
    if len(words) >= 2:
        for letter, word in ((words[0], " ".join(words[1:])), (words[-1], " ".join(words[:-1]))):
            if letter in _LETTER and _WORD.get(word) == _LETTER[letter]:
                return _LETTER[letter]
    return None


def parse_grade(reply: str) -> tuple[str, str | None]:
    """``(grade, extracted)`` from the judge's reply; ``UNPARSED`` unless exactly one grade is stated."""
    text = (reply or "").strip()
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.S).strip()
    extracted = None
    m = re.search(r"^\W*extracted\W*:\s*(.+)$", text, flags=re.I | re.M)
    if m:
        extracted = m.group(1).strip().strip("*").strip()
    grades = []
    for gm in re.finditer(r"^\W*grade\W*:\s*(.+?)\s*$", text, flags=re.I | re.M):
        g = _grade_token(gm.group(1))
        grades.append(g)
    if not grades:  # the bare reply is just a grade
        g = _grade_token(text) if len(text) <= 20 else None
        return (g, extracted) if g else ("UNPARSED", extracted)
    first = grades[0]
    if first is None or any(g != first for g in grades):
        return "UNPARSED", extracted
    return first, extracted


def _norm(s: str) -> str:
    s = unicodedata.normalize("NFKD", str(s)).encode("ascii", "ignore").decode().lower()
    s = re.sub(r"[^a-z0-9.\s]", " ", s)
    s = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", s)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_grade(answer: str, gold: str) -> str:
    """Offline grading: CORRECT when the normalised gold (every ';'-separated part) appears in the answer."""
    a = _norm(answer)
    if not a:
        return "NOT_ATTEMPTED"
    parts = [_norm(p) for p in str(gold).split(";") if _norm(p)]
    if not parts:
        return "UNPARSED"  # no gold to compare with (a manifest flaw): reported, not guessed
    ok = all(re.search(rf"(?<![a-z0-9]){re.escape(p)}(?![a-z0-9])", a) for p in parts)
    return "CORRECT" if ok else "INCORRECT"


def _answer_key(line: LineSummary) -> str:
    return hashlib.sha256(json.dumps([line.status, line.answer, line.gold]).encode()).hexdigest()[:16]


class Grader:
    """Grades result lines: failed/empty -> NOT_ATTEMPTED, else exact match or the E.5 LLM judge (T=0).

    ``await grader.grade(line)`` returns a record with ``grade``, ``extracted``, ``reply``, ``reason``
    (and ``failed`` when the judge call itself failed). Shared by ``agent.judge`` and the probes.
    """

    def __init__(self, judge: str = "llm", *, endpoint: str = DEFAULT_ENDPOINT, model: str = DEFAULT_MODEL,
                 api_key_env: str | None = None, server: str = "openrouter", concurrency: int = 8,
                 backend=None):
        if judge not in ("llm", "exact"):
            raise ValueError(f"judge must be 'llm' or 'exact', got {judge!r}")
        self.judge = judge
        self.name = judge
        if backend is not None:  # a given backend grades: name its model, not the default one
            model, endpoint = getattr(backend, "model", model), getattr(backend, "base", None) or backend.name
        self.label = ("exact-match (offline; NOT the paper's LLM judge)" if judge == "exact"
                      else f"LLM judge {model} @ {public_url(endpoint)} (paper E.5 prompt, T=0)")
        self._spec = (endpoint, model, api_key_env, server)
        self.backend = backend
        self._own = False
        self.sem = asyncio.Semaphore(concurrency)
        # T = 0 (paper B.6); top-p 1.0 and 2,048 tokens are ours (the release ships no judge): docs/fidelity.md
        self.sp = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=JUDGE_MAX_TOKENS, top_logprobs=0,
                                 enable_thinking=None)

    def client(self):
        if self.backend is None:
            endpoint, model, key_env, server = self._spec
            key_env = judge_key_env(endpoint, key_env)
            if key_env and not os.environ.get(key_env):
                default = is_host(endpoint, "openrouter.ai") and key_env == DEFAULT_KEY_ENV
                raise BackendError(f"{key_env} is not set" + (f": the default judge is {model} on OpenRouter. Set it, "
                                   "point --judge-endpoint/--judge-model at another OpenAI-compatible server, or use "
                                   "--judge exact offline" if default else f" (--api-key-env for {public_url(endpoint)})"))
            self.backend = OpenAIBackend(endpoint, model, server=server, api_key_env=key_env)
            self._own = True
        return self.backend

    def needs_client(self, lines: list[LineSummary]) -> bool:
        return self.judge == "llm" and any(ln.status == "ok" and ln.answer.strip() for ln in lines)

    async def grade(self, ln: LineSummary) -> dict:
        rec = {"sample_id": ln.sample_id, "trial": ln.trial, "answer_key": _answer_key(ln), SOURCE_KEY: ln.line_sha256,
               "benchmark": ln.benchmark, "category": ln.category, "paper_category": ln.paper_category,
               "method": ln.method, "variant": ln.variant, "answer": ln.answer, "gold": ln.gold, "judge": self.label}
        answer = ln.answer.strip()
        if ln.status != "ok" or not answer:
            rec.update(grade="NOT_ATTEMPTED", extracted=None, reply=None,
                       reason=f"trajectory status {ln.status}" if ln.status != "ok" else "empty answer")
        elif self.judge == "exact":
            rec.update(grade=exact_grade(answer, ln.gold), extracted=answer, reply=None, reason="exact")
        else:
            prompt = fill(JUDGE, question=ln.question, correct_answer=ln.gold, response=answer)
            client = self.client()
            async with self.sem:
                try:
                    rec.update(await self._ask(client, prompt))
                except ModelServerDown:  # the command ends here, every finished grade kept
                    raise
                except BackendError as e:  # recorded and retried on the next run
                    rec.update(grade="UNPARSED", extracted=None, reply=None, reason=f"judge call failed: {e}",
                               failed=True)
        return rec

    async def _ask(self, client, prompt: str) -> dict:
        """One grade from the judge. A reply cut by its token limit is no grade, whatever it holds (a tentative
        "Grade: B" in cut reasoning is not the judge's verdict): it is asked again with ``JUDGE_RETRY_TOKENS``; cut
        again, it is UNPARSED with the reason said (never silently)."""
        msgs: list[dict] = [{"role": "user", "content": prompt}]
        usage: dict = {}
        for attempt, sp in enumerate((self.sp, replace(self.sp, max_tokens=JUDGE_RETRY_TOKENS))):
            out = await client.generate(msgs, sp)
            for k in ("prompt_tokens", "completion_tokens", "cached_tokens"):  # for the run's cost ledger
                usage[k] = usage.get(k, 0) + (getattr(out.usage, k) or 0)
            if out.usage.cost is not None:  # the provider's bill, when it sends one (summed over asks)
                usage["cost"] = usage.get("cost", 0.0) + out.usage.cost
            cut = out.finish_reason == "length"
            g, ext = ("UNPARSED", None) if cut else parse_grade(out.visible or out.reasoning)
            if not cut:
                break
        if cut:
            reason = f"the judge's reply was cut by its token limit twice ({JUDGE_MAX_TOKENS}, then {JUDGE_RETRY_TOKENS})"
        else:
            reason = "llm" if attempt == 0 else f"llm (asked again with {JUDGE_RETRY_TOKENS} tokens: the first reply was cut)"
        # the model the reply names: a silently rerouted judge shows up (and is refused in tables)
        return dict(grade=g, extracted=ext, reply=out.text, reason=reason, judge_served_model=out.model or None,
                    usage=usage)

    async def aclose(self) -> None:
        if self._own and self.backend is not None:
            await self.backend.aclose()


def _previous(path: Path, key: str):
    """``key`` of an earlier summary (a rerun that graded nothing asked no server)."""
    try:
        return json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def _graded_before(rd: RunDir, name: str, label: str, regrade: bool, sources: dict) -> dict:
    """The grades this judge already stored, by (sample, trial, source line's seal). Grades of another judge in the
    file are refused, or with ``regrade`` moved aside with everything made from them (under one suffix). Grades that
    cannot be counted (changed since written, torn, or of another line) are set aside into ``quarantine/`` (named)
    and their units graded again."""
    out_path = rd.path / f"judge-{name}.jsonl"
    if out_path.exists():
        labels = {r.judge for r in read_grades(out_path)}
        if labels - {label}:
            if not regrade:
                raise RunError(f"{out_path} was graded by {', '.join(sorted(map(str, labels - {label})))}; this judge is "
                               f"{label}. One file, one judge: give this judge its own --judge-name NAME to keep both "
                               "(then python -m agent.judge agree compares them), or pass --regrade to grade "
                               "everything again with this one (the old grades, summary and table are kept beside "
                               "them)")
            suffix = f"replaced-{int(time.time())}"
            for old in (out_path, rd.path / f"judge-{name}-summary.json", rd.path / f"table1-{name}.md",
                        rd.path / f"table1-{name}.csv"):
                if old.exists():
                    old.rename(old.with_name(f"{old.name}.{suffix}"))
    gf = grade_file(out_path, sources)
    problem = gf.problem()
    if problem:
        q = set_aside(gf.sealed, gf.unusable())
        log.warning(f"warning: {problem}: set aside in {q}; those units are graded again")
    return {(r.sample_id, r.trial, r.source_sha256): r for r in gf.current.values()}


async def judge_run(run_dir, **kw) -> dict:
    """Grade every (sample, trial) of the run (resumable); returns the summary dict. ``name``: the judge's file
    (``judge-NAME.jsonl``; default ``llm`` / ``exact``): a second judge gets a name of its own. One judge per run
    at a time: a second is refused at once (both would pay for every grade and store it twice)."""
    RunDir(run_dir).read_header()  # a directory that is not a run is named before anything is created in it
    with output_lock(run_dir, "judge", ".judge.lock"):
        return await _judge_run(run_dir, **kw)


async def _judge_run(run_dir, *, judge: str = "llm", endpoint: str = DEFAULT_ENDPOINT, model: str = DEFAULT_MODEL,
                     api_key_env: str | None = None, server: str = "openrouter", concurrency: int = 8,
                     backend=None, progress: bool = True, regrade: bool = False, name: str | None = None,
                     retry_unparsed: bool = False) -> dict:
    run = load_run(run_dir)
    rd = RunDir(run.path)
    lines = run.index
    grader = Grader(judge, endpoint=endpoint, model=model, api_key_env=api_key_env, server=server,
                    concurrency=concurrency, backend=backend)
    if name is not None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name) or (name == "exact") != (judge == "exact"):
            raise RunError(f"--judge-name {name!r}: letters, digits, '.', '_' and '-' ('exact' is the offline "
                           "judge's own name)")
        grader.name = name
    name, label = grader.name, grader.label
    out_path = rd.path / f"judge-{name}.jsonl"
    sources = run.seals()
    done = _graded_before(rd, name, label, regrade, sources)
    # an UNPARSED grade is kept as it came (the judge's reply, stored); --retry-unparsed asks the judge again and
    # the new grade, appended, is the unit's (the offline judge's UNPARSED, no gold, would come out the same)
    again = {k for k, r in done.items() if retry_unparsed and judge != "exact" and r.grade == "UNPARSED"}
    pending = [ln for ln in lines if (key := (ln.sample_id, ln.trial, ln.line_sha256)) not in done or key in again]
    log.info(f"judge [{label}]: {len(lines)} trajectories, {len(lines) - len(pending)} already graded"
             + (f"; {len(again)} UNPARSED asked again" if again else ""))
    judge_server = None
    if grader.needs_client(pending):
        client = grader.client()  # fail early (missing key) before any work
        if getattr(client, "server", None) == "sglang":  # a self-hosted judge: the facts of the server grading
            judge_server = await server_facts(client, client.base.removesuffix("/v1"))

    bar = tqdm(total=len(pending), desc="judge", unit="answer", disable=not progress, file=sys.stderr, mininterval=1.0)

    close_fragment(out_path)  # a grade cut by a kill stays a torn line of its own, skipped by every reader
    out = RowWriter(out_path, "grade")

    async def grade(ln: LineSummary) -> Grade:
        rec = await grader.grade(ln)
        where = f"{out_path} ({rec['sample_id']} trial {rec['trial']})"
        # each paid grade lands as soon as it comes: a kill loses none of them; a failed call is counted, not kept
        g = validate("grade", rec, where) if rec.get("failed") else out.append(rec, where)
        bar.update(1)
        return g

    try:
        results = await gather_all(grade(ln) for ln in pending)
    finally:
        bar.close()
        try:
            out.close()
        finally:  # the judge's client closed whatever closing the file raised (no "Unclosed client session")
            await grader.aclose()
    graded = {(r.sample_id, r.trial, r.source_sha256): r for r in [*done.values(), *results]}
    current = [graded[(ln.sample_id, ln.trial, ln.line_sha256)] for ln in lines]
    refused = identical_trials(lines)
    if refused:
        log.warning(f"WARNING: {rd.path}: {refused}")
    summary = accuracy_table(current, label=label, run_label=run.header.label or run.header.method,
                             std_refused=refused)
    summary["judge"] = label
    summary["judge_server"] = judge_server or _previous(rd.path / f"judge-{name}-summary.json", "judge_server")
    summary["lines_changed"] = list(run.changed)  # left out of the grading, edited or damaged in place
    summary["failed_judge_calls"] = sum(1 for r in results if r.failed)
    table = summary.pop("table")
    write_json(rd.path / f"judge-{name}-summary.json", summary, indent=2)  # redacted as it is serialised
    (rd.path / f"table1-{name}.md").write_text(redact(summary["markdown"]))
    table.to_csv(rd.path / f"table1-{name}.csv", index=False)
    return summary
