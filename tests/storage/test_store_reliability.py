"""Silent wrong results, one test each: NaN vectors, hand-edited manifests, a manifest that is not one."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import precompute_news
from typer.testing import CliRunner

import kd.pipeline.engines.shards as P
from kd.cli import app
from kd.common.errors import KdError, StoreError
from kd.storage.store import Store
from kd.storage.validate import check


@pytest.fixture(scope="module")
def clean(tmp_path_factory, tiny_teacher, sentences):
    return precompute_news(tmp_path_factory.mktemp("rel"), tiny_teacher, sentences, 90, 30)


def test_precompute_refuses_non_finite_vectors(tmp_path, tiny_teacher, sentences, monkeypatch):
    real = P.forward_all

    def overflowing(*a, **kw):
        vecs = real(*a, **kw)
        vecs["mean"][5] = np.inf  # what an fp16 overflow produces
        return vecs

    monkeypatch.setattr(P, "forward_all", overflowing)
    with pytest.raises(StoreError) as e:
        precompute_news(tmp_path, tiny_teacher, sentences, 60, 30)
    msg = str(e.value)
    assert "non-finite" in msg and "'mean'" in msg and "--precision fp32" in msg and "tiny" in msg
    assert not Store.open(tmp_path / "store").manifest.tables["teachers/tiny"].shards  # nothing committed



@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_vector_finite_in_fp32_but_not_in_the_stored_fp16_is_refused(tmp_path, tiny_teacher, sentences, monkeypatch,
                                                                       dtype):
    from kd.pipeline.precompute import precompute

    real = P.forward_all

    def large(*a, **kw):
        vecs = real(*a, **kw)
        vecs["mean"][3] = 1e6  # finite in float32, inf in float16 (max 65,504)
        return vecs

    monkeypatch.setattr(P, "forward_all", large)
    src = tmp_path / "news.txt"
    src.write_text("\n".join(sentences[:40]) + "\n", encoding="utf-8")
    run = lambda: precompute([str(src)], str(tmp_path / "store"), [f"tiny={tiny_teacher}"], dtype=dtype,  # noqa: E731
                             shard_rows=20, progress=False)
    if dtype == "float32":
        run()  # stored as it is: nothing to refuse
        t = Store.open(tmp_path / "store").read_table("teachers/tiny", ["mean"])
        assert np.stack(t["mean"].to_numpy(zero_copy_only=False))[3, 0] == 1e6
        return
    with pytest.raises(StoreError, match="non-finite"):
        run()
    assert not Store.open(tmp_path / "store").manifest.tables["teachers/tiny"].shards

def test_validate_and_training_stop_on_nan_vectors(clean, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kd.storage import fs

    store = shutil.copytree(clean, tmp_path / "store")
    f = store / "teachers" / "tiny" / "part-00001.parquet"
    t = pq.read_table(f)
    mean = np.stack(t["mean"].to_numpy(zero_copy_only=False)).astype(np.float32)
    mean[3] = np.nan
    t = t.set_column(t.schema.get_field_index("mean"), "mean",
                     pa.FixedSizeListArray.from_arrays(pa.array(mean.ravel()), mean.shape[1]))
    data = fs.parquet_bytes(t)
    f.write_bytes(data)
    # committed as a writer would (checksums agree): only the finiteness checks can notice
    for m in [store / "manifest.json", *(store / "manifests").glob("*.json")]:
        d = json.loads(m.read_text())
        d["tables"]["teachers/tiny"]["shards"]["1"].update(bytes=len(data), sha256=fs.sha256(data))
        m.write_text(json.dumps(d))
    _, problems = check(str(store))
    assert any("non-finite" in str(p) and "'mean'" in str(p) and "part-00001" in str(p) for p in problems)
    res = CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(tmp_path / "s"),
                                   "--target", "tiny.mean", "--max-steps", "20", "--batch-size", "90",
                                   "--val-percent", "0", "--no-progress"])
    assert res.exit_code == 2 and "non-finite (NaN/Inf)" in res.output, res.output
    assert not (tmp_path / "s" / "model.safetensors").exists()


def test_hand_edited_row_counts_are_refused(clean, tmp_path):
    store = shutil.copytree(clean, tmp_path / "store")
    d = json.loads((store / "manifest.json").read_text())
    d["inputs"]["num_rows"] = 60
    (store / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(StoreError, match="disagree on \\['num_rows'\\]"):
        Store.open(store)
    res = CliRunner().invoke(app, ["validate", str(store)])
    assert res.exit_code != 0 and "num_rows" in res.output


def test_a_dropped_shard_record_is_refused(clean, tmp_path):
    store = shutil.copytree(clean, tmp_path / "store")
    for m in [store / "manifest.json", *(store / "manifests").glob("*.json")]:
        d = json.loads(m.read_text())
        d["tables"]["teachers/tiny"]["shards"]["2"]["rows"] = 10  # a record that lies about its rows
        m.write_text(json.dumps(d))
    _, problems = check(str(store))
    assert any("rows" in str(p) for p in problems)


@pytest.mark.parametrize("content", ["[]", "3", '{"format": "kd-store"}', "\x00\xff"])
def test_a_manifest_that_is_not_one_is_a_clear_error(clean, tmp_path, content):
    store = shutil.copytree(clean, tmp_path / "store")
    shutil.rmtree(store / "manifests")
    (store / "manifest.json").write_bytes(content.encode("latin-1"))
    with pytest.raises(KdError) as e:
        Store.open(store)
    assert "manifest.json" in str(e.value)
    res = CliRunner().invoke(app, ["validate", str(store)])
    assert res.exit_code == 2 and "manifest" in res.output


def test_queries_on_an_incomplete_store_say_so(clean, tmp_path, capsys):
    from kd.dataset.query import connect

    store = shutil.copytree(clean, tmp_path / "store")
    for m in [store / "manifest.json", *(store / "manifests").glob("*.json")]:
        d = json.loads(m.read_text())
        d["tables"]["teachers/tiny"]["shards"].pop("2")  # a writer that has not finished shard 2
        m.write_text(json.dumps(d))
    con = connect(store)
    assert "incomplete" in capsys.readouterr().err
    status = dict(con.sql("SELECT tbl, complete FROM kd_status").fetchall())
    assert status == {"texts": True, "teachers/tiny": False}
    assert con.sql("SELECT count(*) FROM tiny").fetchall()[0][0] == 60  # the committed part only, and it says so


def test_listing_a_folder_another_writer_creates_meanwhile(tmp_path):
    """pyarrow lists first and checks existence after a failure, so a folder created in between (the second
    writer of one store making `manifests/`) failed the listing with FileNotFoundError (a CI failure of
    test_two_processes_write_disjoint_shards_of_one_store). The race is replayed here: the first listing
    fails exactly as pyarrow's does, after the other writer has made the folder and its fragment."""
    import pyarrow.fs as pafs

    from kd.storage import fs

    local = pafs.LocalFileSystem()

    class OtherWriterRaces:
        calls = 0

        def get_file_info(self, sel):
            OtherWriterRaces.calls += 1
            if OtherWriterRaces.calls == 1:
                (tmp_path / "manifests").mkdir()
                (tmp_path / "manifests" / "writer-00001-of-00002.json").write_text("{}")
                return local.get_file_info(pafs.FileSelector(str(tmp_path / "absent" / "manifests")))
            return local.get_file_info(sel)

    loc = fs.Location(OtherWriterRaces(), str(tmp_path))
    assert fs.list_files(loc, "manifests") == ["writer-00001-of-00002.json"]
    assert OtherWriterRaces.calls == 2
    assert fs.list_files(fs.Location(local, str(tmp_path)), "nothing-here") == []


