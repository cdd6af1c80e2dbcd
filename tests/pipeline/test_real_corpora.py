"""Integration: the packaged MiniLM teacher against sentence-transformers, and the real corpora."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
from conftest import shared_file
from typer.testing import CliRunner

from kd.cli import app
from kd.pipeline.precompute import precompute
from kd.storage import Store
from kd.storage.schema import arrow_to_vectors


@pytest.mark.slow
def test_minilm_on_stsb_test_matches_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    from kd.pipeline.teacher.resolve import resolve_teacher

    out = tmp_path / "stsb"
    r = CliRunner().invoke(app, ["precompute", str(shared_file("stsb", "sts-test.csv")), "--pair-columns", "5,6",
                                 "--label-column", "4", "-t", "minilm", "-o", str(out), "--outputs",
                                 "mean,sentence", "--precision", "fp32", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert CliRunner().invoke(app, ["validate", str(out)]).exit_code == 0
    store = Store.open(out)
    texts = store.read_table("texts")
    ours = store.read_table("teachers/minilm")
    st = SentenceTransformer(resolve_teacher("minilm").path, device="cpu")
    a = texts["text_a"].to_pylist()
    ref = st.encode(a, batch_size=64, convert_to_numpy=True)
    sent = arrow_to_vectors(ours["sentence_a"])
    mean = arrow_to_vectors(ours["mean_a"])
    cos = (sent * ref).sum(1) / np.linalg.norm(sent, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= 0.9999
    mean_n = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    assert ((mean_n * ref).sum(1) / np.linalg.norm(ref, axis=1)).min() >= 0.9999
    # teacher quality straight from the store: Spearman of cosine vs gold on STS-B test
    from scipy.stats import spearmanr

    b = arrow_to_vectors(ours["sentence_b"])
    rho = spearmanr((sent * b).sum(1), texts["label"].to_numpy()).statistic
    assert 0.81 < rho < 0.83  # sentence-transformers reports 82.03
    files = [str(out / r.file) for _, r in sorted(store.table("teachers/minilm").shards.items())]
    con = duckdb.connect()
    n, sim = con.execute(
        f"SELECT count(*), any_value(array_cosine_similarity(sentence_a::FLOAT[384], sentence_b::FLOAT[384])) "
        f"FILTER (WHERE id = {texts['id'][0].as_py()}) FROM read_parquet({files!r})").fetchone()
    assert n == 1379 and sim == pytest.approx(float(sent[0] @ b[0]), abs=1e-5)


@pytest.mark.slow
def test_news_corpus_segmented_into_sentences(tmp_path, tiny_teacher):
    import csv
    import sys

    # The first 800 of the 3,824 articles keep the suite fast; bench/ runs the whole corpus.
    csv.field_size_limit(sys.maxsize)
    with open(shared_file("corpus", "news_articles.csv"), newline="") as f, open(tmp_path / "news.csv", "w") as g:
        rows = csv.reader(f)
        csv.writer(g).writerows(row for _, row in zip(range(801), rows))
    s = precompute([str(tmp_path / "news.csv")], str(tmp_path / "news"), [str(tiny_teacher)],
                   text_column="text", segment="sentences", outputs=["cls", "mean"], shard_rows=50000,
                   batch_tokens=32768, progress=False)
    assert s.rows_total > 15000
    assert CliRunner().invoke(app, ["validate", str(tmp_path / "news")]).exit_code == 0
    store = Store.open(tmp_path / "news")
    files = [str(tmp_path / "news" / r.file) for _, r in sorted(store.table("teachers/tiny-bert").shards.items())]
    tfiles = [str(tmp_path / "news" / r.file) for _, r in sorted(store.table("texts").shards.items())]
    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({files!r})")
    con.execute(f"CREATE VIEW x AS SELECT * FROM read_parquet({tfiles!r})")
    assert con.execute("SELECT count(*) FROM t").fetchone()[0] == s.rows_total
    docs, first = con.execute("SELECT count(DISTINCT doc_id), min(position) FROM x").fetchone()
    assert docs > 780 and first == 0
    ids = con.execute("SELECT id FROM t ORDER BY id LIMIT 2").fetchall()
    sim = con.execute(f"SELECT array_cosine_similarity(a.cls::FLOAT[32], b.cls::FLOAT[32]) FROM t a, t b "
                      f"WHERE a.id = {ids[0][0]} AND b.id = {ids[1][0]}").fetchone()[0]
    tab = store.read_table("teachers/tiny-bert")
    pos = {v: i for i, v in enumerate(tab["id"].to_pylist())}
    cls = arrow_to_vectors(tab["cls"])
    u, v = cls[pos[ids[0][0]]], cls[pos[ids[1][0]]]
    assert sim == pytest.approx(float(u @ v / np.linalg.norm(u) / np.linalg.norm(v)), abs=1e-5)
