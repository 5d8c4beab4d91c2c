"""``python -m agent.judge``: grade a run (``agent/judge/grading.py``), or compare two judges (``agree``).

    python -m agent.judge RUN_DIR [--judge llm|exact] [--judge-endpoint URL --judge-model NAME]
    python -m agent.judge agree RUN_DIR [--judges A B]

The flags of both are here; the work (grading.py, agreement.py) loads once they parse, so ``--help`` and a usage
error need the standard library only.
"""
from __future__ import annotations

import asyncio
import logging
import sys

from ..cli import DEFAULT_CONCURRENCY, add_judge_args, done, make_parser
from ..errors import EXIT_DISK_FULL, ToolkitError, disk_full_message
from ..redact import is_host

log = logging.getLogger(__name__)

__all__ = ["main"]

GRADE_DOC = """The judge (paper B.6, appendix E.5): grade a run's answers, then accuracy in the layout of Table 1."""
AGREE_DOC = """Two judges of one run compared: Cohen's kappa, the confusion of their grades and the gap in accuracy."""


def _agree_parser():
    ap = make_parser("python -m agent.judge agree", AGREE_DOC, [
        "python -m agent.judge agree runs/react-27b", "python -m agent.judge agree runs/react-27b --judges llm qwen27b"])
    ap.add_argument("run_dir", help="a run graded by two judges (python -m agent.judge ... --judge-name NAME)")
    ap.add_argument("--judges", nargs=2, metavar=("A", "B"),
                    help="the two judges' names (judge-A.jsonl, judge-B.jsonl); default: the run's only two")
    ap.add_argument("--common-only", action="store_true", help="compare the units both judges graded (said)")
    ap.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    return ap


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["agree"]:
        a = _agree_parser().parse_args(args[1:])
        from .agreement import agree_command  # noqa: PLC0415 - the work loads once the arguments parse

        return agree_command(a)

    ap = make_parser("python -m agent.judge", GRADE_DOC, [
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
    ap.add_argument("--retry-unparsed", action="store_true",
                    help="ask the judge again for the answers whose grade is UNPARSED (its reply stated no grade); "
                         "the new grade is appended and counts")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    a = ap.parse_args(args)
    from .grading import judge_run  # noqa: PLC0415 - the work loads once the arguments parse

    server = "openrouter" if is_host(a.judge_endpoint, "openrouter.ai") else "other"
    try:
        s = asyncio.run(judge_run(a.run_dir, judge=a.judge, endpoint=a.judge_endpoint, model=a.judge_model,
                                  api_key_env=a.judge_api_key_env, server=server, concurrency=a.concurrency,
                                  progress=a.progress, regrade=a.regrade, name=a.judge_name,
                                  retry_unparsed=a.retry_unparsed))
    except (ToolkitError, OSError) as e:
        full = disk_full_message(e, a.run_dir, "Grades written")
        log.error(full or f"error: {e}")
        return EXIT_DISK_FULL if full else 2
    print(s["markdown"])
    if s["unparsed"] and a.judge != "exact":
        log.info(f"{s['unparsed']} answer(s) graded UNPARSED (the judge's reply stated no grade; counted as not "
                 f"correct): python -m agent.judge {a.run_dir} --retry-unparsed asks the judge again")
    if s["failed_judge_calls"]:
        log.info(f"{s['failed_judge_calls']} judge calls failed; rerun to retry them")
        return 1
    if s.get("lines_changed"):  # graded without them (warned above): the table is not the whole run's
        log.info(f"{len(s['lines_changed'])} line(s) of the run changed since they were written and were not graded; "
                 f"python -m agent.rundir check {a.run_dir} lists them")
        return 1
    name = a.judge_name or ("exact" if a.judge == "exact" else "llm")
    done([f"{a.run_dir}/judge-{name}.jsonl, judge-{name}-summary.json, table1-{name}.md/.csv"],
         f"python -m analysis.report --runs {a.run_dir}" + (f" --judge {name}" if name == "exact" else ""))
    return 0

