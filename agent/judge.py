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
import os
import re
import sys
import time
import unicodedata

import numpy as np

from .backends.base import BackendError, SamplingParams
from .cli import JUDGE_ENDPOINT, JUDGE_MODEL
from .http import is_host, public_url
from .prompts import JUDGE, fill
from .rundir import RunDir, RunError
from .trajectory import responses_fingerprint  # re-exported

__all__ = ["parse_grade", "exact_grade", "judge_run", "accuracy_table", "Grader", "GRADES", "main", "identical_trials",
           "responses_fingerprint", "DEFAULT_MODEL"]

GRADES = ("CORRECT", "INCORRECT", "NOT_ATTEMPTED", "UNPARSED")
_LETTER = {"A": "CORRECT", "B": "INCORRECT", "C": "NOT_ATTEMPTED"}
_WORD = {"CORRECT": "CORRECT", "INCORRECT": "INCORRECT", "NOT ATTEMPTED": "NOT_ATTEMPTED",
         "NOTATTEMPTED": "NOT_ATTEMPTED"}
DEFAULT_ENDPOINT, DEFAULT_MODEL = JUDGE_ENDPOINT, JUDGE_MODEL  # agent/cli.py: the one constant
DEFAULT_KEY_ENV = "OPENROUTER_API_KEY"




def identical_trials(lines) -> str | None:
    """Why a std over these trials would be meaningless, or None: every sample run in several trials has the
    very same responses in each (one trial repeated: a deterministic server without per-trial seeds, or a
    scripted backend). Table 1's "± std over three independent trials" needs them to differ somewhere."""
    by_sample: dict = {}
    for ln in lines:  # a line's summary carries its digest (runs recorded before it: computed from the events)
        by_sample.setdefault(ln["sample_id"], {})[ln["trial"]] = ln.get("responses_sha") or responses_fingerprint(ln)
    multi = {s: d for s, d in by_sample.items() if len(d) > 1}
    if not multi or any(len(set(d.values())) > 1 for d in multi.values()):
        return None
    trials = sorted({t for d in multi.values() for t in d})
    return (f"the trials {trials} are identical: each of the {len(multi)} samples run in several trials has the same "
            "responses in every trial (a deterministic server without per-trial seeds, or a scripted backend), so "
            "they are one trial repeated and a std over them is refused")


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
    if None in grades or len(set(grades)) != 1:
        return "UNPARSED", extracted
    return grades[0], extracted


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


def read_grades(path) -> list[dict]:
    """The records of a ``judge-*.jsonl``, read as bytes line by line: a torn line (a kill mid-write, a cut
    multi-byte character) is skipped, never a crash."""
    from pathlib import Path

    out = []
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return out
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            r = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            continue
        if isinstance(r, dict):
            out.append(r)
    return out


def _answer_key(line: dict) -> str:
    return hashlib.sha256(json.dumps([line["status"], line.get("answer"), line.get("gold")]).encode()).hexdigest()[:16]


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
        self.sp = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=2048, top_logprobs=0, enable_thinking=None)

    def client(self):
        if self.backend is None:
            from .backends.openai_compat import OpenAIBackend

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

    def needs_client(self, lines) -> bool:
        return self.judge == "llm" and any(ln["status"] == "ok" and (ln.get("answer") or "").strip() for ln in lines)

    async def grade(self, ln: dict) -> dict:
        rec = {"sample_id": ln["sample_id"], "trial": ln["trial"], "answer_key": _answer_key(ln),
               "benchmark": ln["benchmark"], "category": ln.get("category"), "paper_category": ln.get("paper_category"),
               "method": ln["method"], "variant": ln.get("variant", ""), "answer": ln.get("answer", ""),
               "gold": ln.get("gold"), "judge": self.label}
        answer = (ln.get("answer") or "").strip()
        if ln["status"] != "ok" or not answer:
            rec.update(grade="NOT_ATTEMPTED", extracted=None, reply=None,
                       reason=f"trajectory status {ln['status']}" if ln["status"] != "ok" else "empty answer")
        elif self.judge == "exact":
            rec.update(grade=exact_grade(answer, ln.get("gold", "")), extracted=answer, reply=None, reason="exact")
        else:
            prompt = fill(JUDGE, question=ln["question"], correct_answer=ln.get("gold", ""), response=answer)
            client = self.client()
            async with self.sem:
                try:
                    out = await client.generate([{"role": "user", "content": prompt}], self.sp)
                    g, ext = parse_grade(out.text or out.reasoning)
                    # the model the reply names: a silently rerouted judge shows up (and is refused in tables)
                    rec.update(grade=g, extracted=ext, reply=out.text, reason="llm", judge_served_model=out.model or None,
                               usage={"prompt_tokens": out.usage.prompt_tokens,  # for the run's cost ledger
                                      "completion_tokens": out.usage.completion_tokens,
                                      "cached_tokens": out.usage.cached_tokens})
                except BackendError as e:  # recorded and retried on the next run
                    rec.update(grade="UNPARSED", extracted=None, reply=None, reason=f"judge call failed: {e}",
                               failed=True)
        return rec

    async def aclose(self) -> None:
        if self._own and self.backend is not None:
            await self.backend.aclose()