def test_a_file_where_a_store_keeps_a_folder_is_named(tmp_path, clean, tiny_teacher):
    """A store's manifests/ a file: "a file was given where a folder is needed", naming no path, its fix "pass a
    folder, not a file"; texts/, a teacher's table or tokenizer, locks/ a file: every command read on (kd distill
    planned its steps and failed training on "cannot read a committed file", whose fix, --repair, dropped the table
    for good; a finished run said done): named, with its fix, by readers, writers and --repair alike (probes)."""
    from kd.pipeline.precompute import precompute

    store = tmp_path / "store"
    store.mkdir()
    (store / "manifests").write_text("mine")
    r = CliRunner().invoke(app, ["validate", str(store)])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "the store's manifests is a file, where kd keeps a folder" in said, said
    assert f"where: {store / 'manifests'}" in said and (store / "manifests").read_text() == "mine"
    store = Path(shutil.copytree(clean, tmp_path / "copy"))
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    for rel in ("texts", "teachers/tiny", "tokenizers/tiny", "locks"):
        shutil.move(store / rel, tmp_path / "aside")
        (store / rel).write_text("mine")
        for args in (["validate", str(store)], ["validate", str(store), "--repair"], ["info", str(store)]):
            r = CliRunner().invoke(app, args)
            said = " ".join(r.output.split())
            assert r.exit_code == 2 and f"the store's {rel} is a file, where kd keeps a folder" in said, (args, said)
            assert "fix: move the file away, or put back the folder kd wrote" in said, said
        with pytest.raises(StoreError, match=f"the store's {rel} is a file"):
            Store.open(store)
        (store / rel).unlink()
        shutil.move(tmp_path / "aside", store / rel)
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before
    shutil.move(store / "texts", tmp_path / "aside")  # a link to a file there is named as the link (it was "a file")
    (store / "texts").symlink_to(tmp_path / "aside" / "part-00000.parquet")
    r = CliRunner().invoke(app, ["validate", str(store)])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "the store's texts is a symbolic link to a file (" in said, said
    assert "fix: remove the link, or put back the folder kd wrote" in said, said
    (store / "texts").unlink()
    shutil.move(tmp_path / "aside", store / "texts")
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0
    # --overwrite replaces such a store (the file stayed: a traceback creating texts/; locks/ a file: "cannot take the
    # lock", probes)
    for rel in ("texts", "locks"):
        shutil.rmtree(store / rel)
        (store / rel).write_text("mine")
        precompute([str(clean.parent / "news.txt")], str(store), [f"tiny={tiny_teacher}"], shard_rows=30,
                   progress=False, overwrite=True)
        assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0 and (store / rel).is_dir()
    # locks/ a link out of the store: the lock was taken through it, a file made outside (a probe); named, and
    # --overwrite removes the link itself, never what it names
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(store / "locks")
    (store / "locks").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StoreError, match="the store's locks is a symbolic link") as e:
        precompute([str(clean.parent / "news.txt")], str(store), [f"tiny={tiny_teacher}"], shard_rows=30,
                   progress=False)
    assert e.value.fix == "remove the link: kd makes the folder again" and list(outside.iterdir()) == []
    precompute([str(clean.parent / "news.txt")], str(store), [f"tiny={tiny_teacher}"], shard_rows=30, progress=False,
               overwrite=True)
    assert (store / "locks").is_dir() and not (store / "locks").is_symlink() and list(outside.iterdir()) == []


def test_the_bytes_readers_decode_are_arrow_s_memory(clean):
    """Parquet decodes a shard on Arrow's threads, which may drop the last reference to its bytes just after the
    read returned. Python-owned bytes then need the GIL to be freed, and a process already exiting aborted there
    (SIGABRT "terminate called without an active exception": 1 in ~40 `kd validate` runs on a loaded machine,
    the core's stack in `arrow::py::PyBuffer::~PyBuffer`). Arrow's own memory is freed without the GIL."""
    store = Store.open(clean)
    for name in ("texts", "teachers/tiny"):
        rec, data = store.shard_record(name, 1), store.read_checked(name, 1)
        gc.collect()  # other tests' garbage is freed before the count, not during it
        held = pa.total_allocated_bytes()
        del data  # its bytes were Arrow's: Arrow's pool gets them back (once a reader's reference cycle is collected)
        gc.collect()
        assert held - pa.total_allocated_bytes() >= rec.bytes
        assert pq.ParquetFile(pa.BufferReader(store.read_checked(name, 1))).read().num_rows == rec.rows == 30
