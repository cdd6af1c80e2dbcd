"""A human summary of a store's manifest (what `kd info` prints)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from kd.storage.manifest import Manifest
from kd.storage.store import Store
from kd.storage.validate import plan_problems


def backend_details(meta: dict) -> str:
    """The backend part of a teacher's details: e.g. " onnx int8 float32, min cosine 0.9886"; with --backend
    auto, what it chose and why (" torch bfloat16; auto: openvino none failed the fidelity check (...)")."""
    choice = meta.get("backend_choice")
    out = ""
    if meta.get("backend", "torch") != "torch":
        low = min((f["min_cosine"] for f in (meta.get("fidelity") or {}).values()), default=None)
        recipe = (meta.get("int8_recipe") or {}).get("method")  # openvino: static | weights
        out = (f" {meta['backend']} {meta.get('quantize')}" + (f" ({recipe})" if recipe else "")
               + f" {meta.get('precision')}" + (f", min cosine {low:.4f}" if low is not None else ""))
    elif choice:
        out = f" torch {meta.get('precision')}"
    return out + (f"; auto: {choice['reason']}" if choice else "")


def _rows_line(m: Manifest) -> str:
    """The row plan, or, where its counts disagree with each other or with the shard records (a damaged or
    forged manifest), what disagrees: such numbers are never printed as the store's size."""
    problems = plan_problems(m)
    if problems:
        return "[red]unknown: the manifest's counts disagree[/] (" + "; ".join(problems) + "; run kd validate)"
    return f"{m.inputs.get('num_rows', 0):,} in {m.num_shards} shard(s) of {m.inputs.get('rows_per_shard', 0):,}"


def summary_table(store_path: str) -> Group:
    store = Store.open(store_path)
    m = store.manifest
    inputs = m.inputs
    head = Table.grid(padding=(0, 2))
    head.add_row("store", store.root)
    head.add_row("format version", str(m.format_version))
    head.add_row("fingerprint", m.fingerprint[:16])
    head.add_row("inputs", ", ".join(f["path"] for f in inputs.get("files", [])))
    head.add_row("rows", _rows_line(m))
    head.add_row("dropped", ", ".join(f"{k}={v}" for k, v in inputs.get("counts", {}).items()))
    head.add_row("versions", ", ".join(f"{k} {v}" for k, v in m.versions.items()))
    tables = Table(title="tables")
    for col in ("table", "kind", "shards", "rows", "MB", "columns", "details"):
        tables.add_column(col)
    for name, rec in sorted(m.tables.items()):
        rows = sum(s.rows for s in rec.shards.values())
        mb = sum(s.bytes for s in rec.shards.values()) / 1e6
        details = ""
        if rec.kind == "teacher":
            details = (f"{rec.meta.get('architecture')} L={rec.meta.get('num_layers')} d={rec.meta.get('dim')} "
                       f"max_len={rec.meta.get('max_length')} {rec.meta.get('dtype')}")
            details += backend_details(rec.meta)
        cols = ", ".join(c for c in rec.columns if c not in ("id",))
        tables.add_row(name, rec.kind, f"{len(rec.shards)}/{m.num_shards}", f"{rows:,}", f"{mb:.1f}", cols, details)
    return Group(head, tables)
