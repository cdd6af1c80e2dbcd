"""Issue 48, the seventh reliability pass: the fourth probe's last warts.

- a stored init output whose weights do not fit its config (a tensor of another shape, re-signed): validate
  accepted it and training ended in torch's size-mismatch traceback; now validate reports it, every reader
  refuses it and --repair sets it aside;
- `kd eval --baseline-dir` on a folder whose weights are a folder or another model's file: model2vec's own
  traceback; now refused with kd's message when the folder is named, before any model loads.
The full disk during training (train-student's rerun) and a static student wider than its teacher are in
test_student_safety.py and test_static.py / test_distill.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from store_forgery import init_store, refused, rewrite_file, validate
from typer.testing import CliRunner

from kd.cli import app


@pytest.mark.parametrize(("change", "said"), [
    ("shape", "the weights' embeddings.LayerNorm.bias is [3, 3], the config's model has [32]"),
    ("extra", "the weights hold 'pooler.dense.weight', which the config's model has not"),
    ("missing", "the weights lack embeddings.LayerNorm.bias"),
])
def test_init_weights_that_do_not_fit_their_config_are_reported_refused_and_repaired(
        tmp_path, tiny_teacher, sentences, change, said):
    from safetensors.numpy import load, save

    store = init_store(tmp_path, tiny_teacher, sentences)
    assert validate(store).exit_code == 0  # the sound init output passes the new check
    (rel,) = [p.relative_to(store).as_posix() for p in store.glob("teachers/tiny/init-*/model.safetensors")]
    tensors = load((store / rel).read_bytes())
    if change == "shape":
        tensors["embeddings.LayerNorm.bias"] = np.zeros((3, 3), dtype=np.float32)
    elif change == "extra":
        tensors["pooler.dense.weight"] = np.zeros((32, 32), dtype=np.float32)
    else:
        del tensors["embeddings.LayerNorm.bias"]
    rewrite_file(store, rel, save(tensors))
    res = validate(store)
    assert res.exit_code == 1 and said in " ".join(res.output.split()), res.output
    res = CliRunner().invoke(app, ["train-student", "-s", str(store), "-o", str(tmp_path / "student"), "--arch",
                                   "transformer-init", "--max-steps", "1", "--no-progress"])
    refused(res, said)
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert f"set aside {rel.rsplit('/', 1)[0]}" in " ".join(res.output.split()), res.output


def _model2vec_folder(folder: Path, teacher: Path) -> Path:
    """A model2vec model as StaticModel.save_pretrained lays it out: config, tokenizer, an 8-wide token table."""
    from safetensors.numpy import save_file

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "model2vec", "normalize": True}))
    shutil.copy(teacher / "tokenizer.json", folder / "tokenizer.json")
    rows = len(json.loads((teacher / "tokenizer.json").read_text())["model"]["vocab"])
    table = np.random.default_rng(0).normal(size=(rows, 8)).astype(np.float32)
    save_file({"embeddings": table}, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(("damage", "said"), [
    ("none", None),
    ("weights-folder", "the baseline's model.safetensors is a folder"),
    ("other-model", "the baseline's weights hold no token table ('embeddings' of 2 dimensions)"),
    ("one-dimension", "the baseline's weights hold no token table"),
    ("junk", "the baseline's weights cannot be read"),
])
def test_a_baseline_dir_whose_weights_are_not_a_token_table_is_refused_when_named(
        tmp_path, tiny_teacher, damage, said):
    from safetensors.numpy import save_file

    pytest.importorskip("model2vec")
    folder = _model2vec_folder(tmp_path / "m2v", tiny_teacher)
    weights = folder / "model.safetensors"
    if damage == "weights-folder":
        weights.unlink()
        weights.mkdir()
    elif damage == "other-model":  # a student's weights in its place
        save_file({"student.embed.weight": np.zeros((10, 8), dtype=np.float32)}, str(weights))
    elif damage == "one-dimension":
        save_file({"embeddings": np.zeros(80, dtype=np.float32)}, str(weights))
    elif damage == "junk":
        weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    res = CliRunner().invoke(app, ["eval", "--teacher", str(tiny_teacher), "--baseline-dir", str(folder), "--task",
                                   "speed", "--no-cache", "--no-progress"])
    if said is None:  # the sound folder: measured, as a baseline
        assert res.exit_code == 0 and "model2vec" in res.output, res.output
    else:
        refused(res, said, str(folder))


@pytest.mark.parametrize("folder", ["missing", "sound"])
def test_a_baseline_dir_without_model2vec_installed_is_kd_s_error(tmp_path, tiny_teacher, monkeypatch, folder):
    """model2vec is an extra: without it --baseline-dir ended in a ModuleNotFoundError traceback, for a folder that
    did not even exist too (the sixth probe)."""
    from kd.apps.eval import models

    monkeypatch.setattr(models, "model2vec_available", lambda: False)
    path = tmp_path / "nothing" if folder == "missing" else _model2vec_folder(tmp_path / "m2v", tiny_teacher)
    res = CliRunner().invoke(app, ["eval", "--teacher", str(tiny_teacher), "--baseline-dir", str(path), "--task",
                                   "speed", "--no-cache", "--no-progress"])
    refused(res, "is not a folder" if folder == "missing" else "needs model2vec, which is not installed", str(path))


@pytest.mark.parametrize("kind", ["evil", "mpnet"])
def test_an_init_output_of_a_type_no_student_takes_is_reported_refused_and_repaired(tmp_path, tiny_teacher, sentences,
                                                                                    kind):
    """The last probe: validate passed an init config whose model_type training refuses (an MPNet one, as kd wrote
    before it refused them, or a forged type)."""
    store = init_store(tmp_path, tiny_teacher, sentences)
    (rel,) = [p.relative_to(store).as_posix() for p in store.glob("teachers/tiny/init-*/config.json")]
    rewrite_file(store, rel, json.dumps(json.loads((store / rel).read_text()) | {"model_type": kind}).encode())
    said = f"it is a '{kind}' model's, whose layers a BertModel cannot take"
    res = validate(store)
    assert res.exit_code == 1 and said in " ".join(res.output.split()), res.output
    refused(CliRunner().invoke(app, ["train-student", "-s", str(store), "-o", str(tmp_path / "s"), "--arch",
                                     "transformer-init", "--max-steps", "1", "--no-progress"]), said)
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert f"set aside {rel.rsplit('/', 1)[0]}" in " ".join(res.output.split()), res.output
    assert validate(store).exit_code == 0
