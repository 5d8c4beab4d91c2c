#!/usr/bin/env bash
# Run the checks and the test suite on the CPU (no GPU, no network): bash scripts/test.sh [pytest args]
# First the code's shape (ruff: pyflakes, import order, imports at the top, function size; import-linter: the layers
# of docs/architecture.md), then every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
export MMCF_TINY_MODEL_DIR=${MMCF_TINY_MODEL_DIR:-$PWD/.cache/tiny-qwen35}
exec .venv/bin/python -m pytest -q "$@"
