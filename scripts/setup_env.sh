#!/usr/bin/env bash
# Create (or reuse) the project venv and install the toolkit with its CPU-capable extras.
#   bash scripts/setup_env.sh            # used by scripts/demo.sh and scripts/test.sh
# Env: VENV (default .venv), PYTHON (default python3). Re-runs are no-ops unless pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.mmcf-installed"
want=$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# torch + torchvision pairs known to import together (transformers' Qwen3.5 processor needs torchvision).
case "$(uname -m)" in
  x86_64) TORCH_PINS=${TORCH_PINS:-"torch==2.14.1 torchvision==0.29.1"} ;;
  aarch64|arm64) TORCH_PINS=${TORCH_PINS:-"torch==2.9.1 torchvision==0.24.1"} ;;
  *) TORCH_PINS=${TORCH_PINS:-"torch torchvision"} ;;
esac
echo "[setup] installing $TORCH_PINS and mmcf-toolkit[local,dev] into $VENV (first run: about a minute)"
# uv installs (one small wheel, into the venv): it unpacks torch's ~5 GB CUDA build in parallel and links it from its
# cache, 24 s for everything on a fresh machine against pip's 97 s (docs/performance.md); pip where uv cannot be had
if "$VENV/bin/python" -m pip install -q uv >/dev/null 2>&1 && [ -x "$VENV/bin/uv" ]; then
  INSTALL=("$VENV/bin/uv" pip install -q --python "$VENV/bin/python")
else
  echo "[setup] uv could not be installed; using pip (slower)"
  INSTALL=("$VENV/bin/python" -m pip install -q --no-compile)
fi
# shellcheck disable=SC2086
# one resolve for both (the pins first: a bare torch requirement alone would take another build)
"${INSTALL[@]}" $TORCH_PINS -e ".[local,dev]"
# byte code: Python writes what it compiles on first import, unless PYTHONDONTWRITEBYTECODE is set (as on this
# project's machines); then every process would compile torch, transformers, pandas... again (`import torch`: 1.9 CPU-s
# compiled, 3.7 from source), so the venv is compiled once here, on all cores (pip compiles on one): ~45 CPU-s,
# ~270 MB, the packages' own tests left out.
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  "$VENV/bin/python" -m compileall -q -j 0 -x '/tests/' "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
fi
echo "$want" > "$stamp"
