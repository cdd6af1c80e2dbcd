"""Static students: one vector per vocabulary token; a text is the mean of its tokens' vectors.

The model2vec + Tokenlearn recipe, fed from a store instead of a live teacher:
- init: the teacher's `vocab` output (its own output for each token alone, written by
  `kd precompute --outputs vocab`), reduced by PCA to `embed_dim`, each token scaled by its SIF
  weight a / (a + p(token)) with p counted over the store's texts (frequent tokens say little);
  [CLS] and [SEP] are counted as the encoder sees them, once per text: left out of the counts they kept
  weight 1 while content tokens shrank to 0.02-0.9, so every text shared one large common part and all
  cosines sat in 0.65-1.0 (issue 50: STS-B dev of the untrained start 76.93 -> 78.37 on 1,000 sentences);
- head (when `embed_dim` differs from the target's width): fitted by least squares onto the target
  before the first step (`student.head_fit`, `--head-init auto`): the untrained start then already
  speaks the teacher's geometry (dev 76.93 with no head -> 80.56 on 1,000 sentences; a random head
  made training start from, and on a small corpus end near, 68);
- encode: mean of the token vectors over the real tokens ([CLS]/[SEP] included: they act as a learned
  offset), then a bias-free linear map to the teacher's width when `embed_dim` differs;
- train: the store's sentence vectors with the usual objectives (cosine by default), streaming, so
  the corpus never has to fit in memory (Tokenlearn loads all targets at once).
A weighted mean and a mean of pre-scaled vectors differ only by a per-text factor, which cosine
similarity ignores, so the weights live inside the vectors and encoding is one embedding-bag.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor, nn

from kd.student.pca import pca_embeddings

SIF_A = 1e-3  # SIF's smoothing constant (Arora et al. 2017)


class StaticEncoder(nn.Module):
    """No encoder at all: the token vectors are the states (pooling averages them)."""

    def __init__(self, cfg) -> None:
        super().__init__()

    def forward(self, x: Tensor, mask: Tensor) -> list[Tensor]:
        return [x]


def token_counts(texts, tokenizer, vocab_size: int, batch: int = 4096) -> np.ndarray:
    """Occurrences of every token id over an iterable of text batches (streaming, bounded memory), the special
    tokens the tokenizer adds to each text included (see the module docstring)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for chunk in texts:
        for start in range(0, len(chunk), batch):
            ids = tokenizer(list(chunk[start : start + batch]), add_special_tokens=True, verbose=False,
                            return_attention_mask=False)["input_ids"]
            flat = np.fromiter((i for row in ids for i in row), dtype=np.int64)
            counts += np.bincount(flat, minlength=vocab_size)[:vocab_size]
    return counts


def sif_weights(counts: np.ndarray, a: float = SIF_A) -> np.ndarray:
    """a / (a + p(w)); tokens never seen get weight 1 (p = 0)."""
    p = counts / max(1, int(counts.sum()))
    return (a / (a + p)).astype(np.float32)


def static_init(vocab_vectors: np.ndarray, dim: int, weights: np.ndarray | None, pad_id: int) -> np.ndarray:
    """PCA of the teacher's per-token outputs to `dim`, scaled per token; the padding row is zero."""
    m = pca_embeddings(vocab_vectors, dim)
    if weights is not None:
        m = m * weights[: len(m), None]
    m[pad_id] = 0.0
    return m.astype(np.float32)
