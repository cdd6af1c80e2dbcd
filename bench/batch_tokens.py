"""kd precompute's wall time per token budget (`--batch-tokens`), fresh processes, budgets rotated.

    python -m bench.batch_tokens [--n 10000] [--threads 2] [--pairs 3] [--budgets 2048,4096,8192,16384]
                                 [--backend torch] [--precision fp32]

Each run is `bench.precompute_vs_st`'s kd child (imports warmed, then `precompute()` of the first `--n`
Leipzig sentences writing cls + mean + layers) with one budget; every round runs each budget once, the
order rotated. Why it matters: on a CPU, a batch's activations (rows x padded length x hidden, and 4x
that inside the feed-forward) stream through the caches for every elementwise op (GELU, LayerNorm,
residual adds, softmax); a budget sized for a GPU keeps them in DRAM. Printed: median [min-max] seconds
and sentences/s per budget, and the speed-up against the largest budget measured in the same run.
"""

from __future__ import annotations

import argparse
import os

from bench.fresh import alternate, fmt, run_fresh, spread


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--budgets", default="2048,4096,8192,16384")
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--precision", default="fp32")
    a = ap.parse_args()
    budgets = [int(b) for b in a.budgets.split(",")]

    def run(budget: int) -> dict:
        return run_fresh("bench.precompute_vs_st", ["--child", "--side", "kd", "--backend", a.backend,
                                                    "--precision", a.precision, "--n", str(a.n),
                                                    "--threads", str(a.threads), "--batch-tokens", str(budget),
                                                    "--started", "0"], a.threads)

    print(f"load average before: {os.getloadavg()}; {a.n} sentences, {a.threads} threads, {a.pairs} rounds, "
          f"backend {a.backend}, precision {a.precision}", flush=True)
    runs = alternate({str(b): (lambda b=b: run(b)) for b in budgets}, a.pairs)
    ref = spread([r["seconds"] for r in runs[str(max(budgets))]])["median"]
    print(f"| --batch-tokens | seconds | sentences/s | speed-up vs {max(budgets)} |\n|---|---|---|---|")
    for b in budgets:
        secs = spread([r["seconds"] for r in runs[str(b)]])
        rate = spread([r["rows"] / r["seconds"] for r in runs[str(b)]])
        print(f"| {b} | {fmt(secs)} | {fmt(rate, 0)} | {ref / secs['median']:.2f}x |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
