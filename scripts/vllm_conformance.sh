#!/usr/bin/env bash
# Build the vLLM conformance layer: vLLM's own Python code (its OpenAI-compatible request and response models:
# CompletionRequest, CompletionResponse, ChatCompletionRequest, Logprob, and the sampling parameters they build)
# importable on a CPU machine, so that the toolkit's vLLM scoring is tested against vLLM's models rather than our
# reading of them (serving/fakes/vllm_server.py speaks them; tests/test_vllm.py).
#
#   bash scripts/vllm_conformance.sh            # builds .venv-vllm/site (~70 MB, under a minute)
#   bash scripts/vllm_conformance.sh install    # only the files, then
#   bash scripts/vllm_conformance.sh check      # the import check with .venv's torch and transformers; stamps it built
#
# The wheel's Python files only: its compiled parts (CUDA kernels, ~1 GB unpacked) are left out, and nothing that
# needs them is imported. With the SGLang layer (.venv-sglang/site, scripts/sglang_conformance.sh) after it on
# PYTHONPATH for what both need (fastapi, openai, msgspec, pybase64, ...), and .venv's torch, transformers and
# pydantic; the list below is what the modules above import beyond those. Pinned to the vLLM version the toolkit
# is tested against. Re-runs are no-ops unless this file changed.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=${VLLM_SITE:-.venv-vllm/site}
PY=${VENV:-.venv}/bin/python
BASE_PY=${PYTHON:-python3}
STEP=${1:-all}
[[ "$STEP" =~ ^(all|install|check)$ ]] || { echo "usage: bash scripts/vllm_conformance.sh [install|check]" >&2; exit 2; }
VLLM=vllm==0.33.0
DEPS=(cbor2==5.7.1 openai-harmony==0.0.8 cachetools==6.2.4 prometheus-client==0.23.1 cloudpickle==3.1.2
      py-cpuinfo==9.0.0)
stamp="$SITE/.mmcf-installed"
want=$(sha256sum "$0" | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

install() {
  echo "[vllm-conformance] installing vLLM's Python files into $SITE (no compiled parts, --no-deps)"
  rm -rf "$SITE" "$SITE.files"
  mkdir -p "$SITE"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  PIP_ROOT_USER_ACTION=ignore "$BASE_PY" -m pip download -q --no-deps -d "$tmp" "$VLLM" 2>&1 | grep -v "^WARNING: Location" || true
  "$BASE_PY" - "$tmp" "$SITE" <<'EOF'
import sys, zipfile
from pathlib import Path
wheel = next(Path(sys.argv[1]).glob("vllm-*.whl"))
with zipfile.ZipFile(wheel) as z:  # the Python files and the package metadata; no .so
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.endswith(".py") or ".dist-info/" in n])
EOF
  if [ -x "${VENV:-.venv}/bin/uv" ]; then
    "${VENV:-.venv}/bin/uv" pip install -q --no-deps --target "$SITE" --python "$BASE_PY" "${DEPS[@]}"
  else
    PIP_ROOT_USER_ACTION=ignore "$BASE_PY" -m pip install -q --no-compile --no-deps --target "$SITE" "${DEPS[@]}" 2>&1 | grep -v "^WARNING: Location" || true
  fi
  if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then "$BASE_PY" -m compileall -q -j 0 "$SITE/vllm/entrypoints" >/dev/null 2>&1 || true; fi
  echo "$want" > "$SITE.files"
}

check() {
  [ -x "$PY" ] || { echo "run bash scripts/setup_env.sh first (the check needs .venv)" >&2; exit 2; }
  [ -f "$SITE.files" ] && [ "$(cat "$SITE.files")" = "$want" ] || { echo "run bash scripts/vllm_conformance.sh install first" >&2; exit 2; }
  SGLANG_SITE=${SGLANG_SITE:-.venv-sglang/site}
  PYTHONPATH="$SITE:$SGLANG_SITE" PYTHONWARNINGS=ignore "$PY" -c "
from vllm.entrypoints.openai.completion.protocol import CompletionRequest, CompletionResponse
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest, ChatCompletionResponse
from vllm.logprobs import Logprob" >/dev/null 2>"$SITE.import-error" \
    || { echo "[vllm-conformance] vLLM does not import from $SITE:" >&2; tail -20 "$SITE.import-error" >&2; exit 1; }
  rm -f "$SITE.import-error"
  echo "$want" > "$stamp"
  echo "[vllm-conformance] ready: $(du -sh "$SITE" | cut -f1)"
}

if [[ "$STEP" != check ]]; then install; fi
if [[ "$STEP" != install ]]; then check; fi
