"""The SGLang oracle: SGLang's own request models, parser and argument parsers in a side process.

Built by ``bash scripts/sglang_conformance.sh`` (CI builds it before the suite); the tests here skip with a
clear reason when it is absent.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.jsonio import dumps
from tests.guards import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("MMCF_SGLANG_SITE", REPO / ".venv-sglang" / "site"))


class Oracle:
    def __init__(self, site: Path):
        env = {**os.environ, "PYTHONPATH": str(site), "PYTHONWARNINGS": "ignore"}
        self.p = subprocess.Popen([sys.executable, str(Path(__file__).with_name("sglang_oracle.py"))], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.lock = threading.Lock()
        first = self._read(timeout=HANG_GUARD_S)
        if not first.get("ready"):
            raise RuntimeError(f"the SGLang oracle did not start: {first}")
        self.version = first["sglang"]

    def _read(self, timeout: float) -> dict:
        out: list = []
        t = threading.Thread(target=lambda: out.append(self.p.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not out or not out[0]:
            raise RuntimeError("the SGLang oracle did not answer (see scripts/sglang_conformance.sh)")
        return json.loads(out[0])

    def ask(self, op: str, **kw) -> dict:
        with self.lock:
            # the bytes our client would send (agent.http.dumps: numpy id arrays are written as JSON lists)
            self.p.stdin.write(dumps({"op": op, **kw}).decode() + "\n")
            self.p.stdin.flush()
            return self._read(timeout=HANG_GUARD_S)

    def close(self):
        self.p.kill()
        self.p.wait()


@pytest.fixture(scope="session")
def sglang():
    if not (SITE / "sglang").is_dir():
        pytest.skip(f"SGLang conformance layer not built at {SITE}: run bash scripts/sglang_conformance.sh")
    o = Oracle(SITE)
    yield o
    o.close()


# ------------------------------------------------------------------ SGLang's real front end (serving/fakes/standin.py)
class RealSGLang:
    """SGLang's own HTTP server, TokenizerManager and DetokenizerManager on 127.0.0.1, with our scheduler
    stand-in (``python -m serving.fakes.standin``); ``mode`` is ``scripted`` (the agents' policy), ``model``, or ``both``
    (either, as :meth:`use` chose)."""

    def __init__(self, site: Path, model_dir: Path, mode: str, log: Path):
        import socket
        import time
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_dir, self.log = model_dir, log
        # write a number here to make the stand-in leak cached state into repeated scorings (serving/fakes/standin.py)
        self.leak_file = log.with_suffix(".leak")
        # with mode "both", the engine that serves the next requests: see use()
        self.mode_file = log.with_suffix(".mode")
        # write 1 here to make the stand-in return raw logprobs (as SGLANG_RETURN_ORIGINAL_LOGPROB=1 does)
        self.original_file = log.with_suffix(".original")
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{site}", "PYTHONWARNINGS": "ignore"}
        cmd = [sys.executable, "-m", "serving.fakes.standin", "--model-path", str(model_dir), "--port", str(self.port),
               "--mode", mode, "--served-model-name", "tiny-qwen35", "--leak-file", str(self.leak_file),
               "--mode-file", str(self.mode_file), "--original-logprob-file", str(self.original_file)]
        if mode in ("scripted", "both"):
            cmd += ["--policy", "serving.fakes.policy:agent_policy"]
        self.p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                                  start_new_session=True)
        deadline = time.time() + 600  # a bound, not a timing assumption: a loaded 2-core machine takes 60-90 s
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"SGLang's front end exited ({self.p.returncode}); log:\n{self.tail()}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=5)
                return
            except OSError:
                time.sleep(0.5)
        self.close()
        raise RuntimeError(f"SGLang's front end did not answer within 600 s; log:\n{self.tail()}")

    def use(self, engine: str) -> "RealSGLang":
        """Serve the next requests with ``engine`` (``scripted`` or ``model``; a server started in mode ``both``)."""
        self.mode_file.write_text(engine)
        return self

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def close(self):
        import signal

        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
                self.p.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()


def _need_front_end():
    if not (SITE / "fastapi").is_dir():
        msg = f"SGLang's front end not built at {SITE}: run bash scripts/sglang_conformance.sh"
        if os.environ.get("CI"):
            pytest.fail(msg + " (CI must run these tests, not skip them)")
        pytest.skip(msg)


@pytest.fixture(scope="session")
def sglang_front_end_built():
    _need_front_end()
    return SITE


def _front_end(tmp_path_factory, tiny_model_dir, mode):
    _need_front_end()
    srv = RealSGLang(SITE, tiny_model_dir, mode, tmp_path_factory.mktemp("sglang") / f"{mode}.log")
    return srv


@pytest.fixture(scope="session")
def _real_sglang_both(tmp_path_factory, tiny_model_dir):
    """One SGLang front end for the session, its stand-in scheduler holding both engines (each start costs ~40 s
    of CPU); the fixtures below choose which engine serves their test."""
    srv = _front_end(tmp_path_factory, tiny_model_dir, "both")
    yield srv
    srv.close()


@pytest.fixture
def real_sglang(_real_sglang_both):
    """Scripted stand-in: the agents act (serving/fakes/policy.py's policy), the reasoning split is exercised."""
    return _real_sglang_both.use("scripted")


@pytest.fixture
def real_sglang_model(_real_sglang_both):
    """Model stand-in: every token and logprob from the embedded tiny Qwen3.5 (images change the distribution)."""
    return _real_sglang_both.use("model")
