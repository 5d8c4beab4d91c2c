#!/usr/bin/env bash
# The main job on the embedded default (tiny random Qwen3.5 + offline tool world), no GPU needed:
#   bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export MMCF_TINY_MODEL_DIR=${MMCF_TINY_MODEL_DIR:-$PWD/.cache/tiny-qwen35}
exec .venv/bin/python -m scripts.demo "$@"
