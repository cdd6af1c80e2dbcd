"""kd precompute --engine ray (N one-thread workers) vs one process (N threads), measured fairly.

    python -m bench.ray_engine [--n 4000] [--workers 2] [--pairs 3] [--teacher minilm] [--shard-rows 250]
    python -m bench.ray_engine --quick     # a smoke run: 200 sentences, one pair

Each run is a fresh process limited to `--workers` threads (torch, OpenMP, MKL, tokenizers), on the first `--n`
real sentences (Leipzig news + Wikipedia 2016) and a new store:
- `one`: `precompute()` in that process, torch on `--workers` threads;
- `ray`: a local Ray runtime with `--workers` CPUs is started first (timed apart: `ray start`), then
  `precompute(engine="ray", workers=N)`: N actors of one thread each, each loading the teacher.
Both time the whole `precompute()` call (read input, load teachers, encode, write checksummed shards; ray: also
start its actors). Sides alternate for `--pairs` rounds (order rotated each round). Printed per side: seconds
and rows/s as median [min-max]; the ratio one / ray of the medians (> 1: ray faster), with and without Ray's
runtime start. Results also go to bench/out/ray_engine.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from bench.fresh import ROOT, alternate, fmt, run_fresh, spread

OUT = ROOT / "bench" / "out"


def load_sentences(n: int) -> list[str]:
    from kd.apps.eval.corpus import _leipzig

    return (_leipzig("news") + _leipzig("wikipedia"))[:n]


def child(a: argparse.Namespace) -> None:
    """One timed run in this (fresh) process; writes {seconds, rows, ...} to --result."""
    from kd.pipeline.precompute import precompute

    tmp = Path(tempfile.mkdtemp(prefix="kd-ray-bench-"))
    try:
        src = tmp / "corpus.txt"
        src.write_text("\n".join(load_sentences(a.n)) + "\n", encoding="utf-8")
        kwargs = dict(shard_rows=a.shard_rows, precision=a.precision, progress=False)
        startup = 0.0
        if a.side == "ray":
            import ray

            t = time.perf_counter()
            ray.init(num_cpus=a.workers, include_dashboard=False, logging_level="WARNING")
            startup = time.perf_counter() - t
            kwargs |= dict(engine="ray", workers=a.workers)
        t = time.perf_counter()
        s = precompute([str(src)], str(tmp / "store"), [a.teacher], **kwargs)
        seconds = time.perf_counter() - t
        if a.side == "ray":
            ray.shutdown()
        result = {"seconds": seconds, "startup": startup, "rows": s.rows_computed, "shards": s.shards_written}
        Path(a.result).write_text(json.dumps(result))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4000, help="sentences")
    ap.add_argument("--workers", type=int, default=2, help="Ray workers of one thread = threads of the one process")
    ap.add_argument("--pairs", type=int, default=3, help="rounds of (one, ray)")
    ap.add_argument("--teacher", default="minilm")
    ap.add_argument("--shard-rows", type=int, default=250, help="rows per shard = per unit")
    ap.add_argument("--precision", default="auto", help="both sides alike")
    ap.add_argument("--quick", action="store_true", help="smoke run: 200 sentences, shards of 50, one pair")
    ap.add_argument("--json", default=str(OUT / "ray_engine.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--side", default="one", help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    if a.quick:
        a.n, a.shard_rows, a.pairs = 200, 50, 1
    args = ["--n", str(a.n), "--workers", str(a.workers), "--teacher", a.teacher, "--shard-rows", str(a.shard_rows),
            "--precision", a.precision, "--child"]
    sides = {s: (lambda s=s: run_fresh("bench.ray_engine", [*args, "--side", s], a.workers)) for s in ("one", "ray")}
    print(f"{a.n} sentences, teacher {a.teacher}, shards of {a.shard_rows}, {a.workers} threads: one process vs "
          f"{a.workers} Ray workers x 1 thread; {a.pairs} pair(s), load {os.getloadavg()[0]:.2f}")
    runs = alternate(sides, a.pairs)
    summary: dict = {"n": a.n, "workers": a.workers, "teacher": a.teacher, "shard_rows": a.shard_rows,
                     "precision": a.precision, "pairs": a.pairs, "machine": platform.processor() or platform.machine(),
                     "cpus": os.cpu_count(), "runs": runs}
    for side, rs in runs.items():
        secs = spread([r["seconds"] for r in rs])
        rate = spread([r["rows"] / r["seconds"] for r in rs])
        summary[side] = {"seconds": secs, "rows_per_s": rate, "startup": spread([r["startup"] for r in rs])}
        extra = f", + ray start {fmt(summary[side]['startup'])} s" if side == "ray" else ""
        print(f"{side:>4}: {fmt(secs)} s, {fmt(rate, 0)} rows/s{extra}")
    one, ray = summary["one"]["seconds"]["median"], summary["ray"]["seconds"]["median"]
    summary["ratio"] = one / ray
    summary["ratio_with_start"] = one / (ray + summary["ray"]["startup"]["median"])
    print(f"one / ray (median seconds): {summary['ratio']:.2f}x; with Ray's runtime start: "
          f"{summary['ratio_with_start']:.2f}x (> 1: ray faster)")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
