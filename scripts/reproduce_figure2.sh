#!/usr/bin/env bash
# Figure 2 end to end: collect ReAct trajectories -> grounding -> entropy -> removal -> judge -> figures.
#
#   bash scripts/reproduce_figure2.sh --demo
#       the offline demo on the SCRIPTED FAKE model (--backend scripted, agent/backends/demo_model.py): its
#       behaviour and distributions are planted, so every panel has visible structure; every number is fake
#       and every figure is stamped so. Add --demo-model tiny for the embedded random Qwen3.5 instead (its
#       actions never parse, so panel (a) stays empty and accuracies are 0).
#   bash scripts/reproduce_figure2.sh --benchmark DATA/mmsearch --endpoint http://gpu:30000 [--endpoint URL ...] \
#       --model-dir /models/Qwen3.5-27B [--out runs/fig2-27b] [--trials 1] [--steps 1..5] [--limit N]
#       [--concurrency N]    (in flight; default: the runner's 32 per server, the probes' 128 per server)
#       [--teacher-forced]   (also score each step teacher-forced: the KL influence panel; ~2 scoring calls per step)
#       [--skip-fidelity]    (do not run the serving-fidelity check before the entropy probes; recorded)
#       against a served Qwen3.5 (serving/launch_qwen35.sh), live tools (SERPER_API_KEY, JINA_API_KEY, a lens
#       URL), the paper's annotator and judge (OpenRouter google/gemini-3-flash-preview, OPENROUTER_API_KEY); everything a
#       later stage needs is checked first (python -m agent.preflight).
#
# Every step is resumable: rerunning the script continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."

DEMO=0 DEMO_MODEL=scripted BENCHMARK="" ENDPOINTS=() MODEL_DIR="" CONCURRENCY="" OUT="" TRIALS="" STEPS="1..5" LIMIT="" LOGPROB_MODE="scaled" TEACHER_FORCED=0 SKIP_FIDELITY=()
usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --demo) DEMO=1 ;;
    --demo-model) DEMO_MODEL="$2"; shift ;;
    --benchmark) BENCHMARK="$2"; shift ;;
    --endpoint) ENDPOINTS+=(--endpoint "$2"); shift ;;
    --concurrency) CONCURRENCY="$2"; shift ;;
    --model-dir) MODEL_DIR="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --trials) TRIALS="$2"; shift ;;
    --steps) STEPS="$2"; shift ;;
    --limit) LIMIT="$2"; shift ;;
    --logprob-mode) LOGPROB_MODE="$2"; shift ;;
    --teacher-forced) TEACHER_FORCED=1 ;;
    --skip-fidelity) SKIP_FIDELITY=(--skip-fidelity) ;;
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
  JUDGE_ARGS=(--judge exact)
  if [[ "$DEMO_MODEL" == tiny ]]; then
    OUT=${OUT:-runs/fig2-demo-tiny}
    echo "== DEMO on the embedded default: a tiny RANDOMLY INITIALISED model; all numbers are meaningless =="
    RUN_ARGS=(--benchmark demo --t-max 6 --max-tokens 24)
    PROBE_BACKEND=()
    ENTROPY_ARGS=(--include-unparsed)   # the random model's first calls never parse: the paper's rule would drop all
    GROUNDING_ARGS=(--judge local --re-asks 0 --max-tokens 32 --include-unparsed)
  else
    OUT=${OUT:-runs/fig2-demo}
    echo "== DEMO on the SCRIPTED FAKE backend: planted behaviour and distributions; all numbers are fake =="
    RUN_ARGS=(--benchmark demo --backend scripted --trials "${TRIALS:-3}")  # the paper's 3: answer agreement
    PROBE_BACKEND=(--backend scripted)
    TEACHER_FORCED=1
    ENTROPY_ARGS=()
    GROUNDING_ARGS=(--judge scripted)
  fi
