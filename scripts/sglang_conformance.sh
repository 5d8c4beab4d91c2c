#!/usr/bin/env bash
# Build the SGLang conformance layer: SGLang's own pure-Python code (request models, sampling-parameter
# checks, the qwen3 reasoning parser, the server's argument parser, smg (the gateway, a native binary), and its real HTTP server,
# TokenizerManager and DetokenizerManager) importable on a CPU machine, so that tests/conformance/ checks the
# toolkit against SGLang itself rather than against our reading of it (serving/fakes/standin.py stands in for the
# scheduler only).
#
#   bash scripts/sglang_conformance.sh          # builds .venv-sglang/site (a --target dir, ~350-450 MB, ~1-2 min)
#   bash scripts/sglang_conformance.sh install  # only the files (with .venv's uv when there, else pip), then
#   bash scripts/sglang_conformance.sh check    # the import check with .venv's torch and transformers; stamps it built
#
# Everything goes in with --no-deps into one folder that the tests put on PYTHONPATH of a separate
# process (tests/conformance/sglang_oracle.py), next to the project's .venv (its torch, transformers,
# pydantic): nothing in .venv changes. The list below is exactly what these modules import; pinned to
# the SGLang version the toolkit is tested against. Re-runs are no-ops unless this file changed.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=${SGLANG_SITE:-.venv-sglang/site}
PY=${VENV:-.venv}/bin/python  # the venv scripts/setup_env.sh made
# the files need only a Python of .venv's version (scripts/setup_env.sh makes .venv from $PYTHON too)
BASE_PY=${PYTHON:-python3}
STEP=${1:-all}
[[ "$STEP" =~ ^(all|install|check)$ ]] || { echo "usage: bash scripts/sglang_conformance.sh [install|check]" >&2; exit 2; }
stamp="$SITE/.mmcf-installed"
want=$(sha256sum "$0" | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
PKGS=(
  sglang==0.5.23 smg==1.13.0
  sniffio==1.3.1 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 urllib3==2.8.0 starlette==1.10.0 msgspec==0.23.0
  pyzmq==27.3.0 ipython==9.18.1 traitlets==5.16.1 aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0
  yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0
  # at SGLang's own pins where its METADATA pins them (tests/conformance/test_pins.py); openai 2.8 needs distro, jiter
  openai==2.8.0 dill==0.4.1 apache-tvm-ffi==0.1.11 sentencepiece==0.2.1 compressed-tensors==0.18.0
  distro==1.9.0 jiter==0.19.0
  loguru==0.7.3 gguf==0.19.0 partial-json-parser==0.2.1.1.post7
  # SGLang's real HTTP front end on CPU (serving/fakes/standin.py): FastAPI / uvicorn, the multimodal processor's needs
  fastapi==0.165.0 uvicorn==0.54.0 h11==0.16.0 click==8.5.1 uvloop==0.23.0 python-multipart==0.0.34
  opentelemetry-api==1.45.2 setproctitle==1.3.8 einops==0.8.2 xgrammar==0.2.7 soundfile==0.13.1 cffi==2.1.1
  pycparser==3.12 jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1
)

install() {
  echo "[sglang-conformance] installing SGLang's pure-Python parts into $SITE (--no-deps)"
  rm -rf "$SITE" "$SITE.files"
  mkdir -p "$SITE"
  # with .venv's uv where scripts/setup_env.sh installed it (2 s against pip's 12 s), else pip
  if [ -x "${VENV:-.venv}/bin/uv" ]; then
    "${VENV:-.venv}/bin/uv" pip install -q --no-deps --target "$SITE" --python "$BASE_PY" "${PKGS[@]}"
  else
    PIP_ROOT_USER_ACTION=ignore "$BASE_PY" -m pip install -q --no-compile --no-deps --target "$SITE" "${PKGS[@]}" 2>&1 | grep -v "^WARNING: Location" || true
  fi
  # byte-compiled once here where PYTHONDONTWRITEBYTECODE is set: every SGLang process the suite starts would
  # otherwise compile these modules again (elsewhere Python writes what it compiles on first import)
  if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then "$BASE_PY" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true; fi
  echo "$want" > "$SITE.files"
}

check() {
  [ -x "$PY" ] || { echo "run bash scripts/setup_env.sh first (the check needs .venv)" >&2; exit 2; }
  [ -f "$SITE.files" ] && [ "$(cat "$SITE.files")" = "$want" ] || { echo "run bash scripts/sglang_conformance.sh install first" >&2; exit 2; }
  # pydantic comes with the project's venv; bring it only where that venv lacks it
  "$PY" -c "import pydantic" 2>/dev/null || PIP_ROOT_USER_ACTION=ignore "$BASE_PY" -m pip install -q --no-deps --target "$SITE" \
    pydantic pydantic-core annotated-types typing-inspection 2>&1 | grep -v "^WARNING: Location" || true
  # one import of everything the tests use (SGLang's HTTP front end imports its request models and argument parser)
  PYTHONPATH="$SITE" PYTHONWARNINGS=ignore "$PY" -c "
import sglang.srt.entrypoints.http_server, sglang.srt.entrypoints.openai.protocol, sglang.srt.server_args
import sglang.srt.managers.io_struct, sglang.srt.sampling.sampling_params, sglang.srt.parser.reasoning_parser
import smg.router_args" >/dev/null 2>"$SITE.import-error" \
    || { echo "[sglang-conformance] SGLang does not import from $SITE:" >&2; tail -20 "$SITE.import-error" >&2; exit 1; }
  rm -f "$SITE.import-error"
  echo "$want" > "$stamp"
  echo "[sglang-conformance] ready: $(du -sh "$SITE" | cut -f1)"
}

if [[ "$STEP" != check ]]; then install; fi
if [[ "$STEP" != install ]]; then check; fi
