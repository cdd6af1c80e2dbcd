"""Issue 48, the fifth reliability pass (readers): every reader refuses a store whose content `kd validate` refuses,
and validate refuses the content the probe forged past it.

The probe re-forged every checksum and ids digest after changing a store, so only a content check can tell: ids
twice or unlike their texts' content hash, NaN/Inf or 3e38 vectors, negative token counts, null, blank or 1.5 MiB
texts, a column named twice, input embeddings of 3e38 or of the wrong shape, vocab token ids past the tokenizer.
Readers that do not hold every value run validate's content checks once per store state, and remember a sound
verdict in the kd cache (never in the store). Each store here is a real one (Leipzig news sentences through a
tiny BERT teacher, kd precompute's own ids), forged by `store_forgery`."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import store_forgery
from safetensors.numpy import load, save
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from store_forgery import (
    TEACHER,
    index,
    refused,
    rewrite_file,
    rewrite_shard,
    set_column,
    snapshot,
    swap_text,
    train,
    validate,
    write_forged,
)
from typer.testing import CliRunner

from kd.cli import app
from kd.common.ids import text_id
from kd.storage.schema import VectorDType, vectors_to_arrow

EMB = "teachers/tiny/input_embeddings.safetensors"


real, store = store_forgery.real, store_forgery.store  # the sound store and a copy per test


def query(store: Path, sql: str = "SELECT count(*), sum(mean[1]) FROM tiny"):
    return CliRunner().invoke(app, ["query", str(store), sql])


def leakage(store: Path):
    return CliRunner().invoke(app, ["leakage", str(store)])


def _with_id(table: pa.Table, row: int, new_id: int) -> pa.Table:
    ids = table["id"].to_pylist()
    ids[row] = new_id
    return set_column(table, "id", ids)


def duplicate_id(store: Path) -> None:
    """Row 1 of shard 0 given row 0's id, in texts and the teacher table alike (so the tables stay aligned)."""
    for table in ("texts", TEACHER):
        rewrite_shard(store, table, 0, lambda t: _with_id(t, 1, t["id"][0].as_py()))


def retext(store: Path, text: str | None, rehash: bool) -> None:
    """Row 0's text replaced; `rehash`: its id made the content hash of the new text, in every table, so the
    id check passes and only the text check is left."""
    def change(t: pa.Table) -> pa.Table:
        texts = t["text"].to_pylist()
        texts[0] = text
        schema = pa.schema([f.with_nullable(True) if f.name == "text" else f for f in t.schema])
        return pa.table([pa.array(texts, pa.string()) if n == "text" else t[n] for n in t.column_names],
                        schema=schema)

    rewrite_shard(store, "texts", 0, change)
    if rehash:
        for table in ("texts", TEACHER):
            rewrite_shard(store, table, 0, lambda t: _with_id(t, 0, text_id(text, 0)))


def set_vector(store: Path, column: str, value: float) -> None:
    def change(t: pa.Table) -> pa.Table:
        v = np.stack(t[column].to_numpy(zero_copy_only=False)).astype(np.float32)
        v[2, 0] = value
        return set_column(t, column, vectors_to_arrow(v, VectorDType.float32))

    rewrite_shard(store, TEACHER, 0, change)


# --- ids: twice, or not their texts' content hash ----------------------------------------------------------------


def test_train_student_refuses_an_id_twice(store, tmp_path):
    duplicate_id(store)
    res = train(store, tmp_path / "student")
    refused(res, "appears twice", "texts/part-00000.parquet", "write the store again")
    assert not (tmp_path / "student").exists()


def test_query_refuses_an_id_twice_and_names_the_shard(store):
    duplicate_id(store)
    before = snapshot(store)
    refused(query(store), "appears twice", "part-00000")
    assert snapshot(store) == before  # a reader writes nothing into the store, not even its verdict


def test_query_index_and_leakage_refuse_an_id_unlike_its_texts_hash(store, sentences):
    swap_text(store, 3, sentences[200])
    for res in (query(store), index(store), leakage(store)):
        refused(res, "is not the content hash of its text", "texts/part-00000.parquet")


def test_precompute_add_to_refuses_a_store_with_an_id_twice(store, tiny_teacher):
    duplicate_id(store)
    before = snapshot(store)
    res = CliRunner().invoke(app, ["precompute", "--add-to", str(store), "-t", f"t2={tiny_teacher}", "--outputs",
                                   "cls", "--no-progress"])
    refused(res, "appears twice")
    assert snapshot(store) == before and not (store / "teachers" / "t2").exists()