else
  [[ -n "$BENCHMARK" && ${#ENDPOINTS[@]} -gt 0 && -n "$MODEL_DIR" ]] || { echo "need --benchmark, --endpoint and --model-dir (or --demo)" >&2; exit 2; }
  # the paper's runs use the live tools: say what this script needs (agent.run's own hint, --tools offline, is not
  # one of this script's flags; its offline path is --demo)
  [[ -n "${SERPER_API_KEY:-}" ]] || { echo "SERPER_API_KEY is not set: the runs search the web (Serper) and Google Lens through it; set it (and JINA_API_KEY for page reading), or try the whole pipeline offline with: bash scripts/reproduce_figure2.sh --demo" >&2; exit 2; }
  OUT=${OUT:-runs/fig2-$(basename "$MODEL_DIR")}
  N_SERVERS=$(( ${#ENDPOINTS[@]} / 2 ))
  RUN_ARGS=(--benchmark "$BENCHMARK" --backend sglang "${ENDPOINTS[@]}" --model-dir "$MODEL_DIR"
            --logprob-mode "$LOGPROB_MODE" --tools live --trials "${TRIALS:-1}" --concurrency "${CONCURRENCY:-$(( 32 * N_SERVERS ))}")
  # the probes spread over the same servers, one trajectory per server (its prefix cache); probes/cli.py's default
  PROBE_BACKEND=(--backend sglang "${ENDPOINTS[@]}" --model-dir "$MODEL_DIR" --logprob-mode "$LOGPROB_MODE"
                 ${CONCURRENCY:+--concurrency "$CONCURRENCY"})
  ENTROPY_ARGS=()
  GROUNDING_ARGS=()
  JUDGE_ARGS=()
  # every key and server a later stage needs, checked before the first stage starts
  "$PY" -m agent.preflight --benchmark "$BENCHMARK" --backend sglang "${ENDPOINTS[@]}" --model-dir "$MODEL_DIR" \
    --tools live --judge-api-key-env "${JUDGE_API_KEY_ENV:-OPENROUTER_API_KEY}"
fi

set -x
"$PY" -m agent.run --method react --out "$OUT" "${RUN_ARGS[@]}" "${LIMIT_ARGS[@]}" --no-progress
"$PY" -m probes.grounding "$OUT" "${GROUNDING_ARGS[@]}" --no-progress || echo "grounding: see $OUT/probes/grounding/summary.json" >&2
"$PY" -m probes.entropy "$OUT" --mode regenerate "${PROBE_BACKEND[@]}" "${ENTROPY_ARGS[@]}" ${SKIP_FIDELITY[@]+"${SKIP_FIDELITY[@]}"} --no-progress
if [[ "$TEACHER_FORCED" == 1 ]]; then  # the KL influence panel and per-token ΔH / KL in agent.show
  "$PY" -m probes.entropy "$OUT" --mode teacher-forced "${PROBE_BACKEND[@]}" "${ENTROPY_ARGS[@]}" --skip-fidelity --no-progress
fi
"$PY" -m probes.removal "$OUT" --steps "$STEPS" "${PROBE_BACKEND[@]}" "${JUDGE_ARGS[@]}" --no-progress
"$PY" -m agent.judge "$OUT" "${JUDGE_ARGS[@]}" --no-progress
"$PY" -m analysis.report --react "$OUT" --runs "$OUT" --out "$OUT/figures" ${JUDGE_ARGS[@]+"${JUDGE_ARGS[@]}"}
set +x
echo
echo "wrote:"
find "$OUT/figures" -maxdepth 1 -type f \( -name '*.png' -o -name '*.md' \) | sort | sed 's/^/  /'
echo "  $OUT/probes/ (grounding/, entropy-regenerate/$([[ "$TEACHER_FORCED" == 1 ]] && echo ' entropy-teacher-forced/'), removal/: each probe's tables and run directories)"
echo "Figure 2: $OUT/figures/fig2.png; look at the trajectories: $PY -m agent.show $OUT"
