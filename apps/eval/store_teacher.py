"""Teacher vectors read back from a store instead of running the teacher again.

- `lookup(texts)` returns the stored vectors of exactly these texts when the store holds every
  one of them (the first stored row of a text wins), else None so the caller runs the teacher;
- `sample(n)` returns n rows spread evenly over the store (texts and vectors), the set on which
  agreement and neighbour recall are measured.
In pair stores both sides count as texts, with the per-side columns (`sentence_a`, `sentence_b`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kd.common.errors import StoreError
from kd.common.finite import OUT_OF_RANGE, unusable_rows
from kd.storage import Store
from kd.storage.int8 import DAMAGED
from kd.storage.schema import table_vectors, with_scales

# Above this many rows a text->row map costs more memory than running the teacher on a task.
MAX_LOOKUP_ROWS = 5_000_000


@dataclass
class StoreTeacher:
    store: Store
    name: str
    target: str
    _index: dict[str, tuple[int, str]] | None = field(default=None, repr=False)

    @classmethod
    def open(cls, path: str, name: str | None = None, target: str | None = None) -> StoreTeacher:
        store = Store.open(path, content=True)  # its rows are the teacher's answers: what validate refuses is refused
        names = store.manifest.teachers()
        if name is None:
            if len(names) != 1:
                raise StoreError(f"the store holds {len(names)} teachers ({', '.join(names) or 'none'})", path,
                                 "name one with --teacher NAME")
            name = names[0]
        if name not in names:
            raise StoreError(f"the store has no teacher {name!r} (teachers: {', '.join(names) or 'none'})", path,
                             "pass one of its teachers to --teacher, or run kd precompute with it")
        meta = store.require_complete(f"teachers/{name}").meta
        target = target or meta.get("default_target", "mean")
        have = store.table(f"teachers/{name}").columns
        col = f"{target}_a" if store.manifest.pairs else target
        if col not in have:
            raise StoreError(f"teacher {name!r} has no stored column {col!r} (columns: {', '.join(have)})", path,
                             "pass --target with one of its vector columns")
        return cls(store, name, target)

    @property
    def meta(self) -> dict:
        return self.store.table(f"teachers/{self.name}").meta

    @property
    def num_rows(self) -> int:
        return int(self.store.manifest.inputs.get("num_rows") or self.store.dataset("texts").count_rows())

    def _sides(self) -> list[tuple[str, str]]:
        """(text column, vector column) pairs: one for single-text stores, two for pair stores."""
        if self.store.manifest.pairs:
            return [("text_a", f"{self.target}_a"), ("text_b", f"{self.target}_b")]
        return [("text", self.target)]

    def _vectors(self, column: str, rows: np.ndarray) -> np.ndarray:
        """The stored vectors of these rows; a NaN/Inf one is refused, naming its id (a measure over it would be
        undefined, and the table is damaged: every other reader of the store refuses it too)."""
        data = self.store.dataset(f"teachers/{self.name}")
        table = data.take(rows.astype(np.int64), columns=with_scales(["id", column], data.schema.names))
        where = self.store.loc.path(f"teachers/{self.name}")
        vecs = table_vectors(table, column, where)
        bad = unusable_rows(vecs)
        if len(bad):
            raise StoreError(f"{len(bad)} stored teacher vector(s) of column {column!r} hold {OUT_OF_RANGE}, first at "
                             f"row id {table['id'][int(bad[0])].as_py()}", where, DAMAGED)
        return vecs

    def sample(self, n: int) -> tuple[list[str], np.ndarray]:
        """n rows spread evenly over the store (all rows when it has fewer), first side of pairs."""
        total = self.num_rows
        rows = np.unique(np.linspace(0, total - 1, num=min(n, total)).round().astype(np.int64))
        text_col, vec_col = self._sides()[0]
        texts = self.store.dataset("texts").take(rows, columns=[text_col]).column(text_col).to_pylist()
        return texts, self._vectors(vec_col, rows)

    def lookup(self, texts: list[str]) -> np.ndarray | None:
        """Stored vectors for `texts`, or None if any text is not in the store."""
        if self.num_rows > MAX_LOOKUP_ROWS:
            return None
        if self._index is None:
            index: dict[str, tuple[int, str]] = {}
            for text_col, vec_col in reversed(self._sides()):
                col = self.store.read_table("texts", [text_col]).column(text_col).to_pylist()
                for i in range(len(col) - 1, -1, -1):
                    index[col[i]] = (i, vec_col)
            self._index = index
        hits = [self._index.get(t) for t in texts]
        if any(h is None for h in hits):
            return None
        out: np.ndarray | None = None
        for _, vec_col in self._sides():
            pos = [j for j, h in enumerate(hits) if h[1] == vec_col]  # type: ignore[index]
            if not pos:
                continue
            rows = np.asarray([hits[j][0] for j in pos])  # type: ignore[index]
            uniq, inv = np.unique(rows, return_inverse=True)
            vecs = self._vectors(vec_col, uniq)[inv]
            if out is None:
                out = np.empty((len(texts), vecs.shape[1]), dtype=np.float32)
            out[pos] = vecs
        return out
