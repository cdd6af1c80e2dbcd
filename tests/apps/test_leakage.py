"""The leakage check finds evaluation sentences in a store, and training can leave them out."""

from __future__ import annotations

import numpy as np
from conftest import precompute_news
from typer.testing import CliRunner

from kd.apps.eval import tasks
from kd.apps.leakage import check_store
from kd.cli import app
from kd.storage.store import Store
from kd.student import data as D
from kd.student.setup import read_ids


def test_a_planted_eval_sentence_is_found_and_excluded(tmp_path, tiny_teacher, sentences):
    planted = tasks.load_stsb("test").a[7]
    texts = sentences[:80] + ["  " + planted.upper() + " "]  # other case and spacing: still the same text
    store = precompute_news(tmp_path, tiny_teacher, texts, len(texts), 40)
    out = tmp_path / "exclude.txt"
    res = CliRunner().invoke(app, ["leakage", str(store), "--exclude-out", str(out)])
    assert res.exit_code == 0, res.output
    assert "1 of 81 store rows" in res.output.replace(",", "")
    overlap = check_store(str(store))
    assert overlap.sets["stsb-test"][1] >= 1 and overlap.sets["sst2-dev"][1] == 0
    ids = read_ids(str(out))
    s = Store.open(store)
    t = s.read_table("texts", ["id", "text"])
    planted_id = next(i for i, x in zip(t["id"].to_pylist(), t["text"].to_pylist()) if planted.upper() in x)
    assert ids == (planted_id,)
    cfg = D.DataConfig(str(store), ["tiny.mean"], "tiny", batch_size=8, max_length=32, val_percent=20.0,
                       exclude=ids)
    plan = D.build_plan(s, cfg)
    seen = np.concatenate([b["id"].numpy() for b in D.train_batches(s, plan, 0, 0)])
    val = np.concatenate([b["id"].numpy() for b in D.validation_batches(s, plan)])
    assert planted_id not in seen and planted_id not in val
    assert len(seen) + len(val) >= 72  # everything else still trains or validates (batch remainders aside)
    unfiltered = D.build_plan(s, D.DataConfig(str(store), ["tiny.mean"], "tiny", batch_size=8, max_length=32,
                                              val_percent=20.0))
    assert unfiltered.train_rows() + unfiltered.num_val == plan.train_rows() + plan.num_val + 1


def test_a_bad_id_file_is_a_clear_error(tmp_path):
    f = tmp_path / "ids.txt"
    f.write_text("# ok\n123\nnot-an-id\n")
    try:
        read_ids(str(f))
    except Exception as e:
        assert "line 3" in str(e) and type(e).__name__ == "InputError"
    else:
        raise AssertionError("no error")
