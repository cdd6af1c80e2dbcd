"""Issue 48, the fourth reliability pass (stores): readers refuse what `kd validate` refuses, validate checks the
content a re-forged store can still get wrong, a writer plans from the manifest it reads under its lock, and the
files kd opens itself are regular files and JSONL objects name each key once.

Every forged store here is re-forged: checksums, sizes and ids digests are recomputed in manifest.json and every
fragment, so only the check under test can catch it. The store is a real one: Leipzig news sentences through a
tiny BERT teacher, content-hash ids as kd precompute gives them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import store_forgery
from named_pipes import make_fifo, unblocking
from safetensors.numpy import load, save
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from store_forgery import (
    TEACHER,
    edit_manifests,
    index,
    refused,
    rewrite_file,
    rewrite_shard,
    swap_text,
    train,
    validate,
)
from store_forgery import set_column as _set
from store_forgery import snapshot as _snapshot
from typer.testing import CliRunner

from kd.cli import app
from kd.storage.schema import VectorDType, vectors_to_arrow

real, store = store_forgery.real, store_forgery.store  # the sound store and a copy per test


def test_a_real_store_passes_every_new_check(real):
    """kd precompute's own ids are content hashes, its shards hold what the manifest declares."""
    res = validate(real)
    assert res.exit_code == 0, res.output


# --- 3. validate checks content; readers refuse what validate refuses --------------------------------------


def test_a_duplicate_id_is_reported_and_refused_by_kd_index(store):
    """Row 5 of shard 1 replaced by a copy of row 4 (text, id, vectors) in texts and the teacher table."""
    def dup(t: pa.Table) -> pa.Table:
        return pa.concat_tables([t.slice(0, 5), t.slice(4, 1), t.slice(6)])

    rewrite_shard(store, "texts", 1, dup)
    rewrite_shard(store, TEACHER, 1, dup)
    res = validate(store)
    assert res.exit_code == 1 and "appears twice" in res.output and "part-00001" in res.output, res.output
    before = _snapshot(store)
    refused(index(store), "appears twice")
    assert _snapshot(store) == before


def test_an_id_that_is_not_its_texts_hash_is_reported(store, sentences):
    """Row 3's text replaced by another real sentence, its id (and every digest) kept."""
    swap_text(store, 3, sentences[200])
    res = validate(store)
    assert res.exit_code == 1 and "is not the content hash of its text" in res.output, res.output
    assert sentences[200][:40] in " ".join(res.output.split()), res.output


def test_an_undeclared_column_is_reported_and_refused_by_readers(store):
    rewrite_shard(store, TEACHER, 0, lambda t: t.append_column("planted", pa.array(np.zeros(t.num_rows))))
    res = validate(store)
    assert res.exit_code == 1 and "'planted' (double) is not declared" in res.output, res.output
    before = _snapshot(store)
    refused(index(store), "'planted'", "not declared", "part-00000")
    assert _snapshot(store) == before


def test_repair_drops_what_the_readers_refuse(real, store, tiny_teacher):
    """A planted column and a shard file one row short: --repair drops both shards (validate and the readers
    refuse them), and the rerun of precompute writes them again."""
    from kd.pipeline.precompute import precompute

    rewrite_shard(store, TEACHER, 0, lambda t: t.append_column("planted", pa.array(np.zeros(t.num_rows))))
    rewrite_shard(store, TEACHER, 2, lambda t: t.slice(0, t.num_rows - 1))
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert "dropped shard 0 of teachers/tiny: column 'planted'" in res.output, res.output
    assert "dropped shard 2 of teachers/tiny: 29 rows" in res.output, res.output
    precompute([str(real.parent / "news.txt")], str(store), [f"tiny={tiny_teacher}"], shard_rows=30,
               outputs=["cls", "mean", "vocab"], progress=False)
    assert validate(store).exit_code == 0


