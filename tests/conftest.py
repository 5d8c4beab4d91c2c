"""Shared fixtures: the tiny Qwen3.5 (built once per session), a loopback SGLang, the shared data."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MMCF_SHARED_DIR", REPO.parent / "shared"))


# ------------------------------------------------------------------ how the suite is spread over workers
# Most tests wait on processes they started (servers, commands), so scripts/test.sh runs more workers than cores.
# A test is its own unit of work, except where tests share an expensive fixture: the modules using the SGLang
# oracle or SGLang's real front end (session fixtures, tests/conformance/conftest.py) form one unit so each starts
# once per run, and a module with a module-scoped fixture is one unit. Units marked ``slow`` go out first, then the
# larger units, so the longest work does not start last.
ONE_UNIT = dict.fromkeys(
    ["tests/conformance/test_sglang_frontend.py", "tests/conformance/test_sglang_launcher.py",
     "tests/conformance/test_sglang_cache.py",
     "tests/conformance/test_sglang_reasoning.py", "tests/conformance/test_sglang_requests.py"], "sglang")


def unit_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    if module in ONE_UNIT:
        return ONE_UNIT[module]
    return module if _has_module_fixture(module) else nodeid


_module_fixture: dict = {}


def _has_module_fixture(module: str) -> bool:
    if module not in _module_fixture:
        path = REPO / module
        _module_fixture[module] = path.is_file() and 'scope="module"' in path.read_text()
    return _module_fixture[module]


class UnitScheduling(LoadScopeScheduling):
    """pytest-xdist's loadscope over :func:`unit_of`, in collection order (see pytest_collection_modifyitems)."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") not in ("load", "loadscope"):
        return None  # another --dist asked for by name: pytest-xdist's own
    config.option.loadscopereorder = False
    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    size: dict = {}
    for item in items:
        size[unit_of(item.nodeid)] = size.get(unit_of(item.nodeid), 0) + 1
    slow = {unit_of(i.nodeid) for i in items if i.get_closest_marker("slow")}
    items.sort(key=lambda i: (unit_of(i.nodeid) not in slow, -size[unit_of(i.nodeid)]))


@pytest.fixture(autouse=True, scope="session")
def _console_logging():
    """What the commands say on stderr, as every command's parser sets it up (library calls in tests say it too)."""
    from agent.cli import setup_logging

    setup_logging()


@pytest.fixture(autouse=True)
def _no_credentials_carried_over():
    """Each test starts with no credential registered (agent/redact.py keeps them per process)."""
    from agent.redact import CREDENTIALS

    CREDENTIALS.clear()
    yield
    CREDENTIALS.clear()


def have_local_extra() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    if not have_local_extra():
        pytest.skip("needs the 'local' extra (torch, transformers)")
    from agent.backends.tiny_model import ensure_tiny_model

    cached = os.environ.get("MMCF_TINY_MODEL_DIR")
    return ensure_tiny_model(cached or tmp_path_factory.mktemp("tiny") / "tiny-qwen35", quiet=True)


@pytest.fixture(scope="session")
def local_backends(tiny_model_dir):
    from agent.backends.local import LocalBackend

    return {m: LocalBackend(tiny_model_dir, logprob_mode=m) for m in ("raw", "scaled")}


@pytest.fixture
def fake_sglang(tiny_model_dir):
    from serving.fakes.sglang_server import FakeSGLang

    with FakeSGLang(tokenizer_dir=str(tiny_model_dir)) as srv:
        yield srv


@pytest.fixture
def red_image(tmp_path) -> Path:
    from PIL import Image

    p = tmp_path / "red.png"
    Image.new("RGB", (120, 90), (200, 30, 30)).save(p)
    return p


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared data not found at {SHARED}")
    return SHARED


@pytest.fixture
def live_web(monkeypatch):
    """The live tools pointed at serving/fakes/web_apis.py (Serper search and Lens, Jina Reader, Serper scrape),
    with fake keys; ``web.log`` lists every request the fake APIs received."""
    from serving.fakes.web_apis import FakeWeb

    with FakeWeb() as web:
        monkeypatch.setenv("SERPER_API_KEY", "sk-fake")
        monkeypatch.setenv("JINA_API_KEY", "jina-fake")
        monkeypatch.setenv("MMCF_SERPER_BASE", web.url)
        monkeypatch.setenv("MMCF_SERPER_SCRAPE_BASE", web.url + "/scrape")
        monkeypatch.setenv("MMCF_JINA_BASE", web.url)
        monkeypatch.setenv("MMCF_LENS_URL_TEMPLATE", "https://images.example/{sha256}")
        yield web


# ------------------------------------------------------------------ a guard that fires says what it is
@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A subprocess guard that fires (tests/guards.py) fails its test in one line saying what hung and for how
    long, as a guard against a hang (never a verdict on speed), not with a TimeoutExpired traceback."""
    import subprocess

    try:
        return (yield)
    except subprocess.TimeoutExpired as e:
        cmd = e.cmd if isinstance(e.cmd, str) else " ".join(map(str, e.cmd))
        pytest.fail(f"no progress for {e.timeout:.0f} s: {cmd[:300]} (a guard against a hang, not a verdict on "
                    "speed; tests/guards.py)", pytrace=False)


# ------------------------------------------------------------------ what the Slurm tier did, shown in every run
def pytest_terminal_summary(terminalreporter):
    """tests/test_slurm.py records its commands and the tasks' states (``record_property("slurm", ...)``); a passing
    test's output is hidden, so the summary shows them (each worker's reports carry their properties)."""
    for rep in terminalreporter.stats.get("passed", []):
        for key, text in getattr(rep, "user_properties", []):
            if key == "slurm" and rep.when == "call":
                terminalreporter.write_sep("-", "Slurm: one-node cluster, scripts/slurm_array.sh")
                terminalreporter.write_line(text)


@pytest.fixture
def web(monkeypatch):
    """Loopback Serper / Lens / Jina (serving/fakes/web_apis.py), the live tools pointed at it."""
    from serving.fakes.web_apis import FakeWeb

    with FakeWeb() as w:
        for var, value in (("SERPER_API_KEY", "serper-test-key-1"), ("JINA_API_KEY", "jina-test-key-1"),
                           ("MMCF_SERPER_BASE", w.url), ("MMCF_SERPER_SCRAPE_BASE", w.url + "/scrape"),
                           ("MMCF_JINA_BASE", w.url), ("MMCF_LENS_URL_TEMPLATE", "https://img.example/{benchmark}/{filename}")):
            monkeypatch.setenv(var, value)
        yield w
