"""Stable row ids: the same text gets the same id in every store, run and stage.

- `text_key(text)`: a single text is its own key; a pair (a, b) is "a\\x1eb".
- `text_id(key, occurrence)`: the first 8 bytes of blake2b(f"{occurrence}\\x1f{key}") as a signed
  int64. `occurrence` (0 for the first copy of a key, 1 for the second...) keeps ids unique when
  duplicates are kept.
- `in_sample(id, fraction)`: whether an id falls in the first `fraction` of the id space. Ids are uniform hashes,
  so this keeps a uniform random sample that is the same in every store, run and teacher (`--sample`): stores
  built from one corpus with one fraction hold the same rows, aligned by id.
- `row_ids(texts)`: the ids `kd precompute` gives a list of non-empty texts without dedup, which is
  how `kd finetune` finds each training row's teacher outputs in a store.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

import numpy as np


def text_key(text: str | tuple[str, str] | list[str]) -> str:
    return text if isinstance(text, str) else f"{text[0]}\x1e{text[1]}"


def is_empty(text: str | tuple[str, str] | list[str]) -> bool:
    """Blank texts, and pairs with a blank side, are never stored (precompute drops and counts them)."""
    return not text.strip() if isinstance(text, str) else not (text[0].strip() and text[1].strip())


def text_id(key: str, occurrence: int) -> int:
    h = hashlib.blake2b(f"{occurrence}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little", signed=True)


def in_sample(row_id: int, fraction: float) -> bool:
    return (row_id % 2**64) < fraction * 2**64


def row_ids(texts: Sequence) -> np.ndarray:
    """int64 id of every text, counting earlier copies of the same text as occurrences."""
    seen: Counter[str] = Counter()
    out = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        key = text_key(text)
        out[i] = text_id(key, seen[key])
        seen[key] += 1
    return out