def test_a_default_target_precompute_never_records_is_reported_and_refused(store, tmp_path):
    """`default_target = "layers"` (a 3-D output, no target) passed validate; a reader without --target took it and
    failed later (the sixth probe)."""
    edit_manifests(store, lambda d: d["tables"][TEACHER]["meta"].__setitem__("default_target", "layers"))
    said = "meta.default_target is 'layers', not one of sentence, mean"
    res = validate(store)
    assert res.exit_code == 1 and said in " ".join(res.output.split()), res.output
    refused(train(store, tmp_path / "student"), said)


def test_meta_dim_unlike_the_column_type_is_reported_and_refused(store, tmp_path):
    edit_manifests(store, lambda d: d["tables"][TEACHER]["meta"].__setitem__("dim", 64))
    res = validate(store)
    assert res.exit_code == 1 and "meta.dim is 64 but column 'mean' is declared float[32]" in res.output, res.output
    refused(train(store, tmp_path / "student"), "meta.dim is 64")
    assert not (tmp_path / "student").exists()


def test_a_vocab_output_of_the_wrong_width_is_named_not_embed_dim(store, tmp_path):
    rel = "teachers/tiny/vocab.safetensors"
    tensors = load((store / rel).read_bytes())
    rewrite_file(store, rel, save({"vectors": np.ascontiguousarray(tensors["vectors"][:, :16]),
                                   "token_ids": tensors["token_ids"]}))
    res = validate(store)
    assert res.exit_code == 1 and "16 wide, the teacher's dim is 32" in res.output, res.output
    res = train(store, tmp_path / "student", "--init-embeddings", "vocab")
    refused(res, "16 wide, the teacher's dim is 32", "vocab.safetensors")
    assert "--embed-dim" not in res.output.split("fix:")[0]
    assert not (tmp_path / "student").exists()


def test_a_finite_but_huge_component_is_reported_and_refused_by_kd_index(store):
    def huge(t: pa.Table) -> pa.Table:
        v = np.stack(t["mean"].to_numpy(zero_copy_only=False)).astype(np.float32)
        v[2, 0] = 3e38  # finite: every isfinite check passes it
        return _set(t, "mean", vectors_to_arrow(v, VectorDType.float32))

    rewrite_shard(store, TEACHER, 0, huge)
    res = validate(store)
    assert res.exit_code == 1 and "out-of-range (|value| > 1e+06)" in res.output, res.output
    before = _snapshot(store)
    res = index(store)
    refused(res, "out-of-range", "part-00000" if "part-00000" in res.output else "shard 0")
    assert "overflow" not in res.output
    assert _snapshot(store) == before


def test_train_student_refuses_a_forged_num_rows(store, tmp_path):
    edit_manifests(store, lambda d: d["inputs"].__setitem__("num_rows", 89))
    refused(train(store, tmp_path / "student"), "inputs.num_rows 89", "manifest.json")
    assert not (tmp_path / "student").exists()


def test_a_shard_file_one_row_short_is_refused_by_kd_index(store):
    """The last row of shard 2 gone from texts and the teacher table; checksums and digests re-forged, the
    records' row counts left as they were (30)."""
    for table in ("texts", TEACHER):
        rewrite_shard(store, table, 2, lambda t: t.slice(0, t.num_rows - 1))
    res = validate(store)
    assert res.exit_code == 1 and "part-00002.parquet: 29 rows" in res.output, res.output  # (validate knew)
    before = _snapshot(store)
    refused(index(store), "29 rows, the manifest records 30", "part-00002")
    assert _snapshot(store) == before


def test_train_student_refuses_a_shard_record_one_row_short(store, tmp_path):
    """As above, and the shard records forged to say 29 rows: files and records agree, the row plan does not."""
    for table in ("texts", TEACHER):
        rewrite_shard(store, table, 1, lambda t: t.slice(0, t.num_rows - 1), rows=True)
    res = validate(store)
    assert res.exit_code == 1 and "shard 1 records 29 rows, the plan 30" in res.output, res.output
    refused(train(store, tmp_path / "student"), "shard 1 records 29 rows, the plan 30", "manifest.json")
    assert not (tmp_path / "student").exists()


