"""`kd precompute --sample`: a uniform subset chosen by content-hash id, the same for every teacher and run."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
from conftest import build_tiny_bert
from typer.testing import CliRunner

from kd.cli import app
from kd.common.ids import in_sample
from kd.pipeline.precompute import precompute


def _table(folder):
    return pq.read_table(sorted(folder.glob("part-*.parquet")))


def _ids(store) -> list[int]:
    return _table(store / "texts").column("id").to_pylist()


def test_sample_keeps_the_rows_whose_id_is_in_the_fraction_for_any_teacher(tmp_path, tiny_teacher, sentences):
    src = tmp_path / "news.txt"
    src.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    full = tmp_path / "full"
    precompute([str(src)], str(full), [f"tiny={tiny_teacher}"], shard_rows=64, progress=False, dedup=True)
    other = build_tiny_bert(tmp_path / "other", seed=3)
    stores = []
    for name, teacher in (("a", tiny_teacher), ("b", other)):
        stores.append(tmp_path / name)
        precompute([str(src)], str(stores[-1]), [f"tiny={teacher}"], shard_rows=64, progress=False, dedup=True,
                   sample=0.3)
    every = _ids(full)
    kept = [i for i in every if in_sample(i, 0.3)]
    assert _ids(stores[0]) == _ids(stores[1]) == kept  # same rows, same order, whatever the teacher
    assert 0.2 * len(every) < len(kept) < 0.4 * len(every)  # ids are uniform hashes: about 30% of 300
    m = json.loads((stores[0] / "manifest.json").read_text())
    assert m["inputs"]["counts"]["sampled_out"] == len(every) - len(kept)
    assert m["inputs"]["counts"]["kept"] == len(kept)
    assert "sampled_out" not in json.loads((full / "manifest.json").read_text())["inputs"]["counts"]
    # the sampled rows' vectors are the full store's rows (same teacher, same inputs)
    a = _table(stores[0] / "teachers" / "tiny").to_pandas().set_index("id")
    f = _table(full / "teachers" / "tiny").to_pandas().set_index("id").loc[a.index]
    np.testing.assert_allclose(np.stack(a["mean"]), np.stack(f["mean"]), atol=1e-5)


def test_sample_outside_zero_one_and_a_changed_fraction_are_refused(tmp_path, tiny_teacher, sentences):
    src = tmp_path / "news.txt"
    src.write_text("\n".join(sentences[:40]) + "\n", encoding="utf-8")
    out = tmp_path / "s"
    for bad in ("0", "1.5", "-0.1"):
        r = CliRunner().invoke(app, ["precompute", str(src), "-t", f"tiny={tiny_teacher}", "-o", str(out),
                                     "--sample", bad])
        assert r.exit_code == 2 and "--sample" in r.output, r.output
    assert not out.exists()
    ok = ["precompute", str(src), "-t", f"tiny={tiny_teacher}", "-o", str(out), "--sample", "0.5", "--no-progress"]
    assert CliRunner().invoke(app, ok).exit_code == 0
    # another fraction is another subset: resuming into this store would mix them
    r = CliRunner().invoke(app, ok[:-2] + ["0.6", "--no-progress"])
    msg = " ".join(r.output.split())
    assert r.exit_code == 2 and "--sample: the store has 0.5, this run 0.6" in msg and "--overwrite" not in msg, msg
