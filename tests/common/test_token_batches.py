"""common/token_batches.py: the one sort -> cut -> run -> scatter loop, and every forward pass over texts uses it."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from package_modules import modules

from kd.common.token_batches import run_sorted, scatter_batches

ROOT = Path(__file__).resolve().parents[2]
HELPERS = {"scatter_batches", "run_batches", "run_sorted"}
# each forward pass over rows of mixed lengths: the teacher pass, a student's encode, the ONNX encoder and the
# fine-tuned models' predictions
CALLERS = ("pipeline/teacher/batches.py", "student/saved.py", "student/exporters/onnx_graph.py", "common/finetune.py")


def test_results_come_back_in_input_order_whatever_the_batching():
    lengths = np.random.default_rng(0).permutation(np.arange(1, 41))
    seen: list[np.ndarray] = []

    def run(idx: np.ndarray) -> np.ndarray:
        seen.append(idx)
        assert len(idx) * lengths[idx].max() <= 64  # the budget holds
        return np.stack([idx, lengths[idx]], axis=1).astype(np.float32)

    out = run_sorted(lengths, 64, run, 2, max_batch=5)
    assert out.dtype == np.float32 and out.tolist() == [[i, n] for i, n in enumerate(lengths)]
    assert len(seen) > 8 and lengths[seen[0]].max() == 40  # longest first, cut into many batches
    assert run_sorted(np.zeros(0, np.int64), 64, run, 3).shape == (0, 3)


def test_batches_in_flight_are_launched_before_the_oldest_is_fetched():
    events: list[str] = []

    def launch(idx: np.ndarray):
        events.append(f"launch {idx[0]}")
        return lambda: events.append(f"fetch {idx[0]}") or {"v": idx[:, None] * 1.0, "w": -idx[:, None] * 1.0}

    done: list[int] = []
    out = scatter_batches(6, [np.array([4, 1]), np.array([0, 5]), np.array([2, 3])], launch, in_flight=2,
                          on_batch=lambda idx: done.extend(idx.tolist()))
    assert events == ["launch 4", "launch 0", "fetch 4", "launch 2", "fetch 0", "fetch 2"]
    assert out["v"][:, 0].tolist() == list(range(6)) and out["w"][:, 0].tolist() == [-i for i in range(6)]
    assert done == [4, 1, 0, 5, 2, 3]


def _uses(tree: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(tree)
            if isinstance(n, (ast.Name, ast.Attribute))}


def test_every_forward_pass_over_texts_runs_through_the_helper():
    for rel in CALLERS:
        assert _uses(ast.parse((ROOT / rel).read_text(encoding="utf-8"))) & HELPERS, rel
    # nobody else loops over the planned batches by hand
    for path in modules().values():
        if path.relative_to(ROOT) == Path("common/token_batches.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.For, ast.comprehension)):
                assert "plan_batches" not in ast.unparse(node.iter), f"{path}: {ast.unparse(node.iter)}"

