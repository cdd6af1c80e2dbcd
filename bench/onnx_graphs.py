"""kd's ONNX teacher graphs against each other and torch: which exporter, and what smoothing costs int8.

    python -m bench.onnx_graphs [--n 3000] [--threads 2] [--pairs 3] [--graphs torch,traced,dynamo,...]

Graphs (MiniLM, exported once per graph into bench/out/onnx_graphs/<graph>/ before any clock starts):
- torch: no graph, kd's eager torch forward (the reference);
- traced / dynamo: the fp32 graph from torch's tracing exporter (kd's choice) / from torch.export;
- traced-int8 / dynamo-int8: kd's int8 recipe (SmoothQuant, then ONNX Runtime dynamic int8) on each;
- traced-int8-plain: the same without SmoothQuant.
Each run is a fresh process limited to `--threads` threads that loads the teacher on its graph (fidelity
check included, untimed), encodes 64 sentences as a warm-up, then times `pipeline.teacher.batches.encode_all`
(tokenize, forward, pool cls + mean + layers) on the first `--n` Leipzig sentences of
bench.precompute_vs_st. Rounds rotate the order. Printed: seconds median [min-max], speed-up against torch
in the same run, and the min / mean cosine of each graph's `mean` vectors to torch's.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from bench.fresh import ROOT, alternate, fmt, run_fresh, spread

WORK = ROOT / "bench" / "out" / "onnx_graphs"
GRAPHS = ("torch", "traced", "dynamo", "traced-int8", "dynamo-int8", "traced-int8-plain")


def load(graph: str):
    """The teacher on `graph`, exporting it into WORK/<graph> first if needed (KD_CACHE points there)."""
    from kd.pipeline.backends import export, loading
    from kd.pipeline.backends.loading import load_teacher

    if graph == "torch":
        return load_teacher("minilm", "cpu")
    os.environ["KD_CACHE"] = str(WORK / graph)
    if graph.startswith("dynamo"):  # the exporter kd uses past the protobuf limit
        real = export.to_onnx
        export.to_onnx = lambda g, args, path, inputs, outputs, big: real(g, args, path, inputs, outputs, True)
    if graph.endswith("-plain"):
        export.smooth_onnx = lambda *a: {"method": "none"}
    return loading.load("minilm", "onnx", "int8" if "int8" in graph else "none", precision="fp32")


def child(a: argparse.Namespace) -> None:
    import torch

    from bench.precompute_vs_st import load_sentences
    from kd.pipeline.teacher.batches import encode_all
    from kd.pipeline.teacher.model import Output

    torch.set_num_threads(a.threads)
    texts = load_sentences(a.n)
    outputs = [Output.mean, Output.cls, Output.layers]
    teacher = load(a.graph)
    encode_all(teacher, texts[:64], outputs)
    t0 = time.perf_counter()
    vectors = encode_all(teacher, texts, outputs)[0]["mean"]
    secs = time.perf_counter() - t0
    np.save(WORK / f"mean-{a.graph}.npy", vectors)
    Path(a.result).write_text(json.dumps({"seconds": secs, "rows": len(texts)}))


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--graph", default="torch", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    if a.child:
        return child(a)
    graphs = ["torch", *[g for g in a.graphs.split(",") if g != "torch"]]

    def run(g: str) -> dict:
        return run_fresh("bench.onnx_graphs", ["--child", "--graph", g, "--n", str(a.n), "--threads",
                                               str(a.threads)], a.threads)

    for g in graphs:  # export every graph once, untimed (a one-row run in a fresh process)
        run_fresh("bench.onnx_graphs", ["--child", "--graph", g, "--n", "1", "--threads", str(a.threads)], a.threads)
    print(f"load average before: {os.getloadavg()}; {a.n} sentences, {a.threads} threads, {a.pairs} rounds",
          flush=True)
    runs = alternate({g: (lambda g=g: run(g)) for g in graphs}, a.pairs)
    torch_s = spread([r["seconds"] for r in runs["torch"]])["median"]
    ref = np.load(WORK / "mean-torch.npy")
    print("| graph | run s | speed-up vs torch | min / mean cosine to torch |")
    print("|---|---|---|---|")
    for g in graphs:
        secs = spread([r["seconds"] for r in runs[g]])
        c = cosines(np.load(WORK / f"mean-{g}.npy"), ref)
        print(f"| {g} | {fmt(secs)} | {torch_s / secs['median']:.2f}x | {c.min():.5f} / {c.mean():.6f} |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
