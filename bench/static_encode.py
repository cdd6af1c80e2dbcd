"""A static student's encode: the numpy path (calls of up to NUMPY_STATIC_TEXTS texts) against torch's
embedding_bag, at 1 text per call and 256, each side in a fresh process, A/B alternated.

- the same student, texts (STS-B test sentences, tokenisation included) and thread count on both sides;
- `--pairs` rounds of (A, B) with the order swapped every round; medians and min-max of texts/s;
- torch's side is forced by `LoadedStudent._static = None` (the numpy arrays never built).

    python -m bench.static_encode --student kd-demo/students/static --pairs 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = """
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]))
from kd import student
from kd.apps.eval import tasks
st = student.load(sys.argv[1])
if sys.argv[2] == "torch":
    st._static = None
sts = tasks.load_stsb("test")
texts = (sts.a + sts.b)[:2048]
out = {}
for batch, n in ((1, 1024), (256, 2048)):
    st.encode(texts[:batch])  # warm-up
    t = time.perf_counter()
    for i in range(0, n, batch):
        st.encode(texts[i:i + batch], batch_size=batch)
    out[str(batch)] = n / (time.perf_counter() - t)
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--student", required=True)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), TOKENIZERS_PARALLELISM="false")
    print(f"load average before: {os.getloadavg()}", flush=True)
    runs: dict[str, list[dict]] = {"numpy": [], "torch": []}
    for r in range(a.pairs):
        for side in (("numpy", "torch") if r % 2 == 0 else ("torch", "numpy")):
            res = subprocess.run([sys.executable, "-c", CHILD, a.student, side, str(a.threads)], env=env,
                                 check=True, capture_output=True, text=True)
            runs[side].append(json.loads(res.stdout.strip().splitlines()[-1]))
    for side, rs in runs.items():
        for batch in ("1", "256"):
            vals = [x[batch] for x in rs]
            print(f"{side:5s} batch {batch:>3}: {statistics.median(vals):,.0f} texts/s "
                  f"[{min(vals):,.0f}-{max(vals):,.0f}] over {len(vals)} processes")
    print(f"load average after: {os.getloadavg()}; {time.strftime('%Y-%m-%d %H:%M')}")


if __name__ == "__main__":
    main()
