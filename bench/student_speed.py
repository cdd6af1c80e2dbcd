"""Two students' `encode` speed side by side: each run in a fresh process, A/B alternated, medians and spread.

Short texts (STS-B test sentences) and long ones (news articles, cut by the students' max length), one text per
call and 256 per call, the same texts and thread count on both sides. Issue 51 item 4: a student of a combined
target (mpnet + MiniLM, a 384 -> 1,152 head) against the single-teacher one (384 -> 768).

    python -m bench.student_speed A_DIR B_DIR --pairs 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.fresh import alternate, fmt, run_fresh, spread

ARTICLES = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus" / "news_articles.csv"


def _texts(kind: str) -> list[str]:
    if kind == "short":
        from kd.apps.eval import tasks

        sts = tasks.load_stsb("test")
        return (sts.a + sts.b)[:1024]
    import csv

    csv.field_size_limit(1 << 24)
    with open(ARTICLES, encoding="utf-8") as f:
        return [row["text"] for row, _ in zip(csv.DictReader(f), range(256))]


def child(folder: str, result: str) -> None:
    import torch

    from kd import student

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = student.load(folder)
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    for kind in ("short", "long"):
        texts = _texts(kind)
        for batch in (1, 256):
            n = min(len(texts), 256 if batch == 1 else len(texts))
            model.encode(texts[:batch], batch_size=batch)  # warm-up
            t = time.perf_counter()
            for i in range(0, n, batch):
                model.encode(texts[i : i + batch], batch_size=batch)
            out[f"{kind} x{batch}"] = n / (time.perf_counter() - t)
    out["seconds"] = time.perf_counter() - t0
    Path(result).write_text(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", nargs="?")
    ap.add_argument("b", nargs="?")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child")
    ap.add_argument("--result")
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.result)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    sides = {name: (lambda d=d: run_fresh("bench.student_speed", ["--child", d], args.threads))
             for name, d in (("A " + args.a, args.a), ("B " + args.b, args.b))}
    runs = alternate(sides, args.pairs)
    keys = [k for k in next(iter(runs.values()))[0] if k != "seconds"]
    print("| texts/s | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, rs in runs.items():
        print(f"| {name} | " + " | ".join(fmt(spread([r[k] for r in rs]), 0) for k in keys) + " |")


if __name__ == "__main__":
    main()
