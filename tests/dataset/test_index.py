"""faiss indexes over a store: exact flat search, approximate kinds, manifest pointers, kd index/search."""

from __future__ import annotations

import json
import shutil
import types

import numpy as np
import pytest
from conftest import build_tiny_bert
from store_builder import TableSpec, build_store, grouped_vectors, unit
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import InputError, StoreError
from kd.common.ids import row_ids
from kd.dataset.index import build_index, search
from kd.storage.index_files import list_indexes
from kd.storage.store import Store, open_writer

DIM = 24


@pytest.fixture()
def store(tmp_path, sentences):
    x, _ = grouped_vectors(12, 20, DIM, spread=0.08, seed=1)
    n = len(x)
    ids = row_ids(sentences[:n])  # content hashes, as kd precompute writes: the index maps positions to ids
    student = unit(np.random.default_rng(2).normal(size=(n, 16)))
    path = tmp_path / "store"
    build_store(path, sentences[:n], {
        "teachers/minilm": TableSpec("teacher", {"sentence": x, "layers": np.stack([x, x], 1)}),
        "students/bilstm": TableSpec("student", {"embedding": student}),
    }, rows_per_shard=70, ids=ids)
    return path, x, ids, student


def brute_force(x: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    sims = unit(q) @ unit(x).T
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(sims, order, 1)


def test_flat_search_is_exact_brute_force(store, sentences):
    path, x, ids, _ = store
    info = build_index(path, "minilm", "sentence", "flat")
    q = np.random.default_rng(5).normal(size=(7, DIM)).astype(np.float32) * 3.0  # unnormalised queries
    res = search(path, q, k=10)
    order, sims = brute_force(x, q, 10)
    np.testing.assert_array_equal(res.ids, ids[order])
    np.testing.assert_allclose(res.scores, sims, atol=1e-5)
    assert res.texts[3] == [sentences[i] for i in order[3]]
    assert res.index.name == info.name == "minilm-sentence-flat"
    # an indexed row finds itself first with cosine 1
    res = search(path, x[[0, 150]], k=1)
    assert res.ids[:, 0].tolist() == [ids[0], ids[150]] and np.allclose(res.scores[:, 0], 1.0, atol=1e-5)


def test_manifest_points_at_atomically_written_files(store):
    path, x, ids, _ = store
    build_index(path, "teachers/minilm", "sentence", "flat")
    extras = json.loads((path / "manifest.json").read_text())["extras"]
    entry = extras["index:minilm-sentence-flat"]
    assert entry["file"] == "indexes/minilm-sentence-flat.faiss" and entry["rows"] == len(x) and entry["dim"] == DIM
    assert np.array_equal(np.load(path / entry["ids_file"]), ids)
    assert not [p for p in (path / "indexes").iterdir() if ".tmp-" in p.name]
    # other writers' tables are untouched, and the index survives a later, unrelated publish
    m = Store.open(path).manifest
    assert {"texts", "teachers/minilm", "students/bilstm"} <= set(m.tables)
    w = open_writer(path, m, "someone-else")
    w.publish()
    w.close()
    assert [i.name for i in list_indexes(Store.open(path))] == ["minilm-sentence-flat"]


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_kinds_recall(store, kind):
    path, x, ids, _ = store
    build_index(path, "minilm", "sentence", kind)
    q = x[::11] + 0.02 * np.random.default_rng(3).normal(size=x[::11].shape).astype(np.float32)
    res = search(path, q, k=10, kind=kind)
    order, _ = brute_force(x, q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(res.ids, ids[order])])
    assert recall >= 0.9, recall
    assert (res.ids[:, 0] == ids[order[:, 0]]).mean() >= 0.95


def test_choosing_among_indexes(store):
    path, x, ids, student = store
    build_index(path, "minilm", "sentence", "flat")
    build_index(path, "minilm", "sentence", "hnsw")
    build_index(path, "student_bilstm", "embedding", "flat")
    with pytest.raises(InputError, match="2 indexes match"):
        search(path, x[:1], k=3)
    # the queries' dimension picks the student's index
    res = search(path, student[4:5], k=1)
    assert res.index.table == "students/bilstm" and res.ids[0, 0] == ids[4]
    with pytest.raises(StoreError, match="no index"):
        search(path, x[:1], k=3, kind="ivf")


