#!/bin/bash
# One measured default for the recurrent students (issue 40, item 5): four BiLSTM settings, each trained the same
# 2 epochs on the same leakage-free store (MiniLM's sentence vectors over the 10 % id-hash sample of the frontier
# corpus), then scored side by side on STS-B dev with their encoding speed. Only kd's CLI is used.
#   A  the demo's setting until now:       --embed-dim 128 --hidden-dim 256 --max-length 64 --batch-size 64 --lr 2e-3
#   B  train-student's defaults until now:  (no flags: 300-d embeddings, 512 per direction, 128 tokens, lr 1e-3)
#   C  the frontier runs' setting:          --hidden-dim 256 --pooling max --batch-size 128 --lr 2e-3 --max-length 64
#   D  C with the demo's 128-d embeddings
# Needs bench/out/frontier.jsonl (python bench/corpus.py --in-domain --out bench/out/frontier.jsonl).
# Usage: CORE=0 OUT=bench/out/bilstm-defaults bash bench/bilstm_defaults.sh
set -euo pipefail
OUT=${OUT:-bench/out/bilstm-defaults}
PIN=(taskset -c "${CORE:-0}")
KD=("${PIN[@]}" kd)
mkdir -p "$OUT"
"${KD[@]}" precompute bench/out/frontier.jsonl --text-column text --sample 0.1 -t minilm --outputs sentence,vocab \
    --shard-rows 5000 -o "$OUT/store" --no-progress
[ -f "$OUT/exclude.txt" ] || "${KD[@]}" leakage "$OUT/store" --exclude-out "$OUT/exclude.txt"
common=(--shards "$OUT/store" --exclude-ids "$OUT/exclude.txt" --arch bilstm --epochs 2 --seed 0 --no-progress)
declare -A flags=(
  [A]="--embed-dim 128 --hidden-dim 256 --max-length 64 --batch-size 64 --lr 2e-3"
  [B]=""
  [C]="--hidden-dim 256 --pooling max --batch-size 128 --lr 2e-3 --max-length 64"
  [D]="--embed-dim 128 --hidden-dim 256 --pooling max --batch-size 128 --lr 2e-3 --max-length 64"
)
for s in A B C D; do
  if [ ! -f "$OUT/$s/config.json" ]; then
    start=$(date +%s)
    # shellcheck disable=SC2086
    "${KD[@]}" train-student "${common[@]}" ${flags[$s]} --out "$OUT/$s"
    echo "$s trained in $(( $(date +%s) - start )) s: ${flags[$s]:-defaults}" | tee -a "$OUT/times.txt"
  fi
done
"${KD[@]}" eval --teacher minilm --student "$OUT/A" --student "$OUT/B" --student "$OUT/C" --student "$OUT/D" \
    --task sts --sts-split dev --task speed --threads 1 --json "$OUT/report.json" --markdown "$OUT/report.md" --overwrite
cat "$OUT/times.txt" "$OUT/report.md"
