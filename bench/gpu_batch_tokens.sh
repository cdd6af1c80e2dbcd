#!/usr/bin/env bash
# kd precompute's token budget per batch on CUDA (--batch-tokens 16384 / 65536 / 262144), each run in a fresh
# process, two rounds in opposite orders; an mpnet-shaped teacher with random weights (bench/random_teachers.py says
# why), the same N texts each run. Needs the .gpu bundle of bench/gpu_check.sh.
#   OUT=/tmp/bt-out bash bench/gpu_batch_tokens.sh          # on the GPU machine
#   DEV=cpu N=300 bash bench/gpu_batch_tokens.sh             # a dry run
set -u
cd "$(dirname "$0")/.."
DEV=${DEV:-cuda}; N=${N:-60000}; O=${OUT:-/tmp/bt-out}; mkdir -p $O
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/pp
mkdir -p /tmp/pp && ln -sfn $PWD /tmp/pp/kd
rm -rf /tmp/t /tmp/bt-s-*
python3 bench/random_teachers.py .gpu /tmp/t mpnet
python3 -c "import pyarrow.parquet as pq,sys; pq.write_table(pq.read_table('.gpu/texts.parquet').slice(0,int(sys.argv[1])),'/tmp/tN.parquet')" $N
(nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 1 > $O/smi.csv 2>/dev/null &)
for bt in 16384 65536 262144 262144 65536 16384; do
  echo "=== bt=$bt $(date +%T)" | tee -a $O/bt.txt
  python3 -m kd precompute /tmp/tN.parquet --text-column text --device $DEV -t mpnet=/tmp/t/mpnet \
    --outputs sentence,mean,cls --batch-tokens $bt -o /tmp/bt-s-$bt-$RANDOM 2>&1 | tr '\r' '\n' | grep -a "rows/s" | tail -2 | tee -a $O/bt.txt
done
pkill -f "nvidia-smi --query" || true
