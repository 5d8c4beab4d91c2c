#!/usr/bin/env bash
# Everything the suite needs, then the checks and every test, on the CPU (no GPU, no network):
#   bash scripts/test.sh [pytest args]
# 1. the venv (scripts/setup_env.sh), SGLang's pure-Python layer for tests/conformance/ (scripts/sglang_conformance.sh),
#    vLLM's request models (scripts/vllm_conformance.sh), a real vLLM engine (vLLM's CPU build in .venv-vllm-engine,
#    scripts/vllm_engine.sh: the real_engine tier, tests/test_real_engine.py)
#    and Debian's chromium (the viewer's browser test) and Slurm (tests/test_slurm.py), where apt-get can;
# 2. the code's shape, beside the tiny model's warm-up: ruff (pyflakes, import order, imports at the top, function
#    size), import-linter (the layers of docs/architecture.md) and mypy (the record and the backends);
# 3. the suite on four workers (pytest-xdist), ending with the failed tests and the skipped ones and why (-rfEs).
set -euo pipefail
cd "$(dirname "$0")/.."
# byte code written once and read by all: the suite starts ~200 Python processes, and where PYTHONDONTWRITEBYTECODE
# is set (as on this project's machines) each would compile torch, transformers, pandas... from source again
# (`import torch`: 1.9 CPU-s compiled, 3.7 from source). Only what is imported gets compiled (~40 % of the venv).
unset PYTHONDONTWRITEBYTECODE
have_chromium() { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }
have_slurm() { command -v sbatch >/dev/null 2>&1 && { command -v slurmctld || [[ -x /usr/sbin/slurmctld ]]; } >/dev/null 2>&1; }
# Debian's chromium (the viewer's browser test, tests/test_show.py) and a one-node Slurm (slurmctld, slurmd, the
# clients and munge: tests/test_slurm.py starts and stops its own daemons; the packages' own services are not used)
install_debian() {
  SUDO=""; [[ "$(id -u)" != 0 ]] && SUDO="sudo -n"
  if command -v apt-get >/dev/null 2>&1 && { [[ -z "$SUDO" ]] || sudo -n true 2>/dev/null; }; then
    echo "== installing Debian's $* for the browser and Slurm tests =="
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" \
      || echo "warning: $* could not be installed; the tests that need them will skip" >&2
  else
    echo "note: no way to install $* here; the tests that need them will skip" >&2
  fi
}
# they install beside the rest (most of their time is waiting on disk and network); SGLang's files after the
# venv, with the uv that scripts/setup_env.sh installs there
debian=()
have_chromium || debian+=(chromium)
have_slurm || debian+=(slurmctld slurmd slurm-client munge)
debian_pid=""
if (( ${#debian[@]} )); then install_debian "${debian[@]}" & debian_pid=$!; fi
bash scripts/setup_env.sh
bash scripts/sglang_conformance.sh install & sglang_pid=$!
engine_log=$(mktemp)
bash scripts/vllm_engine.sh > "$engine_log" 2>&1 & engine_pid=$!
# the code's shape, beside the warm-up below (they share no files; on a busy machine two processes of ours get
# more of the cores than one): its output is shown when it ends
shape_checks() {
  .venv/bin/ruff check . \
    && { .venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache; } \
    && { .venv/bin/mypy --no-error-summary >/dev/null || .venv/bin/mypy; }  # the record and the backends ([tool.mypy])
}
shape_log=$(mktemp)
trap 'rm -f "$shape_log" "$engine_log"' EXIT
shape_checks > "$shape_log" 2>&1 & shape_pid=$!
export MMCF_TINY_MODEL_DIR=${MMCF_TINY_MODEL_DIR:-$PWD/.cache/tiny-qwen35}
# the tiny model, loaded once here: with the toolkit's commands imported, this writes the byte code of most of what
# the suite's processes import before they start (rather than each compiling it at once)
.venv/bin/python -c "import os; from agent.backends.tiny_model import ensure_tiny_model
from agent.backends.local import LocalBackend; LocalBackend(ensure_tiny_model(os.environ['MMCF_TINY_MODEL_DIR']))
import agent.run, agent.judge, agent.show, probes.entropy, probes.removal, probes.grounding, analysis.report"
wait "$sglang_pid" || { echo "error: SGLang's conformance layer could not be installed (above)" >&2; exit 1; }
# SGLang's import check (after the line above: it imports torch and transformers too)
bash scripts/sglang_conformance.sh check
# vLLM's request and response models (tests/test_vllm.py): its wheel's Python files, beside the SGLang layer
bash scripts/vllm_conformance.sh
shape_ok=0; wait "$shape_pid" || shape_ok=$?
cat "$shape_log"; rm -f "$shape_log"
[[ "$shape_ok" == 0 ]] || { echo "error: the code's shape checks failed (above)" >&2; exit 1; }
[[ -z "$debian_pid" ]] || wait "$debian_pid" || true
engine_ok=0; wait "$engine_pid" || engine_ok=$?
cat "$engine_log"
if [[ "$engine_ok" != 0 ]]; then
  # 3: this machine cannot run vLLM's CPU build (not x86_64 with AVX2); anything else is a failed install
  [[ -n "${CI:-}" ]] && { echo "error: CI must run the real-engine tier, and vLLM's CPU build could not be installed (above)" >&2; exit 1; }
  echo "warning: no real vLLM engine here (above): the real_engine tier will skip" >&2
fi
if [[ -n "${CI:-}" ]] && ! have_chromium; then
  echo "error: CI must run the browser test, and chromium could not be installed" >&2
  exit 1
fi
if [[ -n "${CI:-}" ]] && ! have_slurm; then
  echo "error: CI must run the Slurm tier (tests/test_slurm.py), and Slurm could not be installed" >&2
  exit 1
fi
# four workers on CI's two cores: most tests wait on servers and commands they started. Tests that share an
# expensive fixture stay on one worker and the slow ones go first (tests/conftest.py says how).
# MMCF_TEST_WORKERS=0 runs in one process. Each process's OpenMP pool (torch's) gets one thread unless the caller
# says otherwise: with four workers on two cores, threads of a second pool spin while they wait for work, and the
# suite spent 14 % more CPU so (docs/performance.md).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -q -rfEs -n "${MMCF_TEST_WORKERS:-4}" "$@"
