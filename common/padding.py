"""Token-id rows of different lengths padded into one int64 block: the one padder of kd.

Shared by every path from text to a model (common/fast_tokenizer.py gives the rows): the teacher pass, a student's
training batches, its `encode`, its sentence-transformers module and the exported ONNX graph's encoder. Padding
here, in numpy, because transformers' `tokenizer.pad` over a list of dicts costs more than a small model's forward.

- `pad_rows`: one numpy block filled with the pad id, each row written at the left (right padding) or at the
  right (left padding), and the attention mask that marks the written cells. Students always pad right (the
  default): their packed recurrences and position embeddings assume the real tokens come first, whatever side
  the tokenizer they share with a teacher pads on.
"""

from __future__ import annotations

from collections.abc import Sequence

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

