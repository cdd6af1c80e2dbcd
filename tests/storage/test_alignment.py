"""Issue 41: a table's shard is bound to its texts shard, checked by every reader, not only by checksums.

The forged case: another store's teacher shard (other texts, so other ids) copied over this store's one, with
`sha256`/`bytes` fixed in manifest.json and every fragment. Checksums pass; the ids digest does not.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import precompute_news
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from typer.testing import CliRunner

from kd.apps.eval.run import EvalConfig, Measure, evaluate
from kd.cli import app
from kd.common.errors import StoreError
from kd.dataset.cluster import cluster_store
from kd.dataset.index import build_index
from kd.dataset.query import connect
from kd.pipeline.precompute import precompute
from kd.storage import fs
from kd.storage.alignment import ids_digest
from kd.storage.manifest import Manifest, ShardRecord, TableRecord, merge
from kd.storage.repair import repair
from kd.storage.store import Store
from kd.storage.validate import validate

ROWS, SHARD_ROWS = 20, 10
TABLE = "teachers/tiny"
SHARD = f"{TABLE}/part-00000.parquet"
NOT_ALIGNED = r"shard 0 of table 'teachers/tiny' is not aligned with texts"


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_teacher, sentences) -> tuple[Path, Path]:
    """Two stores of the tiny teacher, same shape (2 shards of 10 rows), different texts (so different ids)."""
    root = tmp_path_factory.mktemp("alignment")
    (root / "a").mkdir()
    (root / "b").mkdir()
    return (precompute_news(root / "a", tiny_teacher, sentences, ROWS, SHARD_ROWS),
            precompute_news(root / "b", tiny_teacher, sentences[100:], ROWS, SHARD_ROWS))


def _manifests(store: Path) -> list[Path]:
    return [store / "manifest.json", *sorted((store / "manifests").glob("*.json"))]


def forge(store: Path, donor: Path, rel: str) -> None:
    """Copy `donor`'s file `rel` over `store`'s and fix its sha256/bytes in every manifest (not its ids digest)."""
    shutil.copy(donor / rel, store / rel)
    data = (store / rel).read_bytes()
    for f in _manifests(store):
        d = json.loads(f.read_text())
        for rec in d["tables"].values():
            for shard in rec["shards"].values():
                if shard["file"] == rel:
                    shard.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        f.write_text(json.dumps(d))


def strip_digests(store: Path) -> None:
    """What a store written before digests were recorded looks like."""
    for f in _manifests(store):
        d = json.loads(f.read_text())
        for rec in d["tables"].values():
            rec.pop("ids", None)
        f.write_text(json.dumps(d))


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture
def forged(pair, tmp_path) -> Path:
    a, b = pair
    out = copy(a, tmp_path / "forged")
    forge(out, b, SHARD)
    return out


def test_manifest_records_an_ids_digest_beside_each_shard_record(pair):
    a, _ = pair
    store = Store.open(a)
    d = json.loads((a / "manifest.json").read_text())
    assert d["format_version"] == 1  # a float store stays readable by an older kd, which ignores the digests
    for name, rec in d["tables"].items():
        assert set(rec["ids"]) == set(rec["shards"]), name
        # an older kd builds ShardRecord(file, rows, bytes, sha256) from each record: no other key in there
        assert all(set(s) == {"file", "rows", "bytes", "sha256"} for s in rec["shards"].values())
        for k, shard in store.manifest.tables[name].shards.items():
            assert shard.ids == ids_digest(store.read_shard(name, k, ["id"])["id"]) == rec["ids"][str(k)]
    texts, teacher = store.manifest.tables["texts"].shards, store.manifest.tables[TABLE].shards
    assert [texts[k].ids for k in (0, 1)] == [teacher[k].ids for k in (0, 1)] and texts[0].ids != texts[1].ids


def test_merge_keeps_the_digest_and_refuses_two_different_ones():
    inputs = {"fingerprint": "f", "num_shards": 1}
    plain, digest = ShardRecord("t/part-00000.parquet", 3, 10, "x"), "ab" * 16

    def manifest(rec: ShardRecord) -> Manifest:
        return Manifest(dict(inputs), {"texts": TableRecord("texts", shards={0: rec})})

    for order in ((plain, replace(plain, ids=digest)), (replace(plain, ids=digest), plain)):
        merged = merge([manifest(r) for r in order], "here")  # manifest.json of an older kd + a newer fragment
        assert merged.tables["texts"].shards[0].ids == digest
    with pytest.raises(StoreError, match="two different records"):
        merge([manifest(replace(plain, ids=digest)), manifest(replace(plain, ids="cd" * 16))], "here")
    round_trip = Manifest.from_json(manifest(replace(plain, ids=digest)).to_json(), "here")
    assert round_trip.tables["texts"].shards[0] == replace(plain, ids=digest)


def test_store_reads_refuse_a_forged_shard(forged):
    store = Store.open(forged)
    with pytest.raises(StoreError, match=NOT_ALIGNED) as e:
        store.read_shard(TABLE, 0)
    assert e.value.where == str(forged / SHARD) and "kd validate" in e.value.fix and "--repair" in e.value.fix
    for read in (lambda: store.read_shard(TABLE, 0, ["mean"]), lambda: store.read_table(TABLE),
                 lambda: store.dataset(TABLE)):
        with pytest.raises(StoreError, match=NOT_ALIGNED):
            read()
    assert store.read_shard(TABLE, 1).num_rows == SHARD_ROWS  # the other shard is sound
    assert store.read_table("texts").num_rows == ROWS


def test_a_store_without_digests_is_checked_against_the_texts_ids(pair, tmp_path):
    a, b = pair
    sound = copy(a, tmp_path / "sound")
    strip_digests(sound)
    assert all(s.ids is None for s in Store.open(sound).manifest.tables[TABLE].shards.values())
    assert Store.open(sound).read_table(TABLE).num_rows == ROWS
    forged = copy(sound, tmp_path / "forged")
    forge(forged, b, SHARD)
    with pytest.raises(StoreError, match=NOT_ALIGNED):
        Store.open(forged).read_shard(TABLE, 0)
    with pytest.raises(StoreError, match=NOT_ALIGNED):
        connect(forged)


def test_query_views_refuse_a_forged_shard(forged):
    with pytest.raises(StoreError, match=NOT_ALIGNED):
        connect(forged)
    r = CliRunner().invoke(app, ["query", str(forged), "SELECT count(*) FROM outputs"])
    assert r.exit_code == 2 and "not aligned with texts" in r.output


def test_eval_agreement_refuses_a_forged_shard(forged):
    cfg = EvalConfig(store=str(forged), measures=[Measure.agreement], baseline=False, progress=False)
    with pytest.raises(StoreError, match=NOT_ALIGNED):
        evaluate(cfg)


def test_index_and_cluster_refuse_a_forged_shard_and_write_nothing(forged):
    before = (forged / "manifest.json").read_bytes()
    with pytest.raises(StoreError, match=NOT_ALIGNED):
        build_index(forged, TABLE, "mean")
    with pytest.raises(StoreError, match=NOT_ALIGNED):
        cluster_store(forged, TABLE, "mean", 0.5)
    assert (forged / "manifest.json").read_bytes() == before


def test_reuse_refuses_a_forged_old_store(forged, tmp_path, tiny_teacher, sentences):
    corpus = tmp_path / "grown.txt"
    corpus.write_text("\n".join(sentences[:ROWS + 5]) + "\n", encoding="utf-8")
    with pytest.raises(StoreError, match=NOT_ALIGNED):
        precompute([str(corpus)], str(tmp_path / "new"), [f"tiny={tiny_teacher}"], shard_rows=SHARD_ROWS,
                   reuse=str(forged), progress=False)


def test_a_forged_texts_shard_is_refused_by_embed_and_the_ray_worker(pair, tmp_path):
    from kd.pipeline.engines.ray_pool import read_texts
    from kd.student.embed import embed
    from kd.student.trainer import TrainConfig, train

    a, b = pair
    student = tmp_path / "student"
    train(TrainConfig(str(a), str(student), arch="bilstm", embed_dim=8, hidden_dim=8, max_steps=2, batch_size=8,
                      progress=False))
    store = copy(a, tmp_path / "store")
    forge(store, b, "texts/part-00000.parquet")
    with pytest.raises(StoreError, match="texts shard 0 holds other ids"):
        embed(student, str(store), progress=False)
    assert not any(r.shards for n, r in Store.open(store).manifest.tables.items() if n.startswith("students/"))
    rec = Store.open(store).manifest.tables["texts"].shards[0]
    with pytest.raises(StoreError, match="texts shard 0 holds other ids"):
        read_texts(fs.resolve(store), rec, 0)
    assert read_texts(fs.resolve(a), Store.open(a).manifest.tables["texts"].shards[0], 0).num_rows == SHARD_ROWS


def test_validate_reports_repair_drops_and_precompute_restores(forged, pair, tiny_teacher):
    a, _ = pair
    problems = validate(Store.open(forged))
    assert [(p.file, p.what) for p in problems] == [(str(forged / SHARD), "ids are not aligned with texts shard 0")]
    report = repair(str(forged))
    assert report.dropped == [(TABLE, 0, "ids are not aligned with texts shard 0")]
    kept = Store.open(forged).manifest.tables
    assert set(kept[TABLE].shards) == {1} and kept[TABLE].shards[1].ids is not None  # digests survive the rewrite
    assert (forged / (SHARD + ".damaged")).exists()
    precompute([str(a.parent / "news.txt")], str(forged), [f"tiny={tiny_teacher}"], shard_rows=SHARD_ROWS,
               progress=False)
    restored = Store.open(forged)
    assert validate(restored) == []
    assert restored.read_table(TABLE).equals(Store.open(a).read_table(TABLE))


def test_the_ray_driver_refuses_a_unit_encoded_from_other_rows(pair):
    """A worker's shard whose ids digest is not its texts shard's is not adopted (no Ray needed: the commit step)."""
    from types import SimpleNamespace

    from kd.pipeline.engines.plan import Unit
    from kd.pipeline.engines.ray_pool import _Driver

    a, _ = pair
    adopted: list[tuple] = []
    writer = SimpleNamespace(loc=fs.resolve(a), adopt=lambda *args: adopted.append(args))
    driver = SimpleNamespace(committed=set(), texts={0: Store.open(a).manifest.tables["texts"].shards[0]},
                             ctx=SimpleNamespace(writer=writer))
    got = {"teacher": "tiny", "shard": 0, "tmp": "part.tmp-1", "rows": SHARD_ROWS, "bytes": 1, "sha256": "s",
           "ids": "00" * 16}
    with pytest.raises(StoreError, match=NOT_ALIGNED):
        _Driver._commit(driver, None, Unit("tiny", 0), got, None)
    assert adopted == []
