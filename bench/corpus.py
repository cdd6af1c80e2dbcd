"""The distillation corpus of the benchmarks, from ../shared/data/corpus.

News articles are segmented by `kd precompute --segment sentences` itself (spaCy); this script writes
the other sources as one JSONL file with a "text" key so all go into one store:
- Leipzig news + Wikipedia 2016 (20,000 sentences);
- Brown corpus sentences, detokenised (first --brown of 57,340);
- WordNet 3.0 definitions (first --wordnet of 117,659 synsets, deterministic sample).

    python bench/corpus.py --out bench/out/extra.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from apps.corpus import _brown, _leipzig, _wordnet


def build(out: Path, brown: int, wordnet: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    parts = {"leipzig": _leipzig("news") + _leipzig("wikipedia")}
    b = _brown()
    parts["brown"] = [b[i] for i in sorted(rng.permutation(len(b))[:brown])]
    w = _wordnet()
    parts["wordnet"] = [w[i] for i in sorted(rng.permutation(len(w))[:wordnet])]
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(out, "w", encoding="utf-8") as f:
        for source, texts in parts.items():
            for t in texts:
                f.write(json.dumps({"text": t, "source": source}) + "\n")
                n += 1
    return n


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench/out/extra.jsonl"))
    ap.add_argument("--brown", type=int, default=30000)
    ap.add_argument("--wordnet", type=int, default=40000)
    a = ap.parse_args()
    print(f"wrote {build(a.out, a.brown, a.wordnet)} texts to {a.out}")
