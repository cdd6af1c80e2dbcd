"""The bytes of a faiss index file `kd index` writes, walked before faiss reads them.

faiss trusts every length a file states: it sizes a buffer from it, then reads; an HNSW neighbour or an IVF list
entry is used as an offset unchecked. So a hostile `.faiss` file (its checksum re-forged in the manifest) could
make `faiss.read_index` allocate terabytes or read out of bounds, and a well-formed one of another kind, dim or
size than the manifest records answered searches with wrong rows (issue 48's probe). This module walks the three
layouts `kd.dataset.index.make_index` writes (faiss's own serialisation, `faiss/impl/index_write.cpp`) and checks
each length and cross-reference against the record (kind, rows, dim) before faiss sees a byte:
- `IxFI` IndexFlatIP: header, then the rows * dim float32 codes;
- `IHNf` IndexHNSWFlat: header, the HNSW graph (levels, offsets, neighbours), then an IndexFlatIP storage;
- `IwFl` IndexIVFFlat: header, nlist and nprobe, an IndexFlatIP quantizer, an empty direct map, then the
  inverted lists (`ilar`, `full` or `sprs` sizes, each list's codes and positions).
Any other layout (another faiss version's, another metric) is refused: rebuilding the index writes this one.
"""

from __future__ import annotations

import struct

import numpy as np

FOURCC = {"flat": b"IxFI", "hnsw": b"IHNf", "ivf": b"IwFl"}
METRIC_INNER_PRODUCT = 0  # every kd index is inner product over unit vectors (cosine)
_HNSW_TAIL = 5  # int32 fields after the graph: entry point, max level, efConstruction, efSearch, a dummy


class LayoutError(ValueError):
    """The file is not laid out as the record says (the message says how)."""


def max_file_bytes(rows: int, dim: int) -> int:
    """An upper bound on an index file of `rows` vectors of `dim` floats, of any kind kd writes: checked before
    the file is read at all. The vectors once (twice leaves IVF centroids room), plus 4 KiB a row of graph or list
    bookkeeping (an HNSW row with M=32 takes ~270 bytes) and 1 MiB of headers."""
    return (1 << 20) + rows * (2 * 4 * dim + 4096)


def stored_vectors(data: bytes, kind: str, rows: int, dim: int) -> list[np.ndarray]:
    """The float32 row vectors the index stores (views on `data`, one array per flat storage or IVF list), after the
    whole file has been walked; a LayoutError says where it differs from a `kind` index of `rows` x `dim`."""
    return _walk(data, kind, rows, dim)[0]


def vectors_by_position(data: bytes, kind: str, rows: int, dim: int) -> np.ndarray:
    """[rows, dim]: the vector the index returns for position p at row p (an IVF list holds its rows in its own
    order, each with its position); checked as `stored_vectors`."""
    parts, positions = _walk(data, kind, rows, dim)
    if positions is None:
        return parts[0]
    out = np.empty((rows, dim), dtype=np.float32)
    for part, pos in zip(parts, positions):
        out[pos] = part
    return out


def _walk(data: bytes, kind: str, rows: int, dim: int) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """(stored vectors, and for IVF each list's positions) of the whole file, walked to its end."""
    if kind not in FOURCC:
        raise LayoutError(f"the record names an index kind {kind!r} kd does not write")
    r = _Reader(data)
    out = _ivf(r, rows, dim) if kind == "ivf" else ({"flat": _flat, "hnsw": _hnsw}[kind](r, rows, dim), None)
    if r.pos != len(data):
        raise LayoutError(f"{len(data) - r.pos} bytes follow the end of the index")
    return out


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise LayoutError(f"the file ends inside the {what} ({len(self.data)} bytes; {what} wants {n} at "
                              f"{self.pos})")
        self.pos += n
        return memoryview(self.data)[self.pos - n : self.pos]

    def scalar(self, fmt: str, what: str) -> int:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def vector(self, dtype: str, what: str, count: int | None = None) -> np.ndarray:
        """A length-prefixed vector, its length held to the bytes left (and to `count` when given)."""
        n = self.scalar("<Q", f"length of {what}")
        if count is not None and n != count:
            raise LayoutError(f"{what} holds {n} entries, not {count}")
        size = np.dtype(dtype).itemsize
        if n > (len(self.data) - self.pos) // size:
            raise LayoutError(f"{what} claims {n} entries, more than the file holds")
        return np.frombuffer(self.take(n * size, what), dtype=dtype)

    def fourcc(self, want: bytes, what: str) -> None:
        got = bytes(self.take(4, what))
        if got != want:
            raise LayoutError(f"the {what} is {_name(got)}, not {_name(want)}")


def _name(fourcc: bytes) -> str:
    kind = next((k for k, v in FOURCC.items() if v == fourcc), None)
    return f"{fourcc!r} (a {kind} index)" if kind else repr(fourcc)


def _header(r: _Reader, fourcc: bytes, rows: int, dim: int, what: str) -> None:
    r.fourcc(fourcc, f"{what} type")
    d, ntotal = r.scalar("<i", f"{what} dim"), r.scalar("<q", f"{what} size")
    r.take(16 + 1, f"{what} header")  # two unused int64s and is_trained
    metric = r.scalar("<i", f"{what} metric")
    if (d, ntotal, metric) != (dim, rows, METRIC_INNER_PRODUCT):
        raise LayoutError(f"the {what} holds {ntotal} vectors of dim {d} (metric {metric}); the record says {rows} "
                          f"of dim {dim} (inner product)")


