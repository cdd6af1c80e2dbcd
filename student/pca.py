"""PCA of an embedding table: how a teacher's token vectors become a narrower student's first table."""

from __future__ import annotations

import numpy as np

from kd.common.errors import KdError


def pca_embeddings(matrix: np.ndarray, dim: int) -> np.ndarray:
    """Reduce a [vocab, width] embedding matrix to [vocab, dim] float32 with PCA (sklearn).

    - dim == width: returned as float32 unchanged.
    - Otherwise project onto the top `dim` principal directions (centred, seeded, so deterministic);
      the kept directions carry most of the variance that distinguishes tokens.
    """
    matrix = np.asarray(matrix, dtype=np.float32)
    if matrix.ndim != 2:
        raise KdError(f"expected a 2-D embedding matrix, got shape {matrix.shape}", "pca_embeddings")
    if dim == matrix.shape[1]:
        return matrix
    if not 1 <= dim <= min(matrix.shape):
        raise KdError(f"cannot reduce a {matrix.shape} matrix to {dim} dims", "pca_embeddings",
                      f"pick 1 <= embed_dim <= {min(matrix.shape)}")
    from sklearn.decomposition import PCA

    return PCA(n_components=dim, random_state=0).fit_transform(matrix).astype(np.float32)
