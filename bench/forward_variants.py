"""Ways to run the teacher's torch forward pass on a CPU, timed: what kd's fp32 default was chosen against.

    python -m bench.forward_variants [--n 3000] [--threads 2] [--pairs 3] [--variants eager,compile,freeze,mkldnn]

Each run is a fresh process limited to `--threads` threads that loads the packaged MiniLM, applies one
variant, encodes 64 sentences as a warm-up (timed apart: compilation happens here), then times
`pipeline.teacher.batches.encode_all` (tokenize, forward, pool cls + mean + layers) on the first `--n` Leipzig
sentences of bench.precompute_vs_st. Variants:
- eager: the model as kd runs it (HF BERT, SDPA attention, fp32);
- compile: `torch.compile(model, dynamic=True)` (inductor; dynamic because every batch has its own shape);
- freeze: the same with inductor's `freezing` (weights folded in as constants, oneDNN prepacked linears);
- mkldnn: `torch.utils.mkldnn.to_mkldnn(model)` (Linear layers on oneDNN's blocked weight layout).
Rounds rotate the order. Printed: warm-up and run seconds as median [min-max], sentences/s, the speed-up
against eager in the same run, and the min cosine of each variant's `mean` vectors to eager's.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from bench.fresh import ROOT, alternate, fmt, run_fresh, spread

WORK = ROOT / "bench" / "out" / "forward_variants"
VARIANTS = ("eager", "compile", "freeze", "mkldnn")


def apply(model, variant: str):
    import torch

    if variant in ("compile", "freeze"):
        import torch._inductor.config as inductor

        inductor.freezing = variant == "freeze"
        return torch.compile(model, dynamic=True)
    if variant == "mkldnn":
        from torch.utils import mkldnn

        return mkldnn.to_mkldnn(model)
    return model


def child(a: argparse.Namespace) -> None:
    import torch

    from bench.precompute_vs_st import load_sentences
    from kd.pipeline.backends.loading import load_teacher
    from kd.pipeline.teacher.batches import encode_all
    from kd.pipeline.teacher.model import Output

    torch.set_num_threads(a.threads)
    texts = load_sentences(a.n)
    outputs = [Output.mean, Output.cls, Output.layers]
    teacher = load_teacher("minilm", "cpu")
    teacher.model = apply(teacher.model, a.variant)
    t0 = time.perf_counter()
    encode_all(teacher, texts[:64], outputs)
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    vectors = encode_all(teacher, texts, outputs)[0]["mean"]
    secs = time.perf_counter() - t0
    WORK.mkdir(parents=True, exist_ok=True)
    np.save(WORK / f"mean-{a.variant}.npy", vectors)
    Path(a.result).write_text(json.dumps({"seconds": secs, "warm_seconds": warm, "rows": len(texts)}))


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="eager", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    variants = a.variants.split(",")
    if "eager" not in variants:
        variants.insert(0, "eager")

    def run(v: str) -> dict:
        return run_fresh("bench.forward_variants", ["--child", "--variant", v, "--n", str(a.n),
                                                    "--threads", str(a.threads)], a.threads)

    print(f"load average before: {os.getloadavg()}; {a.n} sentences, {a.threads} threads, {a.pairs} rounds",
          flush=True)
    runs = alternate({v: (lambda v=v: run(v)) for v in variants}, a.pairs)
    eager = spread([r["seconds"] for r in runs["eager"]])["median"]
    ref = np.load(WORK / "mean-eager.npy")
    print("| variant | warm-up s (compile) | run s | sentences/s | speed-up vs eager | min cosine to eager |")
    print("|---|---|---|---|---|---|")
    for v in variants:
        secs = spread([r["seconds"] for r in runs[v]])
        warm = spread([r["warm_seconds"] for r in runs[v]])
        rate = spread([r["rows"] / r["seconds"] for r in runs[v]])
        cos = min_cosine(np.load(WORK / f"mean-{v}.npy"), ref)
        print(f"| {v} | {fmt(warm)} | {fmt(secs)} | {fmt(rate, 0)} | {eager / secs['median']:.2f}x | {cos:.6f} |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
