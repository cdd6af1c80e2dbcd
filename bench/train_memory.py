"""Peak RSS of `kd train-student` on a store and on one 10x larger: streaming keeps memory flat.

Two synthetic stores (tests/student_stores.make_store: real tokenizer, 384-d teacher vectors with
per-layer states, 20,000-row shards) of N and 10 N rows. Each run trains the same student for the
same number of steps in a fresh subprocess, with the `layers` column read too (the heaviest
projection: contrastive objective); the peak RSS of each child is read from getrusage.
Target: ratio <= 1.2.

    python bench/train_memory.py --rows 20000 --steps 150
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


# A fresh wrapper process per run: RUSAGE_CHILDREN is the max over every child a process ever waited
# for, so measuring two runs from one parent would report the larger twice.
WRAPPER = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def peak_rss_mb(store: Path, out: Path, steps: int) -> float:
    cmd = [sys.executable, "-m", "kd", "train-student", "-s", str(store), "-o", str(out), "--max-steps", str(steps),
           "--objective", "cosine", "--objective", "contrastive:0.5", "--batch-size", "64", "--hidden-dim", "128",
           "--no-progress", "--eval-every", "1000000", "--patience", "0"]
    res = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], check=True, cwd=ROOT, capture_output=True, text=True)
    return int(res.stdout.split()[-1]) / 1024  # Linux reports KiB


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()
    from student_stores import make_store

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        small = make_store(t / "x1", rows=args.rows, shards=max(1, args.rows // 20000), dim=384, num_layers=6, tmp=t)
        big = make_store(t / "x10", rows=10 * args.rows, shards=max(1, args.rows // 2000), dim=384, num_layers=6,
                         tmp=t)
        size = {p: sum(f.stat().st_size for f in p.rglob("*.parquet")) / 1e6 for p in (small, big)}
        r1 = peak_rss_mb(small, t / "s1", args.steps)
        r10 = peak_rss_mb(big, t / "s10", args.steps)
    print(f"store 1x : {args.rows:,} rows, {size[small]:,.0f} MB parquet -> peak RSS {r1:,.0f} MB")
    print(f"store 10x: {10 * args.rows:,} rows, {size[big]:,.0f} MB parquet -> peak RSS {r10:,.0f} MB")
    print(f"ratio 10x / 1x: {r10 / r1:.2f} (target <= 1.2)")


if __name__ == "__main__":
    main()
