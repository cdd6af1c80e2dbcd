"""Tiny synthetic stores for the student tests, written through the store contract (no teacher runs).

The "teacher" is a bag of words over a random input-embedding matrix: `mean` is the mean of the
token vectors, `sentence` its normalised version, `layers` fixed random maps of it. So targets are a
learnable function of the text, and a student whose loss falls has learned something real.
news_init_store and cross_encoder_pairs are real stores instead: tiny BERTs through kd precompute.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
from conftest import WORDS, build_tiny_bert
from safetensors.numpy import save_file

from kd.common.ids import text_id, text_key
from kd.storage.manifest import Manifest
from kd.storage.schema import VectorDType, texts_schema, type_name, vector_type, vectors_to_arrow
from kd.storage.store import open_writer

TEACHER = "tiny"


def tokenizer_files(root: Path) -> Path:
    """A WordPiece tokenizer dir (from the conftest tiny BERT; the weights are not copied)."""
    src = root / "tiny-bert-src"
    if not (src / "tokenizer.json").exists():
        build_tiny_bert(src, hidden=8, layers=1)
    out = root / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab")):
            shutil.copy(f, out / f.name)
    return out


def tiny_student(store: Path, out: Path, steps: int = 1) -> Path:
    """A bilstm student of `store` at `out`, 8 wide, trained `steps` steps by `kd train-student` (seconds)."""
    from typer.testing import CliRunner

    from kd.cli import app

    res = CliRunner().invoke(app, ["train-student", "-s", str(store), "-o", str(out), "--arch", "bilstm", "--embed-dim",
                                   "8", "--hidden-dim", "8", "--max-steps", str(steps), "--no-progress"])
    assert res.exit_code == 0, res.output
    return out


def random_texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(n)]


def make_store(path: Path, *, rows: int = 240, shards: int = 2, dim: int = 16, num_layers: int = 2,
               pairs: bool = False, labels: bool = False, seed: int = 0, tmp: Path | None = None,
               nan_at: tuple[int, int] | None = None) -> Path:
    """Write texts + teachers/tiny (cls, mean, sentence, layers) + tokenizer + input embeddings.

    `nan_at` (shard, row): that row's `mean` holds a NaN (what an old kd or another writer may have stored)."""
    from transformers import AutoTokenizer

    tok_dir = tokenizer_files(tmp or path.parent)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    rng = np.random.default_rng(seed)
    vocab = len(tok)
    emb = rng.normal(size=(vocab, dim)).astype(np.float32)
    maps = rng.normal(size=(num_layers + 1, dim, dim)).astype(np.float32) / np.sqrt(dim)

    def teacher_vectors(texts: list[str]) -> dict[str, np.ndarray]:
        ids = tok(texts, add_special_tokens=False)["input_ids"]
        mean = np.stack([emb[i].mean(0) if i else np.zeros(dim, np.float32) for i in ids])
        return {
            "cls": np.tanh(mean),
            "mean": mean,
            "sentence": mean / np.linalg.norm(mean, axis=1, keepdims=True).clip(1e-9),
            "layers": np.einsum("bd,lde->ble", mean, maps),
        }

    per = -(-rows // shards)
    header = Manifest(inputs={
        "fingerprint": f"synthetic-{seed}-{rows}-{shards}-{pairs}", "num_rows": rows, "rows_per_shard": per,
        "num_shards": shards, "pairs": pairs,
    })
    w = open_writer(path, header, "test")
    label_type = pa.int64() if labels else None
    tschema = texts_schema(pairs, label_type)
    w.declare("texts", "texts", {f.name: type_name(f.type) for f in tschema}, {"pairs": pairs})
    suffixes = ("_a", "_b") if pairs else ("",)
    outs = ["cls", "mean", "sentence", "layers"]
    shapes = {"cls": (dim,), "mean": (dim,), "sentence": (dim,), "layers": (num_layers + 1, dim)}
    tcols = {"id": "int64", "n_tokens": "int32", "truncated": "bool"}
    tcols |= {f"{o}{s}": type_name(vector_type(shapes[o], VectorDType.float32)) for o in outs for s in suffixes}
    meta = {
        "source": "synthetic", "num_layers": num_layers, "dim": dim, "max_length": 64, "outputs": outs,
        "dtype": "float32", "label_names": None, "default_target": "sentence",
        "tokenizer": f"tokenizers/{TEACHER}", "input_embeddings": f"teachers/{TEACHER}/input_embeddings.safetensors",
    }
    w.declare(f"teachers/{TEACHER}", "teacher", tcols, meta)
    seen: Counter[str] = Counter()  # content-hash ids, as kd precompute gives them (kd validate checks them)
    for k in range(shards):
        n = min(per, rows - k * per)
        rng.integers(-(2**62), 2**62, size=n, dtype=np.int64)  # (the random ids it once drew: later draws unchanged)
        sides = [random_texts(n, seed * 1000 + k * 10 + i) for i in range(len(suffixes))]
        ids = np.empty(n, np.int64)
        for i, text in enumerate(zip(*sides) if pairs else sides[0]):
            key = text_key(text)
            ids[i], seen[key] = text_id(key, seen[key]), seen[key] + 1
        cols: dict[str, pa.Array] = {"id": pa.array(ids)}
        tvals: dict[str, pa.Array] = {"id": pa.array(ids), "n_tokens": pa.array(np.full(n, 8, np.int32)),
                                      "truncated": pa.array(np.zeros(n, bool))}
        for s, texts in zip(suffixes, sides):
            cols[f"text{s}"] = pa.array(texts)
            for o, v in teacher_vectors(texts).items():
                if o == "mean" and nan_at is not None and nan_at[0] == k:
                    v[nan_at[1], 0] = np.nan
                tvals[f"{o}{s}"] = vectors_to_arrow(v, VectorDType.float32)
        cols |= {"doc_id": pa.array([f"d{k}-{i}" for i in range(n)]), "position": pa.array(np.zeros(n, np.int32)),
                 "source": pa.array(["synthetic"] * n)}
        if labels:
            cols["label"] = pa.array(rng.integers(0, 3, n))
        w.commit("texts", k, pa.Table.from_pydict(cols, schema=tschema))
        w.commit(f"teachers/{TEACHER}", k, pa.Table.from_pydict(tvals))
    w.publish()
    w.close()
    shutil.copytree(tok_dir, path / "tokenizers" / TEACHER, dirs_exist_ok=True)
    save_file({"weight": emb}, str(path / "teachers" / TEACHER / "input_embeddings.safetensors"))
    return path


def tiny_bert_config(hidden: int = 8, layers: int = 2, vocab: int = 64, max_length: int = 32) -> dict:
    """A BERT config dict for transformer-init students in unit tests (random weights, no store)."""
    return dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                intermediate_size=2 * hidden, max_position_embeddings=max_length, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0)


