"""The pins agree: the embedded model runs the tokenizer and processor code a node running SGLang runs.

SGLang's own metadata (the wheel ``scripts/sglang_conformance.sh`` installs) says which transformers and torch it
needs; the project's ``local`` extra, ``scripts/setup_env.sh`` and the ``serve`` extra must say the same.
"""
from __future__ import annotations

import re

import tomllib

from tests.conformance.conftest import REPO, SITE, _need_front_end


def _pins(reqs) -> dict:
    return {m.group(1).lower(): m.group(2) for r in reqs if (m := re.match(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;]+)", r))}


def test_the_local_extra_and_the_torch_pair_agree_with_the_sglang_the_toolkit_is_tested_against():
    _need_front_end()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    script = (REPO / "scripts" / "sglang_conformance.sh").read_text()
    sglang = re.search(r"\bsglang==([\d.]+)", script).group(1)
    assert _pins(extras["serve"])["sglang"] == sglang            # the serve extra is the SGLang tested here
    meta = (SITE / f"sglang-{sglang}.dist-info" / "METADATA").read_text()
    theirs = _pins(line.removeprefix("Requires-Dist:") for line in meta.splitlines() if line.startswith("Requires-Dist:"))
    assert _pins(extras["local"])["transformers"] == theirs["transformers"]
    x86 = re.search(r'x86_64\) TORCH_PINS=\$\{TORCH_PINS:-"([^"]+)"\}', (REPO / "scripts" / "setup_env.sh").read_text())
    assert _pins(x86.group(1).split())["torch"] == theirs["torch"]


def test_the_conformance_layer_installs_sglangs_own_pins():
    """Every package the conformance script installs that SGLang pins exactly (openai, apache-tvm-ffi,
    compressed-tensors, sentencepiece, xgrammar, ...) is installed at SGLang's version, so the front end the tests
    run is the one a node runs (issue 58)."""
    _need_front_end()
    script = (REPO / "scripts" / "sglang_conformance.sh").read_text()
    block = script[script.index("PKGS=("):script.index(")\n", script.index("PKGS=("))]
    ours = _pins(tok for line in block.splitlines() if not line.strip().startswith("#") for tok in line.split())
    sglang = ours["sglang"]
    meta = (SITE / f"sglang-{sglang}.dist-info" / "METADATA").read_text()
    theirs = _pins(line.removeprefix("Requires-Dist:") for line in meta.splitlines() if line.startswith("Requires-Dist:"))
    differ = {k: (v, theirs[k]) for k, v in ours.items() if k in theirs and theirs[k] != v}
    assert not differ, f"the conformance script's pins differ from SGLang {sglang}'s (ours, theirs): {differ}"
    assert {"openai", "apache-tvm-ffi", "compressed-tensors", "sentencepiece"} <= set(ours) & set(theirs)
