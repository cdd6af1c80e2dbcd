"""Two kd trees' `kd precompute` on the same job, A/B alternated, each run a fresh process: wall time, the
encoding phase's rows/s, the GPU's busy share while each run lasted, and whether both wrote the same vectors.

- a side is NAME=DIR, DIR holding a `kd` package (a link to a checkout: `mkdir pp && ln -s $PWD pp/kd`);
- a job is NAME:TEXTS:TEACHER:OUTPUTS; every job runs PAIRS times per side, sides in alternating order
  (A B, B A, ...), each into a new store;
- on a GPU, nvidia-smi samples utilisation every 100 ms in the background; each run's share is the mean of
  the samples taken while it ran;
- vectors: each job's last store of each side is read back and compared (max |a - b| per column), so a
  faster side that writes other numbers shows up in the same table.

    python bench/precompute_ab.py --side new=/tmp/pp --side base=/tmp/ppbase \\
        --job mpnet:/tmp/t80k.parquet:/tmp/t/mpnet:sentence,mean,cls --pairs 3 --out /tmp/ab
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

SUMMARY = re.compile(r"; ([\d.]+) s, ([\d,]+) rows/s")
ENCODING = re.compile(r"([\d,.]+) rows/s, elapsed")


def run_once(side_dir: str, job: list[str], store: Path, extra: list[str]) -> dict:
    """One fresh `python -m kd precompute` of `job` with the kd of `side_dir`: wall time and the rates it printed."""
    name, texts, teacher, outputs = job
    env = {**os.environ, "PYTHONPATH": side_dir, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "kd", "precompute", texts, "--text-column", "text", "-t", f"{name}={teacher}",
           "--outputs", outputs, "-o", str(store), *extra]
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    t1 = time.time()
    log = (proc.stdout + proc.stderr).replace("\r", "\n")
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log[-3000:]}")
    summary = SUMMARY.findall(log)
    encoding = ENCODING.findall(log)
    return {"start": t0, "end": t1, "wall": t1 - t0, "job_s": float(summary[-1][0]) if summary else None,
            "encode_rows_s": float(encoding[-1].replace(",", "")) if encoding else None}


def gpu_busy(samples: Path, start: float, end: float) -> float | None:
    """Mean GPU utilisation (%) of the nvidia-smi samples taken between start and end (epoch seconds)."""
    if not samples.exists():
        return None
    vals = []
    for line in samples.read_text().splitlines():
        parts = line.split(",")
        if len(parts) < 2:
            continue
        try:
            t = time.mktime(time.strptime(parts[0].strip().split(".")[0], "%Y/%m/%d %H:%M:%S"))
            t += float("0." + parts[0].strip().split(".")[1]) if "." in parts[0] else 0.0
            util = float(parts[1].strip().split()[0])
        except (ValueError, IndexError):
            continue
        if start <= t <= end:
            vals.append(util)
    return statistics.mean(vals) if vals else None


def max_difference(a: Path, b: Path, name: str, outputs: str) -> dict[str, float]:
    """max |a - b| per output column between two stores of the same job (rows matched by id)."""
    import numpy as np
    import pyarrow.dataset as ds

    diffs = {}
    for col in outputs.split(","):
        ta, tb = (ds.dataset(sorted(map(str, (s / "teachers" / name).glob("*.parquet"))), format="parquet")
                  .to_table(columns=["id", col]).sort_by("id") for s in (a, b))
        assert ta["id"].equals(tb["id"]), "both sides hold the same ids"
        va = np.stack(ta[col].to_numpy(zero_copy_only=False)).astype(np.float32)
        vb = np.stack(tb[col].to_numpy(zero_copy_only=False)).astype(np.float32)
        diffs[col] = float(np.abs(va - vb).max())
    return diffs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side", action="append", required=True, help="NAME=DIR (DIR/kd is the package); two of them")
    ap.add_argument("--job", action="append", required=True, help="NAME:TEXTS:TEACHER_DIR:OUTPUTS")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--extra", default="", help="more precompute flags, e.g. '--device cuda'")
    ap.add_argument("--out", default="/tmp/precompute-ab")
    args = ap.parse_args()
    sides = [s.split("=", 1) for s in args.side]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    samples = out / "smi.csv"
    smi = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,utilization.gpu", "--format=csv,noheader",
                                "-lms", "100"], stdout=samples.open("w"), stderr=subprocess.DEVNULL)
    rows, last = [], {}
    try:
        for spec in args.job:
            job = spec.split(":")
            for pair in range(args.pairs):
                order = sides if pair % 2 == 0 else sides[::-1]
                for side, pp in order:
                    store = out / "stores" / f"{job[0]}-{side}-{pair}"
                    shutil.rmtree(store, ignore_errors=True)
                    r = run_once(pp, job, store, args.extra.split())
                    r |= {"job": job[0], "side": side, "pair": pair}
                    rows.append(r)
                    last[(job[0], side)] = store
                    print(json.dumps({k: v for k, v in r.items() if k not in ("start", "end")}), flush=True)
    finally:
        if smi:
            smi.terminate()
    for r in rows:
        r["gpu_busy"] = gpu_busy(samples, r["start"], r["end"])
    report = []
    for spec in args.job:
        job = spec.split(":")
        for side, _ in sides:
            mine = [r for r in rows if r["job"] == job[0] and r["side"] == side]
            def med(key: str, mine: list[dict] = mine) -> str:
                vals = [r[key] for r in mine if r[key] is not None]
                return f"{statistics.median(vals):,.1f} ({min(vals):,.1f}-{max(vals):,.1f})" if vals else "-"
            report.append(f"| {job[0]} | {side} | {med('wall')} | {med('job_s')} | {med('encode_rows_s')} | "
                          f"{med('gpu_busy')} |")
        a, b = (last[(job[0], s)] for s, _ in sides)
        report.append(f"| {job[0]} | max abs diff {sides[0][0]} vs {sides[1][0]} | "
                      f"{max_difference(a, b, job[0], job[3])} | | | |")
    table = ("| job | side | wall s, median (range) | job s (kd's summary) | encoding rows/s | GPU busy % |\n"
             "|---|---|---|---|---|---|\n" + "\n".join(report))
    (out / "runs.json").write_text(json.dumps(rows, indent=1))
    (out / "table.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
