"""`kd precompute` against sentence-transformers' `encode` on one GPU: whole processes, A/B alternated.

    python bench/gpu_vs_st.py TEXTS.parquet TEACHER_DIR WORK --n 40000 --pairs 3 --name short

Each round runs one fresh process per side, the order swapped every round (kd first in rounds 0, 2, ...):
- kd: `python -m kd precompute TEXTS[:n] -t NAME=TEACHER --outputs sentence --device cuda` (its CUDA default:
  fp16 autocast, token-budget batches; reads Parquet, writes checksummed shards and a manifest);
- ST: `SentenceTransformer(TEACHER, device="cuda", model_kwargs={"torch_dtype": torch.float16})` then
  `encode(texts, batch_size=--st-batch, convert_to_numpy=True)` and the vectors saved with `np.save` (ST sorts
  texts by length itself; fp16 weights are its fastest plain-PyTorch setting on a GPU).
Both read the same first `n` texts, both truncate at the model's max_seq_length, both in fp16 arithmetic. The
wall time is the process's, interpreter start to exit, as a user waits for it. Printed: medians and ranges per
side, the ratio, and the cosine of kd's vectors to ST's on the same texts (min and mean).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ST_CHILD = """
import sys, numpy as np, pyarrow.parquet as pq, torch
from sentence_transformers import SentenceTransformer
texts = pq.read_table(sys.argv[1]).column("text").to_pylist()
dtype = torch.float16 if sys.argv[5] == "cuda" else torch.float32
m = SentenceTransformer(sys.argv[2], device=sys.argv[5], model_kwargs={"torch_dtype": dtype})
np.save(sys.argv[3], m.encode(texts, batch_size=int(sys.argv[4]), convert_to_numpy=True))
"""


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return wall


def agreement(store: Path, texts: list[str], st_vectors: Path) -> tuple[float, float]:
    """Cosine of kd's stored sentence vector to ST's for each text (matched by text, not by row order)."""
    import numpy as np
    import pyarrow.dataset as ds

    ids = ds.dataset(sorted(store.glob("texts/part-*.parquet"))).to_table(columns=["id", "text"]).to_pydict()
    row_of = dict(zip(ids["text"], ids["id"]))
    t = ds.dataset(sorted(store.glob("teachers/*/part-*.parquet"))).to_table(columns=["id", "sentence"]).to_pydict()
    kd_vec = dict(zip(t["id"], t["sentence"]))
    st = np.load(st_vectors).astype(np.float32)
    a = np.asarray([kd_vec[row_of[x]] for x in texts], dtype=np.float32)
    cos = (a * st).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(st, axis=1) + 1e-12)
    return float(cos.min()), float(cos.mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("texts")
    ap.add_argument("teacher")
    ap.add_argument("work")
    ap.add_argument("--n", type=int, default=40_000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--st-batch", type=int, default=256)
    ap.add_argument("--name", default="job")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script (fp32 on both sides)")
    a = ap.parse_args()
    import pyarrow.parquet as pq

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    texts = pq.read_table(a.texts).column("text").to_pylist()[: a.n]
    src = work / f"{a.name}.parquet"
    pq.write_table(pq.read_table(a.texts).slice(0, a.n), src)
    py = sys.executable
    walls: dict[str, list[float]] = {"kd": [], "st": []}
    for r in range(a.pairs):
        store, vec = work / f"{a.name}-kd-{r}", work / f"{a.name}-st-{r}.npy"
        sides = {"kd": [py, "-m", "kd", "precompute", str(src), "--text-column", "text", "-t", f"t={a.teacher}",
                        "--outputs", "sentence", "--device", a.device, "--no-progress", "-o", str(store)],
                 "st": [py, "-c", ST_CHILD, str(src), a.teacher, str(vec), str(a.st_batch), a.device]}
        for side in (("kd", "st") if r % 2 == 0 else ("st", "kd")):
            walls[side].append(timed(sides[side]))
            print(f"{a.name} round {r} {side}: {walls[side][-1]:.1f} s", flush=True)
    lo, mean = agreement(work / f"{a.name}-kd-{a.pairs - 1}", texts, work / f"{a.name}-st-{a.pairs - 1}.npy")
    med = {s: statistics.median(w) for s, w in walls.items()}
    result = {"job": a.name, "texts": len(texts), "pairs": a.pairs, "st_batch": a.st_batch, "walls": walls,
              "median": med, "st_over_kd": med["st"] / med["kd"], "cos_min": lo, "cos_mean": mean}
    print(json.dumps(result), flush=True)
    for s in ("kd", "st"):
        print(f"| {a.name} ({len(texts):,} texts) | {s} | {med[s]:.1f} ({min(walls[s]):.1f}-{max(walls[s]):.1f}) | "
              f"{len(texts) / med[s]:,.0f} |")
    print(f"ST / kd: {med['st'] / med['kd']:.2f}x; cosine kd vs ST min {lo:.4f} mean {mean:.5f}")


if __name__ == "__main__":
    main()