# --- vector values: a column train-student does not read is checked too -----------------------------------------


def test_train_student_refuses_inf_in_a_column_it_does_not_train_on(store, tmp_path):
    """The student learns `mean`; an Inf in `cls` is still a store validate refuses."""
    set_vector(store, "cls", np.inf)
    refused(train(store, tmp_path / "student"), "column 'cls' has non-finite", "teachers/tiny/part-00000.parquet",
            "--repair")
    assert not (tmp_path / "student").exists()


@pytest.mark.parametrize("value", [np.nan, 3e38])
def test_query_refuses_nan_or_a_finite_3e38_vector(store, value):
    set_vector(store, "mean", value)
    refused(query(store), "column 'mean' has non-finite (NaN/Inf) or out-of-range", "--repair")


# --- token counts and texts --------------------------------------------------------------------------------------


def test_a_negative_token_count_is_reported_and_refused(store, tmp_path):
    rewrite_shard(store, TEACHER, 1, lambda t: set_column(t, "n_tokens", [-5] + t["n_tokens"].to_pylist()[1:]))
    res = validate(store)
    assert res.exit_code == 1 and "column 'n_tokens' is negative in 1 row(s), first -5 at row 0" in res.output, \
        res.output
    for res in (index(store), query(store), train(store, tmp_path / "student")):
        refused(res, "'n_tokens' is negative", "teachers/tiny/part-00001.parquet")


def test_a_null_text_is_reported_not_a_traceback_and_repair_fixes_it(real, store, tmp_path, tiny_teacher):
    from kd.pipeline.precompute import precompute

    retext(store, None, rehash=False)
    res = validate(store)
    assert res.exit_code == 1 and "column 'text' holds a null text at row 0" in res.output, res.output
    assert "Traceback" not in res.output
    refused(train(store, tmp_path / "student"), "null text", "texts/part-00000.parquet", "--repair")
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert "dropped shard 0 of texts" in res.output, res.output
    precompute([str(real.parent / "news.txt")], str(store), [f"tiny={tiny_teacher}"], shard_rows=30,
               outputs=["cls", "mean", "vocab"], progress=False)
    assert validate(store).exit_code == 0


def test_a_blank_text_with_its_own_hash_as_id_is_refused(store):
    """Its id forged to be the content hash of "  ": the id check passes, the text check does not."""
    retext(store, "  ", rehash=True)
    res = validate(store)
    assert res.exit_code == 1 and "holds a blank text at row 0" in res.output, res.output
    assert "content hash" not in res.output
    refused(query(store), "blank text")
    refused(index(store), "blank text")


def test_a_text_over_one_mib_with_its_own_hash_as_id_is_refused(store, tmp_path):
    retext(store, "word " * 300_000, rehash=True)
    res = validate(store)
    assert res.exit_code == 1 and "a text of 1,500,000 characters at row 0" in res.output, res.output
    refused(train(store, tmp_path / "student"), "over kd's limit of 1 MiB")
    assert not (tmp_path / "student").exists()


def test_a_texts_column_named_twice_is_refused_by_kd_index(store):
    t = pq.read_table(store / "texts/part-00000.parquet")
    twice = pa.Table.from_arrays([*t.columns, t["text"]], names=[*t.column_names, "text"])
    buf = io.BytesIO()
    pq.write_table(twice, buf)
    write_forged(store, "texts", 0, buf.getvalue(), twice)
    res = validate(store)
    assert res.exit_code == 1 and "column 'text' appears twice" in res.output, res.output
    before = snapshot(store)
    refused(index(store), "column 'text' appears twice", "texts/part-00000.parquet")
    assert snapshot(store) == before


# --- the files beside the tables ---------------------------------------------------------------------------------


def test_input_embeddings_of_3e38_are_reported_and_refused_by_training(store, tmp_path):
    weight = load((store / EMB).read_bytes())["weight"]
    rewrite_file(store, EMB, save({"weight": np.full_like(weight, 3e38)}))
    res = validate(store)
    assert res.exit_code == 1 and "tensor 'weight' holds non-finite (NaN/Inf) or out-of-range" in res.output, \
        res.output
    refused(train(store, tmp_path / "student"), "out-of-range", "input_embeddings.safetensors")


