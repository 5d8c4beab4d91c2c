"""The judge (paper B.6, appendix E.5) and judge agreement: grade a run's answers, compare two judges.

- ``grading.py``: the E.5 prompt's reply parser, exact match, the :class:`Grader` and :func:`judge_run`;
- ``agreement.py``: two judges of one run compared (Cohen's kappa, confusion, accuracy gap);
- ``cli.py``: ``python -m agent.judge RUN`` and ``python -m agent.judge agree RUN``.

Stored grades are read back in the records layer (``agent/rundir/grades.py``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

__all__ = ["parse_grade", "exact_grade", "judge_run", "accuracy_table", "Grader", "GRADES", "main", "identical_trials",
           "DEFAULT_MODEL", "read_grades", "judge_key_env"]

# loaded when first read: ``python -m agent.judge --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "accuracy_table": "..rundir.accuracy", "identical_trials": "..rundir.grades", "read_grades": "..rundir.grades",
    "main": ".cli", **{n: ".grading" for n in ("DEFAULT_MODEL", "GRADES", "Grader", "exact_grade", "judge_key_env",
                                                  "judge_run", "parse_grade")}})

if TYPE_CHECKING:
    from ..rundir.accuracy import accuracy_table
    from ..rundir.grades import identical_trials, read_grades
    from .cli import main
    from .grading import DEFAULT_MODEL, GRADES, Grader, exact_grade, judge_key_env, judge_run, parse_grade