def news_init_store(root: Path, teacher: Path, sentences: list[str]) -> Path:
    """A real store for every arch: 96 news sentences through `teacher` ("tiny"), with the vocab and init outputs
    (layer 1 kept) that static and transformer-init students start from."""
    from conftest import precompute_news

    from kd.pipeline.precompute import precompute

    path = precompute_news(root, teacher, sentences, 96, 48)
    precompute([str(root / "news.txt")], str(path), [f"tiny={teacher}"], outputs=["vocab", "init"], shard_rows=48,
               keep_layers="1", progress=False)
    return path


def cross_encoder_pairs(root: Path, teachers: dict[str, Path], rows: int = 90) -> Path:
    """A pair store written by the real precompute with cross-encoder teachers only (logits, no embedding)."""
    from kd.pipeline.precompute import precompute

    rng = np.random.default_rng(0)
    lines = ["a\tb\tlabel"] + [f"{' '.join(rng.choice(WORDS, 6))}\t{' '.join(rng.choice(WORDS, 6))}\t{i % 3}"
                               for i in range(rows)]
    (root / "pairs.tsv").write_text("\n".join(lines) + "\n")
    precompute([str(root / "pairs.tsv")], str(root / "store"), [f"{n}={p}" for n, p in teachers.items()],
               pair_columns="a,b", label_column="label", shard_rows=50, progress=False)
    return root / "store"


def train_students(store: Path, root: Path, specs: dict[str, tuple[str, list[str]]],
                   max_length: int) -> dict[str, Path]:
    """name -> (arch, extra train-student options): each trained 4 steps away from its initial weights at root/name."""
    from typer.testing import CliRunner

    from kd.cli import app

    out = {}
    for name, (arch, extra) in specs.items():
        out[name] = root / name
        res = CliRunner().invoke(app, ["train-student", "--shards", str(store), "--out", str(out[name]), "--arch",
                                       arch, "--target", "tiny.mean", "--max-steps", "4", "--lr", "1e-2",
                                       "--batch-size", "24", "--val-percent", "0", "--max-length", str(max_length),
                                       "--no-progress", *extra])
        assert res.exit_code == 0, (name, res.output)
    return out
