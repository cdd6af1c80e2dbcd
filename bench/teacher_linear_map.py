"""How far a linear map carries one stored teacher's vectors onto another's (issue 26).

The floor a cross-teacher student must beat: least squares from the source teacher's column (plus a bias) to
the target teacher's, fitted on the store's rows minus `kd leakage`'s ids and a held-out sample, scored as the
mean cosine on the held-out rows (what `--objective cosine` minimises as 1 - cos).

    python bench/teacher_linear_map.py bench/out/stronger-full/store --source minilm.sentence \
        --target mpnet.sentence --exclude bench/out/stronger-full/exclude.txt
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from kd.storage import Store
from kd.storage.schema import arrow_to_vectors


def column(store: Store, spec: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of `teacher.column`, shard by shard (checksums verified by the store reader)."""
    teacher, name = spec.split(".", 1)
    table = store.read_table(f"teachers/{teacher}", columns=["id", name])
    return table.column("id").to_numpy(), arrow_to_vectors(table.column(name))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("--source", default="minilm.sentence")
    ap.add_argument("--target", default="mpnet.sentence")
    ap.add_argument("--exclude", default=None, help="kd leakage --exclude-out file")
    ap.add_argument("--held-out", type=int, default=5000)
    a = ap.parse_args()
    store = Store.open(a.store)
    ids, x = column(store, a.source)
    ids_t, y = column(store, a.target)
    if not np.array_equal(ids, ids_t):
        raise SystemExit("the two teachers' rows are not aligned by id")
    if a.exclude:
        drop = {int(t) for t in Path(a.exclude).read_text().split() if t.lstrip("-").isdigit()}
        keep = np.fromiter((int(i) not in drop for i in ids), bool, len(ids))
        x, y = x[keep], y[keep]
    order = np.random.default_rng(0).permutation(len(x))
    fit, held = order[:-a.held_out], order[-a.held_out:]
    xb = np.c_[x, np.ones(len(x), np.float32)]
    w, *_ = np.linalg.lstsq(xb[fit], y[fit], rcond=None)
    pred = xb[held] @ w
    cos = (pred * y[held]).sum(1) / np.linalg.norm(pred, axis=1) / np.linalg.norm(y[held], axis=1)
    print(f"{a.source} -> {a.target}: fitted on {len(fit):,} rows; held-out {len(held):,}: "
          f"mean cosine {cos.mean():.4f} (1 - cos {1 - cos.mean():.4f})")


if __name__ == "__main__":
    main()
