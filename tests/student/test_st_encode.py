"""Issue 49: a kd student's `encode` takes sentence-transformers' arguments with their names and meanings, and by
default gives the vectors its sentence-transformers export gives (both normalise)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import make_store, tiny_student
from typer.testing import CliRunner

from kd import student
from kd.cli import app
from kd.common.errors import InputError

TEXTS = ["The market fell sharply on Monday.", "A dog runs in the park.", "Stocks dropped.", "It rained all day."]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("st-encode")
    return tiny_student(make_store(root / "store", rows=40, shards=2, tmp=root), root / "bilstm", steps=2)


def test_the_default_is_the_exports_vectors(trained, tmp_path):
    from kd.student.st_load import load_exported

    model = student.load(trained)
    raw = model.encode(TEXTS, normalize_embeddings=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)  # the premise: the student's own norms vary
    got = model.encode(TEXTS)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(got, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)
    res = CliRunner().invoke(app, ["export", str(trained), "--out", str(tmp_path / "st")])
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(load_exported(tmp_path / "st").encode(TEXTS), got, atol=1e-5)


def test_each_sentence_transformers_argument(trained, capsys):
    model = student.load(trained)
    want = model.encode(TEXTS)
    np.testing.assert_allclose(model.encode(TEXTS, batch_size=1), want, atol=1e-6)
    tensor = model.encode(TEXTS, convert_to_tensor=True)
    assert isinstance(tensor, torch.Tensor) and tensor.shape == (4, model.dim)
    np.testing.assert_allclose(tensor.numpy(), want, atol=0)
    listed = model.encode(TEXTS, convert_to_numpy=False)
    assert isinstance(listed, list) and len(listed) == 4 and all(isinstance(t, torch.Tensor) for t in listed)
    np.testing.assert_allclose(torch.stack(listed).numpy(), want, atol=0)
    one = model.encode(TEXTS[0], convert_to_tensor=True)
    assert isinstance(one, torch.Tensor) and one.shape == (model.dim,)
    np.testing.assert_allclose(model.encode(TEXTS, device="cpu", precision="float32"), want, atol=0)
    capsys.readouterr()
    np.testing.assert_allclose(model.encode(TEXTS, show_progress_bar=True), want, atol=0)
    assert "encode" in capsys.readouterr().err
    np.testing.assert_allclose(model.encode(TEXTS, normalize=False), model.encode(TEXTS, normalize_embeddings=False))


@pytest.mark.parametrize(("kwargs", "said"), [({"precision": "int8"}, "quantize_embeddings"),
                                              ({"output_value": "token_embeddings"}, "output_value"),
                                              ({"prompt_name": "query"}, "prompt_name")])
def test_what_encode_does_not_do_is_a_clear_error(trained, kwargs, said):
    with pytest.raises(InputError, match=said) as e:
        student.load(trained).encode(TEXTS, **kwargs)
    assert e.value.fix


@pytest.mark.parametrize(("texts", "said"), [(5, "takes a str or a list of str, not int"),
                                             (None, "not NoneType"), ([1, 2], "item 0 is int"),
                                             (["a", None], "item 1 is NoneType"), ([b"x"], "item 0 is bytes")])
def test_encode_of_what_is_not_text_is_kd_s_error(trained, texts, said):
    """Issue 48's probe: encode(5) and encode(None) were Python's TypeError, a list of non-strings had no where."""
    with pytest.raises(InputError, match=said) as e:
        student.load(trained).encode(texts)
    assert e.value.where == "LoadedStudent.encode" and e.value.fix


@pytest.mark.parametrize("fmt", ["sentence-transformers", "onnx"])
def test_every_export_folder_has_a_model_card(trained, tmp_path, fmt):
    res = CliRunner().invoke(app, ["export", str(trained), "--format", fmt, "--out", str(tmp_path / fmt)])
    assert res.exit_code == 0, res.output
    card = (tmp_path / fmt / "README.md").read_text(encoding="utf-8")
    assert "`bilstm` sentence encoder" in card and "teacher **tiny**" in card and "## Evaluation" in card
    assert ("onnx_encode(" if fmt == "onnx" else "SentenceTransformer(\"PATH") in card  # bilstm: built-ins only
