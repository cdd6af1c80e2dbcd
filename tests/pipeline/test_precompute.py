"""kd precompute on tiny random teachers: values, alignment, DuckDB, resume, scale-out, errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest
import torch
from conftest import ROOT, build_tiny_bert, shared_file
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import InputError, StoreError
from kd.pipeline.precompute import precompute
from kd.storage import Store
from kd.storage.schema import arrow_to_vectors
from kd.storage.validate import validate


def _write_lines(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _table_arrays(store: Store, name: str) -> dict[str, np.ndarray]:
    t = store.read_table(name)
    return {c: (arrow_to_vectors(t[c]) if "list" in str(t[c].type) else t[c].to_numpy()) for c in t.column_names
            if c not in ("text", "doc_id", "source")}


def test_outputs_match_an_unbatched_forward(tmp_path, tiny_teacher, sentences):
    from transformers import AutoModel, AutoTokenizer

    src = _write_lines(tmp_path / "s.txt", sentences[:60])
    s = precompute([src], str(tmp_path / "st"), [str(tiny_teacher)], shard_rows=25, batch_tokens=300, progress=False)
    assert (s.rows_total, s.shards_written) == (60, 3)
    store = Store.open(tmp_path / "st")
    got = _table_arrays(store, "teachers/tiny-bert")
    assert got["layers"].shape == (60, 3, 32) and got["cls"].shape == (60, 32)
    tok, model = AutoTokenizer.from_pretrained(tiny_teacher), AutoModel.from_pretrained(tiny_teacher).eval()
    for i in (0, 17, 59):  # one at a time: no padding, so any batching/order bug shows
        enc = tok(sentences[i], return_tensors="pt", truncation=True, max_length=64)
        with torch.no_grad():
            h = model(**enc, output_hidden_states=True).hidden_states
        np.testing.assert_allclose(got["mean"][i], h[-1][0].mean(0).numpy(), atol=1e-5)
        np.testing.assert_allclose(got["cls"][i], h[-1][0, 0].numpy(), atol=1e-5)
        np.testing.assert_allclose(got["layers"][i, 0], h[0][0].mean(0).numpy(), atol=1e-5)
    n_tok = [len(tok(t)["input_ids"]) for t in sentences[:60]]
    assert got["n_tokens"].tolist() == n_tok
    assert got["truncated"].tolist() == [n > 64 for n in n_tok]
    assert validate(store) == []


def test_duckdb_reads_every_column_and_cosine_is_right(tmp_path, tiny_teacher, sentences):
    src = _write_lines(tmp_path / "s.txt", sentences[:40])
    precompute([src], str(tmp_path / "st"), [str(tiny_teacher)], shard_rows=15, dtype="float16", progress=False)
    store = Store.open(tmp_path / "st")
    files = [str(tmp_path / "st" / r.file) for _, r in sorted(store.table("teachers/tiny-bert").shards.items())]
    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({files!r})")
    assert con.execute("SELECT count(*) FROM t").fetchone()[0] == 40
    sim = con.execute(
        "SELECT array_cosine_similarity(a.cls::FLOAT[32], b.cls::FLOAT[32]) FROM t a, t b "
        "WHERE a.id = (SELECT id FROM t LIMIT 1 OFFSET 3) AND b.id = (SELECT id FROM t LIMIT 1 OFFSET 20)"
    ).fetchone()[0]
    v = _table_arrays(store, "teachers/tiny-bert")["cls"]
    assert sim == pytest.approx(float(v[3] @ v[20] / np.linalg.norm(v[3]) / np.linalg.norm(v[20])), abs=1e-5)
    layer = con.execute("SELECT layers[2] FROM t LIMIT 1").fetchone()[0]
    assert len(layer) == 32  # nested arrays come back too


def test_pairs_store_cross_encoder_logits_and_biencoder_sides(tmp_path, tiny_teacher, tiny_cross_encoder):
    src = tmp_path / "p.tsv"
    src.write_text("a\tb\tlabel\nthe cat runs\tthe dog runs\t1\na man reads\tthe news\t0\nbig city\tsmall city\t2\n")
    precompute([str(src)], str(tmp_path / "st"), [str(tiny_teacher), f"ce={tiny_cross_encoder}"],
               pair_columns="a,b", label_column="label", progress=False)
    store = Store.open(tmp_path / "st")
    ce = store.read_table("teachers/ce")
    assert arrow_to_vectors(ce["logits"]).shape == (3, 3)
    assert store.table("teachers/ce").meta["label_names"] == ["label_0", "label_1", "label_2"]
    bi = store.read_table("teachers/tiny-bert")
    assert {"mean_a", "mean_b", "layers_a"} <= set(bi.column_names) and "logits" not in bi.column_names
    assert store.read_table("texts")["label"].to_pylist() == [1, 0, 2]
    assert validate(store) == []


def test_second_teacher_is_added_without_touching_the_first(tmp_path, tiny_teacher, tiny_cross_encoder, sentences):
    src = _write_lines(tmp_path / "s.txt", sentences[:30])
    precompute([src], str(tmp_path / "st"), [str(tiny_teacher)], shard_rows=10, progress=False)
    before = Store.open(tmp_path / "st").table("teachers/tiny-bert").shards
    s = precompute([src], str(tmp_path / "st"), [f"ce={tiny_cross_encoder}"], shard_rows=10, progress=False)
    assert s.shards_written == 3 and s.rows_computed == 30
    store = Store.open(tmp_path / "st")
    assert store.table("teachers/tiny-bert").shards == before
    assert store.read_table("teachers/ce")["id"].equals(store.read_table("texts")["id"])
    assert validate(store) == []


def test_complete_store_does_nothing_and_says_so(tmp_path, tiny_teacher, sentences):
    src = _write_lines(tmp_path / "s.txt", sentences[:20])
    args = ["precompute", src, "--teacher", str(tiny_teacher), "--out", str(tmp_path / "st"), "--no-progress"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0 and "wrote 1 shard(s)" in first.stdout
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "nothing to do" in again.stdout


def _files(store: Path) -> dict:
    """Each store file's bytes, inode and mtime: a file replaced by the same bytes is still a write."""
    return {p.relative_to(store): (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns)
            for p in store.rglob("*") if p.is_file() and "locks" not in p.parts}


