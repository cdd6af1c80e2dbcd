"""student.setup: a training run reads each file of its set-up once (store, tokenizer, input embeddings,
vocab output, the --init student), however many epochs it trains."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import safetensors.numpy
from conftest import precompute_news
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)

import kd.storage.store as store_module
import kd.storage.tokenizer_files as tokenizer_files
from kd.pipeline.precompute import precompute
from kd.storage import fs
from kd.storage.store import Store
from kd.student import saved
from kd.student import setup as S
from kd.student import trainer as T

TINY = dict(embed_dim=8, hidden_dim=8, batch_size=8, val_percent=20, epochs=2, progress=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_teacher, sentences) -> Path:
    """A precomputed store with the files set-up reads: tokenizer, input embeddings and the vocab output."""
    root = tmp_path_factory.mktemp("setup")
    path = precompute_news(root, tiny_teacher, sentences, 48, 24)
    precompute([str(root / "news.txt")], str(path), [f"tiny={tiny_teacher}"], outputs=["vocab"], shard_rows=24,
               progress=False)
    return path


@pytest.fixture
def reads(monkeypatch) -> Counter:
    """Counts what a run reads: Store.open, tokenizer loads (by folder), files read through the store (by
    path relative to it) or by safetensors' own file reader, and student config.json reads."""
    seen: Counter = Counter()
    real_open, real_bytes, real_tok = Store.open.__func__, fs.read_bytes, tokenizer_files.load_tokenizer
    real_st, real_cfg = safetensors.numpy.load_file, saved.read_config

    def count(key, fn):
        def wrapped(*a, **kw):
            seen[key(*a, **kw)] += 1
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(Store, "open", classmethod(count(lambda cls, uri, **kw: "Store.open", real_open)))
    monkeypatch.setattr(fs, "read_bytes", count(lambda loc, *parts: "/".join(parts), real_bytes))
    tokenizer = count(lambda folder, *a, **kw: f"tokenizer {Path(folder).parent.name}", real_tok)
    for user in (tokenizer_files, store_module, saved):  # where it is defined, and the two modules that call it
        monkeypatch.setattr(user, "load_tokenizer", tokenizer)
    monkeypatch.setattr(safetensors.numpy, "load_file", count(lambda p, *a, **kw: Path(p).name, real_st))
    config = count(lambda p: f"config.json of {Path(p).name}", real_cfg)
    monkeypatch.setattr(saved, "read_config", config)
    monkeypatch.setattr(S, "read_config", config)
    return seen


def _checked(store, reads) -> None:
    """The store's content verdict made first (storage.soundness: one pass over a store state, remembered in the kd
    cache): what follows counts the set-up's own reads."""
    from kd.storage.soundness import require_sound_content

    require_sound_content(Store.open(store))
    reads.clear()


def test_each_set_up_file_is_read_once_over_two_epochs(store, tmp_path, reads):
    _checked(store, reads)
    out = T.train(T.TrainConfig(str(store), str(tmp_path / "a"), **TINY))
    assert reads["Store.open"] == 1
    assert reads["tokenizer tokenizers"] == 1  # set-up, validation and both epochs share one load
    assert reads["teachers/tiny/input_embeddings.safetensors"] == 1
    assert reads["input_embeddings.safetensors"] == 0  # never again by safetensors' file reader
    assert reads["tokenizers/tiny/tokenizer.json"] == 1  # its checksum, once
    assert (out / "config.json").exists()


def test_the_vocab_output_and_an_init_student_are_read_once(store, tmp_path, reads):
    _checked(store, reads)
    T.train(T.TrainConfig(str(store), str(tmp_path / "static"), arch="static", **TINY))
    assert reads["teachers/tiny/vocab.safetensors"] == 1 and reads["vocab.safetensors"] == 0
    assert reads["tokenizer tokenizers"] == 1  # SIF's token counts use the set-up's tokenizer too
    first = T.train(T.TrainConfig(str(store), str(tmp_path / "first"), max_steps=2, **TINY))
    reads.clear()
    T.train(T.TrainConfig(str(store), str(tmp_path / "second"), init=str(first), max_steps=2, **TINY))
    assert reads["config.json of first"] == 1 and reads["tokenizer first"] == 1
    assert reads["Store.open"] == 1 and reads["tokenizer tokenizers"] == 1
