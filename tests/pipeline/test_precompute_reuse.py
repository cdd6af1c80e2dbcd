"""`kd precompute --reuse OLD`: a grown corpus encodes only the rows OLD lacks, and the store it writes holds
OLD's vectors for the others, in the new corpus's order; a reuse that would mix settings is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import InputError
from kd.pipeline.precompute import precompute
from kd.pipeline.teacher.model import Teacher
from kd.storage.store import Store
from kd.storage.validate import check


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _vectors(store: Path) -> tuple[np.ndarray, np.ndarray]:
    t = Store.open(store).read_table("teachers/tiny", ["id", "mean"])
    return t["id"].to_numpy(), np.stack(t["mean"].to_numpy(zero_copy_only=False))


@pytest.fixture(scope="module")
def old_store(tmp_path_factory, tiny_teacher, sentences) -> Path:
    root = tmp_path_factory.mktemp("reuse")
    precompute([_write(root / "old.txt", sentences[:120])], str(root / "old"), [f"tiny={tiny_teacher}"],
               outputs=["mean", "cls"], shard_rows=50, dedup=True, progress=False)
    return root / "old"


def test_a_grown_corpus_encodes_only_its_new_rows(old_store, tmp_path, tiny_teacher, sentences, monkeypatch):
    grown = _write(tmp_path / "grown.txt", sentences[:50] + sentences[200:260] + sentences[60:120] + sentences[120:180])
    encoded, launch = [], Teacher.launch
    monkeypatch.setattr(Teacher, "launch", lambda self, enc, outs: encoded.append(len(enc["input_ids"]))
                        or launch(self, enc, outs))
    s = precompute([grown], str(tmp_path / "new"), [f"tiny={tiny_teacher}"], outputs=["mean"], shard_rows=50,
                   dedup=True, progress=False, reuse=str(old_store))
    monkeypatch.undo()
    old_ids, old_vecs = _vectors(old_store)
    ids, vecs = _vectors(tmp_path / "new")
    shared = np.isin(ids, old_ids)
    assert 100 <= shared.sum() <= 110 and s.rows_reused == shared.sum()  # (dedup: sentences repeat in the news)
    assert s.rows_computed == sum(encoded) == len(ids) - shared.sum() and s.rows_total == len(ids)
    per_shard = [shared[i:i + 50].mean() for i in range(0, len(ids), 50)]
    assert per_shard[0] == 1 and any(0 < f < 1 for f in per_shard) and 0 in per_shard  # all copied, mixed, all new
    by_id = dict(zip(old_ids.tolist(), old_vecs))
    assert all(np.array_equal(v, by_id[i]) for i, v in zip(ids[shared].tolist(), vecs[shared]))
    assert check(str(tmp_path / "new"))[1] == []  # checksums and schema as any store's

    precompute([grown], str(tmp_path / "fresh"), [f"tiny={tiny_teacher}"], outputs=["mean"], shard_rows=50,
               dedup=True, progress=False)
    fresh_ids, fresh = _vectors(tmp_path / "fresh")
    assert np.array_equal(ids, fresh_ids)  # the same rows in the same order as without --reuse
    np.testing.assert_allclose(vecs, fresh, atol=1e-5)  # the same vectors (batch padding aside)


def test_reuse_refuses_other_settings_the_output_itself_and_ray(old_store, tmp_path, tiny_teacher, sentences):
    src = _write(tmp_path / "in.txt", sentences[:80])
    base = ["precompute", src, "-t", f"tiny={tiny_teacher}", "--outputs", "mean", "--no-progress", "--reuse",
            str(old_store)]
    res = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "a"), "--dtype", "float16"])
    assert res.exit_code == 2 and "dtype: 'float32' there, 'float16' here" in res.output, res.output
    res = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "b"), "--outputs", "mean,layers"])
    assert res.exit_code == 2 and "lacks output(s) layers" in res.output, res.output
    res = CliRunner().invoke(app, [*base[:-1], str(tmp_path / "c"), "-o", str(tmp_path / "c")])
    assert res.exit_code == 2 and "--reuse names the output store itself" in res.output, res.output
    res = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "d"), "--engine", "ray"])
    assert res.exit_code == 2 and "--reuse runs with the local engine only" in res.output, res.output
    with pytest.raises(InputError, match="max_length: 64 there, 16 here"):
        precompute([src], str(tmp_path / "e"), [f"tiny={tiny_teacher}"], outputs=["mean"], max_length=16,
                   reuse=str(old_store), progress=False)
    assert not any((tmp_path / d).exists() for d in "abcde")  # refused before anything was written


def test_a_reuse_source_with_a_shard_of_other_types_is_refused_before_anything_is_written(old_store, tmp_path,
                                                                                        tiny_teacher, sentences):
    """The probe's B05: a shard 31 wide in a 32-wide table, its checksum forged, was copied with exit 0; then it was
    refused mid-run, leaving a half store at -o. Now refused while OLD is indexed: no folder is made."""
    import hashlib
    import io
    import json
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    old = Path(shutil.copytree(old_store, tmp_path / "old"))
    rel = "teachers/tiny/part-00001.parquet"
    t = pq.read_table(old / rel)
    narrow = pa.list_(pa.float32(), 31)
    t = t.set_column(t.schema.get_field_index("mean"), pa.field("mean", narrow),
                     pa.array([v[:31] for v in t["mean"].to_pylist()], narrow))
    buf = io.BytesIO()
    pq.write_table(t, buf)
    (old / rel).write_bytes(buf.getvalue())
    for m in [old / "manifest.json", *(old / "manifests").glob("*.json")]:
        d = json.loads(m.read_text())
        d["tables"]["teachers/tiny"]["shards"]["1"].update(sha256=hashlib.sha256(buf.getvalue()).hexdigest(),
                                                            bytes=len(buf.getvalue()))
        m.write_text(json.dumps(d))
    res = CliRunner().invoke(app, ["precompute", _write(tmp_path / "in.txt", sentences[:80]), "-t",
                                   f"tiny={tiny_teacher}", "--outputs", "mean", "--shard-rows", "50", "--dedup",
                                   "-o", str(tmp_path / "new"), "--reuse", str(old), "--no-progress"])
    assert res.exit_code == 2 and "column 'mean' is float[31], the manifest declares float[32]" in res.output, \
        res.output
    assert rel in res.output and not (tmp_path / "new").exists()


def test_the_progress_counts_only_the_rows_to_encode(old_store, tmp_path, tiny_teacher, sentences, capsys):
    """Copied rows leave the bar's total: counted as done, 10,000 copied sentences made a precompute of 1,000 new
    documents show "540/11,000 rows, 0.3 rows/s, ETA 8:56:42" for 20 minutes of work."""
    grown = _write(tmp_path / "grown.txt", sentences[:120] + sentences[200:210])
    s = precompute([grown], str(tmp_path / "new"), [f"tiny={tiny_teacher}"], outputs=["mean"], shard_rows=50,
                   dedup=True, progress=True, reuse=str(old_store))
    assert s.rows_reused >= 100 and s.rows_computed >= 5
    last = [line for line in capsys.readouterr().err.splitlines() if line.startswith("precompute: ")][-1]
    assert last.startswith(f"precompute: {s.rows_computed}/{s.rows_computed} rows (100.0%)"), last


def test_rows_of_another_tokenizer_are_never_reused_or_resumed(tmp_path, tiny_teacher, sentences):
    """The teacher's tokenizer edited in place to stop lowercasing: the same weights, path and settings, other
    vectors (up to 0.56 away in issue 48's probe, where --reuse copied and a resume kept the old rows, exit 0).
    Both refused before anything is written."""
    import shutil

    from store_forgery import snapshot
    from transformers import BertTokenizerFast

    teacher = tmp_path / "tiny"
    shutil.copytree(tiny_teacher, teacher)
    corpus = _write(tmp_path / "in.txt", sentences[:80])
    old = tmp_path / "old"
    precompute([corpus], str(old), [f"tiny={teacher}"], outputs=["mean"], shard_rows=50, progress=False)
    BertTokenizerFast.from_pretrained(str(teacher), do_lower_case=False).save_pretrained(str(teacher))
    with pytest.raises(InputError, match="another tokenizer") as e:
        precompute([corpus], str(tmp_path / "new"), [f"tiny={teacher}"], outputs=["mean"], shard_rows=50,
                   reuse=str(old), progress=False)
    assert "--reuse" in str(e.value) and not (tmp_path / "new").exists()
    before = snapshot(old)
    with pytest.raises(InputError, match=r"another tokenizer \('.*' becomes"):  # the probe text that differs
        precompute([corpus], str(old), [f"tiny={teacher}"], outputs=["mean", "cls"], shard_rows=50, progress=False)
    assert snapshot(old) == before


def test_a_reuse_source_kd_validate_refuses_is_refused(old_store, tmp_path, tiny_teacher, sentences):
    """Its checksums re-forged, a negative n_tokens passes every checksum: --reuse copied its 300 rows into a
    store that validate then refused (issue 48's probe)."""
    import shutil

    import pyarrow as pa
    from store_forgery import rewrite_shard, set_column

    bad = tmp_path / "bad"
    shutil.copytree(old_store, bad)
    rewrite_shard(bad, "teachers/tiny", 0, lambda t: set_column(
        t, "n_tokens", pa.array([-5, *t["n_tokens"].to_pylist()[1:]], t.schema.field("n_tokens").type)))
    src = _write(tmp_path / "in.txt", sentences[:80])
    with pytest.raises(Exception, match="'n_tokens' is negative") as e:
        precompute([src], str(tmp_path / "new"), [f"tiny={tiny_teacher}"], outputs=["mean"], shard_rows=50,
                   reuse=str(bad), progress=False)
    assert e.value.exit_code == 2 and not (tmp_path / "new").exists()
