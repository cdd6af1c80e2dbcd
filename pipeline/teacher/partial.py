"""A shard's finished batches, kept on disk while it is encoded: a killed precompute loses about a minute at most.

A shard (20,000 rows by default) is what a store commits, and mpnet on one CPU core takes ~30 min for one, so a kill
before the commit lost all of it (issue 50). While a shard is encoded, the vectors of its finished batches are
written every SPILL_SECONDS into the store, `.partial/<table>/<k>/part-<n>.safetensors` (append-only: each part
holds the batches finished since the last, so a minute's work costs one write of that minute's vectors). A rerun
reads the parts back when their key is this run's and runs only the other batches. A shard's batches depend only
on its rows (the token-budget plan is a function of their token counts), so every batch, run before or after the
kill, has the rows and padding of an uninterrupted run, and the committed shard is bit-identical to one.

The key (`partial_key`): the teacher's settings as the manifest compares them (weights, precision, backend, outputs,
stored dtype...), the shard's ids digest, the batch plan and the device (kernels differ between CPUs and GPUs).
A part of another key, or one that does not read back whole, is removed, never used. The parts go once the shard is
committed. Stores on a local disk only (an object store has no cheap appends; there the shard stays the unit).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, save

from kd.storage import fs

SPILL_SECONDS = 60.0
FOLDER = ".partial"
ROWS = "rows"  # a part's tensors are "<side>/rows" (the rows' indices in the shard) and "<side>/<output>"


def partial_key(settings: dict, ids_digest: str, batches: list[list[np.ndarray]], device: str) -> str:
    """What must be equal for kept batches to be this run's batches (see the module docstring)."""
    plan = hashlib.sha256()
    for side in batches:
        for b in side:
            plan.update(np.asarray(b, dtype=np.int64).tobytes() + b"|")
        plan.update(b"#")
    record = {"format": 1, "settings": settings, "ids": ids_digest, "plan": plan.hexdigest(), "device": device}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


class Partial:
    """The kept batches of one shard of one teacher table (a local store), read back and added to."""

    def __init__(self, root: str, table: str, k: int, key: str) -> None:
        self.folder = os.path.join(root, FOLDER, *table.split("/"), str(k))
        self.key = key
        self.pending: dict[str, list[np.ndarray]] = {}
        self.parts = 0
        self.last = time.monotonic()

    def restore(self) -> dict[str, tuple[np.ndarray, dict[str, np.ndarray]]]:
        """What the parts kept, per side (its suffix: "" or "_a"/"_b"): (row indices, {output: vectors of those
        rows}). Parts of another key, or damaged ones, are removed and nothing is kept."""

        names = sorted(n for n in _listing(self.folder) if n.startswith("part-") and n.endswith(".safetensors"))
        kept: dict[str, list[np.ndarray]] = {}
        try:
            for name in names:
                with open(os.path.join(self.folder, name), "rb") as f:
                    data = f.read()
                if _meta_key(data) != self.key:
                    raise ValueError("another key")
                for key, v in load(data).items():
                    kept.setdefault(key, []).append(v)
        except (OSError, ValueError, KeyError, SafetensorError):
            self.clear()
            return {}
        self.parts = len(names)
        rows: dict[str, np.ndarray] = {}
        vecs: dict[str, dict[str, np.ndarray]] = {}
        for key, parts in kept.items():
            side, _, name = key.partition("/")
            if name == ROWS:
                rows[side] = np.concatenate(parts)
            else:
                vecs.setdefault(side, {})[name] = np.concatenate(parts)
        return {side: (rows.get(side, np.zeros(0, np.int64)), vecs.get(side, {})) for side in rows.keys() | vecs.keys()}

    def add(self, suffix: str, idx: np.ndarray, vecs: Mapping[str, np.ndarray]) -> None:
        """One finished batch of a side; written out once SPILL_SECONDS have passed since the last write."""
        self.pending.setdefault(f"{suffix}/{ROWS}", []).append(np.asarray(idx, dtype=np.int64))
        for name, v in vecs.items():
            self.pending.setdefault(f"{suffix}/{name}", []).append(np.asarray(v, dtype=np.float32))
        if time.monotonic() - self.last >= SPILL_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Write the batches finished since the last part as one more part (temp file, fsync, rename)."""
        self.last = time.monotonic()
        if not self.pending:
            return
        tensors = {k: np.ascontiguousarray(np.concatenate(v)) for k, v in self.pending.items()}
        data = save(tensors, metadata={"key": self.key})
        fs.atomic_write_bytes(fs.resolve(self.folder), data, f"part-{self.parts:05d}.safetensors")
        self.parts += 1
        self.pending = {}

    def clear(self) -> None:
        self.pending, self.parts = {}, 0
        shutil.rmtree(self.folder, ignore_errors=True)


def clear_table(root: str, table: str) -> None:
    """Remove whatever a table's shards kept (after a run that committed them all)."""
    shutil.rmtree(os.path.join(root, FOLDER, *table.split("/")), ignore_errors=True)
    with contextlib.suppress(OSError):  # the folder goes with its last table; another writer's may remain
        os.removedirs(os.path.dirname(os.path.join(root, FOLDER, *table.split("/"))))


def _listing(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _meta_key(data: bytes) -> str | None:
    n = int.from_bytes(data[:8], "little")
    if not 0 < n <= len(data) - 8:
        raise ValueError("not a safetensors file")
    return json.loads(data[8 : 8 + n]).get("__metadata__", {}).get("key")
