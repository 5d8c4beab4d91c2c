#!/usr/bin/env bash
# Figure 2 end to end: collect ReAct trajectories -> grounding -> entropy -> removal -> judge -> figures.
#
#   bash scripts/reproduce_figure2.sh --demo
#       the embedded default (tiny random Qwen3.5, offline world, demo benchmark): shows the chain runs;
#       every number is meaningless, and the tiny model cannot annotate, so panel (a) is reported invalid.
#   bash scripts/reproduce_figure2.sh --benchmark DATA/mmsearch --endpoint http://gpu:30000 \
#       --model-dir /models/Qwen3.5-27B [--out runs/fig2-27b] [--trials 1] [--steps 1..5] [--limit N]
#       against a served Qwen3.5 (serving/launch_qwen35.sh), live tools (SERPER_API_KEY, JINA_API_KEY),
#       the default annotator and judge (OpenRouter gemini-3-flash, OPENROUTER_API_KEY).
#
# Every step is resumable: rerunning the script continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."

DEMO=0 BENCHMARK="" ENDPOINT="" MODEL_DIR="" OUT="" TRIALS=1 STEPS="1..5" LIMIT="" LOGPROB_MODE="scaled"
usage() { sed -n '2,13p' "$0"; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --demo) DEMO=1 ;;
    --benchmark) BENCHMARK="$2"; shift ;;
    --endpoint) ENDPOINT="$2"; shift ;;
    --model-dir) MODEL_DIR="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --trials) TRIALS="$2"; shift ;;
    --steps) STEPS="$2"; shift ;;
    --limit) LIMIT="$2"; shift ;;
    --logprob-mode) LOGPROB_MODE="$2"; shift ;;
    -h|--help) usage 0 ;;
    *) echo "unknown argument: $1" >&2; usage 2 ;;
  esac
  shift
done

PY=${PYTHON:-python}
if [[ -x .venv/bin/python && -z "${PYTHON:-}" ]]; then PY=.venv/bin/python; fi
LIMIT_ARGS=()
[[ -n "$LIMIT" ]] && LIMIT_ARGS=(--limit "$LIMIT")

if [[ "$DEMO" == 1 ]]; then
  OUT=${OUT:-runs/fig2-demo}
  echo "== DEMO on the embedded default: a tiny RANDOMLY INITIALISED model; all numbers are meaningless =="
  RUN_ARGS=(--benchmark demo --t-max 6 --max-tokens 24)
  PROBE_BACKEND=()
  ENTROPY_ARGS=(--include-unparsed)   # the random model's first calls never parse: the paper's rule would drop all
  GROUNDING_ARGS=(--local --retries 0 --max-tokens 32 --include-unparsed)
  JUDGE_ARGS=(--judge exact)
  REMOVAL_JUDGE=(--judge exact)
else
  [[ -n "$BENCHMARK" && -n "$ENDPOINT" && -n "$MODEL_DIR" ]] || { echo "need --benchmark, --endpoint and --model-dir (or --demo)" >&2; exit 2; }
  OUT=${OUT:-runs/fig2-$(basename "$MODEL_DIR")}
  RUN_ARGS=(--benchmark "$BENCHMARK" --backend sglang --endpoint "$ENDPOINT" --model-dir "$MODEL_DIR"
            --logprob-mode "$LOGPROB_MODE" --tools live --trials "$TRIALS" --concurrency 32)
  PROBE_BACKEND=(--backend sglang --endpoint "$ENDPOINT" --model-dir "$MODEL_DIR" --logprob-mode "$LOGPROB_MODE")
  ENTROPY_ARGS=()
  GROUNDING_ARGS=()
  JUDGE_ARGS=()
  REMOVAL_JUDGE=()
fi

if [[ "$DEMO" != 1 ]]; then  # every key and server a later stage needs, checked before the first stage starts
  "$PY" -m agent.preflight --benchmark "$BENCHMARK" --backend sglang --endpoint "$ENDPOINT" --model-dir "$MODEL_DIR" \
    --tools live --judge-api-key-env "${JUDGE_API_KEY_ENV:-OPENROUTER_API_KEY}"
fi
set -x
"$PY" -m agent.run --method react --out "$OUT" "${RUN_ARGS[@]}" "${LIMIT_ARGS[@]}"
"$PY" -m probes.grounding "$OUT" "${GROUNDING_ARGS[@]}" || echo "grounding: see $OUT/probes/grounding/summary.json" >&2
"$PY" -m probes.entropy "$OUT" --mode regenerate "${PROBE_BACKEND[@]}" "${ENTROPY_ARGS[@]}"
"$PY" -m probes.removal "$OUT" --steps "$STEPS" "${PROBE_BACKEND[@]}" "${REMOVAL_JUDGE[@]}"
"$PY" -m agent.judge "$OUT" "${JUDGE_ARGS[@]}"
"$PY" -m analysis.report --react "$OUT" --runs "$OUT" --out "$OUT/figures"
set +x
echo "Figure 2: $OUT/figures/fig2.png (panels fig2a/b/c_*.png); tables in $OUT/figures/"