def test_bad_columns_and_stale_index(store):
    path, x, ids, _ = store
    with pytest.raises(InputError, match="not a vector"):
        build_index(path, "minilm", "layers", "flat")
    with pytest.raises(InputError, match="no column"):
        build_index(path, "minilm", "cls", "flat")
    with pytest.raises(InputError, match="no table"):
        build_index(path, "mpnet", "sentence", "flat")
    build_index(path, "minilm", "sentence", "flat")
    # the indexed table's shard 0 changes under the index (hand edit of every manifest record of it)
    for f in [path / "manifest.json", *(path / "manifests").glob("*.json")]:
        m = json.loads(f.read_text())
        if "teachers/minilm" in m["tables"]:
            m["tables"]["teachers/minilm"]["shards"]["0"]["sha256"] = "0" * 64
            f.write_text(json.dumps(m))
    with pytest.raises(StoreError, match="stale"):
        search(path, x[:1], k=3)


def test_kd_index_and_search_with_a_student(store, monkeypatch, sentences):
    path, x, ids, _ = store
    runner = CliRunner()
    r = runner.invoke(app, ["index", str(path), "--table", "minilm", "--column", "sentence"])
    assert r.exit_code == 0 and "indexed 240 rows" in r.output, r.output
    # a student distilled into the teacher's space: its query vector is row 42's teacher vector
    import kd.student

    monkeypatch.setattr(kd.student, "load", lambda d: types.SimpleNamespace(encode=lambda texts: x[42:43]))
    r = runner.invoke(app, ["search", str(path), "anything", "--student", "some/dir", "-k", "3"])
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[3].split("│")
    assert first[2].strip() == "1.0000" and first[3].strip() == str(ids[42])
    assert sentences[42].split()[0] in first[4]
    r = runner.invoke(app, ["search", str(path), "q"])
    assert r.exit_code == 2 and "exactly one query encoder" in r.output


