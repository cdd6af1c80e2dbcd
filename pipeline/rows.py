"""Turn records into the store's `texts` rows: drop empties, optionally dedup, assign stable ids.

- An id is the first 8 bytes of blake2b(text, occurrence) as int64 (`common.ids`): the same text gets
  the same id in any store and any run, whatever file or line it came from. `occurrence` (0 for the
  first copy, 1 for the second...) keeps ids unique when duplicates are kept.
- With dedup, only the first occurrence of an exact duplicate is kept.
- With a sample fraction, only rows whose id is `in_sample` are kept (after dedup, so a sampled-out text's
  later copies are duplicates too): a uniform subset that every teacher's store of this corpus shares.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pyarrow as pa

from kd.common.ids import in_sample, text_id
from kd.common.ids import is_empty as _is_empty
from kd.common.ids import text_key as _key
from kd.pipeline.inputs import Records
from kd.storage.schema import texts_schema


@dataclass
class RowCounts:
    read: int = 0
    empty_dropped: int = 0
    duplicates_dropped: int = 0
    sampled_out: int = 0
    kept: int = 0

    def record(self) -> dict[str, int]:
        """The counts the manifest records (sampled_out only when sampling, so other stores stay as before)."""
        return {k: v for k, v in self.__dict__.items() if k != "sampled_out" or v}


def label_type(labels: list) -> pa.DataType | None:
    """int64 when every label is an integer, float64 when numeric, else string; None if no labels."""
    present = [x for x in labels if x is not None and x != ""]
    if not present:
        return None
    for kind, conv in ((pa.int64(), int), (pa.float64(), float)):
        try:
            if all(float(conv(x)) == float(x) for x in present):
                return kind
        except (TypeError, ValueError):
            continue
    return pa.string()


def build_texts(records: Records, dedup: bool, pairs: bool, sample: float | None = None) -> tuple[pa.Table, RowCounts]:
    counts = RowCounts(read=len(records.texts))
    positions = getattr(records, "positions", None) or [0] * len(records.texts)
    seen: Counter[str] = Counter()
    keep: list[int] = []
    ids: list[int] = []
    for i, text in enumerate(records.texts):
        if _is_empty(text):
            counts.empty_dropped += 1
            continue
        key = _key(text)
        if dedup and seen[key]:
            counts.duplicates_dropped += 1
            continue
        row_id = text_id(key, seen[key])
        seen[key] += 1
        if sample is not None and not in_sample(row_id, sample):
            counts.sampled_out += 1
            continue
        ids.append(row_id)
        keep.append(i)
    counts.kept = len(keep)
    ltype = label_type([records.labels[i] for i in keep])
    cols: dict[str, list] = {"id": ids}
    if pairs:
        cols["text_a"] = [records.texts[i][0] for i in keep]
        cols["text_b"] = [records.texts[i][1] for i in keep]
    else:
        cols["text"] = [records.texts[i] for i in keep]
    cols["doc_id"] = [records.doc_ids[i] for i in keep]
    cols["position"] = [positions[i] for i in keep]
    cols["source"] = [records.sources[i] for i in keep]
    if ltype is not None:
        conv = {pa.int64(): lambda x: int(float(x)), pa.float64(): float, pa.string(): str}[ltype]
        cols["label"] = [None if records.labels[i] in (None, "") else conv(records.labels[i]) for i in keep]
    return pa.Table.from_pydict(cols, schema=texts_schema(pairs, ltype)), counts
