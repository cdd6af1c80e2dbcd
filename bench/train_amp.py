"""Training step speed of a Transformer student in fp32 vs bf16 autocast on this CPU (`--amp` on CPU).

The student is what `--arch transformer-init --init-layers 2,5` trains from MiniLM: a 2-layer BertModel
(d 384, 12 heads, ff 1536). One step = forward under autocast (or not) + mean-pool + backward + AdamW, on a
fixed batch of `--batch` rows x `--tokens` tokens. Each measurement is a fresh process (fp32 and bf16
alternated, `--pairs` pairs), `--steps` timed steps after 2 warm-up steps; printed: rows/s median
[min-max] per side and the ratio.

    python -m bench.train_amp --threads 1 --pairs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(dtype: str, threads: int, batch: int, tokens: int, steps: int) -> float:
    import torch
    from transformers import BertConfig, BertModel

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=384, num_hidden_layers=2, num_attention_heads=12,
                                 intermediate_size=1536), add_pooling_layer=False)
    opt = torch.optim.AdamW(model.parameters(), 1e-4)
    ids = torch.randint(1000, 20000, (batch, tokens))
    mask = torch.ones_like(ids)
    enabled = dtype == "bf16"
    t0 = 0.0
    for i in range(steps + 2):
        if i == 2:
            t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            out = model(input_ids=ids, attention_mask=mask).last_hidden_state.mean(1)
        loss = out.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return steps * batch / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.threads, a.batch, a.tokens, a.steps)))
        return
    print(f"load average before: {os.getloadavg()}, threads {a.threads}, batch {a.batch} x {a.tokens} tokens")
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads)}
    rates: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for p in range(a.pairs):
        for dtype in (("fp32", "bf16") if p % 2 == 0 else ("bf16", "fp32")):
            cmd = [sys.executable, "-m", "bench.train_amp", "--child", dtype, "--threads", str(a.threads),
                   "--batch", str(a.batch), "--tokens", str(a.tokens), "--steps", str(a.steps)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            rates[dtype].append(float(out.strip().splitlines()[-1]))
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in rates.items():
        print(f"{k}: {med[k]:.0f} rows/s [{min(v):.0f}-{max(v):.0f}]")
    print(f"bf16 / fp32: {med['bf16'] / med['fp32']:.2f}x; load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
