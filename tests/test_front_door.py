"""One front door (issue 82): ``mmcf`` lists every command, and each subcommand is the program its ``python -m`` form
runs; ``mmcf --help`` and a misspelled command are answered without importing the toolkit."""
from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from mmcf.cli import COMMANDS
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S


def _run(*args):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_mmcf_help_lists_every_command_with_one_line_and_imports_none_of_the_toolkit():
    r = _run("-m", "mmcf", "--help")
    assert r.returncode == 0
    for name, (module, _) in COMMANDS.items():
        line = next(x for x in r.stdout.splitlines() if x.strip().startswith(name + " "))
        assert f"(python -m {module})" in line
    # every program with a python -m form is a command (a module with __main__, or one that runs as main)
    mains = {str(p.parent.relative_to(REPO)).replace("/", ".") for p in REPO.glob("*/*/__main__.py")}
    mains |= {str(p.relative_to(REPO))[:-3].replace("/", ".") for p in REPO.glob("*/*.py")
              if p.parent.name in ("agent", "probes", "analysis", "serving")
              and 'if __name__ == "__main__"' in p.read_text() and "def main(" in p.read_text()}
    internal = {"agent.tools.demo_world", "serving.server_args", "serving.fakes.standin", "mmcf"}  # not a user's command
    assert mains - internal <= {m for m, _ in COMMANDS.values()}, mains - internal - {m for m, _ in COMMANDS.values()}
    code = ("import sys, json; from mmcf.cli import main; sys.argv=['mmcf','--help']; main(); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('agent','probes','analysis','serving','numpy','pandas','aiohttp','httpx'))))")
    loaded = json.loads(_run("-c", code).stdout.strip().splitlines()[-1])
    assert loaded == [], loaded


def test_a_misspelled_command_is_named_with_the_nearest():
    r = _run("-m", "mmcf", "entropi")
    assert r.returncode == 2 and "did you mean 'entropy'" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_each_subcommand_is_its_python_m_program():
    def both(name):  # every command through the front door; a few beside their python -m form, byte for byte
        module = COMMANDS[name][0]
        same = name in ("run", "entropy", "report", "launch")
        return name, _run("-m", "mmcf", name, "--help"), _run("-m", module, "--help") if same else None
    with ThreadPoolExecutor(4) as ex:
        for name, front, direct in ex.map(both, COMMANDS):
            assert front.returncode == 0 and "usage:" in front.stdout, (name, front.stderr[-500:])
            assert direct is None or (direct.returncode == 0 and front.stdout == direct.stdout), name
    bad = _run("-m", "mmcf", "run", "--no-such-flag")
    assert bad.returncode == 2 and "--no-such-flag" in bad.stderr and "Traceback" not in bad.stderr


def test_one_spelling_per_idea_the_grounding_judge_and_its_re_asks(tmp_path):
    """--judge picks the judge in every command (the judge, removal and now grounding); the annotator's re-ask count
    is --re-asks, since --retries means transport retries (serving.check). The old spellings still parse, noticed."""
    r = _run("-m", "probes.grounding", str(tmp_path / "absent"), "--judge-backend", "openai", "--retries", "1")
    notices = [x for x in r.stderr.splitlines() if x.startswith("notice:")]
    assert notices == ["notice: --judge-backend is now --judge; the old name works in this version only",
                       "notice: --retries is now --re-asks; the old name works in this version only",
                       "notice: --judge openai is now --judge llm; the old value works in this version only"]
    # the flags parsed: the server judge (--judge llm) asks first for its key
    assert r.returncode != 0 and "is not set: the default annotator" in r.stderr and "Traceback" not in r.stderr
    r = _run("-m", "probes.grounding", str(tmp_path / "absent"), "--judge", "exact")
    assert r.returncode == 2 and "invalid choice: 'exact'" in r.stderr