async def judge_run(run_dir, *, judge: str = "llm", endpoint: str = DEFAULT_ENDPOINT, model: str = DEFAULT_MODEL,
                    api_key_env: str | None = None, server: str = "openrouter", concurrency: int = 8,
                    backend=None, progress: bool = True, regrade: bool = False, name: str | None = None) -> dict:
    """Grade every (sample, trial) of the run (resumable); returns the summary dict. ``name``: the judge's file
    (``judge-NAME.jsonl``; default ``llm`` / ``exact``): a second judge gets a name of its own."""
    rd = RunDir(run_dir)
    header = rd.read_header()
    lines = list(rd.latest().values())
    grader = Grader(judge, endpoint=endpoint, model=model, api_key_env=api_key_env, server=server,
                    concurrency=concurrency, backend=backend)
    if name is not None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name) or (name == "exact") != (judge == "exact"):
            raise RunError(f"--judge-name {name!r}: letters, digits, '.', '_' and '-' ('exact' is the offline "
                           "judge's own name)")
        grader.name = name
    name, label = grader.name, grader.label
    out_path = rd.path / f"judge-{name}.jsonl"
    done = {}
    if out_path.exists():
        labels = {r.get("judge") for r in read_grades(out_path)}
        if labels - {label}:
            if not regrade:
                raise RunError(f"{out_path} was graded by {', '.join(sorted(map(str, labels - {label})))}; this judge is "
                               f"{label}. One file, one judge: give this judge its own --judge-name NAME to keep both "
                               "(then python -m agent.judge agree compares them), or pass --regrade to grade "
                               "everything again with this one (the old grades, summary and table are kept beside "
                               "them)")
            # the old grades and everything made from them move aside together, under one suffix
            suffix = f"replaced-{int(time.time())}"
            for old in (out_path, rd.path / f"judge-{name}-summary.json", rd.path / f"table1-{name}.md",
                        rd.path / f"table1-{name}.csv"):
                if old.exists():
                    old.rename(old.with_name(f"{old.name}.{suffix}"))
    for r in read_grades(out_path):
        try:
            done[(r["sample_id"], r["trial"], r["answer_key"])] = r
        except KeyError:
            continue
    pending = [ln for ln in lines if (ln["sample_id"], ln["trial"], _answer_key(ln)) not in done]
    print(f"judge [{label}]: {len(lines)} trajectories, {len(lines) - len(pending)} already graded", file=sys.stderr)
    if grader.needs_client(pending):
        grader.client()  # fail early (missing key) before any work
    from tqdm import tqdm

    bar = tqdm(total=len(pending), desc="judge", unit="answer", disable=not progress, file=sys.stderr, mininterval=1.0)

    from .rundir import close_fragment

    close_fragment(out_path)  # a grade cut by a kill stays a torn line of its own, skipped by every reader
    out = open(out_path, "ab")

    async def grade(ln: dict) -> dict:
        rec = await grader.grade(ln)
        if not rec.get("failed"):  # each paid grade lands as soon as it comes: a kill loses none of them
            out.write(json.dumps(rec, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n")
            out.flush()
        bar.update(1)
        return rec

    try:
        results = await asyncio.gather(*(grade(ln) for ln in pending))
    finally:
        out.close()
        bar.close()
        await grader.aclose()
    graded = {(r["sample_id"], r["trial"], r["answer_key"]): r for r in [*done.values(), *results]}
    current = [graded[(ln["sample_id"], ln["trial"], _answer_key(ln))] for ln in lines]
    refused = identical_trials(lines)
    if refused:
        print(f"WARNING: {rd.path}: {refused}", file=sys.stderr)
    summary = accuracy_table(current, label=label, run_label=header.get("label") or header.get("method", ""),
                             std_refused=refused)
    summary["judge"] = label
    summary["failed_judge_calls"] = sum(1 for r in results if r.get("failed"))
    table = summary.pop("table")
    (rd.path / f"judge-{name}-summary.json").write_text(json.dumps(summary, indent=2))
    (rd.path / f"table1-{name}.md").write_text(summary["markdown"])
    table.to_csv(rd.path / f"table1-{name}.csv", index=False)
    return summary


def _mean_std(vals: list[float], refused: bool = False) -> tuple[float, float | None]:
    """Mean and std (ddof = 1) in %; the std is None (printed "—") for one trial (undefined) or when refused."""
    a = np.asarray(vals, dtype=float)
    return float(a.mean() * 100), (float(a.std(ddof=1) * 100) if len(a) > 1 and not refused else None)


def fmt_mean_std(mean: float, std: float | None) -> str:
    return f"{mean:.1f} ± {std:.1f}" if std is not None else f"{mean:.1f} ± —"


def accuracy_table(records: list[dict], *, label: str = "", run_label: str = "", std_refused: str | None = None) -> dict:
    """Accuracy (%) per benchmark, per category and weighted overall: mean ± std over trials.

    ``std_refused``: why no std may be given (identical trials); the std is then None and the note says why."""
    import pandas as pd

    df = pd.DataFrame(records)
    if df.empty:
        raise RunError("nothing to grade: the run has no finished trajectories")
    df["correct"] = df["grade"] == "CORRECT"
    trials = sorted(df["trial"].unique())

    def block(sub: "pd.DataFrame") -> dict:
        per_trial = [sub[sub.trial == t]["correct"].mean() for t in trials if (sub.trial == t).any()]
        m, s = _mean_std(per_trial, refused=std_refused is not None)
        return {"n": int(sub[sub.trial == trials[0]].shape[0]), "mean": m, "std": s, "n_trials": len(per_trial),
                "per_trial": [p * 100 for p in per_trial],
                "grades": sub["grade"].value_counts().to_dict()}

    benchmarks = {b: block(g) for b, g in df.groupby("benchmark")}
    categories = {c: block(g) for c, g in df.groupby(df["category"].fillna("(none)"))}
    paper_categories = {c: block(g) for c, g in df.groupby(df["paper_category"].fillna("(none)"))}
    overall = block(df)
    cols, row = [], {"method": run_label}
    for b, r in benchmarks.items():
        cols.append(f"{b} (n={r['n']})")
        row[cols[-1]] = fmt_mean_std(r["mean"], r["std"])
    row["Avg."] = fmt_mean_std(overall["mean"], overall["std"])
    table = pd.DataFrame([row])
    why = (f" No std: {std_refused}." if std_refused else
           " No std: one trial (a std over one trial is undefined)." if len(trials) < 2 else "")
    md = [f"Accuracy (%), mean ± std (ddof = 1) over {len(trials)} trial(s). Judge: {label}.{why}", "",
          "| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns),
          "| " + " | ".join(str(v) for v in row.values()) + " |", "",
          "| category | n | accuracy |", "|---|---|---|"]
    md += [f"| {c} | {r['n']} | {fmt_mean_std(r['mean'], r['std'])} |" for c, r in categories.items()]
    unparsed = int((df["grade"] == "UNPARSED").sum())
    if unparsed:
        md += ["", f"**{unparsed} UNPARSED judge replies** (counted as not correct; see judge-*.jsonl)."]
    numeric = pd.DataFrame([{"method": run_label, "benchmark": b, "mean": r["mean"], "std": r["std"],
                             "n_trials": r["n_trials"], "n": r["n"]} for b, r in [*benchmarks.items(), ("Avg.", overall)]])
    return {"trials": [int(t) for t in trials], "benchmarks": benchmarks, "categories": categories,
            "paper_categories": paper_categories, "overall": overall, "unparsed": unparsed,
            "std_refused": std_refused, "markdown": "\n".join(md) + "\n", "table": numeric}


def main(argv=None) -> int:
    from .cli import DEFAULT_CONCURRENCY, add_judge_args, done, make_parser

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["agree"]:
        from .agreement import main as agree_main

        return agree_main(args[1:])

    ap = make_parser("python -m agent.judge", __doc__, [
        "python -m agent.judge runs/mmsearch-react-27b                      # Gemini-3-Flash on OpenRouter",
        "python -m agent.judge runs/x --judge-endpoint http://gpu:30001 --judge-model qwen3.5-27b",
        "python -m agent.judge runs/demo-react --judge exact                 # offline, labelled exact-match",
        "python -m agent.judge runs/x --judge-endpoint http://gpu:30002 --judge-model qwen3.5-27b --judge-name qwen27b",
        "python -m agent.judge agree runs/x --judges llm qwen27b             # kappa, confusion, accuracy gap"])
    ap.add_argument("run_dir", help="a run directory of python -m agent.run")
    ap.add_argument("--judge", default="llm", choices=("llm", "exact"),
                    help="llm = the paper's E.5 judge at T=0; exact = offline exact match (labelled so everywhere)")
    add_judge_args(ap)
    ap.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="judge calls at once (paper: 8)")
    ap.add_argument("--judge-name", metavar="NAME",
                    help="keep this judge's grades in judge-NAME.jsonl (a second judge beside the paper's; default: "
                         "llm, or exact); then: python -m agent.judge agree RUN")
    ap.add_argument("--regrade", action="store_true",
                    help="grades from another judge exist: grade everything again with this one (old file kept)")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    a = ap.parse_args(args)
    server = "openrouter" if is_host(a.judge_endpoint, "openrouter.ai") else "other"
    try:
        s = asyncio.run(judge_run(a.run_dir, judge=a.judge, endpoint=a.judge_endpoint, model=a.judge_model,
                                  api_key_env=a.judge_api_key_env, server=server, concurrency=a.concurrency,
                                  progress=a.progress, regrade=a.regrade, name=a.judge_name))
    except (RunError, BackendError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(s["markdown"])
    if s["failed_judge_calls"]:
        print(f"{s['failed_judge_calls']} judge calls failed; rerun to retry them", file=sys.stderr)
        return 1
    name = a.judge_name or ("exact" if a.judge == "exact" else "llm")
    done([f"{a.run_dir}/judge-{name}.jsonl, judge-{name}-summary.json, table1-{name}.md/.csv"],
         f"python -m analysis.report --runs {a.run_dir}" + (f" --judge {name}" if name == "exact" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
