"""Token-id rows of different lengths padded into one int64 block, and the Rust tokenizer set up to give them.

Shared by the teacher pass (pipeline/fast_tokenizer), a trained student's `encode` (student/saved) and the
exported ONNX graph's encoder (student/exporters/onnx_graph): all three call the Rust `tokenizers.Tokenizer`
directly, because transformers' `tokenizer.pad` over a list of dicts costs more than a small model's forward.

- `pad_rows`: one numpy block filled with the pad id, each row written at the left (right padding) or at the
  right (left padding), and the attention mask that marks the written cells.
- `unpadded_truncating`: a Rust tokenizer that never pads (the block above does) and truncates to the
  model's max length; a copy by default, so a tokenizer shared with the caller keeps its own settings
  (`own=True` for one the caller has just loaded: the copy costs more than the load, 38 vs 27 ms for
  BERT's 30k vocabulary).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int, side: str = "right",
             min_width: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ids, attention_mask), both int64 [len(rows), max(longest row, min_width)]."""
    width = max(min_width, max((len(r) for r in rows), default=0))
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        cols = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
        ids[i, cols] = row
        mask[i, cols] = 1
    return ids, mask


def unpadded_truncating(backend: Any, max_length: int | None, own: bool = False) -> Any:
    """The `tokenizers.Tokenizer` `backend` with no padding, truncating at `max_length` (None: never): a copy,
    or `backend` itself set up so when `own` (the caller's alone)."""
    tok = backend if own else copy.deepcopy(backend)
    tok.no_padding()
    if max_length is None:
        tok.no_truncation()
    else:
        tok.enable_truncation(max_length)
    return tok
