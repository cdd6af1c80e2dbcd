"""Every ```sql block of docs/queries.md runs on a small store and gives the answer plain Python computes.

The store's vectors come from `random` (seeded) with planted structure: three near-duplicate pairs,
three rows the student gets wrong, layer norms that grow with depth, truncated rows. The checks
use only `math` and lists, so they do not share code (or bugs) with DuckDB or numpy.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from store_builder import TableSpec, build_store
from typer.testing import CliRunner

from kd.cli import app
from kd.common.ids import row_ids
from kd.dataset.cluster import cluster_store
from kd.dataset.query import connect, view_names

DOC = Path(__file__).resolve().parents[2] / "docs" / "queries.md"
N, DIM, LAYERS, MAX_LEN = 120, 8, 3, 32
DUPS = [(10, 11), (40, 41), (77, 78)]
BAD_STUDENT = [5, 50, 99]
THRESHOLD = 0.05


def sql_blocks() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def _unit(v: list[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def make_data(sentences: list[str]) -> dict:
    rng = random.Random(0)
    gauss = lambda: rng.gauss(0.0, 1.0)  # noqa: E731
    sentence = [_unit([gauss() for _ in range(DIM)]) for _ in range(N)]
    for a, b in DUPS:
        sentence[b] = _unit([x + 0.01 * gauss() for x in sentence[a]])
    student = [[x + (1.0 if i in BAD_STUDENT else 0.1) * gauss() for x in v] for i, v in enumerate(sentence)]
    layers = [[[(k + 1) * gauss() for _ in range(DIM)] for k in range(LAYERS)] for _ in range(N)]
    n_tokens = [rng.randint(5, 60) if i % 9 == 0 else rng.randint(5, MAX_LEN) for i in range(N)]
    logits = [[2.0 * gauss() for _ in range(3)] for _ in range(N)]
    doc_ids = [f"d{math.isqrt(i):02d}" for i in range(N)]
    positions = [i - math.isqrt(i) ** 2 for i in range(N)]
    return {
        "text": sentences[:N], "id": row_ids(sentences[:N]).tolist(),  # kd precompute's content hashes
        "doc_id": doc_ids, "position": positions, "label": [i % 3 for i in range(N)],
        "sentence": sentence, "student": student, "layers": layers, "n_tokens": n_tokens, "logits": logits,
    }


@pytest.fixture(scope="module")
def store(tmp_path_factory, sentences):
    data = make_data(sentences)
    path = tmp_path_factory.mktemp("q") / "store"
    f32 = lambda x: np.asarray(x, dtype=np.float32)  # noqa: E731
    minilm = {
        "n_tokens": np.asarray(data["n_tokens"], dtype=np.int32),
        "truncated": np.asarray([n > MAX_LEN for n in data["n_tokens"]]),
        "sentence": f32(data["sentence"]), "layers": f32(data["layers"]),
    }
    build_store(
        path, data["text"],
        {
            "teachers/minilm": TableSpec("teacher", minilm, {"max_length": MAX_LEN}),
            "teachers/ce": TableSpec("teacher", {"logits": f32(data["logits"])}, {"label_names": ["a", "b", "c"]}),
            "students/bilstm": TableSpec("student", {"embedding": f32(data["student"])}),
        },
        rows_per_shard=50, doc_ids=data["doc_id"], positions=data["position"], labels=data["label"],
    )
    cluster_store(path, "minilm", "sentence", THRESHOLD)
    return path, data


def _f32(v: list[float]) -> list[float]:
    return [float(np.float32(x)) for x in v]  # the store keeps float32: compare on the stored values


# --- expected answers, one per doc block (in order), from lists and math only ---------------------------

def exp_doc_counts(d):
    c = Counter(d["doc_id"])
    pos = defaultdict(int)
    for doc, p in zip(d["doc_id"], d["position"]):
        pos[doc] = max(pos[doc], p + 1)
    top = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    return [{"doc_id": k, "n_rows": n, "n_positions": pos[k]} for k, n in top]


def exp_truncated(d):
    rows = [(i, n) for i, n in enumerate(d["n_tokens"]) if n > MAX_LEN]
    rows.sort(key=lambda r: (-r[1], d["id"][r[0]]))
    return [{"id": d["id"][i], "n_tokens": n, "text": d["text"][i]} for i, n in rows]


def exp_neighbours(d):
    s = [_f32(v) for v in d["sentence"]]
    sims = sorted(((_cos(s[j], s[10]), j) for j in range(N) if j != 10), key=lambda t: -t[0])[:5]
    return [{"id": d["id"][j], "cosine": c, "text": d["text"][j]} for c, j in sims]


def exp_near_dups(d):
    s, ids = [_f32(v) for v in d["sentence"]], d["id"]
    pairs = [(min(ids[a], ids[b]), max(ids[a], ids[b]), _cos(s[a], s[b])) for a in range(N) for b in range(a + 1, N)]
    pairs = sorted((p for p in pairs if p[2] > 0.98), key=lambda p: (-p[2], p[0]))
    return [{"id_a": a, "id_b": b, "cosine": c} for a, b, c in pairs]


def exp_layer_norms(d):
    out = []
    for k in range(LAYERS):
        norms = [_norm(_f32(row[k])) for row in d["layers"]]
        out.append({"layer": k + 1, "mean_norm": sum(norms) / N, "min_norm": min(norms), "max_norm": max(norms)})
    return out


def _student_cos(d):
    return [_cos(_f32(s), _f32(t)) for s, t in zip(d["student"], d["sentence"])]


def exp_worst_student(d):
    c = _student_cos(d)
    worst = sorted(range(N), key=lambda i: (c[i], d["id"][i]))[:5]
    return [{"id": d["id"][i], "cosine": c[i], "text": d["text"][i]} for i in worst]


def exp_doc_student(d):
    c = _student_cos(d)
    per = defaultdict(list)
    for i, doc in enumerate(d["doc_id"]):
        per[doc].append(c[i])
    rows = sorted(((sum(v) / len(v), doc, len(v)) for doc, v in per.items()), key=lambda r: (r[0], r[1]))[:3]
    return [{"doc_id": doc, "n": n, "mean_cosine": m} for m, doc, n in rows]


def _softmax(z):
    m = max(z)
    w = [math.exp(x - m) for x in z]
    return [x / sum(w) for x in w]


def exp_entropy(d):
    per = defaultdict(list)
    for z, y in zip(d["logits"], d["label"]):
        per[y].append(-sum(p * math.log(p) for p in _softmax(_f32(z))))
    return [{"label": y, "n": len(v), "mean_entropy": sum(v) / len(v)} for y, v in sorted(per.items())]


def exp_accuracy(d):
    per = defaultdict(list)
    for z, y in zip(d["logits"], d["label"]):
        per[y].append(1.0 if z.index(max(z)) == y else 0.0)
    return [{"label": y, "n": len(v), "accuracy": sum(v) / len(v)} for y, v in sorted(per.items())]


def exp_clusters(d):
    # With threshold 0.05 only the planted near-duplicates are closer than the threshold (checked here),
    # so they are the only multi-member clusters of average linkage.
    row = {i: r for r, i in enumerate(d["id"])}
    close = [(row[r["id_a"]], row[r["id_b"]]) for r in exp_near_dups(d)]
    s = [_f32(v) for v in d["sentence"]]
    assert {(a, b) for a in range(N) for b in range(a + 1, N) if 1 - _cos(s[a], s[b]) < THRESHOLD} == \
        {tuple(sorted(p)) for p in close}
    first = sorted(min(p, key=lambda i: d["id"][i]) for p in close)
    return sorted(({"size": 2, "first_id": d["id"][a], "first_text": d["text"][a]} for a in first),
                  key=lambda r: r["first_id"])


EXPECTED = [
    ("rows per source document", exp_doc_counts),
    ("truncated", exp_truncated),
    ("nearest neighbours", exp_neighbours),
    ("near-duplicate", exp_near_dups),
    ("per-layer norm", exp_layer_norms),
    ("worst", exp_worst_student),
    ("per source document", exp_doc_student),
    ("entropy", exp_entropy),
    ("accuracy", exp_accuracy),
    ("clusters", exp_clusters),
]


def _same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want):
        for key, value in w.items():
            if isinstance(value, float):
                assert g[key] == pytest.approx(value, rel=1e-4, abs=1e-5), (key, g, w)
            else:
                assert g[key] == value, (key, g, w)


def test_doc_has_enough_queries():
    blocks = sql_blocks()
    assert len(blocks) >= 8
    assert len(blocks) == len(EXPECTED), "add an expected answer for every new query in docs/queries.md"


@pytest.mark.parametrize("i", range(len(EXPECTED)), ids=[k for k, _ in EXPECTED])
def test_doc_query(store, i):
    path, data = store
    title, expected = EXPECTED[i]
    sql = sql_blocks()[i]
    assert title in sql.splitlines()[0], f"block {i} should be the {title!r} query"
    sql = re.sub(r"id (=|<>) 10\b", lambda m: f"id {m[1]} {data['id'][10]}", sql)  # the doc's row 10, by its id
    got = connect(path).sql(sql).to_arrow_table().to_pylist()
    want = expected(data)
    assert want, "the planted data should give a non-empty answer"
    _same(got, want)


def test_views_casts_and_outputs(store):
    path, _ = store
    con = connect(path)
    views = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert {"texts", "minilm", "ce", "student_bilstm", "clusters_minilm_sentence", "outputs",
            "teachers/minilm", "students/bilstm"} <= views
    types = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns "
                             "WHERE table_name = 'outputs'").fetchall())
    assert types["minilm_sentence"] == "FLOAT[8]"
    assert types["minilm_layers"] == "FLOAT[8][3]"
    assert types["ce_logits"] == "FLOAT[3]"
    assert types["clusters_minilm_sentence_cluster"] == "BIGINT"
    assert con.execute("SELECT count(*), count(DISTINCT id) FROM outputs").fetchone() == (N, N)


def test_view_name_rule_and_clashes():
    from kd.storage.manifest import Manifest, TableRecord

    m = Manifest({"fingerprint": "x", "num_shards": 1}, {
        "texts": TableRecord("texts"), "teachers/minilm": TableRecord("teacher"),
        "teachers/all-MiniLM.v2": TableRecord("teacher"), "students/bilstm": TableRecord("student"),
        "derived/minilm": TableRecord("derived"), "teachers/outputs": TableRecord("teacher"),
        "derived/clusters-minilm-sentence": TableRecord("derived"),
    })
    assert view_names(m) == {
        "texts": "texts", "teachers/minilm": "minilm", "teachers/all-MiniLM.v2": "all_MiniLM_v2",
        "students/bilstm": "student_bilstm", "derived/minilm": "derived_minilm",
        "teachers/outputs": "teacher_outputs", "derived/clusters-minilm-sentence": "clusters_minilm_sentence",
    }


def test_views_ignore_uncommitted_files(store):
    path, _ = store
    # a shard file that no manifest commits (a crashed writer's leftover) must not be read
    extra = Path(path) / "texts" / "part-00099.parquet"
    pq.write_table(pq.read_table(Path(path) / "texts" / "part-00000.parquet"), extra)
    try:
        assert connect(path).execute("SELECT count(*) FROM texts").fetchone()[0] == N
    finally:
        extra.unlink()


def test_cli_query_formats(store, tmp_path):
    path, data = store
    runner = CliRunner()
    r = runner.invoke(app, ["query", str(path), "SELECT id, text FROM texts ORDER BY id LIMIT 3", "-f", "csv"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == "id,text" and len(r.output.splitlines()) == 4
    r = runner.invoke(app, ["query", str(path), "SELECT id FROM texts ORDER BY id LIMIT 2", "--format", "json"])
    assert [json.loads(line) for line in r.output.splitlines()] == [{"id": i} for i in sorted(data["id"])[:2]]
    out = tmp_path / "sub" / "o.parquet"
    r = runner.invoke(app, ["query", str(path), "SELECT id, sentence FROM minilm", "-f", "parquet", "-o", str(out)])
    assert r.exit_code == 0, r.output
    t = pq.read_table(out)
    assert t.num_rows == N and {len(v) for v in t.column("sentence").to_pylist()} == {DIM}
    r = runner.invoke(app, ["query", str(path), "SELECT count(*) AS n FROM outputs"])
    assert r.exit_code == 0 and "120" in r.output
    r = runner.invoke(app, ["query", str(path), "SELECT * FROM nope"])
    assert r.exit_code == 2 and "query failed" in r.output


@pytest.mark.parametrize("sql", ["-- how many\nSELECT count(*) AS n FROM texts",
                                 "--how\nSELECT count(*) AS n FROM texts"])
def test_sql_beginning_with_a_dash_is_the_sql_not_an_option(store, tmp_path, sql):
    path, _ = store
    out = tmp_path / "n.csv"  # an option after the SQL is still an option
    r = CliRunner().invoke(app, ["query", str(path), sql, "-f", "csv", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_text().splitlines() == ["n", "120"]


def test_a_mistyped_option_is_still_refused_as_an_option(store):
    path, _ = store
    r = CliRunner().invoke(app, ["query", str(path), "SELECT 1", "--fromat", "csv"])
    assert r.exit_code == 2 and "No such option: --fromat" in r.output


@pytest.mark.parametrize("args, says", [
    (["-- a\nSELECT 1", "-- b"], "unexpected extra argument(s) (-- b)"),  # the seventh re-probe: "(\x00text2)"
    (["SELECT 1", "-f", "- csv"], "'- csv' is not one of"),  # an option's value is the option's
])
def test_a_refused_token_is_quoted_as_the_user_wrote_it(store, args, says):
    path, _ = store
    r = CliRunner().invoke(app, ["query", str(path), *args])
    assert r.exit_code == 2 and says in " ".join(r.output.replace("│", " ").split()), r.output
    assert "kd-text-" not in r.output


def test_cli_query_prompt_reads_piped_statements(store):
    path, _ = store
    script = "SELECT count(*) AS n\n  FROM texts;\nSELECT bad syntax here;\n.tables\nSELECT 41 + 1 AS answer;\n"
    r = CliRunner().invoke(app, ["query", str(path)], input=script)
    assert r.exit_code == 1, r.output  # one statement failed, the others ran
    assert "120" in r.output and "42" in r.output and "student_bilstm" in r.output