def test_a_complete_store_given_its_corpus_by_another_path_writes_nothing(tmp_path, tiny_teacher, sentences):
    """The same files, named the same or otherwise (a symlink, a copy elsewhere): nothing to encode, and nothing
    written. The store's record took each run's spelling, so kd distill runs sharing one store (--store) rewrote it
    in turn; and every rerun replaced manifest.json and its writer's record with the same bytes (a probe)."""
    src = _write_lines(tmp_path / "s.txt", sentences[:20])
    (tmp_path / "link.txt").symlink_to(src)
    out = tmp_path / "st"
    args = ["--teacher", str(tiny_teacher), "--out", str(out), "--no-progress"]
    assert CliRunner().invoke(app, ["precompute", src, *args]).exit_code == 0
    before = _files(out)
    assert Path("manifest.json") in before
    for other in (src, str(tmp_path / "link.txt"), shutil.copy(src, tmp_path / "copy.txt")):
        again = CliRunner().invoke(app, ["precompute", str(other), *args])
        assert again.exit_code == 0 and "nothing to do" in again.stdout, again.stdout
        assert _files(out) == before
    assert Store.open(out).manifest.inputs["files"][0]["path"] == src


def test_the_summary_counts_rows_per_teacher(tmp_path, tiny_teacher, sentences):
    """Each teacher encodes every row: two teachers over 20 rows said "40 rows encoded of 20" (probe)."""
    src = _write_lines(tmp_path / "s.txt", sentences[:20])
    res = CliRunner().invoke(app, ["precompute", src, "--teacher", f"a={tiny_teacher}", "--teacher",
                                   f"b={tiny_teacher}", "--out", str(tmp_path / "st"), "--no-progress"])
    said = " ".join(res.stdout.split())
    assert res.exit_code == 0 and "40 rows encoded of 20 x 2 teachers (0 shard(s) already done)" in said, said


