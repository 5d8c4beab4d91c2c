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

REPO = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("MMCF_SGLANG_SITE", REPO / ".venv-sglang" / "site"))


class Oracle:
    def __init__(self, site: Path):
        env = {**os.environ, "PYTHONPATH": str(site), "PYTHONWARNINGS": "ignore"}
        self.p = subprocess.Popen([sys.executable, str(Path(__file__).with_name("sglang_oracle.py"))], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.lock = threading.Lock()
        first = self._read(timeout=180)
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
            self.p.stdin.write(json.dumps({"op": op, **kw}) + "\n")
            self.p.stdin.flush()
            return self._read(timeout=120)

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
