"""student.saved / student.embed: save + load + encode, and `kd embed` into an aligned store table."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from student_stores import TEACHER, make_store
from typer.testing import CliRunner

from kd import student
from kd.cli import app
from kd.common.errors import InputError, KdError, StoreError
from kd.storage.schema import arrow_to_vectors
from kd.storage.store import Store
from kd.student.embed import embed
from kd.student.trainer import TrainConfig, train


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed")
    store = make_store(root / "store", rows=90, shards=3, tmp=root)
    out = train(TrainConfig(str(store), str(root / "bilstm"), embed_dim=16, hidden_dim=16, max_steps=30, lr=5e-3,
                            batch_size=16, objectives=["cosine", "contrastive:0.1:negatives=8:dim=8"], progress=False))
    return store, out


def test_student_folder_and_load_encode(trained):
    store, out = trained
    weights = load_file(str(out / "model.safetensors"))
    assert any(k.startswith("student.") for k in weights) and any(k.startswith("objectives.1.") for k in weights)
    loaded = student.load(out)
    assert loaded.config.arch.value == "bilstm" and loaded.dim == 16
    assert loaded.num_parameters() == sum(v.numel() for k, v in weights.items() if k.startswith("student."))
    texts = ["the cat runs", "a big red car fell in the river", "news", "the cat runs"]
    one_by_one = np.concatenate([loaded.encode([t]) for t in texts])
    batched = loaded.encode(texts, batch_size=3)
    assert batched.dtype == np.float32 and batched.shape == (4, 16)
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)  # padding and length sorting change nothing
    np.testing.assert_array_equal(batched[0], batched[3])
    assert not np.allclose(batched[0], batched[1])
    unit = loaded.encode(texts, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-5)
    info = json.loads((out / "config.json").read_text())
    assert info["store_fingerprint"] == Store.open(store).manifest.fingerprint
    assert json.loads((out / "training_args.json").read_text())["max_steps"] == 30


def test_encode_cuts_token_budget_batches_and_keeps_the_vectors(trained, monkeypatch):
    """Rows go in batches of similar lengths whose padded size stays within the device's token budget (and at
    most batch_size rows); the vectors equal one-text-at-a-time encoding, in input order."""
    from kd.student import saved

    _, out = trained
    loaded = student.load(out)
    texts = [" ".join(["word"] * n) for n in (3, 40, 5, 38, 2, 41, 4, 39, 1, 37)]  # short and long interleaved
    shapes = []
    forward = loaded.model.forward
    monkeypatch.setattr(loaded.model, "forward", lambda ids, mask, **kw: shapes.append(tuple(ids.shape)) or
                        forward(ids, mask, **kw))
    monkeypatch.setattr(saved, "default_batch_tokens", lambda device: 130)
    got = loaded.encode(texts, batch_size=4)
    assert all(rows <= 4 and (rows == 1 or rows * width <= 130) for rows, width in shapes), shapes
    assert len(shapes) > len(texts) / 4  # the budget, not only batch_size, cut the long rows' batches
    assert shapes[0][1] == max(w for _, w in shapes) > min(w for _, w in shapes)  # longest first, short ones apart
    np.testing.assert_allclose(got, np.concatenate([loaded.encode([t]) for t in texts]), atol=1e-5)


def test_student_beats_an_untrained_one_on_cosine_to_the_teacher(trained, tmp_path):
    store, out = trained
    table = Store.open(store).read_table("texts", ["id", "text"])
    teacher = arrow_to_vectors(Store.open(store).read_table(f"teachers/{TEACHER}", ["sentence"]).column("sentence"))
    texts = table.column("text").to_pylist()
    fresh = train(TrainConfig(str(store), str(tmp_path / "fresh"), embed_dim=16, hidden_dim=16, max_steps=1,
                              lr=0.0, batch_size=16, init_embeddings="random", progress=False))

    def mean_cos(path):
        s = student.load(path).encode(texts, normalize=True)
        return float((s * teacher).sum(1).mean())

    assert mean_cos(out) > mean_cos(fresh) + 0.3  # about 0.6 vs 0.02 here


def test_kd_embed_writes_an_aligned_student_table(trained):
    store, out = trained
    res = CliRunner().invoke(app, ["embed", str(store), "--student", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "3 shard(s) written" in res.output
    s = Store.open(store)
    rec = s.table("students/bilstm")
    assert rec.kind == "student" and s.manifest.is_complete("students/bilstm")
    assert rec.meta["weights_sha256"] == json.loads((out / "config.json").read_text())["weights_sha256"]
    loaded = student.load(out)
    for k in range(3):
        texts = s.read_shard("texts", k, ["id", "text"])
        vecs = s.read_shard("students/bilstm", k)
        assert vecs.column("id").equals(texts.column("id"))  # shard k holds the same ids in the same order
        np.testing.assert_allclose(arrow_to_vectors(vecs.column("embedding")),
                                   loaded.encode(texts.column("text").to_pylist()), atol=1e-5)
    # row by row against the teacher in DuckDB
    files = [s.loc.path(r.file) for r in (s.table("students/bilstm").shards[k] for k in range(3))]
    tfiles = [s.loc.path(r.file) for r in (s.table(f"teachers/{TEACHER}").shards[k] for k in range(3))]
    n, cos = duckdb.sql(
        f"SELECT count(*), avg(list_cosine_similarity(s.embedding, t.sentence)) "
        f"FROM read_parquet({files!r}) s JOIN read_parquet({tfiles!r}) t USING (id)"
    ).fetchall()[0]
    assert n == 90 and -1.0 <= cos <= 1.0
    res = CliRunner().invoke(app, ["validate", str(store)])  # checksums, schemas and id alignment
    assert res.exit_code == 0, res.output
    # a second run resumes: nothing left to do, nothing rewritten
    before = [r.sha256 for r in s.table("students/bilstm").shards.values()]
    summary = embed(out, str(store), progress=False)
    assert (summary.shards_written, summary.shards_skipped) == (0, 3)
    assert [r.sha256 for r in Store.open(store).table("students/bilstm").shards.values()] == before


def test_embed_refuses_another_student_under_the_same_name(trained, tmp_path):
    store, out = trained
    embed(out, str(store), name="dup", progress=False)
    other = train(TrainConfig(str(store), str(tmp_path / "other"), embed_dim=8, hidden_dim=8, max_steps=1,
                              batch_size=16, progress=False))
    with pytest.raises(StoreError, match="another student"):
        embed(other, str(store), name="dup", progress=False)
    summary = embed(other, str(store), name="dup", overwrite=True, progress=False)
    assert summary.shards_written == 3
    assert Store.open(store).table("students/dup").meta["out_dim"] == 16
    assert Store.open(store).table("students/dup").meta["student"] == str(other.resolve())


def test_embed_a_pair_store_writes_both_sides(trained, tmp_path):
    _, out = trained
    pairs = make_store(tmp_path / "pairs", rows=30, shards=2, pairs=True, tmp=tmp_path)
    summary = embed(out, str(pairs), name="s", progress=False)
    assert summary.rows == 30 and summary.shards_written == 2
    s = Store.open(pairs)
    shard = s.read_shard("students/s", 1)
    texts = s.read_shard("texts", 1)
    assert shard.column_names == ["id", "embedding_a", "embedding_b"]
    np.testing.assert_allclose(arrow_to_vectors(shard.column("embedding_b")),
                               student.load(out).encode(texts.column("text_b").to_pylist()), atol=1e-5)


def test_embed_a_text_file_to_parquet(trained, tmp_path):
    _, out = trained
    src = tmp_path / "in.txt"
    src.write_text("the cat runs\n\nthe dog eats\n")
    res = CliRunner().invoke(app, ["embed", str(src), "--student", str(out), "--out", str(tmp_path / "v.parquet"),
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    t = pq.read_table(tmp_path / "v.parquet")
    assert t.column("text").to_pylist() == ["the cat runs", "the dog eats"]
    np.testing.assert_allclose(arrow_to_vectors(t.column("embedding")),
                               student.load(out).encode(["the cat runs", "the dog eats"]), atol=1e-6)
    with pytest.raises(InputError, match="--out"):
        embed(out, str(src), progress=False)


def test_embed_errors(trained, tmp_path):
    store, out = trained
    res = CliRunner().invoke(app, ["embed", str(store), "--student", str(tmp_path), "--no-progress"])
    assert res.exit_code == 2 and "no trained student" in res.output
    res = CliRunner().invoke(app, ["embed", str(tmp_path / "missing.txt"), "--student", str(out), "--out", "x.parquet"])
    assert res.exit_code == 2 and "not found" in res.output


def test_an_empty_input_and_a_text_column_on_a_store_are_refused(tmp_path):
    """As kd precompute refuses: a 0-row file is never what was wanted; a store's texts are its own."""
    from kd.common.errors import InputError
    from kd.student.embed import embed, read_texts

    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(InputError, match="no text to embed"):
        read_texts(str(empty))
    store = tmp_path / "store"
    (store / "manifests").mkdir(parents=True)
    (store / "manifest.json").write_text('{"format": "kd-store"}')
    with pytest.raises(InputError, match="--text-column is for file inputs"):
        embed(str(tmp_path / "student"), str(store), text_column="text")


def test_an_empty_name_is_refused_not_replaced_by_the_folders(trained):
    """`kd embed STORE --name ''` wrote under the student folder's name (the probe's O097)."""
    store, out = trained
    with pytest.raises(KdError, match="invalid student table name"):
        embed(out, str(store), name="", progress=False)