def test_asking_for_fewer_outputs_than_a_store_holds_is_no_other_setting(tmp_path, tiny_teacher, sentences):
    """A teacher stored with more outputs than a run asks for (kd distill's start model stores MiniLM's default
    outputs; tiny6-ensemble then asks MiniLM for `sentence` on that store) has every row the run needs: the run
    finds nothing to do and leaves the store as it was (it was refused as "written with other settings"). An
    output the store lacks is still another setting."""
    src = _write_lines(tmp_path / "s.txt", sentences[:20])
    out = tmp_path / "st"
    precompute([src], str(out), [str(tiny_teacher)], outputs=["cls", "mean"], progress=False)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and "locks" not in p.parts}
    s = precompute([src], str(out), [str(tiny_teacher)], outputs=["mean"], progress=False)
    assert (s.shards_written, s.rows_computed) == (0, 0)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and "locks" not in p.parts}
    assert after == before
    with pytest.raises(StoreError, match="written with other settings"):
        precompute([src], str(out), [str(tiny_teacher)], outputs=["mean", "layers"], progress=False)


def test_one_teacher_folder_by_any_spelling_is_one_teacher(tmp_path, tiny_teacher, sentences, monkeypatch):
    """The store recorded a teacher folder as typed and compared it as a setting: the same folder given absolute, or
    relative from another working folder, was refused as "written with other settings" (exit 2), while a recorded
    relative path named another folder from elsewhere. The record is now the folder's absolute path; which teacher it
    is, its weights tell: the same folder by any spelling finds nothing to do, other weights under the name are
    refused naming them."""
    (tmp_path / "work" / "sub").mkdir(parents=True)
    os.symlink(tiny_teacher, tmp_path / "work" / "tb")
    src = _write_lines(tmp_path / "work" / "s.txt", sentences[:12])
    monkeypatch.chdir(tmp_path / "work")
    precompute([src], "st", ["tiny=tb"], progress=False)
    store = Store.open(str(tmp_path / "work" / "st"))
    assert store.table("teachers/tiny").meta["source"] == os.path.realpath(tiny_teacher)
    before = (tmp_path / "work" / "st" / "manifest.json").read_bytes()
    for where, spelling in ((".", str(tiny_teacher)), ("sub", "../tb/"), (str(tmp_path), "work/tb")):
        monkeypatch.chdir(tmp_path / "work" / where)
        s = precompute([src], str(tmp_path / "work" / "st"), [f"tiny={spelling}"], progress=False)
        assert (s.shards_written, s.rows_computed) == (0, 0), spelling
    assert (tmp_path / "work" / "st" / "manifest.json").read_bytes() == before
    other = build_tiny_bert(tmp_path / "other", seed=7)
    with pytest.raises(StoreError, match="written with other settings .*weights"):
        precompute([src], str(tmp_path / "work" / "st"), [f"tiny={other}"], progress=False)


def _edit_records(store: Path, edit) -> None:
    """Apply `edit` to manifest.json and every writer's record (what a kill before a commit, or an older kd, left)."""
    for path in (store / "manifest.json", *(store / "manifests").glob("*.json")):
        m = json.loads(path.read_text())
        edit(m)
        path.write_text(json.dumps(m))


