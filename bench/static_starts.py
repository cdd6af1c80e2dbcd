"""STS-B dev/test of static starts, untrained, built from a store's vocab output (issue 50, docs/results.md "Any
corpus"): which weighting makes the start model2vec-like or better, with no training and no head.

- PCA of the teacher's vocab output to 256 dims (kd's `student.pca`), each token scaled by a weight;
- weights: none; SIF a/(a+p) with p counted on the corpus, [CLS]/[SEP] left out of the counts (kd before issue
  50) or counted once per text (kd now); model2vec's Zipf prior on the token's rank (a = 1e-4, 1e-3);
- a text is the mean of its tokens' rows, [CLS]/[SEP] included or not;
- `--model2vec DIR`: the same two splits for a model2vec model (e.g. bench/static_baselines.py's distill).

    python -m bench.static_starts --store /work/exp/s1k --corpus /work/exp/news1k.txt --model2vec /work/exp/m2v-mpnet
"""

from __future__ import annotations

import argparse

import numpy as np

from kd.apps.eval import metrics, tasks
from kd.student.pca import pca_embeddings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--teacher", default="mpnet")
    ap.add_argument("--corpus", required=True, help="the store's corpus, one text a line (token counts)")
    ap.add_argument("--model2vec", default=None)
    a = ap.parse_args()
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    vocab = load_file(f"{a.store}/teachers/{a.teacher}/vocab.safetensors")["vectors"]
    tok = AutoTokenizer.from_pretrained(f"{a.store}/tokenizers/{a.teacher}")
    texts = [line.strip() for line in open(a.corpus, encoding="utf-8") if line.strip()]
    counts = np.zeros(len(vocab))
    for ids in tok(texts, add_special_tokens=False)["input_ids"]:
        np.add.at(counts, ids, 1)
    with_specials = counts.copy()
    with_specials[[tok.cls_token_id, tok.sep_token_id]] = len(texts)
    rank = 1 / np.arange(2, len(vocab) + 2)
    sif = lambda c, s=1e-3: s / (s + c / c.sum())  # noqa: E731
    base = pca_embeddings(vocab, 256)
    splits = {s: tasks.load_stsb(s) for s in ("dev", "test")}

    def score(table: np.ndarray, specials: bool) -> dict[str, float]:
        out = {}
        for s, t in splits.items():
            sides = [np.stack([table[ids].mean(0) for ids in tok(list(x), add_special_tokens=specials,
                                                                  truncation=True, max_length=512)["input_ids"]])
                     for x in (t.a, t.b)]
            out[s] = metrics.sts_spearman(*sides, np.asarray(t.scores))
        return out

    variants = {
        "no weights, specials in": (base, True),
        "corpus SIF, specials not counted (kd before)": (base * sif(counts)[:, None], True),
        "corpus SIF, specials counted (kd now)": (base * sif(with_specials)[:, None], True),
        "corpus SIF, specials left out of the mean": (base * sif(counts)[:, None], False),
        "Zipf prior a=1e-4 (model2vec's), specials out": (base * sif(rank, 1e-4)[:, None], False),
        "Zipf prior a=1e-3, specials out": (base * sif(rank)[:, None], False),
    }
    for name, (table, specials) in variants.items():
        r = score(table, specials)
        print(f"{name:48s} dev {r['dev']:.2f}  test {r['test']:.2f}", flush=True)
    if a.model2vec:
        from model2vec import StaticModel

        m = StaticModel.from_pretrained(a.model2vec)
        r = {s: metrics.sts_spearman(m.encode(list(t.a)), m.encode(list(t.b)), np.asarray(t.scores))
             for s, t in splits.items()}
        print(f"{'model2vec ' + a.model2vec:48s} dev {r['dev']:.2f}  test {r['test']:.2f}")


if __name__ == "__main__":
    main()
