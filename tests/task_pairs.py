"""Pair files for a task a tiny random BERT learns in a few steps, for the fine-tuning tests: a pair is "pos" when b
is a shuffle of a's words, "neg" when b's words come from another part of the vocabulary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import WORDS


def write_pairs(path: Path, n: int, seed: int, score: bool = False) -> Path:
    """`n` pairs as a quality/a/b TSV at `path`; `score=True` labels them with scores instead (~4 for a shuffle,
    ~0 for unrelated words)."""
    rng = np.random.default_rng(seed)
    lines = ["quality\ta\tb"]
    for _ in range(n):
        a = list(rng.choice(WORDS[20:40], 5))
        same = rng.random() < 0.5
        b = list(rng.permutation(a)) if same else list(rng.choice(WORDS[40:], 5))
        label = f"{4.0 * same + rng.random():.2f}" if score else ("pos" if same else "neg")
        lines.append(f"{label}\t{' '.join(a)}\t{' '.join(b)}")
    path.write_text("\n".join(lines) + "\n")
    return path