def test_input_embeddings_of_the_wrong_shape_are_reported(store, tmp_path):
    rewrite_file(store, EMB, save({"weight": np.zeros((5, 7), np.float32)}))
    res = validate(store)
    assert res.exit_code == 1 and "the input embeddings have 5 rows, the teacher's tokenizer has" in res.output, \
        res.output
    refused(train(store, tmp_path / "student"), "the input embeddings have 5 rows")
    _repaired(store, EMB)


def test_input_embeddings_narrower_than_the_teacher_are_reported(store, tmp_path):
    """[vocab, 16] for a 32-wide BERT teacher passed validate and started a student's embeddings (the sixth probe);
    docs/store-format.md: [vocab, dim]."""
    weight = load((store / EMB).read_bytes())["weight"]
    rewrite_file(store, EMB, save({"weight": weight[:, : weight.shape[1] // 2].copy()}))
    said = f"the input embeddings are {weight.shape[1] // 2} wide, the teacher's hidden states {weight.shape[1]}"
    res = validate(store)
    assert res.exit_code == 1 and said in " ".join(res.output.split()), res.output
    refused(train(store, tmp_path / "student"), said)
    _repaired(store, EMB)


def _repaired(store: Path, rel: str) -> None:
    """--repair sets a file of the wrong shape aside as it does one unlike its checksum (it once kept it: the store
    it left was still refused by validate and every reader)."""
    res = CliRunner().invoke(app, ["validate", str(store), "--repair"])
    assert f"repair set aside {rel}" in " ".join(res.output.split()), res.output
    assert not (store / rel).exists() and (store / f"{rel}.damaged").exists()
    res = validate(store)  # sound, or missing what the rerun of precompute writes again
    assert res.exit_code == 0 or "re-run the kd precompute command that wrote it" in res.output, res.output


def test_vocab_token_ids_past_the_tokenizer_are_reported(store):
    rel = "teachers/tiny/vocab.safetensors"
    tensors = load((store / rel).read_bytes())
    rewrite_file(store, rel, save({"vectors": tensors["vectors"], "token_ids": tensors["token_ids"] + 10**9}))
    res = validate(store)
    assert res.exit_code == 1 and "the vocab output's token ids run 1000000000" in res.output, res.output
    _repaired(store, rel)


@pytest.mark.parametrize("forge", ["ids_all_zero", "fewer_rows"])
def test_a_vocab_output_unlike_its_tokenizer_is_refused_by_validate_and_readers(store, tmp_path, forge):
    """Token ids that are all 0, or 10 rows of a 100-token tokenizer (ids 0..9, re-signed), passed validate and
    trained a static student from the wrong table (the sixth probe): a static student takes row t as token t."""
    rel = "teachers/tiny/vocab.safetensors"
    t = load((store / rel).read_bytes())
    vecs, ids = t["vectors"], t["token_ids"]
    forged = {"vectors": vecs, "token_ids": np.zeros_like(ids)} if forge == "ids_all_zero" else \
        {"vectors": vecs[:10].copy(), "token_ids": ids[:10].copy()}
    rewrite_file(store, rel, save(forged))
    said = "are not 0, 1, 2, ... in order" if forge == "ids_all_zero" else "the vocab output has 10 rows, the teacher's"
    res = validate(store)
    assert res.exit_code == 1 and said in " ".join(res.output.split()), res.output
    refused(train(store, tmp_path / "student", "--arch", "static"), said)
    refused(CliRunner().invoke(app, ["eval", "--store", str(store), "--student", str(tmp_path / "none"),
                                     "--task", "agreement"]), said)
    _repaired(store, rel)


# --- the verdict: once per store state, in the kd cache ----------------------------------------------------------


def test_a_sound_verdict_is_kept_in_the_kd_cache_and_spares_the_next_query(store, tmp_path, monkeypatch):
    import kd.storage.soundness as S

    monkeypatch.setenv("KD_CACHE", str(tmp_path / "cache"))
    before = snapshot(store)
    res = query(store)
    assert res.exit_code == 0, res.output
    assert len(list((tmp_path / "cache" / "soundness").iterdir())) == 1
    assert snapshot(store) == before

    def no_second_check(store):
        raise AssertionError("the content of a store state already checked was checked again")

    monkeypatch.setattr(S, "values_problems", no_second_check)
    assert query(store).exit_code == 0
    monkeypatch.undo()
    monkeypatch.setenv("KD_CACHE", str(tmp_path / "cache"))
    set_vector(store, "mean", np.nan)  # a new store state: checked again, and refused
    refused(query(store), "column 'mean' has non-finite")
