"""Whether two tokenizers give the same token ids: the same vocabulary, and the same ids for probe texts that
exercise what a vocabulary does not show (lowercasing, accents, digits, punctuation, special tokens). Vectors
stored for one teacher are only that teacher's when its tokenizer is the one that produced them: a tokenizer
that stopped lowercasing leaves the weights (and every recorded setting) unchanged and every vector different.
"""

from __future__ import annotations

from typing import Any

PROBES = ("The quick brown fox, 1999: naïve café-au-lait!", "UPPER lower MiXeD 3.14 e-mail@x.org [x] ##y")


def tokenizer_difference(mine: Any, theirs: Any) -> str | None:
    """How two transformers tokenizers differ (None: the same ids for every probe, and the same vocabulary)."""
    a, b = mine.get_vocab(), theirs.get_vocab()
    if a != b:
        return f"their vocabularies differ ({len(a):,} and {len(b):,} tokens)"
    for text in PROBES:
        x, y = mine(text)["input_ids"], theirs(text)["input_ids"]
        if x != y:
            return f"{text!r} becomes {x} with one and {y} with the other"
    return None
