#!/usr/bin/env bash
# kd precompute on CUDA before and after the overlap of host work with the forward pass (tokenizing the next
# unit on another thread, launching the next batch before fetching the last), A/B in fresh processes:
# bench/precompute_ab.py over three jobs (mpnet-shaped and MiniLM-shaped teachers with random weights on short
# texts, the mpnet shape on documents of 16 consecutive corpus sentences). Needs the .gpu bundle of
# bench/gpu_check.sh plus the baseline tree in it:  mkdir .gpu/base && git archive BASE | tar x -C .gpu/base
#   OUT=/tmp/ov-out bash bench/gpu_overlap.sh                       # on the GPU machine (device tool)
#   DEV=cpu N=3000 NLONG=300 PAIRS=1 bash bench/gpu_overlap.sh     # a dry run
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUNDLE:-.gpu}; O=${OUT:-/tmp/ov-out}; W=${WORK:-/tmp/ov}; DEV=${DEV:-cuda}
N=${N:-80000}; NLONG=${NLONG:-10000}; PAIRS=${PAIRS:-3}; PY=${PYTHON:-python3}
rm -rf "$W" && mkdir -p "$W/pp" "$W/ppbase" "$O"
ln -sfn "$PWD" "$W/pp/kd" && ln -sfn "$PWD/$B/base" "$W/ppbase/kd"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=true
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; nproc; uptime
  "$PY" -c "import torch; print('torch', torch.__version__)"; } | tee "$O/machine.txt"
# Bytecode for both trees first: a fresh machine compiles every source on first import (~5 s), which would
# fall on whichever side ran first.
"$PY" -m compileall -q -x '(\.venv|bench/out|\.gpu/shared)' . "$B/base" >/dev/null 2>&1
"$PY" bench/random_teachers.py "$B" "$W/t" mpnet minilm 2>&1 | tail -1
"$PY" -c "import pyarrow.parquet as pq, sys; t = pq.read_table(sys.argv[1]); pq.write_table(t.slice(0, int(sys.argv[2])),
sys.argv[3]); pq.write_table(t.slice(len(t) - 2000), sys.argv[4])" "$B/texts.parquet" "$N" "$W/short.parquet" "$W/warm.parquet"
# Documents: 16 consecutive texts each, from text 60,000 on (~230 words; under mpnet's 384 tokens).
"$PY" -c "import pyarrow as pa, pyarrow.parquet as pq, sys; t = pq.read_table(sys.argv[1])['text'].to_pylist()
pq.write_table(pa.table({'text': [' '.join(t[60000 + 16 * i:60016 + 16 * i]) for i in range(int(sys.argv[2]))]}), sys.argv[3])" \
  "$B/texts.parquet" "$NLONG" "$W/long.parquet"
# One untimed run per side (CUDA context, caches), then the timed pairs.
"$PY" bench/precompute_ab.py --side new="$W/pp" --side base="$W/ppbase" --pairs 1 --extra "--device $DEV" \
  --job "mpnet:$W/warm.parquet:$W/t/mpnet:sentence" --job "minilm:$W/warm.parquet:$W/t/minilm:sentence" \
  --out "$W/warm" >/dev/null
"$PY" bench/precompute_ab.py --side new="$W/pp" --side base="$W/ppbase" --pairs "$PAIRS" --extra "--device $DEV" \
  --job "mpnet:$W/short.parquet:$W/t/mpnet:sentence,mean,cls" --job "minilm:$W/short.parquet:$W/t/minilm:sentence,mean" \
  --job "mpnetdocs:$W/long.parquet:$W/t/mpnet:sentence,mean,cls" --out "$W/ab" 2>&1 | tee "$O/ab.log"
cp "$W/ab/table.md" "$W/ab/runs.json" "$O/" 2>/dev/null
gzip -c "$W/ab/smi.csv" >"$O/smi.csv.gz" 2>/dev/null
uptime | tee -a "$O/machine.txt"