def test_a_teacher_whose_config_changed_is_another_teacher(tmp_path, tiny_teacher, sentences):
    """The weights (and the tokenizer, `check_same_tokenizers`) said which teacher a table holds: `hidden_act` edited
    in the teacher's config.json between a killed run and its resume wrote the last shard with another function into
    the same table (a probe). Its config's settings are part of it now: refused naming them. A config saved again by
    another transformers is no other teacher, and a store of an older kd (no config digest recorded) still resumes."""
    teacher = Path(shutil.copytree(tiny_teacher, tmp_path / "t"))
    src, out = _write_lines(tmp_path / "s.txt", sentences[:20]), tmp_path / "st"
    run = dict(shard_rows=10, progress=False)
    precompute([src], str(out), [f"t={teacher}"], **run)
    last = lambda m: m["tables"]["teachers/t"]["shards"].pop("1", None)  # noqa: E731 (the shard a kill left uncommitted)
    config = json.loads((teacher / "config.json").read_text())
    (teacher / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    _edit_records(out, last)
    with pytest.raises(StoreError, match="written with other settings .*the config.json settings"):
        precompute([src], str(out), [f"t={teacher}"], **run)
    resaved = {k: v for k, v in config.items() if k != "dtype"}
    (teacher / "config.json").write_text(json.dumps({**resaved, "torch_dtype": "float32", "transformers_version": "9"},
                                                    indent=4))
    assert precompute([src], str(out), [f"t={teacher}"], **run).shards_written == 1
    # as transformers 4 saves it: the keys at their default left out, BERT's position_embedding_type written (a probe)
    diff = {k: v for k, v in config.items() if k not in ("is_decoder", "add_cross_attention", "use_cache",
                                                         "bos_token_id", "eos_token_id", "classifier_dropout")}
    (teacher / "config.json").write_text(json.dumps({**diff, "position_embedding_type": "absolute",
                                                     "_attn_implementation_autoset": True}))
    _edit_records(out, last)
    assert precompute([src], str(out), [f"t={teacher}"], **run).shards_written == 1
    (teacher / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 1e-5}))
    _edit_records(out, lambda m: m["tables"]["teachers/t"]["meta"].pop("config_sha256"))
    _edit_records(out, last)
    assert precompute([src], str(out), [f"t={teacher}"], **run).shards_written == 1


def test_refuses_other_settings_unless_overwrite(tmp_path, tiny_teacher, sentences):
    src = _write_lines(tmp_path / "s.txt", sentences[:20])
    out = str(tmp_path / "st")
    precompute([src], out, [str(tiny_teacher)], progress=False)
    with pytest.raises(StoreError, match="other inputs or settings"):
        precompute([src], out, [str(tiny_teacher)], dedup=True, progress=False)
    with pytest.raises(StoreError, match="written with other settings"):
        precompute([src], out, [str(tiny_teacher)], max_length=8, progress=False)
    s = precompute([src], out, [str(tiny_teacher)], dedup=True, overwrite=True, progress=False)
    assert s.shards_written == 1
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not empty and holds no kd store"):
        precompute([src], str(tmp_path / "junk"), [str(tiny_teacher)], progress=False)
    assert (tmp_path / "junk" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("suffix, lines", [(".txt", ["", "   "]), (".txt", []), (".jsonl", []), (".csv", ["text"])])
def test_a_corpus_without_text_is_refused_before_any_teacher_loads(tmp_path, monkeypatch, suffix, lines):
    """The seventh probe: an empty .jsonl/.csv/.txt was refused ("no text left to encode") only after the teacher
    had loaded (~20 s there; longer for mpnet on a CPU)."""
    from kd.pipeline.backends import loading

    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("a teacher loaded"))
    empty = tmp_path / f"e{suffix}"
    empty.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    r = CliRunner().invoke(app, ["precompute", str(empty), "-t", "minilm", "-o", str(tmp_path / "st")])
    assert r.exit_code == 2 and "no text left to encode" in r.output and str(empty) in r.output, r.output
    assert not (tmp_path / "st").exists()


def test_cli_errors_are_clear_and_write_nothing(tmp_path, tiny_teacher):
    some = _write_lines(tmp_path / "e.txt", ["a text", "another text"])
    r = CliRunner().invoke(app, ["precompute", some, "-t", "no-such-teacher", "-o", str(tmp_path / "st")])
    assert r.exit_code == 2 and "unknown teacher" in r.output and "--teacher NAME=/path/to/dir" in r.output
    r = CliRunner().invoke(app, ["precompute", some, "-t", str(tiny_teacher), "--outputs", "logits", "-o",
                                 str(tmp_path / "x")])
    assert r.exit_code == 2 and "no classification head" in r.output
    assert not (tmp_path / "st").exists() and not (tmp_path / "x").exists()


def test_two_writers_with_the_same_rank_are_locked_out(tmp_path):
    from kd.storage.manifest import Manifest
    from kd.storage.store import open_writer

    header = Manifest({"fingerprint": "f", "num_shards": 1, "num_rows": 1})
    w = open_writer(tmp_path / "st", header, "writer-00000-of-00001")
    with pytest.raises(StoreError, match="another kd process is writing"):
        open_writer(tmp_path / "st", header, "writer-00000-of-00001")
    w.close()
    open_writer(tmp_path / "st", header, "writer-00000-of-00001").close()


