"""Commands start fast: ``--help`` and argument errors load neither SciPy nor matplotlib/seaborn (each ~0.4-0.6 s
of start-up, more on a loaded machine) nor pandas (~0.3 s; agent/lazy.py); they load with the first statistic, figure
or table (issues 59, 68). Asserted on what is imported, not on a time."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conformance.conftest import REPO

COMMANDS = ["probes.entropy", "probes.removal", "probes.grounding", "probes.fidelity", "probes.prefix_cache",
            "agent.judge", "analysis.report", "agent.show", "agent.run", "agent.rundir", "agent.benchmarks",
            "serving.check"]
HEAVY = ("scipy", "matplotlib", "seaborn", "torch", "transformers", "pandas")

PROBE = """
import json, runpy, sys
sys.argv = [sys.argv[1], "--help"]
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit:
    pass
print("\\n" + json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(%r))))
""" % (HEAVY,)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_loads_no_statistics_table_or_plotting_package(command):
    r = subprocess.run([sys.executable, "-c", PROBE, command], cwd=REPO, capture_output=True, text=True,
                       timeout=600)  # a guard against a hang only
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage:" in r.stdout
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [], f"python -m {command} --help imports them"


def test_a_statistic_and_a_figure_load_their_packages_on_first_use():
    code = """
import sys
from analysis.stats import wilcoxon_p
from analysis.figures.style import pyplot
assert "scipy" not in sys.modules and "matplotlib" not in sys.modules
p = wilcoxon_p([0.3, -0.1, 0.4, 0.2, 0.5, 0.1])
assert 0 <= p <= 1 and "scipy.stats" in sys.modules
plt, sns = pyplot()
assert plt.get_backend().lower() == "agg" and sns is sys.modules["seaborn"]
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=600)  # a guard against a hang only
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_a_mistyped_flag_gets_the_suggestion_and_the_way_to_help_not_the_whole_usage(capsys):
    from agent.run import main as run_main

    with pytest.raises(SystemExit) as e:
        run_main(["--metod", "react"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.splitlines() == ["python -m agent.run: error: unrecognized argument: --metod (did you mean --method?)",
                                "  python -m agent.run --help lists the options"]


def test_reproduce_figure2_without_a_serper_key_names_its_own_offline_path():
    env = {k: v for k, v in __import__("os").environ.items() if k != "SERPER_API_KEY"}
    r = subprocess.run(["bash", "scripts/reproduce_figure2.sh", "--benchmark", "DATA/x", "--endpoint", "http://a",
                        "--endpoint", "http://b", "--model-dir", "/m"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)  # a guard against a hang only
    assert r.returncode == 2 and "SERPER_API_KEY is not set" in r.stderr
    assert "reproduce_figure2.sh --demo" in r.stderr and "--tools offline" not in r.stderr
