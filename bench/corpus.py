"""The distillation corpus of the benchmarks, from ../shared/data/corpus.

News articles are segmented by `kd precompute --segment sentences` itself (spaCy); this script writes
the other sources as one JSONL file with a "text" key so all go into one store:
- Leipzig news + Wikipedia 2016 (20,000 sentences);
- Brown corpus sentences, detokenised (first --brown of 57,340);
- WordNet 3.0 definitions (first --wordnet of 117,659 synsets, deterministic sample);
- with --in-domain: the unlabeled sentences of the STS-B train split, the MRPC train split and the
  SST-2 train split (never dev or test: the frontier bench checks the store against every eval set and
  drops overlapping rows before training, see bench/frontier.py).

    python bench/corpus.py --out bench/out/extra.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from kd.apps.eval import tasks
from kd.apps.eval.corpus import _brown, _leipzig, _wordnet


def _in_domain() -> dict[str, list[str]]:
    """Train-split texts of the eval tasks' domains (labels and scores are not used)."""
    stsb = tasks.data_path("stsb/sts-train.csv").read_text(encoding="utf-8").splitlines()
    sts = [c for line in stsb for c in line.split("\t")[5:7]]
    mrpc = tasks.data_path("mrpc/msr_paraphrase_train.txt").read_text(encoding="utf-8-sig").splitlines()[1:]
    para = [c for line in mrpc for c in line.split("\t")[3:5]]
    sst = [line.split("\t")[0].strip() for line in
           tasks.data_path("sst2/sentiment-train").read_text(encoding="utf-8").splitlines()]
    return {"stsb-train": sts, "mrpc-train": para, "sst2-train": sst}


def build(out: Path, brown: int, wordnet: int, seed: int = 0, in_domain: bool = False) -> int:
    rng = np.random.default_rng(seed)
    parts = {"leipzig": _leipzig("news") + _leipzig("wikipedia")}
    if in_domain:
        parts.update(_in_domain())
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
    ap.add_argument("--in-domain", action="store_true", help="add STS-B/MRPC/SST-2 train-split texts")
    a = ap.parse_args()
    print(f"wrote {build(a.out, a.brown, a.wordnet, in_domain=a.in_domain)} texts to {a.out}")