def _flat(r: _Reader, rows: int, dim: int, what: str = "index") -> list[np.ndarray]:
    _header(r, FOURCC["flat"], rows, dim, what)
    return [r.vector("<f4", f"{what} vectors", rows * dim).reshape(rows, dim)]


def _hnsw(r: _Reader, rows: int, dim: int) -> list[np.ndarray]:
    _header(r, FOURCC["hnsw"], rows, dim, "index")
    r.vector("<f8", "HNSW level probabilities")
    cum = r.vector("<i4", "HNSW neighbours per level")
    levels = r.vector("<i4", "HNSW levels", rows)
    offsets = r.vector("<u8", "HNSW offsets", rows + 1)
    neighbours = r.vector("<i4", "HNSW neighbours")
    entry, max_level = r.scalar("<i", "HNSW entry point"), r.scalar("<i", "HNSW max level")
    r.take(4 * (_HNSW_TAIL - 2), "HNSW settings")
    _check_graph(cum, levels, offsets, neighbours, rows)
    if not -1 <= entry < rows or max_level != (int(levels.max()) - 1 if rows else -1):
        raise LayoutError(f"the HNSW entry point {entry} or top level {max_level} does not fit its {rows} rows")
    return _flat(r, rows, dim, "HNSW storage")


def _check_graph(cum: np.ndarray, levels: np.ndarray, offsets: np.ndarray, neighbours: np.ndarray,
                 rows: int) -> None:
    """faiss indexes `neighbours` by offsets[i] + cum[level] unchecked: each row's slice must be its own."""
    if len(cum) < 2 or cum[0] != 0 or np.any(np.diff(cum) < 0):
        raise LayoutError("the HNSW neighbours per level do not rise from 0")
    if rows and (levels.min() < 1 or levels.max() >= len(cum)):
        raise LayoutError(f"an HNSW level is outside 1..{len(cum) - 1}")
    spans = cum[levels].astype(np.uint64)
    if offsets[0] != 0 or not np.array_equal(np.diff(offsets), spans) or offsets[-1] != len(neighbours):
        raise LayoutError("the HNSW offsets do not match the rows' levels and the neighbour count")
    if len(neighbours) and (neighbours.min() < -1 or neighbours.max() >= rows):
        raise LayoutError(f"an HNSW neighbour is outside the index's {rows} rows")


def _ivf(r: _Reader, rows: int, dim: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    _header(r, FOURCC["ivf"], rows, dim, "index")
    nlist = r.scalar("<q", "IVF list count")
    r.take(8, "IVF nprobe")
    if not 1 <= nlist <= max(rows, 1):
        raise LayoutError(f"the IVF index has {nlist} lists for {rows} rows")
    _flat(r, nlist, dim, "IVF quantizer")  # centroids: a search only ranks lists by them, never rows
    out = []
    if r.scalar("<B", "IVF direct map") != 0 or len(r.vector("<i8", "IVF direct map")):
        raise LayoutError("the IVF index has a direct map (kd writes none)")
    sizes = _list_sizes(r, nlist, dim)
    if int(sizes.sum()) != rows:
        raise LayoutError(f"the IVF lists hold {int(sizes.sum())} rows, the record says {rows}")
    positions = []
    for n in map(int, sizes):
        out.append(np.frombuffer(r.take(n * dim * 4, "IVF list vectors"), dtype="<f4").reshape(n, dim))
        positions.append(np.frombuffer(r.take(n * 8, "IVF list positions"), dtype="<i8"))
    if rows and not np.array_equal(np.sort(np.concatenate(positions)), np.arange(rows)):
        raise LayoutError(f"the IVF lists do not hold each of the positions 0..{rows - 1} once")
    return out, positions


def _list_sizes(r: _Reader, nlist: int, dim: int) -> np.ndarray:
    """The number of rows in each inverted list (`full`: one size per list; `sprs`: (list, size) pairs)."""
    r.fourcc(b"ilar", "IVF lists type")
    if r.scalar("<q", "IVF list count") != nlist or r.scalar("<q", "IVF code size") != dim * 4:
        raise LayoutError(f"the IVF lists are not {nlist} lists of {dim} float32")
    form = bytes(r.take(4, "IVF lists form"))
    if form == b"full":
        sizes = r.vector("<u8", "IVF list sizes", nlist)
    elif form == b"sprs":
        pairs = r.vector("<u8", "IVF list sizes")
        if len(pairs) % 2 or np.any(pairs[::2] >= nlist) or len(np.unique(pairs[::2])) != len(pairs) // 2:
            raise LayoutError("the IVF sparse list sizes are not (list, size) pairs of distinct lists")
        sizes = np.zeros(nlist, dtype=np.uint64)
        sizes[pairs[::2].astype(np.int64)] = pairs[1::2]
    else:
        raise LayoutError(f"the IVF lists form is {form!r}, not b'full' or b'sprs'")
    if np.any(sizes > (len(r.data) - r.pos) // (dim * 4 + 8)):
        raise LayoutError("an IVF list claims more rows than the file holds")
    return sizes
