"""The documented repair works: damaged shards are dropped, and re-running precompute redoes exactly them."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import precompute_news
from typer.testing import CliRunner

from kd.cli import app
from kd.pipeline.precompute import precompute
from kd.storage.store import Store


@pytest.fixture(scope="module")
def clean(tmp_path_factory, tiny_teacher, sentences):
    return precompute_news(tmp_path_factory.mktemp("repair"), tiny_teacher, sentences, 120, 40)


def _tables(path) -> dict:
    s = Store.open(path)
    return {t: s.read_table(t).to_pydict() for t in ("texts", "teachers/tiny")}


@pytest.mark.parametrize("damage", ["flip-teacher", "delete-teacher", "delete-texts", "garbage-manifest"])
def test_repair_then_rerun_gives_the_undamaged_store(clean, tmp_path, tiny_teacher, damage):
    store = shutil.copytree(clean, tmp_path / "store")
    src = shutil.copy(clean.parent / "news.txt", tmp_path / "news.txt")
    if damage == "flip-teacher":
        f = store / "teachers/tiny/part-00001.parquet"
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    elif damage == "delete-teacher":
        (store / "teachers/tiny/part-00002.parquet").unlink()
    elif damage == "delete-texts":
        (store / "texts/part-00000.parquet").unlink()
    else:
        (store / "manifest.json").write_text("{garbage")
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code != 0
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert "repair" in res.output and ("dropped shard" in res.output or "rebuilt" in res.output), res.output
    # the same command as before (inputs: a copy with identical content, so the same fingerprint)
    precompute([str(src)], str(store), [f"tiny={tiny_teacher}"], shard_rows=40, progress=False)
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0
    assert _tables(store) == _tables(clean)


# --- per-teacher files and indexes: the same repair ------------------------------------------------------------

@pytest.fixture(scope="module")
def full(clean, tmp_path_factory, tiny_teacher):
    """The clean store plus its per-teacher outputs vocab and init (each added by its own command) and an index."""
    from kd.dataset.index import build_index

    root = tmp_path_factory.mktemp("repair-full")
    store = shutil.copytree(clean, root / "store")
    for extra in ("vocab", "init"):
        precompute([str(clean.parent / "news.txt")], str(store), [f"tiny={tiny_teacher}"], shard_rows=40,
                   outputs=[extra], progress=False)
    build_index(store, "teachers/tiny", "mean")
    return store


def _flip(f) -> None:
    data = bytearray(f.read_bytes())
    data[len(data) // 2: len(data) // 2 + 8] = bytes(b ^ 0xFF for b in data[len(data) // 2: len(data) // 2 + 8])
    f.write_bytes(bytes(data))


def _damage(f, mode: str) -> None:
    if mode == "delete":
        f.unlink()
    elif mode == "append":  # what the tester did: valid JSON, then one more byte ("Extra data")
        f.write_bytes(f.read_bytes() + b"}")
    else:
        _flip(f)


@pytest.mark.parametrize("rel, mode, outputs, unit", [
    ("tokenizers/tiny/tokenizer.json", "append", None, "tokenizers/tiny"),
    ("tokenizers/tiny/tokenizer_config.json", "delete", None, "tokenizers/tiny"),
    ("teachers/tiny/input_embeddings.safetensors", "flip", None, "teachers/tiny/input_embeddings.safetensors"),
    ("teachers/tiny/vocab.safetensors", "flip", "vocab", "teachers/tiny/vocab.safetensors"),
    ("{init}/model.safetensors", "delete", "init", "{init}"),
])
def test_a_damaged_per_teacher_file_is_named_repaired_and_restored(full, tmp_path, tiny_teacher, rel, mode, outputs,
                                                                   unit):
    """validate names the file; --repair sets its unit aside and forgets it; the command that wrote it restores
    exactly it (same bytes, same checksums), and the store validates again."""
    init = next(p.relative_to(full).as_posix() for p in (full / "teachers/tiny").glob("init-*"))
    rel, unit = rel.format(init=init), unit.format(init=init)
    store = shutil.copytree(full, tmp_path / "store")
    _damage(store / rel, mode)
    res = CliRunner().invoke(app, ["validate", str(store)])
    assert res.exit_code == 1 and rel in res.output, res.output
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert f"set aside {unit}" in res.output and "nothing to repair" not in res.output, res.output
    assert not (store / unit).exists() and (store / (unit + ".damaged")).exists()
    assert not any(r == unit or r.startswith(unit + "/") for r in Store.open(store).manifest.extras["files"])
    if not rel.startswith("teachers/tiny/vocab") and not rel.startswith(init):
        assert res.exit_code == 1 and "re-run the kd precompute command" in res.output  # still missing: said so
    args = ["precompute", _news(full), "-t", f"tiny={tiny_teacher}", "--shard-rows", "40",
            "-o", str(store), "--no-progress", *(["--outputs", outputs] if outputs else [])]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0 and "nothing to do" not in res.output, res.output
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0
    assert Store.open(store).manifest.extras["files"] == Store.open(full).manifest.extras["files"]
    assert (store / rel).read_bytes() == (full / rel).read_bytes()


def _news(full) -> str:
    """The inputs the store was made from (the same bytes, so the same fingerprint)."""
    return Store.open(full).manifest.inputs["files"][0]["path"]


@pytest.mark.parametrize("which", ["file", "ids_file"])
def test_a_damaged_index_is_dropped_and_rebuilt(full, tmp_path, which):
    from kd.storage.index_files import list_indexes

    store = shutil.copytree(full, tmp_path / "store")
    info = list_indexes(Store.open(store))[0]
    _flip(store / getattr(info, which))
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 1
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert f"dropped index {info.name}" in res.output and res.exit_code == 0, res.output
    assert list_indexes(Store.open(store)) == []
    res = CliRunner().invoke(app, ["index", str(store), "--table", "teachers/tiny", "--column", "mean"])
    assert res.exit_code == 0, res.output
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0


def test_training_on_a_damaged_tokenizer_names_the_file_and_the_repair(full, tmp_path):
    store = shutil.copytree(full, tmp_path / "store")
    _damage(store / "tokenizers/tiny/tokenizer.json", "append")
    res = CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(tmp_path / "s"),
                                   "--max-steps", "1", "--no-progress"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "tokenizers/tiny/tokenizer.json" in text and "--repair" in text, res.output


def test_a_damaged_tokenizer_without_a_recorded_checksum_names_its_file(full, tmp_path):
    """Stores written before checksums were recorded: the loader itself names the file it cannot parse."""
    from kd.common.errors import KdError

    store = shutil.copytree(full, tmp_path / "store")
    _damage(store / "tokenizers/tiny/tokenizer.json", "append")
    s = Store.open(store)
    s.manifest.extras.pop("files")
    with pytest.raises(KdError) as e:
        s.load_tokenizer("tiny")
    assert str(store / "tokenizers/tiny/tokenizer.json") in str(e.value) and "--repair" in str(e.value)


def test_a_teacher_checkpoint_with_a_damaged_tokenizer_names_the_file(tiny_teacher, tmp_path):
    from kd.common.errors import KdError
    from kd.pipeline.backends.loading import load_teacher

    folder = shutil.copytree(tiny_teacher, tmp_path / "teacher")
    _damage(folder / "tokenizer.json", "append")
    with pytest.raises(KdError) as e:
        load_teacher(str(folder), "cpu")
    assert str(folder / "tokenizer.json") in str(e.value) and "Extra data" in str(e.value)


def test_a_shard_truncated_with_its_checksum_forged_is_a_clear_error_and_repaired(clean, tmp_path, tiny_teacher):
    """Bytes that are not Parquet under a record forged to match (the probe's A16): query and index printed
    pyarrow's traceback and --repair said "nothing to repair" while validate reported it."""
    import hashlib
    import json

    store = shutil.copytree(clean, tmp_path / "store")
    src = shutil.copy(clean.parent / "news.txt", tmp_path / "news.txt")
    rel = "teachers/tiny/part-00001.parquet"
    data = (store / rel).read_bytes()[:-100]
    (store / rel).write_bytes(data)
    for m in [store / "manifest.json", *(store / "manifests").glob("*.json")]:
        d = json.loads(m.read_text())
        d["tables"]["teachers/tiny"]["shards"]["1"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
        m.write_text(json.dumps(d))
    res = CliRunner().invoke(app, ["query", str(store), "SELECT count(*) AS n FROM tiny"])
    assert res.exit_code == 2 and "not a readable Parquet file" in res.output and rel in res.output, res.output
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert "dropped shard 1 of teachers/tiny: unreadable parquet" in res.output, res.output
    assert res.exit_code == 1 and "1 shard(s) missing" in res.output  # until the rerun below writes it again
    precompute([src], str(store), [f"tiny={tiny_teacher}"], shard_rows=40, progress=False)
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0
    assert _tables(store) == _tables(clean)


def test_a_shard_with_other_column_types_under_a_forged_checksum_is_refused_and_repaired(clean, tmp_path):
    """A `mean` column rewritten as a plain list of doubles, its record forged to match (the probe's A20/A21):
    train-student failed in numpy with a TypeError, index and cluster in a concatenation; now every reader names
    the column and --repair drops the shard."""
    import hashlib
    import io
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    store = shutil.copytree(clean, tmp_path / "store")
    rel = "teachers/tiny/part-00000.parquet"
    table = pq.read_table(store / rel)
    i = table.schema.get_field_index("mean")
    table = table.set_column(i, "mean", pa.array(table["mean"].to_pylist(), pa.list_(pa.float64())))
    buf = io.BytesIO()
    pq.write_table(table, buf)
    data = buf.getvalue()
    (store / rel).write_bytes(data)
    for m in [store / "manifest.json", *(store / "manifests").glob("*.json")]:
        d = json.loads(m.read_text())
        d["tables"]["teachers/tiny"]["shards"]["0"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
        m.write_text(json.dumps(d))
    for args in (["index", str(store), "--table", "tiny", "--column", "mean"],
                 ["train-student", "-s", str(store), "-o", str(tmp_path / "st"), "--arch", "static",
                  "--target", "tiny.mean", "--max-steps", "2", "--no-progress"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and "column 'mean' is list<element: double>, the manifest declares float[32]" \
            in res.output, res.output
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert "dropped shard 0 of teachers/tiny: column 'mean'" in res.output, res.output


def _forge_record(store, table: str, k: int, data: bytes) -> None:
    """Write `data` as shard k of `table` and rewrite its sha256/bytes in manifest.json and every fragment."""
    import hashlib
    import json

    rel = f"{table}/part-{k:05d}.parquet"
    (store / rel).write_bytes(data)
    for m in [store / "manifest.json", *(store / "manifests").glob("*.json")]:
        d = json.loads(m.read_text())
        d["tables"][table]["shards"][str(k)].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
        m.write_text(json.dumps(d))


def test_a_nan_vector_under_a_forged_checksum_is_repaired_by_the_documented_fix(clean, tmp_path, tiny_teacher):
    """The probe's a17: one NaN in `mean`, checksums rewritten. --repair said "nothing to repair", and the fix
    train-student gave (precompute --overwrite) was a no-op; now train-student names --repair, which drops the
    shard, and the rerun restores the clean store."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = shutil.copytree(clean, tmp_path / "store")
    src = shutil.copy(clean.parent / "news.txt", tmp_path / "news.txt")
    table = pq.read_table(store / "teachers/tiny/part-00001.parquet")
    vecs = np.stack(table["mean"].to_numpy(zero_copy_only=False)).astype(np.float32)
    vecs[5, 3] = np.nan
    col = pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), vecs.shape[1])
    buf = io.BytesIO()
    pq.write_table(table.set_column(table.schema.get_field_index("mean"), "mean", col), buf)
    _forge_record(store, "teachers/tiny", 1, buf.getvalue())
    res = CliRunner().invoke(app, ["train-student", "-s", str(store), "-o", str(tmp_path / "st"), "--arch", "static",
                                   "--target", "tiny.mean", "--max-steps", "2", "--no-progress"])
    assert res.exit_code == 2 and "non-finite (NaN/Inf)" in res.output and "--repair" in res.output, res.output
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert "dropped shard 1 of teachers/tiny: column 'mean' has non-finite" in res.output, res.output
    precompute([src], str(store), [f"tiny={tiny_teacher}"], shard_rows=40, progress=False)
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0
    assert _tables(store) == _tables(clean)


@pytest.mark.parametrize("link", ["texts/part-00000.parquet", "teachers"])
def test_a_symlink_leading_out_is_set_aside_so_the_rerun_writes_the_store(clean, tmp_path, tiny_teacher, link):
    """The probe's RA05 (a shard) and RA30 (the whole `teachers` folder): the documented sequence (--repair, then the
    same precompute) failed with "refusing to write outside the store", because the link stayed where the files
    go. The link itself is now removed (its target is never touched; a link renamed aside would still lead out)."""
    store = shutil.copytree(clean, tmp_path / "store")
    src = shutil.copy(clean.parent / "news.txt", tmp_path / "news.txt")
    outside = tmp_path / "outside"
    shutil.move(store / link, outside)
    (store / link).symlink_to(outside, target_is_directory=outside.is_dir())
    before = sorted(p.name for p in outside.rglob("*"))
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert "leads out of the store" in res.output, res.output
    assert not os.path.lexists(store / link) and not os.path.lexists(store / (link + ".damaged"))
    precompute([src], str(store), [f"tiny={tiny_teacher}"], shard_rows=40, progress=False)
    assert not (store / link).is_symlink()
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0
    assert _tables(store) == _tables(clean) and sorted(p.name for p in outside.rglob("*")) == before


def test_nan_input_embeddings_under_a_forged_checksum_are_found_repaired_and_restored(clean, tmp_path, tiny_teacher):
    """The probe's A29: input embeddings filled with NaN, their sha256 rewritten: validate said ok and training
    stopped at step 1 telling the user to run validate. Now validate names the tensor, --repair sets the file
    aside and the rerun writes it again."""
    import hashlib
    import json

    import numpy as np
    from safetensors.numpy import load_file, save_file

    store = shutil.copytree(clean, tmp_path / "store")
    src = shutil.copy(clean.parent / "news.txt", tmp_path / "news.txt")
    rel = "teachers/tiny/input_embeddings.safetensors"
    good = (store / rel).read_bytes()
    save_file({k: np.full_like(v, np.nan) for k, v in load_file(store / rel).items()}, store / rel)
    sha = hashlib.sha256((store / rel).read_bytes()).hexdigest()
    for m in [store / "manifest.json", *(store / "manifests").glob("*.json")]:
        d = json.loads(m.read_text())
        if rel in d.get("extras", {}).get("files", {}):
            d["extras"]["files"][rel] = sha
        m.write_text(json.dumps(d))
    res = CliRunner().invoke(app, ["validate", str(store)])
    assert res.exit_code == 1 and "tensor 'weight' holds non-finite (NaN/Inf)" in res.output, res.output
    res = CliRunner().invoke(app, ["train-student", "-s", str(store), "-o", str(tmp_path / "st"), "--arch", "static",
                                   "--max-steps", "2", "--no-progress"])
    assert res.exit_code == 2 and "NaN/Inf" in res.output and "--repair" in res.output, res.output
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert f"set aside {rel} (tensor 'weight' holds non-finite (NaN/Inf)" in res.output, res.output
    precompute([src], str(store), [f"tiny={tiny_teacher}"], shard_rows=40, progress=False)
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0 and (store / rel).read_bytes() == good


def test_a_teacher_shard_lacking_its_columns_under_a_forged_checksum_is_repaired(clean, tmp_path, tiny_teacher):
    """The replayed probe's RN6: the texts shard copied over teacher shard 0, its record forged: validate said
    "column 'mean' missing" but --repair dropped nothing and precompute said "already complete"."""
    store = shutil.copytree(clean, tmp_path / "store")
    src = shutil.copy(clean.parent / "news.txt", tmp_path / "news.txt")
    _forge_record(store, "teachers/tiny", 0, (store / "texts/part-00000.parquet").read_bytes())
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert "dropped shard 0 of teachers/tiny: column" in res.output and "is missing" in res.output, res.output
    precompute([src], str(store), [f"tiny={tiny_teacher}"], shard_rows=40, progress=False)
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0
    assert _tables(store) == _tables(clean)


@pytest.mark.parametrize("table", ["teachers/tiny", "texts"])
def test_a_shard_deleted_by_hand_is_named_not_called_complete(clean, tmp_path, tiny_teacher, table):
    """The probe's wart: with a shard file deleted by hand precompute said "already complete" while validate and every
    reader refused the store. Now it is refused naming the file and the repair, and the documented sequence ends
    with the undamaged store."""
    store = shutil.copytree(clean, tmp_path / "store")
    src = shutil.copy(clean.parent / "news.txt", tmp_path / "news.txt")
    (store / table / "part-00001.parquet").unlink()
    res = CliRunner().invoke(app, ["precompute", str(src), "-t", f"tiny={tiny_teacher}", "--shard-rows", "40", "-o",
                                   str(store), "--no-progress"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and f"{table}/part-00001.parquet" in text and "--repair" in text, res.output
    assert "complete" not in text
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert f"dropped shard 1 of {table}" in res.output, res.output
    precompute([src], str(store), [f"tiny={tiny_teacher}"], shard_rows=40, progress=False)
    assert CliRunner().invoke(app, ["validate", str(store)]).exit_code == 0
    assert _tables(store) == _tables(clean)
