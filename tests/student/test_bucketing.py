"""Length-bucketed batches: much less padding, the same rows each epoch, and exact resume still holds."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from conftest import precompute_news

from kd.storage.store import Store
from kd.student import data as D


def _epoch(store: Store, bucket: bool) -> tuple[list[np.ndarray], float]:
    cfg = D.DataConfig(str(store.root), ["tiny.mean"], "tiny", batch_size=16, max_length=2048, val_percent=0.0,
                       shuffle_buffer=64, bucket=bucket)
    plan = D.build_plan(store, cfg)
    ids, real, slots = [], 0, 0
    for b in D.train_batches(store, plan, 0, 0):
        ids.append(b["id"].numpy())
        real += int(b["attention_mask"].sum())
        slots += b["attention_mask"].numel()
    return ids, 1 - real / slots


def test_bucketing_cuts_padding_and_keeps_every_row(tmp_path, tiny_teacher, sentences):
    store = Store.open(precompute_news(tmp_path, tiny_teacher, sentences, 300, 150))
    plain_ids, plain_pad = _epoch(store, False)
    ids, pad = _epoch(store, True)
    assert Counter(np.concatenate(ids).tolist()) == Counter(np.concatenate(plain_ids).tolist())
    assert [len(b) for b in ids] == [len(b) for b in plain_ids]  # the same number and sizes of batches
    assert pad < 0.5 * plain_pad, (pad, plain_pad)
    again, _ = _epoch(store, True)  # deterministic: a resumed run sees the same batches
    assert all(np.array_equal(a, b) for a, b in zip(ids, again))


def test_buckets_sort_by_tokens_not_characters(tmp_path, tiny_teacher, sentences):
    """Characters per token vary between texts (numbers, names, punctuation), so batches sorted by characters keep
    padding that sorting by the student's own token counts removes; the rows and batch sizes are unchanged."""
    store = Store.open(precompute_news(tmp_path, tiny_teacher, sentences, 600, 300))
    cfg = D.DataConfig(str(store.root), ["tiny.mean"], "tiny", batch_size=16, max_length=2048, val_percent=0.0,
                       shuffle_buffer=64, bucket=True)
    plan = D.build_plan(store, cfg)
    tok = D.Tokenize(cfg.tokenizer_path(store), cfg.max_length)

    def padding(tokens) -> tuple[float, list[int]]:
        rng = np.random.default_rng(0)
        batches = list(D.shuffled_rows(store, plan, plan.units(0, 0, 0), rng, tokens))
        counts = [tok.count(list(b["text"])) for b in batches]
        real, slots = sum(int(c.sum()) for c in counts), sum(int(c.max()) * len(c) for c in counts)
        return 1 - real / slots, sorted(np.concatenate([b["id"] for b in batches]).tolist())

    by_chars, rows_chars = padding(None)
    by_tokens, rows_tokens = padding(tok.count)
    assert rows_tokens == rows_chars
    assert by_tokens < 0.8 * by_chars, (by_tokens, by_chars)


def test_bucketed_padding_is_the_padding_of_the_trainer_s_batches(tmp_path, tiny_teacher, sentences):
    """What `kd distill --dry-run` scales a calibration step by (apps.distill.plan._padding_speedup): with every row
    in one shuffle buffer, the trainer's bucketed batches pad exactly as `bucketed_padding` says of their token
    counts; and a bigger pool of the same lengths pads less (the dry run's 128-row sample against a run's buffer)."""
    store = Store.open(precompute_news(tmp_path, tiny_teacher, sentences, 300, 150))
    cfg = D.DataConfig(str(store.root), ["tiny.mean"], "tiny", batch_size=16, max_length=2048, val_percent=0.0,
                       shuffle_buffer=10_000, bucket=True)
    plan = D.build_plan(store, cfg)
    tok = D.Tokenize(cfg.tokenizer_path(store), cfg.max_length)
    batches = list(D.shuffled_rows(store, plan, plan.units(0, 0, 0), np.random.default_rng(0), tok.count))
    counts = [tok.count(list(b["text"])) for b in batches]
    measured = 1 - sum(int(c.sum()) for c in counts) / sum(int(c.max()) * len(c) for c in counts)
    lengths = np.concatenate(counts)
    assert 0.005 < measured == pytest.approx(D.bucketed_padding(lengths, 16), abs=1e-12)
    draws = np.random.default_rng(1)
    small, big = (D.bucketed_padding(draws.choice(lengths, n), 16) for n in (128, 10_000))
    assert big < 0.5 * small, (small, big)
    assert D.bucketed_padding(np.array([1, 1, 1, 9]), 2) == pytest.approx(1 - 12 / 20)  # [1, 1] and [1, 9]
