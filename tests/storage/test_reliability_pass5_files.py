"""Files a user receives, refused when they are not what kd wrote (issue 48's fifth probe pass):
- a store's faiss index and ids files, forged with their checksums re-forged in the manifest: `kd validate` passed
  them and search answered with wrong rows; a hostile length was handed to faiss to allocate;
- `kd eval --pairs` of a named pipe (blocked forever) or /dev/zero (read until memory ran out);
- small JSON configs of a received folder (a teacher's 1_Pooling/config.json, a baseline's
  config_sentence_transformers.json) that are /dev/zero: read whole;
- a teacher whose tokenizer.json is not a regular file: the teacher ran on a 5-token fallback vocabulary.
Every refusal is a kd error (exit 2; validate: 1, problems listed), never a traceback or a hang: commands that
blocked run in a subprocess with a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
import pytest
from store_builder import TableSpec, build_store, grouped_vectors
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import KdError, StoreError
from kd.common.ids import row_ids
from kd.dataset.index import build_index, make_index, search
from kd.storage import fs
from kd.storage.store import Store

DIM = 16
IDX, IDS = "indexes/minilm-sentence-flat.faiss", "indexes/minilm-sentence-flat.ids.npy"


def _kd(args: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    # a subprocess with a timeout: on the old code the FIFO cases block in open() and this fails instead of hanging
    return subprocess.run([sys.executable, "-m", "kd", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


# -- faiss index files ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, sentences) -> tuple[Path, np.ndarray]:
    x, _ = grouped_vectors(6, 20, DIM, spread=0.1, seed=4)
    path = tmp_path_factory.mktemp("indexed") / "store"
    texts = sentences[: len(x)]
    build_store(path, texts, {"teachers/minilm": TableSpec("teacher", {"sentence": x})}, rows_per_shard=50,
                ids=row_ids(texts))  # content hashes, as kd precompute writes: the sound store validates
    build_index(path, "minilm", "sentence", "flat")
    return path, x


def _forged(src: Path, dst: Path, change: Callable[[Path], None]) -> Path:
    """A copy of the store with `change` applied to it, and the index's sha256s re-forged in every manifest."""
    store = Path(shutil.copytree(src, dst))
    change(store)
    for mf in [store / "manifest.json", *(store / "manifests").glob("*.json")]:
        m = json.loads(mf.read_text())
        for key, rec in m.get("extras", {}).items():
            if key.startswith("index:"):
                for field, rel in (("sha256", rec["file"]), ("ids_sha256", rec["ids_file"])):
                    p = store / rel
                    if p.is_file() and not p.is_symlink():
                        rec[field] = fs.file_sha256(p)
        mf.write_text(json.dumps(m))
    return store


def _flat_index(vectors: np.ndarray) -> bytes:
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return faiss.serialize_index(index).tobytes()


def _ids_reversed(s: Path) -> None:
    np.save(s / IDS, np.load(s / IDS)[::-1].copy())


def _ids_float(s: Path) -> None:
    np.save(s / IDS, np.load(s / IDS).astype(np.float64))


def _ids_huge_header(s: Path) -> None:  # a shape of 10^12 int64s: 7 TiB if believed
    head = b"{'descr': '<i8', 'fortran_order': False, 'shape': (1000000000000,), }"
    (s / IDS).write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", 118) + head.ljust(117) + b"\n")


