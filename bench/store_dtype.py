"""Bytes per row of each stored output and `--dtype` (float32 | float16 | int8), and what int8/float16 cost in
fidelity, on real sentences.

    python -m bench.store_dtype [--teachers minilm,mpnet] [--rows 500] [--work /tmp/store-dtype]

1. the first `--rows` Leipzig news sentences (/work/shared/data/corpus/eng_news_2016_10K-sentences.txt);
2. per teacher and dtype, one `kd precompute --outputs cls,mean,sentence,layers --precision fp32 --dtype D`
   in a fresh process (the store as a user gets it: zstd Parquet shards, kd's own writer);
3. bytes of each output = the compressed bytes of its column chunks in the shard's Parquet footer (the int8
   scale column counted with its output), divided by the rows; `row` = the whole teacher shard file;
4. fidelity: per output, the lowest cosine between a row read back (int8 dequantized) and the float32 store's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from kd.storage.int8 import SCALE_SUFFIX
from kd.storage.schema import table_vectors
from kd.storage.store import Store

ROOT = Path(__file__).resolve().parents[1]
NEWS = Path("/work/shared/data/corpus/eng_news_2016_10K-sentences.txt")
OUTPUTS = ("sentence", "mean", "cls", "layers")
DTYPES = ("float32", "float16", "int8")


def build(src: Path, teacher: str, dtype: str, work: Path) -> Store:
    out = work / f"{teacher}-{dtype}"
    if not (out / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "kd", "precompute", str(src), "-t", teacher, "--outputs",
                        ",".join(OUTPUTS), "--precision", "fp32", "--dtype", dtype, "-o", str(out), "--no-progress"],
                       check=True, cwd=ROOT)
    return Store.open(out)


def column_bytes(store: Store, table: str) -> tuple[dict[str, float], float]:
    """(output -> compressed bytes per row, whole shard bytes per row) from the Parquet footers."""
    per, rows, total = defaultdict(int), 0, 0
    for rec in store.table(table).shards.values():
        md = pq.ParquetFile(store.path_of(rec.file)).metadata
        rows, total = rows + md.num_rows, total + rec.bytes
        for g in range(md.num_row_groups):
            for c in range(md.num_columns):
                col = md.row_group(g).column(c)
                per[col.path_in_schema.split(".")[0].removesuffix(SCALE_SUFFIX)] += col.total_compressed_size
    return {k: v / rows for k, v in per.items()}, total / rows


def min_cosine(ref: Store, other: Store, table: str, column: str) -> float:
    """Lowest cosine over rows (and layers) between two stores' copies of `column`."""
    a, b = (table_vectors(s.read_table(table), column) for s in (ref, other))
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teachers", default="minilm,mpnet")
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--work", default="/tmp/store-dtype")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"news-{a.rows}.txt"
    lines = NEWS.read_text(encoding="utf-8").splitlines()[: a.rows]
    src.write_text("\n".join(x.split("\t", 1)[1] for x in lines) + "\n", encoding="utf-8")
    lines, results = [], {}
    head = "| teacher | output | shape | " + " | ".join(f"{d} B/row" for d in DTYPES) + \
           " | int8 / float32 | min cosine float16 | min cosine int8 |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for teacher in a.teachers.split(","):
        stores = {d: build(src, teacher, d, work) for d in DTYPES}
        table = f"teachers/{next(iter(stores['float32'].manifest.teachers()))}"
        sizes = {d: column_bytes(s, table) for d, s in stores.items()}
        cols = stores["float32"].table(table).columns
        for o in [*OUTPUTS, "row"]:
            b = {d: (sizes[d][1] if o == "row" else sizes[d][0][o]) for d in DTYPES}
            cos = ["", ""] if o == "row" else \
                [f"{min_cosine(stores['float32'], stores[d], table, o):.6f}" for d in ("float16", "int8")]
            shape = "" if o == "row" else cols[o].removeprefix("float")
            lines.append(f"| {teacher} | {o} | {shape} | " + " | ".join(f"{b[d]:,.0f}" for d in DTYPES) +
                         f" | {b['int8'] / b['float32']:.2f} | {cos[0]} | {cos[1]} |")
            results[f"{teacher}.{o}"] = {"bytes_per_row": b, "min_cosine": cos}
    print("\n".join(lines))
    (work / "results.json").write_text(json.dumps({"rows": a.rows, "results": results,
                                                   "load": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
