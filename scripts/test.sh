#!/usr/bin/env bash
# Run the test suite on the CPU (no GPU, no network): bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export MMCF_TINY_MODEL_DIR=${MMCF_TINY_MODEL_DIR:-$PWD/.cache/tiny-qwen35}
exec .venv/bin/python -m pytest -q "$@"