def test_corrupt_shard_is_named_by_validate(tmp_path, tiny_teacher, sentences):
    src = _write_lines(tmp_path / "s.txt", sentences[:20])
    precompute([src], str(tmp_path / "st"), [str(tiny_teacher)], shard_rows=10, progress=False)
    shard = tmp_path / "st" / "teachers" / "tiny-bert" / "part-00001.parquet"
    shard.write_bytes(shard.read_bytes()[:-100])
    r = CliRunner().invoke(app, ["validate", str(tmp_path / "st")])
    assert r.exit_code == 1 and "part-00001.parquet" in r.output and "checksum" in r.output


def _kd(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kd", *args], cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _committed(store: Path) -> int:
    frag = store / "manifests" / "writer-00000-of-00001.json"
    try:
        tables = json.loads(frag.read_text())["tables"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0
    return sum(len(t["shards"]) for name, t in tables.items() if name.startswith("teachers/"))


def test_sigkill_mid_run_then_resume_equals_uninterrupted_run(tmp_path, tiny_teacher):
    lines = shared_file("corpus", "eng_wikipedia_2016_10K-sentences.txt").read_text().splitlines()[:4000]
    src = _write_lines(tmp_path / "w.txt", [x.split("\t", 1)[1] for x in lines])
    args = [src, "-t", str(tiny_teacher), "--shard-rows", "200", "--no-progress"]
    full = _kd("precompute", *args, "-o", str(tmp_path / "full"))
    assert full.wait(120) == 0, full.stderr.read()
    victim = _kd("precompute", *args, "-o", str(tmp_path / "cut"))
    deadline = time.time() + 120
    while _committed(tmp_path / "cut") < 3 and time.time() < deadline and victim.poll() is None:
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert 0 < _committed(tmp_path / "cut") < 20, "the kill must land mid-run"
    again = _kd("precompute", *args, "-o", str(tmp_path / "cut"))
    assert again.wait(120) == 0, again.stderr.read()
    a, b = Store.open(tmp_path / "full"), Store.open(tmp_path / "cut")
    assert validate(b) == []
    for table in ("texts", "teachers/tiny-bert"):
        assert a.read_table(table).equals(b.read_table(table)), table


def test_two_processes_write_disjoint_shards_of_one_store(tmp_path, tiny_teacher, sentences):
    src = _write_lines(tmp_path / "s.txt", sentences[:120])
    args = [src, "-t", str(tiny_teacher), "--shard-rows", "20", "--no-progress", "-o", str(tmp_path / "multi")]
    procs = [_kd("precompute", *args, env={"RANK": str(r), "WORLD_SIZE": "2"}) for r in (0, 1)]
    for p in procs:
        assert p.wait(120) == 0, p.stderr.read()
    precompute([src], str(tmp_path / "single"), [str(tiny_teacher)], shard_rows=20, progress=False)
    multi, single = Store.open(tmp_path / "multi"), Store.open(tmp_path / "single")
    frags = sorted(os.listdir(tmp_path / "multi" / "manifests"))
    assert frags == ["writer-00000-of-00002.json", "writer-00001-of-00002.json"]
    assert multi.manifest.is_complete("teachers/tiny-bert") and validate(multi) == []
    for table in ("texts", "teachers/tiny-bert"):
        assert multi.read_table(table).equals(single.read_table(table))


def test_bad_enum_options_fail_cleanly(tmp_path, tiny_teacher, sentences):
    src = _write_lines(tmp_path / "s.txt", sentences[:5])
    with pytest.raises(InputError, match="--segment .paragraphs. is not one of"):
        precompute([src], str(tmp_path / "st"), [str(tiny_teacher)], segment="paragraphs", progress=False)
    r = CliRunner().invoke(app, ["precompute", src, "-t", str(tiny_teacher), "-o", str(tmp_path / "x"),
                                 "--dtype", "int4"])
    assert r.exit_code == 2 and "int4" in r.output
