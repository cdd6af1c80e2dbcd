"""Teacher-initialised Transformer students: the stored kept layers are the teacher's, and they train."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import precompute_news
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from typer.testing import CliRunner

from kd.cli import app
from kd.common.layers import default_layers
from kd.pipeline.precompute import precompute
from kd.storage.validate import check


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_teacher, sentences) -> Path:
    root = tmp_path_factory.mktemp("tinit")
    path = precompute_news(root, tiny_teacher, sentences, 160, 80)
    for layers in ("0,1", "1"):
        s = precompute([str(root / "news.txt")], str(path), [f"tiny={tiny_teacher}"], outputs=["init"],
                       shard_rows=80, keep_layers=layers, progress=False)
        assert s.shards_written == 0 and s.vocab_written
    return path


def test_default_layers_are_evenly_spaced_and_end_at_the_top():
    assert default_layers(6) == [1, 3, 5] and default_layers(6, 2) == [2, 5] and default_layers(12, 4) == [2, 5, 8, 11]
    assert default_layers(6, 6) == list(range(6))


def test_init_output_is_validated_and_holds_only_the_kept_layers(store, tmp_path):
    from safetensors import safe_open

    assert check(str(store))[1] == []
    with safe_open(str(store / "teachers/tiny/init-1/model.safetensors"), "np") as f:
        keys = list(f.keys())
    assert any(k.startswith("encoder.layer.0.") for k in keys)
    assert not any(k.startswith("encoder.layer.1.") for k in keys)
    cfg = json.loads((store / "teachers/tiny/init-1/config.json").read_text())
    assert cfg["num_hidden_layers"] == 1 and cfg["kept_layers"] == [1] and cfg["teacher_layers"] == 2
    assert cfg["teacher_pooling"] is None  # a plain BERT checkpoint: no sentence-transformers pooling
    broken = Path(shutil.copytree(store, tmp_path / "s"))
    f = broken / "teachers/tiny/init-1/model.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0xFF
    f.write_bytes(bytes(data))
    assert any("init-1" in str(p) for p in check(str(broken))[1])


def _train(store: Path, out: Path, layers: str, steps: int, device: str = "auto") -> CliRunner:
    return CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(out), "--arch",
                                    "transformer-init", "--init-layers", layers, "--target", "tiny.mean",
                                    "--max-steps", str(steps), "--val-percent", "0", "--device", device,
                                    "--log-every", "1", "--batch-size", "16", "--no-progress"])


def test_all_layers_kept_reproduce_the_teacher(store, tmp_path, tiny_teacher, sentences):
    from transformers import AutoTokenizer, BertModel

    from kd import student

    res = _train(store, tmp_path / "st", "0,1", 1)
    assert res.exit_code == 0, res.output
    # undo the one step: reload the stored weights into the saved student's architecture
    from kd.student.transformer_init import load_init_weights

    s = student.load(tmp_path / "st")
    load_init_weights(s.model, store / "teachers/tiny/init-0-1")
    texts = sentences[:20]
    got = s.encode(texts)
    tok = AutoTokenizer.from_pretrained(tiny_teacher)
    enc = tok(texts, padding=True, truncation=True, max_length=s.config.max_length, return_tensors="pt")
    with torch.no_grad():
        h = BertModel.from_pretrained(tiny_teacher).eval()(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    want = ((h * m).sum(1) / m.sum(1)).numpy()
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.9999


def test_a_one_layer_student_trains_without_the_teacher(store, tmp_path, monkeypatch):
    import transformers

    def refuse(*a, **kw):
        raise AssertionError("training loaded a model checkpoint")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))
    res = _train(store, tmp_path / "st1", "1", 30)
    assert res.exit_code == 0, res.output
    before, after = _fixed_batch_losses(store, tmp_path / "st1", "1")
    assert after < 0.85 * before, (before, after)


def test_bf16_autocast_trains_and_keeps_fp32_weights(store, tmp_path, monkeypatch):
    """On a CPU with native bf16 the Transformer student trains under bf16 autocast (the objectives and
    the saved weights stay fp32) and learns as much as in fp32 on the same steps."""
    from safetensors.torch import load_file

    after = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("KD_CPU_BF16", flag)
        res = _train(store, tmp_path / f"bf{flag}", "1", 30, "cpu")  # CPU bf16 is what is tested
        assert res.exit_code == 0, res.output
        recs = [json.loads(x) for x in (tmp_path / f"bf{flag}" / "metrics.jsonl").read_text().splitlines()]
        assert {r["autocast"] for r in recs if "loss" in r} == {"bfloat16" if flag == "1" else "off"}
        weights = load_file(tmp_path / f"bf{flag}" / "model.safetensors")
        assert {t.dtype for t in weights.values() if t.is_floating_point()} == {torch.float32}
        before, after[flag] = _fixed_batch_losses(store, tmp_path / f"bf{flag}", "1")
    assert after["1"] < 0.85 * before, (before, after)  # it learns under bf16
    assert abs(after["1"] - after["0"]) < 0.1 * (before - after["0"]), (before, after)  # as much as fp32


def _fixed_batch_losses(store: Path, folder: Path, layers: str) -> tuple[float, float]:
    """The cosine loss on one fixed batch of store rows (eval mode), before (the stored init weights) and
    after training. Not the logged training loss: that one is dominated by BERT's dropout."""
    from kd import student
    from kd.storage.store import Store
    from kd.student.transformer_init import load_init_weights

    st = Store.open(store)
    texts, targets = st.read_table("texts", ["id", "text"]), st.read_table("teachers/tiny", ["id", "mean"])
    assert texts["id"].to_pylist()[:32] == targets["id"].to_pylist()[:32]
    batch, want = texts["text"].to_pylist()[:32], np.stack(targets["mean"].to_numpy(zero_copy_only=False)[:32])
    trained = student.load(folder)
    after = _cosine_loss(trained.encode(batch), want)
    load_init_weights(trained.model, store / f"teachers/tiny/init-{layers}")
    return _cosine_loss(trained.encode(batch), want), after