def test_kd_index_refuses_a_store_without_a_texts_table(store):
    edit_manifests(store, lambda d: d["tables"].pop("texts"))
    before = _snapshot(store)
    refused(index(store), "no texts table")
    assert _snapshot(store) == before


# --- 4. a writer plans from the manifest it reads under its lock --------------------------------------------


def test_a_second_precompute_plans_from_the_manifest_read_under_the_lock(real, tmp_path, tiny_teacher, monkeypatch):
    """The second run reads the store before the first has committed teacher `more`; the first finishes while
    the second loads its teacher; the second then takes the lock and must find every shard done."""
    import kd.pipeline.precompute as P

    out = Path(shutil.copytree(real, tmp_path / "store"))
    src = str(real.parent / "news.txt")
    real_load, first_done = P._load_teachers, []

    def load_while_the_first_finishes(job, existing):
        if not first_done:
            first_done.append(True)
            P.precompute([src], str(out), [f"more={tiny_teacher}"], shard_rows=30, outputs=["mean"], progress=False)
            first_done.append(_snapshot(out / "teachers" / "more"))
        return real_load(job, existing)

    monkeypatch.setattr(P, "_load_teachers", load_while_the_first_finishes)
    assert not (out / "teachers" / "more").exists()
    summary = P.precompute([src], str(out), [f"more={tiny_teacher}"], shard_rows=30, outputs=["mean"],
                           progress=False)
    assert first_done
    # every shard (its texts and `more`'s rows) found committed; nothing encoded again, the first run's files kept
    assert (summary.shards_written, summary.shards_skipped, summary.rows_computed) == (0, 3, 0), summary
    assert _snapshot(out / "teachers" / "more") == first_done[1]


# --- leftovers: files kd opens itself are regular files; a JSONL key named once ------------------------------


def test_exclude_ids_as_a_pipe_is_refused(real, tmp_path):
    fifo = make_fifo(tmp_path / "leaked.txt")
    timer = unblocking(fifo)
    res = train(real, tmp_path / "student", "--exclude-ids", str(fifo))
    timer.cancel()
    refused(res, "not a regular file but a named pipe (FIFO)", str(fifo))
    assert not (tmp_path / "student").exists()


def test_a_recipe_path_that_is_a_pipe_is_refused(real, tmp_path):
    fifo = make_fifo(tmp_path / "mine.toml")
    timer = unblocking(fifo)
    res = CliRunner().invoke(app, ["distill", str(real.parent / "news.txt"), "-o", str(tmp_path / "run"),
                                   "--recipe", str(fifo), "--no-progress"])
    timer.cancel()
    refused(res, "not a regular file but a named pipe (FIFO)", str(fifo))
    assert not (tmp_path / "run").exists()


def test_agreement_texts_as_a_pipe_is_refused(tmp_path):
    from kd.apps.eval.config import EvalConfig
    from kd.common.errors import InputError

    fifo = make_fifo(tmp_path / "agree.txt")
    timer = unblocking(fifo)
    with pytest.raises(InputError, match="named pipe") as e:
        EvalConfig(students=[str(tmp_path / "student")], agreement_texts=str(fifo))
    timer.cancel()
    assert e.value.where == str(fifo) and e.value.fix


def test_a_duplicate_key_in_a_jsonl_object_is_refused_with_file_and_line(tmp_path, sentences, tiny_teacher):
    lines = [json.dumps({"text": s}) for s in sentences[:3]]
    first, second = json.dumps(sentences[3]), json.dumps(sentences[4])
    lines.append(f'{{"text": {first}, "label": 1, "text": {second}}}')
    (tmp_path / "news.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["precompute", str(tmp_path / "news.jsonl"), "-t", f"tiny={tiny_teacher}", "-o",
                                   str(tmp_path / "store"), "--no-progress"])
    refused(res, "key 'text' appears 2 times", "news.jsonl:4")
    assert not (tmp_path / "store").exists()
