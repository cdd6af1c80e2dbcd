"""One tokenizer path (common/fast_tokenizer.py + common/padding.py): a student is fed the same ids in training
(student/data), by its `encode` (student/saved), by its sentence-transformers export and by its ONNX export, for a
tokenizer saved with padding_side="left" and one that also truncates on the left. Long texts exercise truncation.
Before, training used transformers' `__call__` (left-padded, left-truncated), `encode` the Rust backend
truncating on the right, and the exports each their own copy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from single_thread import one_thread  # noqa: F401  (autouse: this module runs on one thread)
from student_stores import random_texts, tiny_bert_config, tokenizer_files

from kd.student.data import Columns, Tokenize
from kd.student.models import StudentConfig, build_student
from kd.student.saved import LoadedStudent, load, save_student

MAX_LENGTH = 12
SIDES = {"pad-left": {"padding_side": "left"},
         "pad-and-cut-left": {"padding_side": "left", "truncation_side": "left"}}


def _texts() -> list[str]:
    long = [" ".join(random_texts(4, seed)) for seed in range(3)]  # 12-44 words: cut at MAX_LENGTH tokens
    return list(dict.fromkeys(random_texts(9, 7) + long))  # distinct, so fed rows identify their texts


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Path]:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("tokenizers")
    src = tokenizer_files(root)
    out = {}
    for name, sides in SIDES.items():
        AutoTokenizer.from_pretrained(src, **sides).save_pretrained(root / name)
        out[name] = root / name
    return out


def _student(tok_dir: Path, arch: str, out: Path) -> Path:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    bert = tiny_bert_config(8, 1, len(tok), 32) if arch == "transformer-init" else None
    cfg = StudentConfig(arch=arch, vocab_size=len(tok), pad_id=tok.pad_token_id, embed_dim=8, hidden_dim=8,
                        num_layers=1, out_dim=8, dropout=0.0, max_length=MAX_LENGTH, bert=bert)
    torch.manual_seed(0)
    return save_student(out, build_student(cfg).eval(), [], str(tok_dir), {}, "test")


def _rows(ids, mask) -> list[tuple[int, ...]]:
    """The unpadded rows of a padded batch; every row must be right-padded (real tokens first)."""
    ids, mask = np.asarray(ids), np.asarray(mask)
    assert (np.sort(mask, axis=1)[:, ::-1] == mask).all(), "a student batch padded on the left"
    return [tuple(r[m == 1].tolist()) for r, m in zip(ids, mask)]


def _training_batch(tok_dir: Path, texts: list[str]) -> dict[str, torch.Tensor]:
    """What student/data.py hands the trainer for these texts."""
    rows = {"id": np.arange(len(texts)), "text": np.array(texts, dtype=object)}
    return Tokenize(str(tok_dir), MAX_LENGTH)(rows, Columns(("text",), False))


def _fed_by_encode(st: LoadedStudent, texts: list[str]) -> tuple[list, np.ndarray]:
    fed: list = []
    hook = st.model.register_forward_pre_hook(lambda _, args: fed.extend(_rows(args[0], args[1])))
    try:
        return fed, st.encode(texts, batch_size=4)
    finally:
        hook.remove()


def _fed_by_st_export(st: LoadedStudent, texts: list[str], out: Path) -> tuple[list, np.ndarray]:
    from kd.student import load_exported
    from kd.student.exporters.st_directory import export_sentence_transformers

    model = load_exported(export_sentence_transformers(st.path, out))  # the tokenizer as reloaded from disk
    fed: list = []
    model[0].register_forward_pre_hook(
        lambda _, args: fed.extend(_rows(args[0]["input_ids"], args[0]["attention_mask"])))
    return fed, model.encode(texts, batch_size=4)


def _fed_by_onnx_export(st: LoadedStudent, texts: list[str], out: Path) -> tuple[list, np.ndarray]:
    from kd.student.exporters.onnx_graph import OnnxEncoder, export_onnx

    enc = OnnxEncoder(export_onnx(st.path, out))
    fed: list = []
    session = enc.session

    class Recording:
        def run(self, names, feeds):
            fed.extend(_rows(feeds["input_ids"], feeds["attention_mask"]))
            return session.run(names, feeds)

    enc.session = Recording()
    return fed, enc.encode(texts, batch_size=4)


@pytest.mark.parametrize("sides", list(SIDES))
# bigru: kd's own export module tokenizes (a bilstm keeps a long text's first ids, as its WordEmbeddings export does:
# StudentConfig.first_ids);
# transformer-init: the built-in Transformer module
@pytest.mark.parametrize("arch", ["bigru", "transformer-init"])
def test_training_encode_and_exports_feed_the_student_the_same_ids(tokenizers, sides, arch, tmp_path):
    from transformers import AutoTokenizer

    texts = _texts()
    st = load(_student(tokenizers[sides], arch, tmp_path / "student"))
    batch = _training_batch(st.path / "tokenizer", texts)
    trained = _rows(batch["input_ids"], batch["attention_mask"])
    # the tokenizer's own truncation side is honoured, and it matters for these texts
    hf = AutoTokenizer.from_pretrained(tokenizers[sides])
    assert trained == [tuple(r) for r in hf(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]]
    assert max(map(len, trained)) == MAX_LENGTH and min(map(len, trained)) < MAX_LENGTH
    with torch.no_grad():
        want = st.model(batch["input_ids"], batch["attention_mask"], layers=False).embedding.numpy()
    want = want / np.linalg.norm(want, axis=1, keepdims=True)  # encode and both exports give unit vectors
    for name, (fed, vecs) in {"encode": _fed_by_encode(st, texts),
                              "sentence-transformers": _fed_by_st_export(st, texts, tmp_path / "st"),
                              "onnx": _fed_by_onnx_export(st, texts, tmp_path / "onnx")}.items():
        assert sorted(fed) == sorted(trained), name
        np.testing.assert_allclose(vecs, want, atol=2e-5, rtol=1e-4, err_msg=name)


def test_a_left_cutting_tokenizer_keeps_the_end_of_a_long_text(tokenizers):
    from transformers import AutoTokenizer

    text = _texts()[-1]
    whole = AutoTokenizer.from_pretrained(tokenizers["pad-left"])(text)["input_ids"]  # [CLS] ... [SEP], uncut
    keep = MAX_LENGTH - 2
    assert len(whole) > MAX_LENGTH
    for name, content in (("pad-left", whole[1:-1][:keep]), ("pad-and-cut-left", whole[1:-1][-keep:])):
        batch = _training_batch(tokenizers[name], [text])
        assert _rows(batch["input_ids"], batch["attention_mask"]) == [(whole[0], *content, whole[-1])], name


@pytest.mark.parametrize("sides", list(SIDES))
def test_a_static_student_encodes_the_ids_it_trained_on(tokenizers, sides, tmp_path):
    from kd.common.errors import KdError
    from kd.student.exporters.st_directory import export_sentence_transformers

    texts = _texts()
    st = load(_student(tokenizers[sides], "static", tmp_path / "student"))
    batch = _training_batch(st.path / "tokenizer", texts)
    assert [tuple(r) for r in st._token_ids(texts)] == _rows(batch["input_ids"], batch["attention_mask"])
    if SIDES[sides].get("truncation_side") == "left":  # its StaticEmbedding would cut the inserted token first
        with pytest.raises(KdError, match="truncates on the left"):
            export_sentence_transformers(st.path, tmp_path / "st")
        return
    from kd.student import load_exported

    got = load_exported(export_sentence_transformers(st.path, tmp_path / "st")).encode(texts)
    np.testing.assert_allclose(got, st.encode(texts, normalize=True), atol=1e-5)  # the export normalises
