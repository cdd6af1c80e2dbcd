"""kd precompute vs sentence-transformers `encode`: same teacher, same real sentences, same threads.

Both run in this process, one after the other, on the first N sentences of the shared Leipzig
corpora (news + wikipedia). kd writes cls + mean + layers to a store (Parquet, checksums, manifest
included in its time); ST only returns its pooled vectors in memory. Prints both rates and the ratio,
plus kd's cosine to ST and, with --precision bf16, bf16's worst cosine to fp32.

    python bench/precompute_vs_st.py --n 10000 [--precision fp32|bf16] [--threads 2]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus"


def load_sentences(n: int) -> list[str]:
    out: list[str] = []
    for name in ("eng_news_2016_10K-sentences.txt", "eng_wikipedia_2016_10K-sentences.txt"):
        out += [line.split("\t", 1)[1] for line in (SHARED / name).read_text(encoding="utf-8").splitlines()]
    return out[:n]


def run_kd(sentences: list[str], precision: str, batch_tokens: int, workdir: Path) -> tuple[float, np.ndarray]:
    from pipeline.precompute import precompute
    from storage import Store
    from storage.schema import arrow_to_vectors

    src = workdir / "in.txt"
    src.write_text("\n".join(sentences) + "\n")
    out = workdir / f"store-{precision}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    precompute([str(src)], str(out), ["minilm"], outputs=["cls", "mean", "layers"], precision=precision,
               batch_tokens=batch_tokens, shard_rows=5000, progress=False)
    secs = time.perf_counter() - t0
    return secs, arrow_to_vectors(Store.open(out).read_table("teachers/minilm", ["mean"])["mean"])


def run_st(sentences: list[str]) -> tuple[float, np.ndarray]:
    from sentence_transformers import SentenceTransformer

    from pipeline.resolve import resolve_teacher

    model = SentenceTransformer(resolve_teacher("minilm").path, device="cpu")
    t0 = time.perf_counter()
    emb = model.encode(sentences, batch_size=32, convert_to_numpy=True, normalize_embeddings=False)
    return time.perf_counter() - t0, emb


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--batch-tokens", type=int, default=16384)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sentences = load_sentences(args.n)
    with tempfile.TemporaryDirectory() as tmp:
        st_s, st_v = run_st(sentences)
        kd_s, kd_v = run_kd(sentences, args.precision, args.batch_tokens, Path(tmp))
        print(f"sentences: {len(sentences)}  threads: {args.threads}  teacher: minilm  kd precision: {args.precision}")
        print(f"sentence-transformers encode : {len(sentences) / st_s:8.1f} sentences/s ({st_s:.1f} s)")
        print(f"kd precompute (cls+mean+layers, written): {len(sentences) / kd_s:8.1f} sentences/s ({kd_s:.1f} s)")
        print(f"ratio kd / ST: {st_s / kd_s:.2f}x")
        print(f"kd mean vs ST: min cosine {cosine(kd_v, st_v).min():.6f}")
        if args.precision != "fp32":
            _, ref = run_kd(sentences[:2000], "fp32", args.batch_tokens, Path(tmp))
            print(f"{args.precision} vs fp32 (first 2000): min cosine {cosine(kd_v[:2000], ref).min():.6f}")


if __name__ == "__main__":
    main()
