#!/usr/bin/env bash
# Where a CUDA `kd precompute` spends its wall time: one cProfile run (main thread) of an mpnet-shaped and a
# MiniLM-shaped teacher (random weights, bench/random_teachers.py) over the first N frontier texts, plus
# `python -X importtime` of the modules a precompute imports. Needs the .gpu bundle of bench/gpu_check.sh.
#   OUT=/tmp/prof-out bash bench/gpu_profile.sh         # on the GPU machine (device tool)
#   DEV=cpu N=2000 bash bench/gpu_profile.sh            # a dry run
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUNDLE:-.gpu}; O=${OUT:-/tmp/prof-out}; W=${WORK:-/tmp/prof}; DEV=${DEV:-cuda}; N=${N:-80000}; PY=${PYTHON:-python3}
rm -rf "$W" && mkdir -p "$W/pp" "$O" && ln -sfn "$PWD" "$W/pp/kd"
export PYTHONPATH="$W/pp" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=true
"$PY" -m compileall -q -x '(\.venv|bench/out|\.gpu)' . >/dev/null 2>&1
"$PY" bench/random_teachers.py "$B" "$W/t" mpnet minilm >/dev/null 2>&1
"$PY" -c "import pyarrow.parquet as pq, sys; pq.write_table(pq.read_table(sys.argv[1]).slice(0, int(sys.argv[2])), sys.argv[3])" \
  "$B/texts.parquet" "$N" "$W/short.parquet"
"$PY" -m kd precompute "$W/short.parquet" --text-column text -t warm="$W/t/minilm" --outputs sentence --device "$DEV" \
  --sample 2000 -o "$W/warm" >/dev/null 2>&1   # CUDA context and disk caches warm, untimed
"$PY" -X importtime -c "import kd.cli, kd.pipeline.precompute, kd.pipeline.teacher.model, torch, transformers" 2>"$W/imp.txt"
sort -t'|' -k2 -n -r "$W/imp.txt" | head -25 >"$O/importtime.txt"
TIMEV=$([ -x /usr/bin/time ] && echo "/usr/bin/time -v")
for t in mpnet minilm; do
  $TIMEV "$PY" -m cProfile -o "$W/$t.prof" -m kd precompute "$W/short.parquet" --text-column text \
    -t "$t=$W/t/$t" --outputs sentence,mean,cls --device "$DEV" -o "$W/s-$t" 2>&1 | tr '\r' '\n' | grep -a -E "rows/s|Elapsed" | tail -3
  "$PY" -c "import pstats, sys; p = pstats.Stats(sys.argv[1]); p.sort_stats('cumulative').print_stats(60); p.sort_stats('tottime').print_stats(30)" \
    "$W/$t.prof" >"$O/$t-profile.txt"
done
