"""The one check of a store's row plan, tables and shards that `kd validate` and every reader share (issue 48).

A re-forged store (every checksum and ids digest made to match) passed the readers while `kd validate` refused it,
or passed both: train-student trained on a forged `num_rows`, `kd index` ran without a texts table. So what
validate refuses here, readers refuse too, at two costs (docs/design.md, "Readers refuse what validate refuses"):
- cheap, on every open and every shard read: the manifest alone (`manifest_problems`: row plan, texts table,
  `meta.dim` against the declared column types) and a shard's Parquet footer (`shard_problems`: rows, declared
  columns and types, undeclared extra columns);
- expensive, in `kd validate` and where a reader holds the values anyway: every id a content hash of its text
  and none twice (`id_problems`), every vector component finite and within `common.finite.MAX_ABS`, no negative
  token count, every text present, non-blank and within kd's 1 MiB (`values_problems`), a vocab output and
  input embeddings of the teacher's shape (`vocab_problem`, `embeddings_problem`);
- readers that do not hold every value (`kd query`, `kd index`, `kd train-student` reads only its targets) run
  validate's content checks once per store state (`require_sound_content`): the verdict is kept in the kd cache,
  keyed by the manifest (every shard's and file's sha256), so the next reader of that state pays a lookup.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from safetensors import SafetensorError
from safetensors.numpy import load
from tokenizers import Tokenizer

from kd.common.bert_config import bert_config_problem, init_type_problem, init_weights_problem
from kd.common.cache import cache_dir
from kd.common.errors import KdError, StoreError
from kd.common.finite import OUT_OF_RANGE
from kd.common.ids import text_id, text_key
from kd.common.inputs import MAX_TEXT_BYTES
from kd.common.parsing import has_auto_map, parse_json
from kd.storage.fs import Location, check_relative
from kd.storage.manifest import Manifest, plan_problems, teacher_table
from kd.storage.schema import (
    DOCUMENT,
    canonical_type,
    is_int8,
    non_finite_columns,
    table_vectors,
    type_name,
    unlike_declared,
)

if TYPE_CHECKING:  # store.py imports this module
    from kd.storage.store import Store

# Teacher columns pooled from hidden states: their innermost width is the teacher's `meta.dim`. (`sentence` may
# pass a sentence-transformers Dense layer of another width, `logits` has one value per label.)
HIDDEN_COLUMNS = ("cls", "mean", "layers")
_TEXT_COLUMNS = ("text", "text_a", "text_b")  # a null text is `_text_problem`'s, named by its row
_WIDTH = re.compile(r"^\w+\[(\d+)\]")
# A duplicate text whose earlier copy --sample dropped keeps its occurrence number (common.ids): how many more
# occurrences a row of a sampled store may be past the copies the store holds before it.
SAMPLED_OCCURRENCES = 64


DEFAULT_TARGETS = ("sentence", "mean")  # what precompute records (pipeline.teacher.model: a sentence-transformers
# teacher's own pooling, else the mean)


def manifest_problems(m: Manifest) -> list[str]:
    """What is wrong with a manifest on its own: its row plan (`plan_problems`), a missing texts table, a teacher
    table whose `meta.dim` is not the width of its hidden-state columns, whose default target is not one precompute
    records, or whose tokenizer or input embeddings are not a path inside the store. Each is a sentence naming the
    field."""
    out = list(plan_problems(m)) + _meta_path_problems(m)
    if "texts" not in m.tables:
        out.append("the manifest has no texts table (every table's rows are paired with it by id)")
    for teacher in sorted(m.teachers()):
        name = teacher_table(teacher)
        rec = m.tables[name]
        target = rec.meta.get("default_target")
        if target is not None and target not in DEFAULT_TARGETS:  # readers without --target take it
            out.append(f"{name}: meta.default_target is {target!r}, not one of {', '.join(DEFAULT_TARGETS)}")
        dim = rec.meta.get("dim")
        if dim is None:
            continue
        for col, typ in sorted(rec.columns.items()):
            width = _WIDTH.match(canonical_type(typ))
            if col.removesuffix("_a").removesuffix("_b") in HIDDEN_COLUMNS and width and int(width[1]) != dim:
                out.append(f"{name}: meta.dim is {dim!r} but column {col!r} is declared {canonical_type(typ)}")
    return out


def _meta_path_problems(m: Manifest) -> list[str]:
    """Teacher tables' `meta.tokenizer` and `meta.input_embeddings`: kd writes paths inside the store; '/etc' or
    '../../teacher' would have training read another folder's files under the store's checksums."""
    out = []
    for teacher in sorted(m.teachers()):
        meta = m.tables[teacher_table(teacher)].meta
        for field in ("tokenizer", "input_embeddings"):
            if meta.get(field) is not None:
                try:
                    check_relative(meta[field], "", f"{teacher_table(teacher)}: meta.{field}")
                except StoreError as e:
                    out.append(e.what)
    return out


def require_sound_manifest(loc: Location, m: Manifest) -> None:
    """Refuse a store whose manifest `manifest_problems` finds wrong, as every reader and every writer extending it
    does."""
    problems = manifest_problems(m)
    if problems:
        raise StoreError(f"the store's manifest is damaged: {problems[0]}", loc.path("manifest.json"),
                         f"run `kd validate {loc.root}` for every problem; `kd validate {loc.root} --repair` drops "
                         "a few shard records that disagree with the row plan (then re-run the kd precompute command "
                         "that wrote the store); any other damaged plan or table record cannot be repaired: write "
                         "the store again (a new --out, or --overwrite)")


def shard_problems(schema: pa.Schema, rows: int, recorded_rows: int, declared: dict[str, str]) -> list[str]:
    """What is wrong with a shard's footer against its record and its table's declared columns: another row count,
    a declared column missing or of another type, a column the manifest does not declare."""
    out = [f"{rows:,} rows, the manifest records {recorded_rows:,}"] if rows != recorded_rows else []
    out += [f"column {col!r} is missing" if have is None else f"column {col!r} is {have}, the manifest declares {want}"
            for col, have, want in unlike_declared(schema, declared)]
    out += [f"column {f.name!r} ({type_name(f.type)}) is not declared in the manifest"
            for f in schema if f.name not in declared]
    # Parquet allows a name twice; every reader would then pick one of the two by position
    twice = sorted(n for n, c in Counter(schema.names).items() if c > 1)
    return out + [f"column {n!r} appears twice" for n in twice]


def values_problems(name: str, table: pa.Table) -> list[str]:
    """What is wrong with the values of a shard of table `name` (its footer sound): vectors NaN/Inf or beyond
    `MAX_ABS`, int8 codes without a usable scale, a negative token count, texts that kd precompute never writes
    (null, blank, over 1 MiB)."""
    out = [f"column {c!r} holds {table[c].null_count} null(s), which kd never writes" for c in table.column_names
           if c != "label" and table[c].null_count and not (name == "texts" and c in _TEXT_COLUMNS)]
    out += [f"column {c!r} has {OUT_OF_RANGE} in {n} row(s), first ids {ids}"
            for c, n, ids in non_finite_columns(table)]
    out += _bad_scales(table)
    out += _negative(table, "n_tokens")
    if name == "texts":
        out += [p for c in ("text", "text_a", "text_b") if c in table.column_names
                for p in _text_problem(table, c)]
        out += _negative(table, "position", lowest=DOCUMENT)  # (a whole document's row: DOCUMENT, -1)
    return out


def _negative(table: pa.Table, column: str, lowest: int = 0) -> list[str]:
    """A count or position column (`n_tokens`, texts' `position` in its document) below `lowest` in some row."""
    if column not in table.column_names or not pa.types.is_integer(table[column].type):
        return []
    values = table[column].to_numpy(zero_copy_only=False)
    neg = np.nonzero(values < lowest)[0]
    said = "negative" if lowest == 0 else f"below {lowest}"
    return [f"column {column!r} is {said} in {len(neg)} row(s), first {int(values[neg[0]])} at row "
            f"{int(neg[0])}{_row_id(table, int(neg[0]))}"] if len(neg) else []


def _bad_scales(table: pa.Table) -> list[str]:
    """int8 columns whose scale column is missing, non-finite or negative (what `table_vectors` refuses)."""
    out = []
    for f in table.schema:
        if is_int8(f.type):
            try:
                table_vectors(table, f.name)
            except StoreError as e:
                out.append(e.what)
    return out


def _text_problem(table: pa.Table, column: str) -> list[str]:
    """The first text of `column` that is null, blank, or over MAX_TEXT_BYTES of UTF-8 (precompute drops blank
    texts and refuses long ones: such a row was written by something else)."""
    for i, text in enumerate(table[column].to_pylist()):
        if text is None or not text.strip():
            return [f"column {column!r} holds {'a null' if text is None else 'a blank'} text at row "
                    f"{i}{_row_id(table, i)}"]
        if len(text) > MAX_TEXT_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
            return [f"column {column!r} holds a text of {len(text):,} characters at row {i}{_row_id(table, i)}, "
                    f"over kd's limit of {MAX_TEXT_BYTES >> 20} MiB"]
    return []


def _row_id(table: pa.Table, i: int) -> str:
    return f" (id {table['id'][i].as_py()})" if "id" in table.column_names else ""


def id_problems(shards: dict[int, pa.Table], pairs: bool, sampled: bool, hashes: bool = True
                ) -> list[tuple[int, str]]:
    """(shard, what) for rows of the texts table (`shards` by number), in store order, whose id is there twice
    or (`hashes`: every texts shard is there, so occurrences count right) is not the content hash `kd precompute`
    gives its text (`common.ids`: blake2b of occurrence and text); the first of each kind. `sampled`: --sample
    may have dropped earlier copies of a text, so a few later occurrences are accepted. A null text is left to
    `values_problems`. 300,000 short texts take about a second (the hashing, in Python)."""
    order = sorted(shards)
    out = [p for p in [_duplicate_id(shards, order)] if p is not None]
    seen: dict[str, int] = {}
    for k in order if hashes else []:
        table = shards[k]
        cols = [table[c].to_pylist() for c in (("text_a", "text_b") if pairs else ("text",))]
        keys = cols[0] if not pairs else [None if None in side else text_key(side) for side in zip(*cols)]
        for i, (row_id, key) in enumerate(zip(table["id"].to_pylist(), keys)):
            if key is None:
                continue
            before = seen.get(key, 0)
            seen[key] = before + 1
            if text_id(key, before) != row_id and not (sampled and _is_hash(row_id, key, before, sampled)):
                return out + [(k, f"id {row_id} (row {i} of shard {k}) is not the content hash of its text "
                                  f"{_clip(key)!r}")]
    return out


def _duplicate_id(shards: dict[int, pa.Table], order: list[int]) -> tuple[int, str] | None:
    """The first row, in store order, whose id an earlier row has (one stable sort of every id)."""
    if not order:
        return None
    ids = np.concatenate([shards[k]["id"].to_numpy() for k in order])
    sort = np.argsort(ids, kind="stable")
    again = sort[1:][ids[sort[1:]] == ids[sort[:-1]]]  # each a later copy of the id before it in the sort
    if not len(again):
        return None
    pos = int(again.min())
    ends = np.cumsum([shards[k].num_rows for k in order])
    j = int(np.searchsorted(ends, pos, side="right"))
    k, row = order[j], pos - (int(ends[j - 1]) if j else 0)
    return k, f"id {int(ids[pos])} appears twice (row {row} of shard {k} and an earlier row)"


def _is_hash(row_id: int, key: str, before: int, sampled: bool) -> bool:
    last = before + (SAMPLED_OCCURRENCES if sampled else 0)
    return any(text_id(key, j) == row_id for j in range(before, last + 1))


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."


def vocab_problem(tensors: dict[str, Any], dim: Any, tokens: int | None = None) -> str | None:
    """What is wrong with a teacher's `vocab` output (pipeline.teacher.vocab: `vectors` [tokens, dim] float32 and
    `token_ids` 0..tokens-1 in order, a row per token id of its tokenizer), against the teacher's `meta.dim` and
    its tokenizer's size (`tokens`, None when unknown); None when it has that shape."""
    vecs, ids = tensors.get("vectors"), tensors.get("token_ids")
    if vecs is None or ids is None:
        return "the vocab output lacks its 'vectors' or 'token_ids' tensor"
    if vecs.ndim != 2 or vecs.dtype != np.float32 or len(vecs) == 0:
        return f"the vocab output's vectors are {vecs.dtype} {list(vecs.shape)}, not a float32 [tokens, dim] matrix"
    if isinstance(dim, int) and vecs.shape[1] != dim:
        return f"the vocab output's vectors are {vecs.shape[1]} wide, the teacher's dim is {dim}"
    if ids.shape != (len(vecs),):
        return f"the vocab output has {len(vecs):,} vectors but {ids.size:,} token ids"
    if ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= len(vecs):
        return (f"the vocab output's token ids run {ids.min()} to {ids.max()}, outside the tokenizer's "
                f"0 to {len(vecs) - 1}")
    if not np.array_equal(ids, np.arange(len(vecs))):  # a static student takes row t as token t's vector
        return "the vocab output's token ids are not 0, 1, 2, ... in order (a row per token id)"
    if tokens is not None and len(vecs) != tokens:
        return f"the vocab output has {len(vecs):,} rows, the teacher's tokenizer has {tokens:,} token ids"
    return None


# Model types whose word embeddings are as wide as their hidden states (the teacher's `meta.dim`); ALBERT and ELECTRA
# embed narrower (`embedding_size`), so their width is not checked.
HIDDEN_WIDE_EMBEDDINGS = ("bert", "roberta", "xlm-roberta", "mpnet", "distilbert", "camembert")


def embeddings_problem(tensors: dict[str, Any], tokens: int | None, width: int | None = None) -> str | None:
    """What is wrong with a teacher's input embeddings (`weight` [vocab, width] float, a row per token id of its
    tokenizer: `tokens` of them, None when unknown; `width` wide when known); None when it has that shape."""
    w = tensors.get("weight")
    if w is None:
        return "the input embeddings lack their 'weight' tensor"
    if w.ndim != 2 or w.dtype.kind != "f" or w.size == 0:
        return f"the input embeddings are {w.dtype} {list(w.shape)}, not a float [tokens, width] matrix"
    if tokens is not None and len(w) < tokens:
        return f"the input embeddings have {len(w):,} rows, the teacher's tokenizer has {tokens:,} token ids"
    if width is not None and w.shape[1] != width:
        return f"the input embeddings are {w.shape[1]} wide, the teacher's hidden states {width}"
    return None


VOCAB, EMBEDDINGS = "vocab.safetensors", "input_embeddings.safetensors"  # teachers/<name>/ files of a known shape
# The content checks' version: bump when they change, so every store state is checked again by the new ones.
CHECKS = 5
VERDICTS = "soundness"  # $KD_CACHE/soundness/<key>: a store state whose content checks all passed


def require_sound_content(store: Store) -> None:
    """Refuse a store whose content `kd validate` refuses (every shard's bytes, footer, ids and values, the texts'
    ids, the files the manifest records), with the error a reader of that part gives; checked once per store
    state. A sound verdict is remembered in the kd cache under a hash of the manifest (which holds every shard's
    and file's sha256, and every reader verifies them on read), never in the store: readers do not write into a
    store."""
    require_sound_manifest(store.loc, store.manifest)  # (Store.open checked it; `--add-to` builds its Store itself)
    mark = _verdict_path(store)
    if mark is not None and mark.is_file():
        return
    texts = {k: table for name, k, table in _shards(store) if name == "texts"}
    m = store.manifest
    for k, what in id_problems(texts, m.pairs, sampled(m), hashes=sorted(texts) == list(range(m.num_shards))):
        raise StoreError(f"the store's content is damaged: table 'texts': {what}",
                         store.loc.path(m.tables["texts"].shards[k].file),
                         content_fix(store.root, repairable=False))
    for rel in sorted(m.extras.get("files", {})):
        why = recorded_file_problem(store, rel, store.read_recorded(rel))  # checksum and NaN: read_recorded
        if why:
            raise StoreError(why, store.loc.path(rel), content_fix(store.root, repairable=True))
    if mark is not None:
        remember(mark)


def _shards(store: Store) -> Iterator[tuple[str, int, pa.Table]]:
    """(table, k, its rows) for every committed shard, texts first, each read as every reader reads it
    (`Store.read_checked`: checksum, footer, ids aligned with texts shard k) and refused for its values."""
    names = store.manifest.tables
    for name in [n for n in ("texts",) if n in names] + sorted(n for n in names if n != "texts"):
        for k, rec in sorted(names[name].shards.items()):
            table = pq.ParquetFile(pa.BufferReader(store.read_checked(name, k))).read()
            store.mark_verified(rec)
            wrong = values_problems(name, table)
            if wrong:
                raise StoreError(f"the store's content is damaged: shard {k} of table {name!r}: {wrong[0]}",
                                 store.loc.path(rec.file),
                                 content_fix(store.root, repairable=True))
            yield name, k, table


def sampled(m: Manifest) -> bool:
    """Whether --sample may have dropped earlier copies of a text (`id_problems` accepts later occurrences)."""
    return bool((m.inputs.get("options") or {}).get("sample")) or bool((m.inputs.get("counts") or {})
                                                                       .get("sampled_out"))


def recorded_file_problem(store: Store, rel: str, data: bytes) -> str | None:
    """What is wrong with the content of a recorded file whose bytes `data` were read and checked (None: sound)."""
    return file_content_problem(store.manifest, store.read_recorded, rel, data)


def file_content_problem(m: Manifest, read: Callable[[str], bytes], rel: str, data: bytes) -> str | None:
    """What is wrong with recorded file `rel` (bytes `data`) under manifest `m`: a vocab output or input
    embeddings unlike the teacher; a tokenizer JSON file that kd's parser refuses (a duplicate key, a 5,000-digit
    integer) or with an `auto_map` entry (code transformers would be pointed at); an init output's config.json
    that `common.bert_config` refuses. `read` reads another recorded file (`kd validate --repair` reads a store it
    cannot open yet). None: sound, or a file of no known shape."""
    if rel.endswith(".json") and rel.rsplit("/", 1)[0] in _tokenizer_folders(m):
        return tokenizer_json_problem(data)
    parts = rel.split("/")
    if len(parts) == 4 and parts[0] == "teachers" and parts[2].startswith("init-"):
        if parts[3] == "config.json":
            return init_config_problem(data)
        if parts[3] == "model.safetensors":
            return init_weights_file_problem(read, "/".join(parts[:3]), data)
    if len(parts) != 3 or parts[0] != "teachers" or parts[2] not in (VOCAB, EMBEDDINGS):
        return None
    rec = m.tables.get(teacher_table(parts[1]))
    tensors = load(data)
    tokens = _tokenizer_size(m, read, rec.meta.get("tokenizer") if rec else None)
    if parts[2] == EMBEDDINGS:
        meta = rec.meta if rec is not None else {}
        wide = meta.get("model_type") in HIDDEN_WIDE_EMBEDDINGS and isinstance(meta.get("dim"), int)
        return embeddings_problem(tensors, tokens, meta["dim"] if wide else None)
    return vocab_problem(tensors, rec.meta.get("dim") if rec is not None else None, tokens)


def tokenizer_json_problem(data: bytes) -> str | None:
    """What is wrong with a stored tokenizer's JSON file: what kd's parser refuses, or an `auto_map` entry (kd
    precompute stores tokenizers without one: transformers would look for Python code beside it)."""
    try:
        parsed = parse_json(data, "", "", StoreError)
    except StoreError as e:
        return e.what
    return "it has an auto_map entry (a pointer to Python code kd never runs)" if has_auto_map(parsed) else None


def init_config_problem(data: bytes) -> str | None:
    """What is wrong with a teacher's `init` output config.json (`common.bert_config`: a transformer-init student
    is built from its sizes, of a model type it takes), parse errors included."""
    try:
        cfg = parse_json(data, "", "", StoreError)
    except StoreError as e:
        return e.what
    return bert_config_problem(cfg) or init_type_problem(cfg)  # validate refused no type training refused (probe 7)


def init_weights_file_problem(read: Callable[[str], bytes], folder: str, data: bytes) -> str | None:
    """What is wrong with an init output's model.safetensors (bytes `data`) against its config.json (a config
    that is itself refused is reported by its own check)."""

    try:
        cfg = parse_json(read(f"{folder}/config.json"), "", "", StoreError)
    except (StoreError, KdError, OSError):
        return None
    if bert_config_problem(cfg) is not None or init_type_problem(cfg) is not None:
        return None  # the config's own check reports it
    try:
        shapes = {k: v.shape for k, v in load(data).items()}
    except SafetensorError as e:
        return f"it is not a safetensors file ({e})"
    return init_weights_problem(cfg, shapes)


def _tokenizer_folders(m: Manifest) -> set[str]:
    return {rec.meta["tokenizer"] for rec in m.tables.values() if isinstance(rec.meta.get("tokenizer"), str)}


def _tokenizer_size(m: Manifest, read: Callable[[str], bytes], folder: str | None) -> int | None:
    """How many token ids the tokenizer in `folder` has (its tokenizer.json, as `read` gives it; None where there
    is none or it does not parse: the tokenizer's own check reports that)."""
    rel = f"{folder}/tokenizer.json"
    if not folder or rel not in m.extras.get("files", {}):
        return None

    try:
        return Tokenizer.from_str(read(rel).decode()).get_vocab_size(with_added_tokens=True)
    except Exception:  # noqa: BLE001  (tokenizers raises its own exception type for a malformed file)
        return None


def content_fix(root: str, repairable: bool) -> str:
    """The fix for a content problem of the store at `root`: --repair where it drops the damaged part (and the
    rerun of precompute writes it again); ids unlike their texts cannot tell which of the two is wrong."""
    see = f"run `kd validate {root}` for every problem; "
    if repairable:
        return see + (f"`kd validate {root} --repair` drops the damaged shards and files, then re-run the kd "
                      "precompute command that wrote the store")
    return see + "ids and texts written by something else cannot be repaired: write the store again with kd " \
                 "precompute (a new --out, or --overwrite)"


def _verdict_path(store: Store) -> Path | None:
    """Where the verdict on the store's state is kept (None: no usable kd cache folder): a hash of the manifest
    (index records left out: `kd index` adds one without changing any value) and of every recorded file's
    state as the filesystem tells it without opening it (`_files_state`)."""
    state = json.loads(store.manifest.to_json())  # (fragments merge in any order: the key sorts its keys)
    state["extras"] = {k: v for k, v in state["extras"].items() if not k.startswith("index:")}
    key = hashlib.sha256(json.dumps([CHECKS, state, _files_state(store)], sort_keys=True).encode()).hexdigest()
    return cache_dir() / VERDICTS / key


def _files_state(store: Store) -> list[Any]:
    """Each committed shard's and recorded file's kind, identity, size, mtime and ctime (one lstat each): the manifest
    alone did not change when a shard was swapped for a FIFO or a symlink to /dev/zero, and a reader that does not
    read that shard took the earlier verdict (issue 48's probe). Readers that read a file verify its bytes anyway."""
    m, loc = store.manifest, store.loc
    rels = sorted(r.file for t in m.tables.values() for r in t.shards.values()) + sorted(m.extras.get("files", {}))
    if not loc.is_local:
        return [[i.type.value, i.size, i.mtime_ns] for i in loc.fs.get_file_info([loc.path(r) for r in rels])]
    out: list[Any] = []
    for rel in rels:
        try:
            st = os.lstat(loc.path(rel))
        except OSError:
            out.append(None)
            continue
        # ctime: set by the kernel on every write, so a byte changed in place with its mtime put back is a new state
        out.append([st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
    return out


def verdict_mark(*key: object) -> Path:
    """Where a sound verdict on `key` (JSON-able parts that bind the checked bytes) is kept in the kd cache."""
    return cache_dir() / VERDICTS / hashlib.sha256(json.dumps([CHECKS, *key], sort_keys=True).encode()).hexdigest()


def remember(mark: Path) -> None:
    """Write the verdict (an empty file, renamed into place); a cache that cannot be written only costs the next
    reader the check again."""
    with contextlib.suppress(OSError):
        mark.parent.mkdir(parents=True, exist_ok=True)
        tmp = mark.with_name(f".{mark.name}.{os.getpid()}.tmp")
        tmp.write_bytes(b"")
        os.replace(tmp, mark)
