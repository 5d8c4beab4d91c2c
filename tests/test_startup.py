"""Commands start fast: ``--help`` and a usage error are answered by the standard library alone (issue 82: at load 15 a
misspelled flag took 16.7 s to be named while aiohttp, httpx, numpy, pyarrow, pydantic and PIL loaded); the packages a
command computes with load after its arguments parse, and SciPy, matplotlib/seaborn and pandas only with the first
statistic, figure or table (issues 59, 68). Asserted on what is imported, not on a time."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mmcf.cli import COMMANDS
from tests.conformance.conftest import REPO

#: The toolkit's own packages; anything else a --help loads must be the standard library's (or the interpreter's
#: start-up: the editable install's path hook, setuptools' distutils shim, the platform's sysconfig data).
OWN = ("agent", "probes", "analysis", "serving", "mmcf")

PROBE = """
import json, runpy, sys
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit:
    pass
own, std = %r, set(sys.stdlib_module_names)
tops = {m.split(".")[0] for m in sys.modules}
print("\\n" + json.dumps(sorted(t for t in tops if t not in std and t not in own and not t.startswith("_"))))
""" % (OWN,)


def _loaded(module: str, *args: str) -> tuple[subprocess.CompletedProcess, list]:
    r = subprocess.run([sys.executable, "-c", PROBE, module, *args], cwd=REPO, capture_output=True, text=True,
                       timeout=600)  # a guard against a hang only
    return r, json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", sorted({m for m, _ in COMMANDS.values()}))
def test_help_and_a_usage_error_load_nothing_but_the_standard_library(module):
    r, loaded = _loaded(module, "--help")
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr[-2000:]
    assert loaded == [], f"python -m {module} --help imports them"
    r, loaded = _loaded(module, "--no-such-flag")
    assert "unrecognized argument" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert loaded == [], f"python -m {module} --no-such-flag imports them before it says so"


def test_a_statistic_and_a_figure_load_their_packages_on_first_use():
    code = """
import sys
from analysis.estimators.stats import wilcoxon_p
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
