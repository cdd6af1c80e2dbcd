#!/usr/bin/env bash
# `kd distill --student tiny6` end to end on one GPU with the GPU's busy share per step, then `kd precompute`
# against sentence-transformers' `encode` on the same GPU, short and long texts (issue 50 item 5).
#
#   bash bench/gpu_distill.sh bundle                       # here: make .gpu2 (~12 MB), then carry it
#   OUT=/tmp/gd-out bash bench/gpu_distill.sh              # on the GPU machine (the device tool's $OUT)
#   DEVICE=cpu ROWS=1500 N_SHORT=300 N_LONG=40 PAIRS=1 bash bench/gpu_distill.sh    # a CPU dry run of this script
#
# Teachers with random weights (bench/random_teachers.py says why: mpnet's weights cannot travel to that machine):
# speed and busy figures hold for the real teachers; the run's scores mean nothing.
# The texts: the frontier corpus (bench/frontier_texts.py: the news articles split by kd's spaCy segmenter and
# bench/corpus.py --in-domain, exact duplicates dropped), 266,016 texts.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUNDLE:-.gpu2}
if [ "${1:-}" = bundle ]; then
  PY=${PYTHON:-.venv/bin/python}
  rm -rf "$B" && mkdir -p "$B"
  grep -qx "/$B/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/$B/" >>.git/info/exclude; }
  "$PY" bench/corpus.py --in-domain --out "$B/frontier.jsonl" &&
    "$PY" bench/frontier_texts.py ../shared/data/corpus/news_articles.csv "$B/frontier.jsonl" "$B/texts.parquet" &&
    rm "$B/frontier.jsonl" || exit 1
  for t in mpnet minilm; do
    dir=$("$PY" -c "import sys; from kd.pipeline.teacher.resolve import resolve_teacher; print(resolve_teacher(sys.argv[1]).path)" $t)
    mkdir -p "$B/$t-shape" && (cd "$dir" && tar cf - --exclude='*.safetensors' --exclude='*.bin' --exclude='openvino*' .) | (cd "$B/$t-shape" && tar xf -)
  done
  du -sh "$B"; exit 0
fi
O=${OUT:-/tmp/kd-gd-out}
W=${WORK:-/tmp/kd-gd}
DEVICE=${DEVICE:-cuda}
rm -rf "$W" && mkdir -p "$W/pp" "$O"
ln -sfn "$PWD" "$W/pp/kd"  # the repository root is the package `kd`: importable without an install
export PYTHONPATH="$W/pp${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  nproc; uptime; "$PY" -c "import torch, transformers, sentence_transformers as s; print('torch', torch.__version__,
'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'sentence-transformers', s.__version__)"; } 2>&1 | tee "$O/machine.txt"

TEXTS=$B/texts.parquet
if [ -n "${ROWS:-}" ]; then
  "$PY" -c "import pyarrow.parquet as pq, sys; pq.write_table(pq.read_table(sys.argv[1]).slice(0, int(sys.argv[2])), sys.argv[3])" \
    "$TEXTS" "$ROWS" "$W/texts.parquet" && TEXTS=$W/texts.parquet
fi
"$PY" bench/random_teachers.py "$B" "$W/t" mpnet minilm || exit 1
[ "$DEVICE" = cuda ] && { "$PY" bench/gpu_busy.py sample "$O/smi.csv" & SAMPLER=$!; }

# 1. The preset end to end: teacher pass, start model pass, leakage, two stages, choice, export, STS-B dev/test.
timeout -s INT -k 20 "${DISTILL_LIMIT:-400}" "$PY" bench/gpu_busy.py run "$O/distill.log" -- \
  "$PY" -m kd distill "$TEXTS" --text-column text --student tiny6 --teacher "$W/t/mpnet" --start "$W/t/minilm" -o "$W/d"
echo "=== distill rc=$?"
[ -f "$O/smi.csv" ] && "$PY" bench/gpu_busy.py report "$O/smi.csv" "$O/distill.log" | tee "$O/distill_busy.md"
for f in distill.json report.json; do [ -f "$W/d/$f" ] && cp "$W/d/$f" "$O/$f"; done
for s in cosine relational; do [ -f "$W/d/stages/$s/metrics.jsonl" ] && cp "$W/d/stages/$s/metrics.jsonl" "$O/metrics-$s.jsonl"; done

# 2. kd precompute vs ST encode, same GPU, fresh processes, alternated: short texts, then documents of 16
#    consecutive corpus texts (~230 words, under mpnet's 384 tokens).
"$PY" -c "import pyarrow as pa, pyarrow.parquet as pq, sys; t = pq.read_table(sys.argv[1]).column('text').to_pylist()
pq.write_table(pa.table({'text': [' '.join(t[16 * i:16 * i + 16]) for i in range(len(t) // 16)]}), sys.argv[2])" "$TEXTS" "$W/long.parquet"
# one untimed import of both sides first: a fresh machine has no bytecode cache, and whichever side ran first
# would pay for compiling the libraries both share
"$PY" -c "import sentence_transformers, kd.pipeline.precompute, transformers.models.mpnet.modeling_mpnet" >/dev/null 2>&1
AB=(--pairs "${PAIRS:-3}" --device "$DEVICE")
timeout -k 10 "${AB_LIMIT:-100}" "$PY" bench/gpu_vs_st.py "$TEXTS" "$W/t/mpnet" "$W/ab" --n "${N_SHORT:-40000}" --name short "${AB[@]}" 2>&1 | tee "$O/ab-short.log"
timeout -k 10 "${AB_LIMIT:-100}" "$PY" bench/gpu_vs_st.py "$W/long.parquet" "$W/t/mpnet" "$W/ab" --n "${N_LONG:-4000}" --name long "${AB[@]}" 2>&1 | tee "$O/ab-long.log"
[ -n "${SAMPLER:-}" ] && kill "$SAMPLER"
echo "=== done"
