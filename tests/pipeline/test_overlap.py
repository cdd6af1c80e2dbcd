"""Precompute overlaps its host work with the forward pass: the next unit is tokenized on another thread, the
next batch is launched before the last one's vectors are fetched, and a GPU forward leaves cuDNN's attention out
(common/attention.py). None of it may change a vector or the order of rows."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from kd.common.attention import varying_shape_attention
from kd.pipeline.backends.loading import load_teacher
from kd.pipeline.engines.local import _ahead
from kd.pipeline.teacher import batches
from kd.pipeline.teacher.model import Output, Teacher


def test_the_next_item_is_prepared_while_the_caller_works_on_this_one():
    started = {i: threading.Event() for i in range(4)}

    def prepare(i: int) -> int:
        started[i].set()
        return i * i

    seen = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        for i, squared in _ahead(pool, prepare, range(4)):
            # While item i is in the caller's hands, item i + 1 is being prepared (or done) already: without
            # the look-ahead this wait would time out.
            if i < 3:
                assert started[i + 1].wait(timeout=10), f"item {i + 1} was not prepared ahead of item {i}"
            seen.append((i, squared))
    assert seen == [(0, 0), (1, 1), (2, 4), (3, 9)]
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert list(_ahead(pool, prepare, [])) == []


def test_an_error_while_preparing_reaches_the_caller_at_that_item():
    def prepare(i: int) -> int:
        if i == 2:
            raise ValueError("bad item 2")
        return i

    got = []
    with ThreadPoolExecutor(max_workers=1) as pool, pytest.raises(ValueError, match="bad item 2"):
        for i, _ in _ahead(pool, prepare, range(5)):
            got.append(i)
    assert got == [0, 1]


def test_batches_are_launched_before_the_previous_ones_vectors_are_fetched(tiny_teacher, sentences, monkeypatch):
    teacher = load_teacher(str(tiny_teacher))
    texts = sentences[:200]
    events: list[tuple[str, int]] = []
    launch = Teacher.launch

    def recording_launch(self, enc, outputs):
        n = len([e for e in events if e[0] == "launch"])
        events.append(("launch", n))
        fetch = launch(self, enc, outputs)
        return lambda: events.append(("fetch", n)) or fetch()

    monkeypatch.setattr(Teacher, "launch", recording_launch)
    tokens = batches.tokenize(teacher, texts, batch_tokens=512)
    got = batches.forward_all(teacher, tokens, [Output.mean, Output.cls])
    monkeypatch.undo()

    n = len(tokens.sides[0].batches)
    assert n >= 5
    # launch 0, launch 1, fetch 0, launch 2, fetch 1, ...: one batch always queued behind the running one.
    steady = [e for i in range(1, n) for e in (("launch", i), ("fetch", i - 1))]
    expected = [("launch", 0), *steady, ("fetch", n - 1)]
    assert events == expected
    one_by_one = {k: np.stack([teacher.forward(teacher.fast.pad(batches._tokenize(teacher, [t], False)[0]),
                                               [Output.mean, Output.cls])[k][0] for t in texts[:20]])
                  for k in ("mean", "cls")}
    for k in ("mean", "cls"):
        assert got[k].shape == (200, teacher.dim)
        np.testing.assert_allclose(got[k][:20], one_by_one[k], atol=1e-5)  # rows back in input order


def test_a_gpu_forward_leaves_cudnn_attention_out_and_restores_the_settings():
    flags = (torch.backends.cuda.cudnn_sdp_enabled, torch.backends.cuda.flash_sdp_enabled,
             torch.backends.cuda.mem_efficient_sdp_enabled, torch.backends.cuda.math_sdp_enabled)
    before = [f() for f in flags]
    assert before[0], "PyTorch enables cuDNN attention by default"
    with varying_shape_attention("cuda"):
        assert [f() for f in flags] == [False, True, True, True]
    assert [f() for f in flags] == before
    with varying_shape_attention("cpu"):
        assert [f() for f in flags] == before
