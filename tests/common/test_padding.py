"""common/padding.py: the one padder behind every path from text to a model; common/fast_tokenizer.py gives it rows."""

from __future__ import annotations

import numpy as np

from kd.common.fast_tokenizer import FastTokenizer
from kd.common.padding import pad_rows
from kd.pipeline.backends.calibration import fidelity_sentences
from kd.storage.tokenizer_files import load_tokenizer

TEXTS = fidelity_sentences()[:48]  # real bundled sentences


def test_pad_rows_writes_each_row_and_its_mask_on_either_side():
    rows = [[101, 7, 8, 102], [101, 102], [101, 5, 6, 9, 4, 102]]
    for side in ("right", "left"):
        ids, mask = pad_rows(rows, pad_id=3, side=side)
        assert ids.shape == mask.shape == (3, 6) and ids.dtype == mask.dtype == np.int64
        for row, got, m in zip(rows, ids, mask):
            assert got[m == 1].tolist() == row and (got[m == 0] == 3).all()
            assert (m.argmax() == 0) if side == "right" else (m[-1] == 1)
    assert pad_rows([], 0)[0].shape == (0, 0)
    assert pad_rows([[]], 0, min_width=1)[0].tolist() == [[0]]  # a graph's input keeps one column


def test_the_fast_tokenizer_is_a_copy_with_its_own_settings(tiny_teacher):
    hf = load_tokenizer(tiny_teacher, "-")
    shared = hf.backend_tokenizer
    shared.enable_padding(pad_id=0, length=200)
    fast = FastTokenizer.from_transformers(hf, "-")
    got = fast.encode(TEXTS, max_length=30)["input_ids"]
    # the caller's tokenizer is untouched (checked before transformers' own call below resets it)
    assert shared.padding is not None and shared.truncation is None
    assert got == hf(TEXTS, truncation=True, max_length=30)["input_ids"]
    assert len({len(x) for x in got}) > 1  # unpadded: short texts stay short
    whole = fast.encode(TEXTS)["input_ids"]
    assert max(map(len, whole)) > 30 and whole == hf(TEXTS)["input_ids"]