def _cosine_loss(got: np.ndarray, want: np.ndarray) -> float:
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    return float(np.mean(1 - cos))


def _shrink(store: Path, source: Path, out: Path, layers: str, *extra: str) -> CliRunner:
    return CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(out), "--arch",
                                    "transformer-init", "--init", str(source), "--init-layers", layers,
                                    "--target", "tiny.mean", "--val-percent", "0", "--device", "cpu",
                                    "--batch-size", "16", "--no-progress", *extra])


def test_a_student_shrunk_from_a_trained_one_keeps_the_layers_asked_for(store, tmp_path):
    """--init DIR --init-layers 1: a one-layer copy of a trained two-layer student (its layer 1 renumbered 0,
    its embeddings and head), then trained; at a learning rate of 1e-12 the one step leaves the copy as is."""
    from safetensors.torch import load_file

    assert _train(store, tmp_path / "big", "0,1", 20, "cpu").exit_code == 0
    res = _shrink(store, tmp_path / "big", tmp_path / "small", "1", "--max-steps", "1", "--lr", "1e-12",
                  "--head-init", "random")
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "small" / "config.json").read_text())["student"]
    assert cfg["num_layers"] == 1 and cfg["bert"]["num_hidden_layers"] == 1
    big, small = load_file(tmp_path / "big" / "model.safetensors"), load_file(tmp_path / "small" / "model.safetensors")
    layer = "student.encoder.bert.encoder.layer."
    assert not any(k.startswith(layer + "1.") for k in small)
    pairs = [(k, k.replace(layer + "0.", layer + "1.")) for k in small if k.startswith("student.")]
    assert len(pairs) == len([k for k in big if k.startswith("student.") and not k.startswith(layer + "0.")])
    for mine, theirs in pairs:
        torch.testing.assert_close(small[mine], big[theirs], atol=1e-6, rtol=0, msg=mine)
    assert not torch.allclose(big[layer + "0.output.dense.weight"], big[layer + "1.output.dense.weight"])


def test_shrinking_refuses_layers_the_student_lacks_and_other_archs(store, tmp_path):
    assert _train(store, tmp_path / "big", "0,1", 2, "cpu").exit_code == 0
    res = _shrink(store, tmp_path / "big", tmp_path / "s1", "1,2", "--max-steps", "1")
    assert res.exit_code == 2 and "--init-layers '1,2': layers are numbered 0..1" in res.output, res.output
    res = CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(tmp_path / "s2"),
                                   "--arch", "static", "--init-layers", "1", "--target", "tiny.mean"])
    assert res.exit_code == 2 and "--init-layers picks a Transformer's layers" in res.output, res.output
    assert not (tmp_path / "s1").exists() and not (tmp_path / "s2").exists()


def test_a_student_reads_as_far_as_the_model_it_starts_from(tmp_path, tiny_teacher, sentences):
    """transformer-init's default length is the start model's as the store ran it (issue 50: cut at 128 tokens
    where MiniLM reads 256, a student served long documents worse than MiniLM); --max-length still wins, and a
    student shrunk from a trained one keeps its source's length. The start model here reads 32 tokens (its own
    limit is 64): the old default gave 64."""
    from kd import student

    src = tmp_path / "news.txt"
    src.write_text("\n".join(sentences[:80]) + "\n", encoding="utf-8")
    store = tmp_path / "store"
    precompute([str(src)], str(store), [f"tiny={tiny_teacher}"], outputs=["mean", "init"], keep_layers="0,1",
               max_length=32, shard_rows=80, progress=False)
    assert _train(store, tmp_path / "st", "0,1", 1, "cpu").exit_code == 0
    s = student.load(tmp_path / "st")
    assert s.config.max_length == 32
    long = " ".join(sentences[:10])  # past 32 tokens
    ids = s._token_ids([long])[0]
    assert len(ids) == 32
    first_16 = s.tokenizer.decode(ids[1:15])  # what a 16-token student would have read
    assert not np.allclose(s.encode([long]), s.encode([first_16]), atol=1e-3)
    res = CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(tmp_path / "short"),
                                   "--arch", "transformer-init", "--init-layers", "0,1", "--target", "tiny.mean",
                                   "--max-steps", "1", "--val-percent", "0", "--device", "cpu", "--batch-size",
                                   "16", "--no-progress", "--max-length", "20"])
    assert res.exit_code == 0, res.output
    assert student.load(tmp_path / "short").config.max_length == 20
    assert _shrink(store, tmp_path / "short", tmp_path / "shrunk", "0", "--max-steps", "1").exit_code == 0
    assert student.load(tmp_path / "shrunk").config.max_length == 20
