"""The two-stage recipe: a student that starts from a student (--init), and DSE from a cross-encoder alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import cross_encoder_pairs, make_store
from typer.testing import CliRunner

from kd import student
from kd.cli import app
from kd.common.errors import KdError
from kd.student import trainer as T

TEXTS = ["the cat runs in the house", "a man reads the news", "stock price fell this week", "big red car"]
TINY = dict(embed_dim=8, hidden_dim=8, batch_size=8, val_percent=10, progress=False)


@pytest.fixture(scope="module")
def ce_pairs(tmp_path_factory, tiny_cross_encoder) -> Path:
    """Pairs scored by one cross-encoder: logits only, no embedding column."""
    return cross_encoder_pairs(tmp_path_factory.mktemp("ce-only"), {"ce": tiny_cross_encoder}, rows=60)


@pytest.fixture(scope="module")
def stage_one(tmp_path_factory) -> Path:
    """Sentence distillation (stage one) on a bi-encoder store."""
    root = tmp_path_factory.mktemp("stage1")
    store = make_store(root / "store", rows=80, shards=1, tmp=root)
    return T.train(T.TrainConfig(str(store), str(root / "student"), max_steps=4, **TINY))


def test_dse_trains_on_a_store_with_only_a_cross_encoder(ce_pairs, tmp_path):
    out = T.train(T.TrainConfig(str(ce_pairs), str(tmp_path / "dse"), objectives=["pair"], out_dim=12,
                                max_steps=3, **TINY))
    info = json.loads((out / "config.json").read_text())
    assert info["student"]["out_dim"] == 12 and info["target"] == [] and info["tokenizer"] == "ce"
    assert student.load(out).encode(TEXTS).shape == (4, 12)
    losses = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert all(np.isfinite(losses)) and min(losses) > 0
    wide = T.setup(T.TrainConfig(str(ce_pairs), str(tmp_path / "w"), objectives=["pair"], **TINY))
    assert wide.student_cfg.out_dim == 16  # no --out-dim: the encoder's width (2 x 8 for a BiLSTM)
    with pytest.raises(KdError, match="no teacher in the store has an embedding column"):
        T.setup(T.TrainConfig(str(ce_pairs), str(tmp_path / "c"), objectives=["cosine"], **TINY))


def test_init_with_no_learning_keeps_the_source_students_vectors(stage_one, ce_pairs, tmp_path):
    """Stage two (DSE on pairs) from stage one: with lr 0 the encoder is exactly the source student."""
    res = CliRunner().invoke(app, [
        "train-student", "--shards", str(ce_pairs), "--out", str(tmp_path / "two"), "--init", str(stage_one),
        "--objective", "pair", "--lr", "0", "--max-steps", "1", "--batch-size", "8", "--no-progress"])
    assert res.exit_code == 0, res.output
    src, dst = student.load(stage_one), student.load(tmp_path / "two")
    assert dst.config.to_dict() == src.config.to_dict()
    np.testing.assert_array_equal(dst.encode(TEXTS), src.encode(TEXTS))
    scratch = T.train(T.TrainConfig(str(ce_pairs), str(tmp_path / "scratch"), objectives=["pair"], lr=0.0,
                                    max_steps=1, out_dim=16, **TINY))
    assert not np.allclose(student.load(scratch).encode(TEXTS), src.encode(TEXTS))  # the test can fail


def test_init_errors_are_clear(stage_one, ce_pairs, tmp_path):
    with pytest.raises(KdError, match="is a bilstm, this run asks for --arch bigru"):
        T.setup(T.TrainConfig(str(ce_pairs), str(tmp_path / "a"), arch="bigru", objectives=["pair"],
                              init=str(stage_one), **TINY))
    other = tmp_path / "other-tokenizer"
    shutil.copytree(stage_one, other)
    shutil.rmtree(other / "tokenizer")
    from transformers import BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "zebra", "the", "cat", "runs"]
    BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}).save_pretrained(other / "tokenizer")
    with pytest.raises(KdError, match="tokenizer/tokenizer.json does not match the checksum in config.json"):
        T.setup(T.TrainConfig(str(ce_pairs), str(tmp_path / "b"), objectives=["pair"], init=str(other), **TINY))
    with pytest.raises(KdError, match="tokenizer/tokenizer.json does not match the checksum"):
        student.load(other)  # kd embed, eval and export load it the same way
    # a student written before kd recorded the tokenizer's checksums: checked against the store teacher's instead
    info = json.loads((other / "config.json").read_text())
    del info["tokenizer_sha256"]
    (other / "config.json").write_text(json.dumps(info))
    with pytest.raises(KdError, match="tokenizer differs"):
        T.setup(T.TrainConfig(str(ce_pairs), str(tmp_path / "b"), objectives=["pair"], init=str(other), **TINY))
    with pytest.raises(KdError, match="no trained student here"):
        T.setup(T.TrainConfig(str(ce_pairs), str(tmp_path / "c"), objectives=["pair"], init=str(tmp_path), **TINY))
