"""A human summary of a store's manifest (what `kd info` prints)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from kd.storage.info_config import InfoConfig
from kd.storage.manifest import Manifest, TableRecord, plan_problems
from kd.storage.store import Store


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


def _rows_line(m: Manifest) -> str | Text:
    """The row plan, or, where its counts disagree with each other or with the shard records (a damaged or
    forged manifest), what disagrees: such numbers are never printed as the store's size."""
    problems = plan_problems(m)
    if problems:
        return Text.assemble(("unknown: the manifest's counts disagree", "red"),
                             " (" + "; ".join(problems) + "; run kd validate)")
    return f"{m.inputs.get('num_rows', 0):,} in {m.num_shards} shard(s) of {m.inputs.get('rows_per_shard', 0):,}"


def info(cfg: InfoConfig) -> Group:
    """`kd info`: the summary of `cfg.store` (`summary_table`)."""
    return summary_table(cfg.store)


def summary_table(store_path: str) -> Group:
    """The store (key: value lines), a table of its tables, then each table's columns and teacher on lines of
    their own: a table name is never cut and no cell wraps over many lines, even at 80 columns."""
    store = Store.open(store_path, sound=False)  # a damaged plan is shown as such (`_rows_line`), not refused
    m = store.manifest
    return Group(_head(store.root, m), _tables(m), *(_details(name, rec) for name, rec in sorted(m.tables.items())))


def _head(root: str, m: Manifest) -> Table:
    inputs = m.inputs
    head = Table.grid(padding=(0, 2))
    head.add_column(no_wrap=True)
    head.add_column(overflow="fold")  # a long path folds rather than being cut
    head.add_row("store", root)
    head.add_row("format version", str(m.required_version()))  # what its manifest records (merged copies: the default)
    head.add_row("fingerprint", m.fingerprint[:16])
    head.add_row("inputs", ", ".join(f["path"] for f in inputs.get("files", [])))
    head.add_row("rows", _rows_line(m))
    head.add_row("dropped", ", ".join(f"{k}={v}" for k, v in inputs.get("counts", {}).items()))
    head.add_row("versions", ", ".join(f"{k} {v}" for k, v in m.versions.items()))
    return head


def _tables(m: Manifest) -> Table:
    """Only short cells: the name column is as wide as the longest name and never wraps."""
    tables = Table(title="tables")
    tables.add_column("table", no_wrap=True, min_width=max((len(n) for n in m.tables), default=5))
    for col in ("kind", "shards", "rows", "MB"):
        tables.add_column(col, no_wrap=True, justify="left" if col == "kind" else "right")
    for name, rec in sorted(m.tables.items()):
        rows = sum(s.rows for s in rec.shards.values())
        mb = sum(s.bytes for s in rec.shards.values()) / 1e6
        tables.add_row(name, rec.kind, f"{len(rec.shards)}/{m.num_shards}", f"{rows:,}", f"{mb:.1f}")
    return tables


def _details(name: str, rec: TableRecord) -> Group:
    """A table's name, then its columns and (a teacher) its model and backend, each on its own line."""
    lines = Table.grid(padding=(0, 2))
    lines.add_column(no_wrap=True)
    lines.add_column()
    lines.add_row("  columns", ", ".join(c for c in rec.columns if c != "id"))
    if rec.kind == "teacher":
        meta = rec.meta
        lines.add_row("  model", f"{meta.get('architecture')} L={meta.get('num_layers')} d={meta.get('dim')} "
                      f"max_len={meta.get('max_length')} {meta.get('dtype')}")
        backend = backend_details(meta).strip()
        if backend:
            lines.add_row("  backend", backend)
    return Group(Text(name, style="bold"), lines)
