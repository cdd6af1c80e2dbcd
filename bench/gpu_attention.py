"""Which attention kernel a BERT-shaped teacher's CUDA forward pass should run: kd's own batches (tokenize +
forward_all) of the same texts, in one process, each variant in turn for several rounds after a warm-up.

- variants: transformers' default (`sdpa`), `eager`, and `sdpa` restricted to one backend (efficient, math);
- rows/s of `forward_all` per variant and round, then a torch.profiler table of one batch under the default
  (host time per op: what the host waits on).
Random weights (bench/random_teachers.py): speed only.

    python bench/gpu_attention.py /tmp/t/minilm /tmp/texts.parquet 40000 3 > out.txt
"""

from __future__ import annotations

import contextlib
import sys
import time


def main(teacher_dir: str, texts_path: str, n: int, rounds: int) -> None:
    import pyarrow.parquet as pq
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kd.pipeline.backends.loading import load_teacher
    from kd.pipeline.teacher.batches import forward_all, tokenize
    from kd.pipeline.teacher.model import Output, Precision

    device = "cuda" if torch.cuda.is_available() else "cpu"
    texts = pq.read_table(texts_path).slice(0, n)["text"].to_pylist()
    t = load_teacher(teacher_dir, device=device, precision=Precision.auto)
    tokens = tokenize(t, texts)
    outputs = [Output.sentence, Output.mean, Output.cls]

    def impl(name: str) -> None:
        t.model.set_attn_implementation(name)

    variants = {
        "sdpa (default)": (lambda: impl("sdpa"), contextlib.nullcontext),
        "eager": (lambda: impl("eager"), contextlib.nullcontext),
        "sdpa efficient only": (lambda: impl("sdpa"), lambda: sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION])),
        "sdpa math only": (lambda: impl("sdpa"), lambda: sdpa_kernel([SDPBackend.MATH])),
    }
    forward_all(t, tokenize(t, texts[:2000]), outputs)  # warm-up
    for r in range(rounds):
        for name, (setup, ctx) in variants.items():
            setup()
            try:
                with ctx():
                    forward_all(t, tokenize(t, texts[:500]), outputs)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    forward_all(t, tokens, outputs)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    dt = time.perf_counter() - t0
            except RuntimeError as e:  # a backend this device lacks
                print(f"round {r} | {name} | unavailable: {str(e)[:80]}", flush=True)
                continue
            print(f"round {r} | {name} | {n / dt:,.0f} rows/s | {dt:.2f} s", flush=True)
    impl("sdpa")
    side = tokens.sides[0]
    idx = side.batches[len(side.batches) // 2]
    batch = t.fast.pad(side.enc, idx)
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(3):
            t.forward(batch, outputs)
    print(f"profile: 3 forwards of one batch of {len(idx)} rows x {batch['input_ids'].shape[1]} tokens")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
