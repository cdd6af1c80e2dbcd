"""Fair A/B timing helpers shared by the benchmarks: a fresh process per run, equal thread pools, medians.

- `run_fresh` starts `python -m <module> ...` in a new process whose BLAS/OpenMP/tokenizer pools are
  limited to the same thread count, and returns the JSON the child wrote (the child times itself);
- `alternate` runs sides A and B for `pairs` rounds, swapping which goes first each round, so a slow
  drift of the machine (thermal, page cache, a neighbour) hits both sides alike;
- `spread` gives median, min and max: benchmark figures are reported as median [min-max].
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def thread_env(threads: int) -> dict[str, str]:
    n = str(threads)
    return dict(os.environ, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, RAYON_NUM_THREADS=n,
                TOKENIZERS_PARALLELISM="false")


def run_fresh(module: str, args: list[str], threads: int, python: str | None = None) -> dict:
    """Run `python -m module args --result FILE` in a fresh process; return the JSON it wrote to FILE."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [python or sys.executable, "-m", module, *args, "--result", str(result)]
        subprocess.run(cmd, check=True, env=thread_env(threads), cwd=ROOT)
        return json.loads(result.read_text())


def alternate(sides: dict[str, Callable[[], dict]], pairs: int, log: Callable[[str], None] = print
              ) -> dict[str, list[dict]]:
    """Run every side once per round, rotating the order each round; all results per side."""
    names = list(sides)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(pairs):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            runs[n].append(sides[n]())
            log(f"  round {r + 1}/{pairs} {n}: {runs[n][-1].get('seconds', 0):.1f} s "
                f"(load {os.getloadavg()[0]:.2f})")
    return runs


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(s: dict[str, float], digits: int = 1) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"
