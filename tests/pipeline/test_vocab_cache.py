"""Issue 50: the vocab output depends on the teacher alone, so it is computed once per machine (kd cache) and every
later store of that teacher, whatever its corpus, gets the same bytes without the pass; a damaged cached table is
computed again, never used."""

from __future__ import annotations

from pathlib import Path

import pytest
from single_thread import one_thread  # noqa: F401  (autouse: one thread, so vectors are reproducible)

from kd.pipeline.precompute import precompute
from kd.pipeline.teacher import vocab as V


def _store(root: Path, teacher: Path, texts: list[str], name: str) -> Path:
    src = root / f"{name}.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    precompute([str(src)], str(root / name), [f"tiny={teacher}"], outputs=["mean", "vocab"], progress=False)
    return root / name / "teachers" / "tiny" / V.VOCAB_FILE


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_second_corpus_reads_the_vocab_from_the_cache(tmp_path, cache, tiny_teacher, sentences, monkeypatch):
    first = _store(tmp_path, tiny_teacher, sentences[:40], "a")
    cached = list((cache / "vocab").glob("*.safetensors"))
    assert len(cached) == 1 and cached[0].read_bytes() == first.read_bytes()

    def no_pass(*a, **k):
        raise AssertionError("the vocab pass ran again")

    monkeypatch.setattr(V, "vocab_vectors", no_pass)
    second = _store(tmp_path, tiny_teacher, sentences[40:90], "b")  # another corpus, the same teacher
    assert second.read_bytes() == first.read_bytes()


def test_a_damaged_cached_table_is_computed_again(tmp_path, cache, tiny_teacher, sentences):
    first = _store(tmp_path, tiny_teacher, sentences[:40], "a")
    (cached,) = (cache / "vocab").glob("*.safetensors")
    cached.write_bytes(cached.read_bytes()[:-64])  # truncated
    second = _store(tmp_path, tiny_teacher, sentences[40:90], "b")
    assert second.read_bytes() == first.read_bytes() == cached.read_bytes()  # recomputed, and the cache mended
