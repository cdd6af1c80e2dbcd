"""Issue 49: an export loads with plain `SentenceTransformer(path)` (no trust_remote_code) for every student that
sentence-transformers' built-in modules reproduce, with the vectors of `kd.student.load(...).encode` (max |delta|
<= 1e-5 on real news sentences of every length); a student they cannot reproduce says so at export, names the
reason and points to ONNX and `load_exported`; every export folder holds a model card naming its teacher."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from student_stores import news_init_store, train_students
from typer.testing import CliRunner

from kd.cli import app

pytestmark = pytest.mark.slow

MAX_LENGTH = 64  # the tiny teacher's positions; its small vocabulary splits 37 of these 100 sentences within it
# name -> (arch, extra train-student options, the reason `kd export` gives when built-ins cannot reproduce it)
STUDENTS = {
    "bilstm": ("bilstm", ["--hidden-dim", "12", "--layers", "2"], None),  # SRA head: bias-free Dense + tanh
    "bilstm-max": ("bilstm", ["--hidden-dim", "8", "--pooling", "max"], None),
    # kd's widths 3, 4, 5: the even one and 24 / 3 channels each; mean pooling and 16 = 6 + 5 + 5 channels
    "cnn": ("cnn", ["--hidden-dim", "24", "--pooling", "max"], None),  # Dense with bias (24 -> 32)
    "cnn-mean": ("cnn", ["--hidden-dim", "16"], None),
    "ffn": ("ffn", ["--hidden-dim", "32", "--layers", "2"], None),  # no head
    "transformer": ("transformer", ["--embed-dim", "8", "--hidden-dim", "16", "--layers", "2"], None),  # folded map
    "transformer-cls": ("transformer", ["--hidden-dim", "16", "--pooling", "cls"], None),
    "static": ("static", ["--embed-dim", "16"], None),
    "transformer-init": ("transformer-init", ["--init-layers", "1"], None),
    "bigru": ("bigru", ["--hidden-dim", "8"], "no GRU module"),
    "cnn-deep": ("cnn", ["--hidden-dim", "12", "--layers", "2"], "between layers"),
    "ffn-cls": ("ffn", ["--hidden-dim", "32", "--pooling", "cls"], "cls_token_embeddings"),
    "attentive": ("transformer", ["--hidden-dim", "16", "--pooling", "attentive"], "no attentive pooling"),
}
BUILT_IN = [name for name, (_, _, why) in STUDENTS.items() if why is None]
CUSTOM = [name for name, (_, _, why) in STUDENTS.items() if why is not None]


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_teacher, sentences) -> Path:
    return news_init_store(tmp_path_factory.mktemp("st-builtin"), tiny_teacher, sentences)


@pytest.fixture(scope="module")
def students(store, tmp_path_factory) -> dict[str, Path]:
    specs = {name: (arch, extra) for name, (arch, extra, _) in STUDENTS.items()}
    return train_students(store, tmp_path_factory.mktemp("students"), specs, MAX_LENGTH)


def _texts(sentences: list[str]) -> list[str]:
    # unseen news sentences of every length, a few past MAX_LENGTH tokens, odd spacing, one word
    return sentences[200:300] + ["  Stocks   fell,  then ROSE again!  ", "Markets"]


def _export(student: Path, out: Path) -> str:
    res = CliRunner().invoke(app, ["export", str(student), "--out", str(out)])
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


def _fits(student: Path, texts: list[str]) -> np.ndarray:
    """Which texts kd keeps whole (max_length tokens with [CLS]/[SEP])."""
    from kd import student as kd_student

    tokenizer = kd_student.load(student).tokenizer
    return np.array([len(tokenizer(t)["input_ids"]) <= MAX_LENGTH for t in texts])


@pytest.mark.parametrize("name", BUILT_IN)
def test_plain_sentence_transformer_gives_the_students_vectors(name, students, sentences, tmp_path):
    from sentence_transformers import SentenceTransformer

    from kd import student

    said = _export(students[name], tmp_path / "st")
    types = [m["type"] for m in json.loads((tmp_path / "st" / "modules.json").read_text())]
    assert all(t.startswith("sentence_transformers.") for t in types), types
    texts = _texts(sentences)
    want = student.load(students[name]).encode(texts)
    model = SentenceTransformer(str(tmp_path / "st"), device="cpu")  # no trust_remote_code
    got = model.encode(texts, batch_size=16)
    assert got.shape == want.shape
    fits = _fits(students[name], texts)
    assert fits.sum() >= 30 and (~fits).sum() >= 30  # the premise: real sentences on both sides of max_length
    # every text, those past max_length too: a WordEmbeddings student cuts a longer text as WordEmbeddings does
    # (its first ids, [SEP] cut off: StudentConfig.first_ids), in training and in kd's encode
    assert np.abs(got - want).max() <= 1e-5, (name, np.abs(got - want).max(1)[~fits].max())
    assert "texts over" not in said and "--format onnx" not in said, said
    np.testing.assert_allclose(model.encode(texts[:5], batch_size=1), got[:5], atol=1e-6)  # padding-free too
    np.testing.assert_allclose(student.load_exported(tmp_path / "st").encode(texts), got, atol=1e-6)


@pytest.mark.parametrize("name", CUSTOM)
def test_a_student_without_built_ins_says_so_at_export(name, students, sentences, tmp_path):
    from sentence_transformers import SentenceTransformer

    from kd import student

    said = _export(students[name], tmp_path / "st")
    assert STUDENTS[name][2] in said
    assert "kd.student.load_exported" in said and "--format onnx" in said and "trust_remote_code" in said
    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(str(tmp_path / "st"), device="cpu")
    texts = _texts(sentences)
    got, want = student.load_exported(tmp_path / "st").encode(texts), student.load(students[name]).encode(texts)
    assert np.abs(got - want).max() <= 1e-5
    card = (tmp_path / "st" / "README.md").read_text(encoding="utf-8")
    assert STUDENTS[name][2] in " ".join(card.split()) and "load_exported(" in card


@pytest.mark.parametrize("name", ["bilstm", "transformer", "bigru"])
@pytest.mark.parametrize("fmt", ["sentence-transformers", "onnx"])
def test_every_export_folder_has_a_card_naming_the_teacher(name, fmt, students, tmp_path):
    res = CliRunner().invoke(app, ["export", str(students[name]), "--format", fmt, "--out", str(tmp_path / "x")])
    assert res.exit_code == 0, res.output
    card = (tmp_path / "x" / "README.md").read_text(encoding="utf-8")
    assert "teacher **tiny**" in card and "tiny.mean" in card and "## Evaluation" in card
    plain = fmt == "sentence-transformers" and name != "bigru"
    assert ('SentenceTransformer("PATH/TO/THIS/FOLDER")' in card) == plain
    assert "texts over" not in card  # a bilstm export equals the student on long texts too: nothing to warn of


@pytest.mark.parametrize("name", ["transformer-init", "transformer"])
def test_two_exports_of_one_student_are_the_same_bytes(name, students, tmp_path):
    """transformers gives the exported BertModel a pooler the saved one lacks, drawn from torch's generator: a
    kd distill resumed after a kill exported other bytes than an unkilled run did (a probe)."""
    import torch

    folders = []
    for seed in (1, 2):
        torch.manual_seed(seed)  # the process's generator in two states, as two processes' are
        out = tmp_path / f"st{seed}"
        _export(students[name], out)
        folders.append({p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()})
    assert folders[0].keys() == folders[1].keys()
    assert [f for f in folders[0] if folders[0][f] != folders[1][f]] == []
