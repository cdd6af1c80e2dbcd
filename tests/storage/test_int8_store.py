"""int8 stores (`kd precompute --dtype int8`): per-vector scale, error bounds, every reader dequantizes,
damaged scales refused, resume, format versions."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
from store_builder import TableSpec, build_store
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import KdError, StoreError
from kd.dataset.query import connect
from kd.pipeline.precompute import precompute
from kd.storage import Store
from kd.storage.int8 import dequantize, quantize
from kd.storage.schema import table_vectors
from kd.storage.validate import validate
from kd.student.data import DataConfig, build_plan, read_aligned, resolve_columns

COLUMNS = ("cls", "mean", "layers")


@pytest.fixture(scope="module")
def stores(tmp_path_factory, tiny_teacher, sentences):
    """The same 60 real sentences through the tiny BERT teacher, stored as float32 and as int8."""
    root = tmp_path_factory.mktemp("int8")
    src = root / "news.txt"
    src.write_text("\n".join(sentences[:60]) + "\n", encoding="utf-8")
    for dtype in ("float32", "int8"):
        precompute([str(src)], str(root / dtype), [f"tiny={tiny_teacher}"], shard_rows=25, dtype=dtype,
                   outputs=list(COLUMNS), progress=False)
    return Store.open(root / "float32"), Store.open(root / "int8")


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_quantize_bounds_and_zero_vectors():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 4, 16)).astype(np.float32) * rng.uniform(1e-3, 1e3, size=(50, 4, 1))
    x[3, 2] = 0.0  # a zero vector: scale 0, codes 0, read back as zeros
    q, s = quantize(x)
    assert q.dtype == np.int8 and s.shape == (50, 4) and s[3, 2] == 0 and not q[3, 2].any()
    assert np.abs(q).max() == 127 and q.min() >= -127
    back = dequantize(q, s, "v", None)
    assert np.all(np.abs(back - x) <= s[..., None] / 2 * (1 + 1e-5))
    assert not back[3, 2].any()


def test_round_trip_error_and_cosine(stores):
    fp32, int8 = stores
    a, b = fp32.read_table("teachers/tiny"), int8.read_table("teachers/tiny")
    for c in COLUMNS:
        x, y = table_vectors(a, c), table_vectors(b, c)
        scale = b[f"{c}__scale"]
        s = table_vectors(b, f"{c}__scale") if c == "layers" else scale.to_numpy()
        assert np.all(np.abs(y - x) <= s[..., None] / 2 * (1 + 1e-5) + 1e-7), c
        assert _cosine(x, y).min() >= 0.9999, (c, _cosine(x, y).min())
        assert str(b.schema.field(c).type).count("int8") == 1
    cols = int8.manifest.tables["teachers/tiny"].columns
    assert (cols["mean"], cols["mean__scale"], cols["layers"], cols["layers__scale"]) == \
        ("int8[32]", "float", "int8[32][3]", "float[3]")
    assert int8.manifest.tables["teachers/tiny"].meta["dtype"] == "int8"
    versions = [json.loads((Path(s.root) / "manifest.json").read_text())["format_version"] for s in stores]
    assert versions == [1, 2]  # a float store stays version 1: older kd reads it
    assert validate(int8) == []
    size = [sum(r.bytes for r in s.manifest.tables["teachers/tiny"].shards.values()) for s in stores]
    # 32-d vectors: int8 codes are 1/4 of float32 and each vector adds a float32 scale (1/8 of it at 32-d); id,
    # n_tokens and truncated are the same on both sides (0.544 measured; real widths give 0.17-0.19, results.md)
    assert size[1] < 0.6 * size[0], size


def test_duckdb_views_dequantize(stores):
    _, int8 = stores
    table = int8.read_table("teachers/tiny")
    ids = table["id"].to_pylist()
    con = connect(int8)
    cols = [r[0] for r in con.execute("DESCRIBE tiny").fetchall()]
    assert "layers__scale" not in cols and "mean__scale" not in cols
    got = dict(con.execute("SELECT id, layers FROM tiny").fetchall())
    np.testing.assert_allclose(np.array([got[i] for i in ids]), table_vectors(table, "layers"), rtol=1e-6, atol=1e-7)
    got = dict(con.execute("SELECT id, tiny_mean FROM outputs").fetchall())
    np.testing.assert_allclose(np.array([got[i] for i in ids]), table_vectors(table, "mean"), rtol=1e-6, atol=1e-7)


def test_the_trainer_reads_int8_as_float(stores):
    fp32, int8 = stores
    chunks = []
    for store in stores:
        cols = resolve_columns(store, ["tiny.mean", "tiny.layers"])
        assert cols.teachers == {"tiny": ("mean", "layers")}
        build_plan(store, DataConfig(store.root, ["tiny.mean", "tiny.layers"], "tiny"))
        chunks.append(next(read_aligned(store, cols, 1, 100)))
    a, b = chunks
    assert b["tiny.layers"].dtype == np.float32 and b["tiny.layers"].shape == a["tiny.layers"].shape == (25, 3, 32)
    assert _cosine(a["tiny.mean"], b["tiny.mean"]).min() >= 0.9999
    assert np.abs(a["tiny.mean"] - b["tiny.mean"]).max() <= np.abs(a["tiny.mean"]).max() / 254 + 1e-7


def _damaged(tmp_path, scale: np.ndarray | None) -> Store:
    """A store whose int8 column has the given scale column (None: none), checksums intact."""
    rng = np.random.default_rng(1)
    q, s = quantize(rng.normal(size=(20, 8)).astype(np.float32))
    cols = {"mean": q} | ({} if scale is None else {"mean__scale": scale})
    return build_store(tmp_path / "st", [f"text {i}" for i in range(20)], {"teachers/t": TableSpec("teacher", cols)},
                       rows_per_shard=10)


@pytest.mark.parametrize("what", ["missing", "nan", "negative"])
def test_a_damaged_scale_column_is_refused(tmp_path, what):
    scale = None if what == "missing" else np.abs(np.random.default_rng(2).normal(size=20)).astype(np.float32)
    if what != "missing":
        scale[13] = np.nan if what == "nan" else -0.5
    store = _damaged(tmp_path, scale)
    msg = "has no scale column" if what == "missing" else "non-finite or negative scale"
    problems = [str(p) for p in validate(store)]
    assert any(msg in p and "part-00001" in p for p in problems), problems
    with pytest.raises(StoreError, match=msg):
        table_vectors(store.read_shard("teachers/t", 1), "mean", "shard 1")
    with pytest.raises(StoreError, match=msg):  # the trainer's reader
        list(read_aligned(store, resolve_columns(store, ["t.mean"]), 1, 100))
    if what == "missing":  # a NaN scale reads as NaN in SQL, as a NaN float column would
        with pytest.raises(StoreError, match=msg):
            connect(store)


def test_cli_option_and_logits_stay_float(tmp_path, tiny_cross_encoder, sentences):
    src = tmp_path / "pairs.tsv"
    src.write_text("a\tb\n" + "\n".join(f"{sentences[i]}\t{sentences[i + 1]}" for i in range(12)) + "\n")
    r = CliRunner().invoke(app, ["precompute", str(src), "--pair-columns", "a,b", "-t", f"ce={tiny_cross_encoder}",
                                 "--outputs", "logits,cls", "--dtype", "int8", "-o", str(tmp_path / "st"),
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    cols = Store.open(tmp_path / "st").manifest.tables["teachers/ce"].columns
    assert (cols["logits"], cols["cls"], cols["cls__scale"]) == ("float[3]", "int8[32]", "float")
    assert "logits__scale" not in cols
    r = CliRunner().invoke(app, ["precompute", str(src), "-o", str(tmp_path / "x"), "--dtype", "int4"])
    assert r.exit_code == 2 and "int8" in r.output


def test_resume_of_an_int8_store(tmp_path, tiny_teacher, sentences, monkeypatch):
    """A run that fails after some shards resumes to the same store as an uninterrupted one; a float32 run
    into the int8 store is refused (other settings)."""
    src = tmp_path / "news.txt"
    src.write_text("\n".join(sentences[:80]) + "\n", encoding="utf-8")
    args = {"shard_rows": 10, "dtype": "int8", "outputs": ["mean", "layers"], "progress": False}
    precompute([str(src)], str(tmp_path / "full"), [f"tiny={tiny_teacher}"], **args)
    real_fsync, calls = os.fsync, []

    def fail_late(fd: int) -> None:
        if "/teachers/" in os.readlink(f"/proc/self/fd/{fd}") and ".parquet" in os.readlink(f"/proc/self/fd/{fd}"):
            calls.append(fd)
            if len(calls) > 3:
                raise OSError(errno.EIO, "I/O error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fail_late)
    with pytest.raises((OSError, KdError)):  # whichever way the I/O error surfaces, the run stops
        precompute([str(src)], str(tmp_path / "cut"), [f"tiny={tiny_teacher}"], **args)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert 0 < len(Store.open(tmp_path / "cut").manifest.tables["teachers/tiny"].shards) < 8
    s = precompute([str(src)], str(tmp_path / "cut"), [f"tiny={tiny_teacher}"], **args)
    assert 0 < s.rows_computed < 80  # only the shards the failed run had not committed
    a, b = Store.open(tmp_path / "full"), Store.open(tmp_path / "cut")
    assert validate(b) == [] and a.read_table("teachers/tiny").equals(b.read_table("teachers/tiny"))
    with pytest.raises(StoreError, match="other settings"):
        precompute([str(src)], str(tmp_path / "cut"), [f"tiny={tiny_teacher}"], **(args | {"dtype": "float32"}))
