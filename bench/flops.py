"""How close a precompute run is to this CPU's matrix-multiply ceiling: the FLOP arithmetic of issue 13.

A teacher's forward pass is matrix multiplies. If a speed target needs more multiply-adds per second than
the CPU can do at that precision, no change to kd's pipeline can reach it. This script:
- counts the forward FLOPs of the teacher on the benchmark's sentences (bench.precompute_vs_st's
  first `--n` Leipzig sentences), from the real token counts and the model's shapes: per layer
  2*T*(4*d^2 + 2*d*ff) for the projections and feed-forward, 4*T^2*d for attention scores and mixing;
- measures the ceiling: the best GFLOP/s of torch matmuls of the teacher's own shapes (512 to `--tokens`
  tokens x d x ff, ff x d, d x d; fp32 and bf16 as F.linear; int8 as the faster of torch._int_mm and
  ONNX Runtime's MatMulInteger, the kernel int8 ONNX models run) at `--threads` threads;
- prints, for each sentences/s figure given (`--rate NAME=SENT_PER_S`), the GFLOP/s it implies and
  its share of the ceiling at its precision. A rate needing > 100 % of the ceiling is out of reach.

    python -m bench.flops --n 10000 --threads 2 --rate "ST fp32=273" --rate "kd fp32=264" \
        --rate "target fp32 (1.25x ST)=341"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def forward_flops(token_counts: list[int], layers: int, d: int, ff: int) -> float:
    """Multiply-add FLOPs (2 per MAC) of a BERT encoder over sentences of these lengths, no padding."""
    total = 0.0
    for t in token_counts:
        total += layers * (2 * t * (4 * d * d + 2 * d * ff) + 4 * t * t * d)
    return total


def ceiling(dtype: str, m: int, k: int, n: int, repeats: int = 20) -> float:
    """GFLOP/s of an [m, k] x [k, n] matmul in `dtype`: the fastest quartile of `repeats` calls after 3
    warm-ups (oneDNN picks and caches its kernel on the first ones); float types as F.linear, the call a
    model makes (weights [n, k]), int8 via torch._int_mm."""
    import torch
    import torch.nn.functional as F

    if dtype == "int8":
        a = torch.randint(-128, 127, (m, k), dtype=torch.int8)
        b = torch.randint(-128, 127, (k, n), dtype=torch.int8)

        def op():
            return torch._int_mm(a, b)
    else:
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
        x, w = torch.randn(m, k, dtype=dt), torch.randn(n, k, dtype=dt)

        def op():
            return F.linear(x, w)
    for _ in range(3):
        op()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        op()
        times.append(time.perf_counter() - t0)
    return 2 * m * k * n / sorted(times)[repeats // 4] / 1e9


def ceiling_ort_int8(m: int, k: int, n: int, threads: int, repeats: int = 20) -> float:
    """GFLOP/s of ONNX Runtime's MatMulInteger, uint8 activations x int8 weights: the kernel (MLAS) that
    ONNX Runtime's dynamic int8 models (kd's and sentence-transformers') run. torch._int_mm has no fast CPU
    kernel without VNNI, so on AVX2 it would understate the int8 ceiling by ~20x."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.integers(-128, 127, (k, n), dtype=np.int8), "w")
    node = helper.make_node("MatMulInteger", ["a", "w"], ["y"])
    graph = helper.make_graph([node], "mm", [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [m, n])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {"a": rng.integers(0, 255, (m, k), dtype=np.uint8)}
    for _ in range(3):
        session.run(None, feed)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - t0)
    return 2 * m * k * n / sorted(times)[repeats // 4] / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--teacher", default="minilm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4096, help="most rows of the timed matmuls (tokens in a batch)")
    ap.add_argument("--rate", action="append", default=[],
                    help="NAME=SENTENCES_PER_S; the precision is read from NAME (fp32 | bf16 | int8)")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from bench.precompute_vs_st import load_sentences
    from kd.pipeline.teacher.resolve import resolve_teacher

    torch.set_num_threads(a.threads)
    path = resolve_teacher(a.teacher).path
    cfg, tok = AutoConfig.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    counts = [len(x) for x in tok(load_sentences(a.n), truncation=True, max_length=256)["input_ids"]]
    flops = forward_flops(counts, cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size)
    per_sentence = flops / len(counts)
    print(f"{a.teacher}: {cfg.num_hidden_layers} layers, d={cfg.hidden_size}, ff={cfg.intermediate_size}; "
          f"{len(counts):,} sentences, {statistics.mean(counts):.1f} tokens on average (max {max(counts)}); "
          f"{per_sentence / 1e9:.3f} GFLOP per sentence")
    roofs = {}
    for dtype in ("fp32", "bf16", "int8"):
        try:
            d, ff = cfg.hidden_size, cfg.intermediate_size
            shapes = [(m, k, n) for m in (512, 2048, a.tokens) for k, n in ((d, ff), (ff, d), (d, d))]
            roofs[dtype] = max(ceiling(dtype, *s) for s in shapes)
        except (RuntimeError, AttributeError) as e:
            print(f"{dtype}: no CPU matmul here ({str(e).splitlines()[0][:80]})")
    try:
        d, ff = cfg.hidden_size, cfg.intermediate_size
        ort_int8 = max(ceiling_ort_int8(m, k, n, a.threads) for m in (512, 2048, a.tokens)
                       for k, n in ((d, ff), (ff, d), (d, d)))
        print(f"int8: torch._int_mm {roofs.get('int8', 0):,.0f} GFLOP/s, ONNX Runtime MatMulInteger "
              f"{ort_int8:,.0f} GFLOP/s; the ceiling is the faster")
        roofs["int8"] = max(roofs.get("int8", 0.0), ort_int8)
    except ImportError:
        print("int8: onnxruntime not installed, the ceiling is torch._int_mm's")
    for dtype, g in roofs.items():
        print(f"ceiling {dtype}: {g:,.0f} GFLOP/s (best matmul of the model's shapes, {a.threads} threads) = "
              f"{g * 1e9 / per_sentence:,.0f} sentences/s if the forward were nothing but such matmuls")
    print("| rate | sentences/s | GFLOP/s needed | share of its precision's ceiling |")
    print("|---|---|---|---|")
    for spec in a.rate:
        name, value = spec.rsplit("=", 1)
        rate = float(value)
        need = rate * per_sentence / 1e9
        dtype = next((d for d in ("int8", "bf16", "fp32") if d in name), "fp32")
        share = f"{100 * need / roofs[dtype]:.0f} % of {dtype}" if dtype in roofs else "-"
        print(f"| {name} | {rate:,.0f} | {need:,.0f} | {share} |")


if __name__ == "__main__":
    main()
