"""Arrow schemas of the store's tables and conversions between numpy arrays and vector columns.

- Vectors are fixed-size lists (`fixed_size_list<float>[dim]`), per-layer states a fixed-size list
  of those, so every row of a column has the same shape and readers get a dense numpy array back
  with no copy per row.
- Parquet keeps the fixed size only in pyarrow's schema metadata: DuckDB reads such a column as
  FLOAT[] (a list). `dataset.query` casts it back to FLOAT[dim] in its views so that
  `array_cosine_similarity` works; on raw files use `list_cosine_similarity`.
- int8 columns carry a float32 scale column beside them (`storage.int8`): `vector_columns` writes both,
  `table_vectors` dequantizes, so every reader that goes through it sees float32 whatever the dtype.
"""

from __future__ import annotations

import re
from enum import Enum

import numpy as np
import pyarrow as pa
from safetensors.numpy import load

from kd.common.finite import MAX_ABS, OUT_OF_RANGE
from kd.storage.int8 import dequantize, quantize, scale_column


class VectorDType(str, Enum):
    """On-disk precision of vector columns (DuckDB 1.1+ reads float16 back as FLOAT; int8 has a scale column)."""

    float32 = "float32"
    float16 = "float16"
    int8 = "int8"

    @property
    def arrow(self) -> pa.DataType:
        return {"float32": pa.float32(), "float16": pa.float16(), "int8": pa.int8()}[self.value]


# Columns of the texts table in order. text_a/text_b replace text in pair stores.
TEXT_COLUMNS = ("id", "text", "doc_id", "position", "source", "label")
# `position` is a sentence's index in its document, or DOCUMENT for the whole document kept as a row beside its
# sentences (kd precompute --segment sentences+documents); any lower value is damage
DOCUMENT = -1
PAIR_COLUMNS = ("id", "text_a", "text_b", "doc_id", "position", "source", "label")


def texts_schema(pairs: bool, label_type: pa.DataType | None) -> pa.Schema:
    fields = [pa.field("id", pa.int64(), nullable=False)]
    if pairs:
        fields += [pa.field("text_a", pa.string(), nullable=False), pa.field("text_b", pa.string(), nullable=False)]
    else:
        fields.append(pa.field("text", pa.string(), nullable=False))
    fields += [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
    ]
    if label_type is not None:
        fields.append(pa.field("label", label_type))
    return pa.schema(fields)


def concat_shards(tables: list[pa.Table]) -> pa.Table:
    """Rows of several shards as one table. Schemas are unified, so a shard written with a column nullable that kd
    writes NOT NULL (the same values) joins the others instead of failing in pyarrow's words ('Schema at index 1
    was different'); a null where kd never writes one is each reader's values check (`soundness`)."""
    return pa.concat_tables(tables, promote_options="default")


def vector_type(shape: tuple[int, ...], dtype: VectorDType) -> pa.DataType:
    """fixed_size_list nested once per dimension of `shape` (row dimension excluded)."""
    t: pa.DataType = dtype.arrow
    for n in reversed(shape):
        t = pa.list_(t, n)
    return t


def vectors_to_arrow(x: np.ndarray, dtype: VectorDType) -> pa.Array:
    """(rows, *shape) numpy array -> nested fixed-size-list Arrow array, zero copy where possible."""
    flat = pa.array(np.ascontiguousarray(x, dtype=dtype.value).reshape(-1))
    arr: pa.Array = flat
    for n in reversed(x.shape[1:]):
        arr = pa.FixedSizeListArray.from_arrays(arr, n)
    return arr


def vector_columns(name: str, x: np.ndarray, dtype: VectorDType) -> dict[str, pa.Array]:
    """The column(s) that store vectors `x` as `name`: int8 adds its float32 scale column `<name>__scale`."""
    if dtype is not VectorDType.int8:
        return {name: vectors_to_arrow(x, dtype)}
    q, scale = quantize(x)
    return {name: vectors_to_arrow(q, dtype), scale_column(name): vectors_to_arrow(scale, VectorDType.float32)}


def column_types(name: str, shape: tuple[int, ...], dtype: VectorDType) -> dict[str, str]:
    """Manifest types of the column(s) `vector_columns` writes for per-row shape `shape`."""
    types = {name: type_name(vector_type(shape, dtype))}
    if dtype is VectorDType.int8:
        types[scale_column(name)] = type_name(vector_type(shape[:-1], VectorDType.float32))
    return types


def is_int8(t: pa.DataType) -> bool:
    """Whether a vector column holds int8 codes (innermost value type)."""
    while pa.types.is_fixed_size_list(t):
        t = t.value_type
    return pa.types.is_int8(t)


def with_scales(columns: list[str], available: list[str]) -> list[str]:
    """`columns` plus the scale column of each that has one in `available` (what a projected read needs)."""
    return columns + [scale_column(c) for c in columns if scale_column(c) in available]


