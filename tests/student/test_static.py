"""Static students and the `vocab` output they start from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import precompute_news
from typer.testing import CliRunner

from kd.cli import app
from kd.pipeline.precompute import precompute
from kd.storage.store import Store
from kd.storage.validate import check
from kd.student.models import Arch, StudentConfig, build_student
from kd.student.static import sif_weights, static_init


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_teacher, sentences) -> Path:
    root = tmp_path_factory.mktemp("static")
    path = precompute_news(root, tiny_teacher, sentences, 200, 100)
    # the vocab output added to the finished store: no row output is recomputed
    before = {p.name: p.stat().st_mtime_ns for p in (path / "teachers" / "tiny").glob("part-*.parquet")}
    s = precompute([str(root / "news.txt")], str(path), [f"tiny={tiny_teacher}"], outputs=["vocab"],
                   shard_rows=100, progress=False)
    assert s.vocab_written == ["tiny"] and s.shards_written == 0
    assert before == {p.name: p.stat().st_mtime_ns for p in (path / "teachers" / "tiny").glob("part-*.parquet")}
    return path


def test_vocab_output_is_the_teacher_on_each_token_alone(store, tiny_teacher):
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer, BertModel

    vocab = load_file(str(store / "teachers" / "tiny" / "vocab.safetensors"))["vectors"]
    tok = AutoTokenizer.from_pretrained(tiny_teacher)
    assert vocab.shape == (len(tok), 32) and np.isfinite(vocab).all()
    model = BertModel.from_pretrained(tiny_teacher).eval()
    word = tok.convert_tokens_to_ids("market")
    with torch.no_grad():
        h = model(torch.tensor([[tok.cls_token_id, word, tok.sep_token_id]])).last_hidden_state[0]
    np.testing.assert_allclose(vocab[word], h.mean(0).numpy(), atol=1e-5)
    assert check(str(store))[1] == []


def test_a_damaged_vocab_file_is_flagged_and_refused(store, tmp_path):
    broken = Path(shutil.copytree(store, tmp_path / "s"))
    f = broken / "teachers" / "tiny" / "vocab.safetensors"
    data = bytearray(f.read_bytes())
    data[-4:] = b"\x00\x00\xc0\x7f"  # a NaN in the last vector
    f.write_bytes(bytes(data))
    problems = check(str(broken))[1]
    assert any("vocab.safetensors" in str(p) and "checksum" in str(p) for p in problems)
    res = CliRunner().invoke(app, ["train-student", "--shards", str(broken), "--out", str(tmp_path / "st"),
                                   "--arch", "static", "--max-steps", "2", "--no-progress"])
    assert res.exit_code == 2 and "vocab.safetensors" in res.output


def test_static_encode_is_a_hand_computed_weighted_mean():
    cfg = StudentConfig(arch=Arch.static, vocab_size=4, pad_id=0, embed_dim=2, out_dim=2, dropout=0.0)
    model = build_student(cfg).eval()
    vectors = np.array([[0, 0], [1, 0], [0, 1], [3, 3]], dtype=np.float32)  # token 0 is padding
    counts = np.array([0, 900, 100, 0])
    weights = sif_weights(counts, a=0.1)  # p = 0.9, 0.1: weights 0.1/1.0 and 0.1/0.2
    np.testing.assert_allclose(weights[1:3], [0.1, 0.5])
    with torch.no_grad():
        model.embed.weight.copy_(torch.from_numpy(vectors * weights[:, None]))
    ids = torch.tensor([[1, 2, 2, 0]])
    got = model(ids, (ids != 0).long()).embedding[0].detach().numpy()
    want = (0.1 * vectors[1] + 2 * 0.5 * vectors[2]) / 3
    np.testing.assert_allclose(got, want, rtol=1e-6)
    bags = model.embed_bags(torch.tensor([1, 2, 2]), torch.tensor([0])).detach()[0].numpy()
    np.testing.assert_allclose(bags, want, rtol=1e-6)


def test_static_init_is_pca_scaled_by_weights():
    rng = np.random.default_rng(0)
    vocab = rng.normal(size=(50, 8)).astype(np.float32)
    w = rng.uniform(0.1, 1, size=50).astype(np.float32)
    plain, scaled = static_init(vocab, 4, None, 0), static_init(vocab, 4, w, 0)
    assert scaled.shape == (50, 4) and not scaled[0].any()
    np.testing.assert_allclose(scaled[1:], plain[1:] * w[1:, None], rtol=1e-5)


def test_static_student_trains_and_loads(store, tmp_path):
    out = tmp_path / "st"
    res = CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(out), "--arch", "static",
                                   "--embed-dim", "16", "--batch-size", "32", "--epochs", "4", "--val-percent", "0",
                                   "--log-every", "1", "--no-progress"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3])  # it learns
    from kd import student

    s = student.load(out)
    texts = Store.open(store).read_table("texts")["text"].to_pylist()[:40]
    bags = s.encode(texts, normalize_embeddings=False)  # the model's own vectors, before the unit scaling
    ids = s.tokenizer(texts, padding=True, truncation=True, max_length=s.config.max_length, return_tensors="pt",
                      return_token_type_ids=False)
    with torch.no_grad():
        padded = s.model(ids["input_ids"], ids["attention_mask"]).embedding.numpy()
    np.testing.assert_allclose(bags, padded, atol=1e-5)  # the fast path is the model


def test_a_static_students_width_never_exceeds_its_teachers_vocab_output(store, tmp_path):
    """Left out, --embed-dim is min(256, the teacher's width) (the 32-wide teacher: 32; it was 256 and PCA failed
    after the whole run, naming pca_embeddings); a wider one given is refused naming --embed-dim, before any
    model is built."""
    from kd.student.setup import setup
    from kd.student.train_config import TrainConfig

    width = Store.open(store).table("teachers/tiny").meta["dim"]
    s = setup(TrainConfig(str(store), str(tmp_path / "a"), arch="static", progress=False))
    assert s.student_cfg.embed_dim == width == 32
    res = CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(tmp_path / "b"), "--arch",
                                   "static", "--embed-dim", "64", "--no-progress"])
    assert res.exit_code == 2 and "--embed-dim 64 is wider than teacher 'tiny'" in res.output, res.output
    assert "where: --embed-dim" in res.output and "--embed-dim 32 or less" in res.output, res.output
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("out_dim", [16, 48])
def test_numpy_encode_equals_the_torch_embedding_bag(store, tmp_path, sentences, out_dim):
    """The CPU fast path (numpy sums of token rows, then the bias-free head) gives the torch path's vectors,
    for one text and for batches that mix lengths; no head (16 = 16: Identity) and a 16 -> 48 head."""
    from kd import student

    args = ["--embed-dim", "16", "--out-dim", str(out_dim)]
    res = CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(tmp_path / "st"), "--arch",
                                   "static", "--max-steps", "3", "--no-progress", *args])
    assert res.exit_code == 0, res.output
    st = student.load(tmp_path / "st")
    assert st._static_arrays() is not None  # the numpy path is the one encode() takes for a few texts on a CPU
    texts = ["", "market", *sentences[:40]]
    ids = st._token_ids(texts)
    lengths = np.array([len(x) for x in ids])
    want = np.zeros((len(texts), st.dim), dtype=np.float32)
    st._encode_bags(ids, lengths, 7, want)
    for batch in (1, 7, 256):
        got = np.concatenate([st.encode(texts[i : i + batch], batch_size=batch, normalize_embeddings=False)
                              for i in range(0, len(texts), batch)])
        assert got.dtype == np.float32 and got.shape == (len(texts), out_dim)
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(st.encode("market", normalize_embeddings=False), want[1], atol=1e-6, rtol=1e-5)
