"""The documented repair works: damaged shards are dropped, and re-running precompute redoes exactly them."""

from __future__ import annotations

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