def table_vectors(table: pa.Table | pa.RecordBatch, column: str, where: str | None = None) -> np.ndarray:
    """Column `column` of `table` as a float32 (rows, *shape) array; int8 is dequantized with its scale
    column (refused, naming `where`, when that is missing, non-finite or negative)."""
    col = table.column(column)
    if not is_int8(col.type):
        return arrow_to_vectors(col)
    sc = scale_column(column)
    scale = None
    if sc in table.schema.names:
        s = table.column(sc)
        scale = arrow_to_vectors(s) if vector_shape(s.type) else s.to_numpy(zero_copy_only=False)
    return dequantize(arrow_to_vectors(col, np.int8), scale, column, where)


def arrow_to_vectors(col: pa.Array | pa.ChunkedArray, dtype: np.dtype = np.float32) -> np.ndarray:
    """Nested fixed-size-list column -> (rows, *shape) numpy array."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    shape: list[int] = []
    t = col.type
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    if not shape:
        raise TypeError(f"expected a fixed-size-list vector column, got {col.type}")
    values = col
    for _ in shape:
        values = values.flatten()
    return values.to_numpy(zero_copy_only=False).astype(dtype, copy=False).reshape(len(col), *shape)


def vector_shape(t: pa.DataType) -> tuple[int, ...]:
    shape = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    return tuple(shape)


def canonical_type(name: str) -> str:
    """A declared column type in `type_name`'s form: stores (and test builders) written with pyarrow's own str()
    say `fixed_size_list<item: float>[8]` for `float[8]`."""
    while (m := _ARROW_FSL.search(name)) is not None:
        name = name[:m.start()] + f"{m.group(1)}[{m.group(2)}]" + name[m.end():]
    return name


_ARROW_FSL = re.compile(r"fixed_size_list<\w+: ([^<>\[\]]+(?:\[\d+\])*)>\[(\d+)\]")


def type_name(t: pa.DataType) -> str:
    """Canonical type string for manifests: list field names ('item' vs 'element') vary by writer."""
    if pa.types.is_fixed_size_list(t):
        return f"{type_name(t.value_type)}[{t.list_size}]"
    return str(t)


def unlike_declared(schema: pa.Schema, declared: dict[str, str]) -> list[tuple[str, str | None, str]]:
    """(column, its type in the file or None where it is missing, the declared type) for each declared column the
    file does not hold as declared: one comparison for validate, --repair and every reader (`Store.check_schema`)."""
    have = {f.name: type_name(f.type) for f in schema}
    out = []
    for col, typ in declared.items():
        want = canonical_type(typ)
        if have.get(col) != want:
            out.append((col, have.get(col), want))
    return out


def non_finite_columns(table: pa.Table) -> list[tuple[str, int, list]]:
    """(column, first ids of its bad rows) for every float vector column holding NaN/Inf (what an fp16 overflow
    or a damaged file writes) or a component beyond `common.finite.MAX_ABS` (a forged 3e38 is finite, and overflows
    the first norm): validate reports them, --repair drops their shard, readers refuse them."""
    import pyarrow.compute as pc

    out = []
    for f in table.schema:
        col = table[f.name]
        while pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type):
            col = pc.list_flatten(col)
        if f.name == "label" or not pa.types.is_floating(col.type):
            continue
        flat = col.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        with np.errstate(invalid="ignore"):
            ok = np.abs(flat) <= MAX_ABS  # NaN compares False
        if ok.all():
            continue
        per_row = max(1, len(flat) // max(1, table.num_rows))
        rows = np.unique(np.nonzero(~ok)[0] // per_row)
        ids = table["id"].to_pylist() if "id" in table.column_names else list(range(table.num_rows))
        out.append((f.name, len(rows), [ids[i] for i in rows[:3]]))
    return out


def tensors_problem(data: bytes) -> str | None:
    """What is wrong with the bytes of a per-teacher safetensors file (input embeddings, vocab, init weights):
    not safetensors, or a float tensor holding NaN/Inf or values past MAX_ABS (named); None when sound. Its
    checksum may hold (a forged record): one NaN there spreads through a student's every weight from its first
    step."""
    try:
        tensors = load(data)
    except Exception as e:  # safetensors raises its own error type for a bad header
        return f"not a readable safetensors file ({' '.join(str(e).split())[:120]})"
    bad = next((n for n, a in tensors.items() if a.dtype.kind == "f" and not _in_range(a)), None)
    return f"tensor {bad!r} holds {OUT_OF_RANGE}" if bad else None


def _in_range(a: np.ndarray) -> bool:
    """Every value finite and within MAX_ABS: a forged 3e38 is finite, and overflows the first PCA or norm."""
    with np.errstate(invalid="ignore"):
        return bool((np.abs(a) <= MAX_ABS).all())  # NaN compares False
