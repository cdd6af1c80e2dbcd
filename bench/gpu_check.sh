#!/usr/bin/env bash
# kd's CUDA paths end to end on one GPU, with their throughput: the stronger-teacher recipe's shape
# (issue 26) at full size, on the frontier corpus's 267,355 sentences.
#
#   bash bench/gpu_check.sh bundle                               # here: make .gpu (then carry it)
#   BUNDLE=.gpu OUT=/tmp/gpu-out bash bench/gpu_check.sh        # on the GPU machine (device tool)
#   DEVICE=cpu BACKEND=torch ROWS=2000 STEPS=20 PYTEST_ARGS= KD_PTH=0 bash bench/gpu_check.sh   # a CPU dry run
#
# Why random weights: a GPU machine here reaches no network and takes at most 64 MiB of files, so
# mpnet's 438 MB of weights cannot travel. The teachers are built there from the real checkpoints'
# config.json and tokenizer (same architecture, same tokens, same FLOPs per row): every speed figure
# holds for the real weights; no quality figure comes from this script.
# BUNDLE holds: texts.parquet (column text), mpnet-shape/ and minilm-shape/ (each checkpoint's folder
# without its weights), shared/data/corpus/eng_news_2016_10K-sentences.txt (the tests' real sentences); ~13 MB,
# made by `bundle` from STORE's texts (default: the stronger-teacher store) and the resolved teachers.
# Each step is timed, bounded, logged, and a failed step does not stop the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUNDLE:-.gpu}
if [ "${1:-}" = bundle ]; then
  PY=${PYTHON:-.venv/bin/python}
  rm -rf "$B" && mkdir -p "$B/shared/data/corpus"
  grep -qx "/$B/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/$B/" >>.git/info/exclude; }
  "$PY" -c "import pyarrow.dataset as ds, pyarrow.parquet as pq, sys; pq.write_table(ds.dataset(sys.argv[1]).to_table(
columns=['text']), sys.argv[2], compression='zstd')" "${STORE:-bench/out/stronger-full/store}/texts" "$B/texts.parquet"
  for t in mpnet minilm; do
    dir=$("$PY" -c "import sys; from kd.pipeline.teacher.resolve import resolve_teacher; print(resolve_teacher(sys.argv[1]).path)" $t)
    mkdir -p "$B/$t-shape" && (cd "$dir" && tar cf - --exclude='*.safetensors' --exclude='*.bin' .) | (cd "$B/$t-shape" && tar xf -)
  done
  cp ../shared/data/corpus/eng_news_2016_10K-sentences.txt "$B/shared/data/corpus/"
  du -sh "$B"; exit 0
fi
O=${OUT:-/tmp/kd-gpu-out}
W=${WORK:-/tmp/kd-gpu}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-1500}
rm -rf "$W" && mkdir -p "$W/pp" "$O" && rm -f "$O/steps.txt"
# The repository root is the package `kd` (pyproject's package-dir): importable without an install.
ln -sfn "$PWD" "$W/pp/kd"
export PYTHONPATH="$W/pp${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=true
KD=(python3 -m kd)

step() {  # NAME SECONDS CMD...: run one bounded step, log its rc and wall time
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout -s INT -k 15 "$limit" "$@"
  local rc=$?
  echo "=== $name rc=$rc wall=$((SECONDS - t0))s"
  echo "$name $rc $((SECONDS - t0))" >>"$O/steps.txt"
  return $rc
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  nproc; python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
'transformers', transformers.__version__)"; } 2>&1 | tee "$O/machine.txt"

# GPU utilisation and memory every second, to tell GPU-bound steps from CPU-bound ones.
(nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 >"$O/smi.csv" 2>/dev/null &)

TEXTS=$B/texts.parquet
if [ -n "${ROWS:-}" ]; then
  python3 -c "import pyarrow.parquet as pq, sys; pq.write_table(pq.read_table(sys.argv[1]).slice(0, int(sys.argv[2])), sys.argv[3])" \
    "$TEXTS" "$ROWS" "$W/texts.parquet" && TEXTS=$W/texts.parquet
fi

step teachers 60 python3 bench/random_teachers.py "$B" "$W/t" mpnet minilm

ROWS_FLAGS=(--text-column text --shard-rows 2000 --device "$DEVICE" --backend "${BACKEND:-auto}")
step precompute-mpnet 200 "${KD[@]}" precompute "$TEXTS" "${ROWS_FLAGS[@]}" -t mpnet="$W/t/mpnet" \
  --outputs sentence,mean,cls,vocab -o "$W/store"
step precompute-minilm 120 "${KD[@]}" precompute "$TEXTS" "${ROWS_FLAGS[@]}" -t minilm="$W/t/minilm" \
  --outputs sentence,init --keep-layers 0,1,2,3,4,5 -o "$W/store"
du -sb "$W/store" | tee -a "$O/machine.txt"

TRAIN=(train-student -s "$W/store" --target mpnet.sentence --arch transformer-init --init-teacher minilm
       --init-layers 0,1,2,3,4,5 --device "$DEVICE")
step train-tinit6 150 "${KD[@]}" "${TRAIN[@]}" -o "$W/tinit6" --max-steps "$STEPS"

# SIGTERM on CUDA: the step in flight finishes, a checkpoint of it is written, exit 143; then resume.
echo "=== sigterm"
"${KD[@]}" "${TRAIN[@]}" -o "$W/stop" --max-steps 100000 >"$O/stop.log" 2>&1 &
pid=$!
sleep "${STOP_AFTER:-30}"; kill -TERM $pid; wait $pid; echo "=== sigterm rc=$? (143 expected)"
tail -c 600 "$O/stop.log"; echo
at=$(grep -o 'after step [0-9,]*' "$O/stop.log" | tail -1 | tr -dc 0-9)
step resume 60 "${KD[@]}" "${TRAIN[@]}" -o "$W/stop" --max-steps $(( ${at:-0} + ${RESUME_EXTRA:-200} ))

step embed-tinit6 60 "${KD[@]}" embed "$TEXTS" --text-column text --student "$W/tinit6" --device "$DEVICE" -o "$W/vec.parquet"
step export-onnx 60 "${KD[@]}" export "$W/tinit6" --format onnx -o "$W/tinit6-onnx"

# The suite's device-sensitive tests, with a GPU present (device auto picks it). Their subprocesses set their
# own PYTHONPATH: on the throwaway GPU machine a .pth makes this checkout importable as kd there too.
[ "${KD_PTH:-1}" = 1 ] && echo "$W/pp" >"$(python3 -c 'import site; print(site.getsitepackages()[0])')/kd-checkout.pth"
[ -d "$B/shared" ] && export KD_SHARED="$PWD/$B/shared"
step pytest 120 python3 -m pytest -q -p no:cacheprovider ${PYTEST_ARGS--n 8} tests/pipeline/test_teacher_device.py tests/pipeline/test_precision.py \
  tests/student/test_trainer.py tests/student/test_transformer_init.py tests/student/test_cross_teacher.py tests/student/test_student_models.py \
  tests/pipeline/test_teacher_device.py
cat "$O/steps.txt"
pkill -f "nvidia-smi --query-gpu" || true
