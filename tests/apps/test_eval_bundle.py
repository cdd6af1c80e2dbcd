"""The evaluation sets shipped in the package equal what the shared data gives, and need no shared data."""

from __future__ import annotations

import numpy as np
import pytest

from kd.apps.eval import bundle as eval_data
from kd.apps.eval import tasks

needs_shared = pytest.mark.skipif(not tasks.shared_data_dir().is_dir(), reason="../shared/data not present")


@needs_shared
def test_bundle_is_byte_identical_to_a_fresh_build(tmp_path):
    for built in eval_data.build_bundle(tmp_path):
        assert built.read_bytes() == tasks.bundled(built.name).read_bytes(), built.name


@needs_shared
def test_bundled_sets_equal_the_shared_ones():
    sst, sst_shared = tasks.load_sst2(), tasks.load_sst2(bundle=False)
    assert sst.train_texts == sst_shared.train_texts and sst.test_texts == sst_shared.test_texts
    assert np.array_equal(sst.train_labels, sst_shared.train_labels)
    for name in tasks.ClusterSet:
        c, c_shared = tasks.load_cluster_set(name), tasks.load_cluster_set(name, bundle=False)
        assert c.test_texts == c_shared.test_texts and c.dev_texts == c_shared.dev_texts
        assert np.array_equal(c.test_groups, c_shared.test_groups)
    sts = tasks.load_stsb("test")
    assert sts.a == tasks.load_stsb("test", path="stsb/sts-test.csv").a


def test_default_sets_load_without_shared_data(tmp_path, monkeypatch):
    monkeypatch.setenv("KD_SHARED", str(tmp_path))  # an empty folder: no data/ inside
    monkeypatch.chdir(tmp_path)
    sts = tasks.load_stsb("test")
    assert len(sts.a) == 1379 and 0.0 <= sts.scores.min() and sts.scores.max() <= 5.0
    assert len(tasks.load_stsb("dev").a) == 1500
    sst = tasks.load_sst2()
    assert len(sst.train_texts) == 4000 and len(sst.test_texts) == 872 and set(sst.test_labels) == {0, 1}
    news = tasks.load_cluster_set("news-articles")
    assert len(set(news.test_groups)) == 200 and len(news.test_texts) == 1200
    with pytest.raises(Exception, match="data file not found"):
        tasks.load_sst2(train_rows=100)  # a non-default sample still needs the shared data
