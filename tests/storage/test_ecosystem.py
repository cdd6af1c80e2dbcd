"""Stores where users already work: Hugging Face `datasets` and polars read a store's tables directly.

No export step is needed: every table is plain Parquet (one file a shard, vectors as fixed-size lists),
so both libraries read the committed shard files listed in the manifest and get the values kd reads.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import precompute_news

from kd.storage.store import Store


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_teacher, sentences) -> Store:
    return Store.open(precompute_news(tmp_path_factory.mktemp("eco"), tiny_teacher, sentences, 120, 50))


def shard_files(store: Store, table: str) -> list[str]:
    rec = store.require_complete(table)
    return [store.loc.path(rec.shards[k].file) for k in sorted(rec.shards)]


def test_datasets_reads_texts_and_teacher_vectors(store):
    import datasets
    texts = datasets.load_dataset("parquet", data_files=shard_files(store, "texts"), split="train")
    tiny = datasets.load_dataset("parquet", data_files=shard_files(store, "teachers/tiny"), split="train")
    ours_texts = store.read_table("texts")
    ours = store.read_table("teachers/tiny")
    assert texts.num_rows == ours_texts.num_rows == 120
    assert texts["text"] == ours_texts["text"].to_pylist()
    assert tiny["id"] == ours["id"].to_pylist() == texts["id"]
    got = np.asarray(tiny.with_format("numpy")["mean"], dtype=np.float32)
    want = np.stack(ours["mean"].to_numpy(zero_copy_only=False)).astype(np.float32)
    assert got.shape == want.shape and np.array_equal(got, want)


def test_polars_joins_texts_and_vectors(store):
    import polars as pl
    texts = pl.scan_parquet(shard_files(store, "texts"))
    tiny = pl.scan_parquet(shard_files(store, "teachers/tiny"))
    joined = texts.join(tiny, on="id").select("id", "text", "mean").sort("id").collect()
    order = np.argsort(store.read_table("texts")["id"].to_numpy())
    ours = store.read_table("teachers/tiny").take(order)
    assert joined.height == 120
    assert joined["id"].to_list() == ours["id"].to_pylist()
    got = np.asarray(joined["mean"].to_list(), dtype=np.float32)
    want = np.stack(ours["mean"].to_numpy(zero_copy_only=False)).astype(np.float32)
    assert np.array_equal(got, want)
    assert joined["text"].to_list() == store.read_table("texts").take(order)["text"].to_pylist()