def _idx_other_dim(s: Path) -> None:
    (s / IDX).write_bytes(_flat_index(np.random.default_rng(0).random((120, DIM // 2))))


def _idx_nan(s: Path) -> None:
    v = np.load(s / IDS).astype(np.float32)[:, None] * 0 + np.eye(1, DIM, dtype=np.float32)  # unit rows
    v[3, 0] = np.nan
    (s / IDX).write_bytes(_flat_index(v))


def _idx_hnsw(s: Path) -> None:  # an HNSW graph of other vectors where the record says flat
    rows = len(np.load(s / IDS))
    v = np.random.default_rng(1).normal(size=(rows, DIM)).astype(np.float32)
    (s / IDX).write_bytes(faiss.serialize_index(make_index(v / np.linalg.norm(v, axis=1, keepdims=True), "hnsw",
                                                           gpu=False)).tobytes())


def _idx_not_unit(s: Path) -> None:
    (s / IDX).write_bytes(_flat_index(np.random.default_rng(2).random((len(np.load(s / IDS)), DIM)) + 1))


def _idx_ntotal_huge(s: Path) -> None:  # ntotal 2^50 in the header: faiss would size a buffer from it
    b = bytearray((s / IDX).read_bytes())
    b[8:16] = struct.pack("<q", 2**50)
    (s / IDX).write_bytes(bytes(b))


def _idx_truncated(s: Path) -> None:
    b = (s / IDX).read_bytes()
    (s / IDX).write_bytes(b[: len(b) // 2])


def _idx_rows_swapped(s: Path) -> None:  # rows 0 and 1 swapped: every check of the layout, norms and ids holds
    index = faiss.deserialize_index(np.frombuffer((s / IDX).read_bytes(), dtype=np.uint8))
    v = index.reconstruct_n(0, index.ntotal)
    (s / IDX).write_bytes(_flat_index(v[[1, 0, *range(2, len(v))]]))


FORGERIES = {"idx-rows-swapped": _idx_rows_swapped,
             "ids-reversed": _ids_reversed, "ids-float": _ids_float, "ids-huge-header": _ids_huge_header,
             "idx-other-dim": _idx_other_dim, "idx-nan": _idx_nan, "idx-hnsw-swap": _idx_hnsw,
             "idx-not-unit": _idx_not_unit, "idx-ntotal-2^50": _idx_ntotal_huge, "idx-truncated": _idx_truncated}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_forged_index_is_refused_by_validate_and_search(indexed, tmp_path, name):
    src, x = indexed
    store = _forged(src, tmp_path / "s", FORGERIES[name])
    r = CliRunner().invoke(app, ["validate", str(store)])
    assert r.exit_code == 1 and "problem" in r.output and "minilm-sentence-flat" in r.output, r.output
    with pytest.raises(StoreError, match="index minilm-sentence-flat") as e:
        search(store, x[:2], k=5)
    assert e.value.exit_code == 2 and "kd index" in e.value.fix


def test_a_sound_index_still_answers_and_validates(indexed):
    src, x = indexed
    r = CliRunner().invoke(app, ["validate", str(src)])
    assert r.exit_code == 0, r.output
    assert search(src, x[7:8], k=1).ids[0, 0] == np.load(src / IDS)[7]


def test_an_index_file_that_is_a_fifo_is_refused_with_the_rebuild(indexed, tmp_path):
    store = _forged(indexed[0], tmp_path / "s", lambda s: ((s / IDX).unlink(), os.mkfifo(s / IDX)))
    with pytest.raises(StoreError, match="named pipe") as e:
        search(store, indexed[1][:1], k=3)
    assert "kd index" in e.value.fix
    res = _kd(["validate", str(store)], timeout=60)
    assert res.returncode == 1 and "named pipe" in res.stdout + res.stderr, res.stdout + res.stderr


def test_an_index_larger_than_its_record_allows_is_not_read(indexed, tmp_path, monkeypatch):
    store = Store.open(_forged(indexed[0], tmp_path / "s", lambda s: (s / IDX).write_bytes(b"\0" * (3 << 20))))
    monkeypatch.setattr(fs, "read_bytes", lambda *a: pytest.fail("read before its size was checked"))
    with pytest.raises(StoreError, match="more than an index of 120 rows"):
        search(store, indexed[1][:1], k=3)


def _hnsw_bytes() -> tuple[bytes, int]:
    v = np.random.default_rng(3).normal(size=(200, 8)).astype(np.float32)
    return faiss.serialize_index(make_index(v / np.linalg.norm(v, axis=1, keepdims=True), "hnsw", gpu=False)
                                 ).tobytes(), 200


def test_the_layout_walk_refuses_hostile_lengths_and_graph_entries():
    from kd.storage.faiss_layout import LayoutError, stored_vectors

    data, rows = _hnsw_bytes()
    assert sum(len(v) for v in stored_vectors(data, "hnsw", rows, 8)) == rows
    # the neighbours vector's length (after 3 vectors: probabilities, per-level counts, levels) made 2^40
    off = 37
    for size in (8, 4, 4):
        off += 8 + size * struct.unpack_from("<Q", data, off)[0]
    offsets_at = off
    off += 8 + 8 * struct.unpack_from("<Q", data, off)[0]
    huge = bytearray(data)
    huge[off : off + 8] = struct.pack("<Q", 2**40)
    with pytest.raises(LayoutError, match="more than the file holds"):
        stored_vectors(bytes(huge), "hnsw", rows, 8)
    far = bytearray(data)  # a neighbour id past the rows: faiss would follow it out of bounds
    struct.pack_into("<i", far, off + 8, rows + 5)
    with pytest.raises(LayoutError, match="neighbour is outside"):
        stored_vectors(bytes(far), "hnsw", rows, 8)
    skew = bytearray(data)
    struct.pack_into("<Q", skew, offsets_at + 16, 3)
    with pytest.raises(LayoutError, match="offsets"):
        stored_vectors(bytes(skew), "hnsw", rows, 8)


def test_the_layout_walk_refuses_an_ivf_list_that_claims_more_rows():
    from kd.storage.faiss_layout import LayoutError, stored_vectors

    v = np.random.default_rng(4).normal(size=(400, 8)).astype(np.float32)
    data = faiss.serialize_index(make_index(v / np.linalg.norm(v, axis=1, keepdims=True), "ivf", gpu=False)
                                 ).tobytes()
    assert sum(len(p) for p in stored_vectors(data, "ivf", 400, 8)) == 400
    at = data.index(b"full") + 4 + 8  # the first list's size
    forged = bytearray(data)
    forged[at : at + 8] = struct.pack("<Q", 2**40)
    with pytest.raises(LayoutError, match="claims more rows"):
        stored_vectors(bytes(forged), "ivf", 400, 8)
    with pytest.raises(LayoutError, match="2 of dim 8"):
        stored_vectors(data, "ivf", 2, 8)


def test_kd_index_rebuilds_a_refused_index(indexed, tmp_path):
    store = _forged(indexed[0], tmp_path / "s", _ids_reversed)
    with pytest.raises(KdError):
        search(store, indexed[1][:1], k=1)
    r = CliRunner().invoke(app, ["index", str(store), "--table", "teachers/minilm", "--column", "sentence",
                                 "--kind", "flat"])
    assert r.exit_code == 0, r.output
    assert search(store, indexed[1][7:8], k=1).ids[0, 0] == np.load(indexed[0] / IDS)[7]


# -- files handed to kd eval and to teacher loading ------------------------------------------------------------

MEMORY_LIMIT = 8 << 30  # the old code read /dev/zero until memory ran out: held here to fail, not to take the machine


def _kd_bounded(args: list[str], timeout: int = 120) -> tuple[int, str]:
    """`kd ARGS` in a subprocess with a timeout and a memory limit: (exit code, output)."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    res = subprocess.run([sys.executable, "-m", "kd", *args], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "COLUMNS": "200"}, preexec_fn=limit)
    return res.returncode, res.stdout + res.stderr


def _special(path: Path, kind: str) -> Path:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return path


def _refused(rc: int, out: str, *words: str) -> None:
    assert rc == 2 and "Traceback" not in out and all(w in out for w in words), out


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_eval_pairs_that_is_a_pipe_or_a_device_is_refused(tiny_teacher, tmp_path, kind):
    pairs = _special(tmp_path / "pairs.jsonl", kind)
    rc, out = _kd_bounded(["eval", "--teacher", str(tiny_teacher), "--task", "sts", "--pairs", str(pairs),
                           "--text-columns", "a,b", "--score-column", "score", "--no-baseline"])
    _refused(rc, out, "--pairs is not a regular file")


def test_load_pairs_refuses_a_pipe(tmp_path):
    pairs = _special(tmp_path / "pairs.jsonl", "fifo")
    code = f"from kd.apps.eval.tasks import load_pairs; load_pairs({str(pairs)!r}, 'score', ('a', 'b'))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "InputError: the pair file is not a regular file" in res.stderr, res.stderr


def _st_teacher(src: Path, dst: Path) -> Path:
    """The tiny teacher as a sentence-transformers folder (Transformer + mean Pooling)."""
    folder = Path(shutil.copytree(src, dst))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return folder


@pytest.mark.parametrize(("file", "kind"), [("1_Pooling/config.json", "dev-zero"), ("tokenizer.json", "dev-zero"),
                                            ("tokenizer.json", "fifo")])
def test_a_teacher_file_that_is_a_device_or_a_pipe_is_refused(tiny_teacher, tmp_path, sentences, file, kind):
    teacher = _st_teacher(tiny_teacher, tmp_path / "teacher")
    _special(teacher / file, kind)
    (tmp_path / "in.txt").write_text("\n".join(sentences[:20]) + "\n", encoding="utf-8")
    rc, out = _kd_bounded(["precompute", str(tmp_path / "in.txt"), "-t", f"t={teacher}", "--outputs", "mean",
                           "--backend", "torch", "-o", str(tmp_path / "store")])
    _refused(rc, out, f"{Path(file).name} is not a regular file")
    assert not (tmp_path / "store" / "manifest.json").exists()


def test_a_teacher_whose_tokenizer_lost_its_vocabulary_is_refused(tiny_teacher, tmp_path):
    from kd.pipeline.backends.loading import load_teacher

    teacher = Path(shutil.copytree(tiny_teacher, tmp_path / "teacher"))
    for name in ("tokenizer.json", "vocab.txt"):  # transformers then builds a tokenizer of the special tokens alone
        (teacher / name).unlink(missing_ok=True)
    with pytest.raises(KdError, match="tokenizer knows 5 tokens, its model") as e:
        load_teacher(str(teacher))
    assert e.value.exit_code == 2


def test_a_sentence_bert_config_of_another_type_is_refused(tiny_teacher, tmp_path):
    from kd.pipeline.backends.loading import load_teacher

    teacher = _st_teacher(tiny_teacher, tmp_path / "teacher")
    (teacher / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": "big"}))
    with pytest.raises(KdError, match="max_seq_length = 'big'"):
        load_teacher(str(teacher))


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_baseline_dir_config_that_is_a_pipe_or_a_device_is_refused(tiny_teacher, tmp_path, kind):
    baseline = tmp_path / "m2v"
    baseline.mkdir()
    (baseline / "modules.json").write_text("[]")
    _special(baseline / "config_sentence_transformers.json", kind)
    rc, out = _kd_bounded(["eval", "--teacher", str(tiny_teacher), "--baseline-dir", str(baseline), "--task",
                           "speed"])
    _refused(rc, out, "config_sentence_transformers.json")


def test_a_config_larger_than_a_config_is_refused_unread(tmp_path):
    from kd.common.parsing import MAX_CONFIG_BYTES, read_config

    big = tmp_path / "config.json"
    big.write_text('{"pad": "' + "x" * MAX_CONFIG_BYTES + '"}')
    with pytest.raises(KdError, match="larger than 1 MiB"):
        read_config(big, "fix")


def test_a_teacher_whose_weights_file_is_junk_is_kd_s_error(tiny_teacher, tmp_path, sentences):
    """Issue 48's fresh probe: random bytes as model.safetensors ended in safetensors' own traceback (exit 1)."""
    from kd.pipeline.backends.loading import load_teacher

    junk = tmp_path / "junk-teacher"
    shutil.copytree(tiny_teacher, junk)
    (junk / "model.safetensors").write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(KdError, match="cannot load the teacher checkpoint") as e:
        load_teacher(f"junk={junk}")
    assert e.value.where == str(junk) and e.value.exit_code == 2
    corpus = tmp_path / "news.txt"
    corpus.write_text("\n".join(sentences[:20]) + "\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["precompute", str(corpus), "-t", f"junk={junk}", "--backend", "torch",
                                   "-o", str(tmp_path / "store"), "--no-progress"])
    assert res.exit_code == 2 and "Traceback" not in res.output and not (tmp_path / "store").exists(), res.output