def test_kd_search_with_the_stores_teacher(tmp_path, tiny_teacher, sentences):
    from kd.pipeline.precompute import precompute

    src = tmp_path / "in.txt"
    src.write_text("\n".join(sentences[:60]) + "\n", encoding="utf-8")
    out = tmp_path / "st"
    precompute([str(src)], str(out), [str(tiny_teacher)], shard_rows=25, progress=False)
    runner = CliRunner()
    r = runner.invoke(app, ["index", str(out), "--table", "tiny-bert", "--column", "mean"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["search", str(out), sentences[17], "--teacher", "tiny-bert", "-k", "3"])
    assert r.exit_code == 0, r.output
    cells = [line.split("│")[1:-1] for line in r.output.splitlines() if line.startswith("│")]
    ranked = [c for c in cells if c[0].strip()]  # continuation lines of wrapped texts have no rank
    assert [c[0].strip() for c in ranked] == ["1", "2", "3"]
    assert ranked[0][1].strip() == "1.0000" and sentences[17].split()[0] in ranked[0][3]
    # the store's id of that sentence
    s = Store.open(out)
    texts = s.read_table("texts", ["id", "text"]).to_pydict()
    assert int(ranked[0][2]) == texts["id"][texts["text"].index(sentences[17])]
    # the checkpoint path it was precomputed from names the same teacher (and its default column)
    r = runner.invoke(app, ["search", str(out), sentences[17], "--teacher", str(tiny_teacher), "-k", "1"])
    assert r.exit_code == 0 and "tiny_bert-mean-flat" in r.output, r.output
    for spelling in (f"tiny-bert={tiny_teacher}", tiny_teacher.as_uri(), f"{tiny_teacher}/"):  # by any spelling
        r = runner.invoke(app, ["search", str(out), sentences[17], "--teacher", spelling, "-k", "1"])
        assert r.exit_code == 0 and "tiny_bert-mean-flat" in r.output, (spelling, r.output)
    other = build_tiny_bert(tmp_path / "other", seed=4)  # not the store's: its index was searched, exit 0 (a probe)
    r = runner.invoke(app, ["search", str(out), sentences[17], "--teacher", str(other), "-k", "1"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "is not one of the store's teachers (tiny-bert)" in said, said
    for table in ("tiny-bert", "teachers/tiny-bert"):  # --table named the index: any checkpoint searched it (a probe)
        r = runner.invoke(app, ["search", str(out), sentences[17], "--teacher", str(other), "--table", table])
        said = " ".join(r.output.split())
        assert r.exit_code == 2 and "is not the teacher that wrote table 'teachers/tiny-bert'" in said, said
        assert f"pass --teacher {tiny_teacher}" in said, said  # (the writer, as the table records it)
    for table, column, said_here in (("texts", None, "table 'texts' holds no vectors to search"),
                                     ("tiny-bert", "sentence", "table 'teachers/tiny-bert' has no column 'sentence'")):
        args = ["search", str(out), sentences[17], "--teacher", str(tiny_teacher), "--table", table]
        r = runner.invoke(app, args + (["--column", column] if column else []))
        said = " ".join(r.output.split())  # (it proposed building an index on texts/mean: a probe)
        assert r.exit_code == 2 and said_here in said and "kd index" not in said, said
    two = tmp_path / "two"  # a store's other teacher, given with --table of the first: "restore that checkpoint"
    precompute([str(src)], str(two), [f"a={tiny_teacher}", f"b={other}"], shard_rows=25, progress=False)
    r = runner.invoke(app, ["search", str(two), sentences[17], "--teacher", str(other), "--table", "a"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "search its own table (--table teachers/b)" in said, said
    assert "restore" not in said and f"pass --teacher {tiny_teacher}" in said, said
    r = runner.invoke(app, ["search", str(out), sentences[17], "--teacher", str(tiny_teacher), "--table", "tiny-bert",
                            "-k", "1"])
    assert r.exit_code == 0 and "1.0000" in r.output, r.output
    twin = build_tiny_bert(tmp_path / "x" / "tiny-bert", seed=4)  # the table's name, other weights: the weights tell
    for spec in (str(twin), f"tiny-bert={twin}"):
        r = runner.invoke(app, ["search", str(out), sentences[17], "--teacher", spec, "-k", "1"])
        said = " ".join(r.output.split())
        assert r.exit_code == 2 and "is not the teacher that wrote table 'teachers/tiny-bert' (its weights" in said
    # the table's weights and another config.json (another activation): another function, searched (a probe)
    shutil.copytree(tiny_teacher, twin, dirs_exist_ok=True)
    (twin / "config.json").write_text((twin / "config.json").read_text().replace('"gelu"', '"relu"'))
    r = runner.invoke(app, ["search", str(out), sentences[17], "--teacher", str(twin), "-k", "1"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "wrote table 'teachers/tiny-bert' (its config.json settings differ)" in said, said
    assert "restore that checkpoint's config.json settings, or pass" in said, said  # (the twin is not the writer)
    # a byte-identical copy of the teacher's folder, under another name: its weights and config say which teacher it
    # is (it was "not one of the store's teachers"); with another config.json, it is none of them
    copy = shutil.copytree(tiny_teacher, tmp_path / "elsewhere" / "my-copy")
    for spec in (str(copy), f"mine={copy}"):
        r = runner.invoke(app, ["search", str(out), sentences[17], "--teacher", spec, "-k", "1"])
        assert r.exit_code == 0 and "1.0000" in r.output and "tiny_bert-mean-flat" in r.output, (spec, r.output)
    (copy / "config.json").write_text((copy / "config.json").read_text().replace('"gelu"', '"relu"'))
    r = runner.invoke(app, ["search", str(out), sentences[17], "--teacher", str(copy), "-k", "1"])
    assert r.exit_code == 2 and "is not one of the store's teachers (tiny-bert)" in " ".join(r.output.split())
    # a copy of the teacher of two tables (kd distill's start model is its teacher): it was "not one of the store's
    # teachers (start, tt)", where a path writing both says which to pass (a probe)
    same = tmp_path / "same"
    precompute([str(src)], str(same), [f"a={tiny_teacher}", f"b={shutil.copytree(tiny_teacher, tmp_path / 'b')}"],
               shard_rows=25, progress=False)
    third = shutil.copytree(tiny_teacher, tmp_path / "third")
    r = runner.invoke(app, ["search", str(same), sentences[17], "--teacher", str(third), "-k", "1"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "holds the weights and settings of the teacher of several tables of the store (a, b)" \
        in said and "pass one of their names: --teacher a" in said, said
    # the one with an index is the one to pass (it named the first, whose search then failed: a probe), and a table
    # with none is named in the fix that builds one (it said --table TABLE --column COLUMN)
    assert runner.invoke(app, ["index", str(same), "--table", "b", "--column", "mean"]).exit_code == 0
    r = runner.invoke(app, ["search", str(same), sentences[17], "--teacher", str(third), "-k", "1"])
    assert r.exit_code == 2 and "pass one of their names: --teacher b" in " ".join(r.output.split()), r.output
    r = runner.invoke(app, ["search", str(same), sentences[17], "--teacher", "a", "-k", "1"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and f"build one: kd index {same} --table teachers/a --column mean" in said, said
    r = runner.invoke(app, ["search", str(same), sentences[17], "--teacher", "b", "-k", "1"])
    assert r.exit_code == 0 and "1.0000" in r.output, r.output
    r = runner.invoke(app, ["search", str(out), sentences[17], "--teacher", "tiny-bert=", "-k", "1"])
    assert r.exit_code == 2 and "a teacher with a name and no model" in r.output, r.output
    dashed = f"- {sentences[17]}"  # a list item's text is the query, not an option ("No such option: - ...")
    r = runner.invoke(app, ["search", str(out), dashed, "--teacher", "tiny-bert", "-k", "1"])
    assert r.exit_code == 0 and "1.0000" not in r.output and sentences[17].split()[0] in r.output, r.output
    for empty in ("", "   "):  # the probe's B20: 10 "nearest" rows to nothing, exit 0
        r = runner.invoke(app, ["search", str(out), empty, "--teacher", "tiny-bert"])
        assert r.exit_code == 2 and "the query text is empty" in r.output, r.output


def test_pair_store_search_returns_the_embedded_side(tmp_path):
    pairs = [(f"left {i}", f"right {i}") for i in range(30)]
    a = unit(np.random.default_rng(0).normal(size=(30, 8)))
    b = unit(np.random.default_rng(1).normal(size=(30, 8)))
    path = tmp_path / "pairs"
    build_store(path, pairs, {"teachers/bi": TableSpec("teacher", {"sentence_a": a, "sentence_b": b})})
    build_index(path, "bi", "sentence_b", "flat")
    res = search(path, b[7:8], k=2)
    assert res.ids[0, 0] == row_ids(pairs)[7] and res.texts[0][0] == "right 7"


def test_default_vector_is_the_first_teachers_sentence_else_mean_else_first(tmp_path, sentences):
    from kd.dataset.index import default_vector

    x, _ = grouped_vectors(4, 10, DIM, spread=0.1, seed=3)
    path = tmp_path / "store"
    build_store(path, sentences[: len(x)], {
        "teachers/zeta": TableSpec("teacher", {"sentence": x}),
        "teachers/alpha": TableSpec("teacher", {"layers": np.stack([x, x], 1), "cls": x, "mean": x}),
        "teachers/beta": TableSpec("teacher", {"layers": np.stack([x, x], 1), "cls": x}),
    })
    # alpha sorts first and has no sentence column: mean; 2-D layers never qualify
    assert default_vector(path, None, None) == ("teachers/alpha", "mean")
    assert default_vector(path, "zeta", None) == ("teachers/zeta", "sentence")
    assert default_vector(path, "beta", None) == ("teachers/beta", "cls")
    res = CliRunner().invoke(app, ["index", str(path)])
    assert res.exit_code == 0 and "teachers/alpha.mean" in res.output
    assert list_indexes(Store.open(path))[0].column == "mean"
