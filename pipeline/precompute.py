"""`kd precompute`: run one or more teachers over a corpus once and commit their outputs as shards.

Algorithm:
- read + segment + dedup the inputs into the `texts` rows (or reload them from the store when this
  writer's texts shards are already committed: resumes skip spaCy);
- fingerprint the inputs (file hashes + options) so a store is never mixed with other inputs;
- cut rows into shards (`plan.ShardPlan`); this writer owns shards k % num_writers == index;
- for every owned shard and teacher not yet committed: length-sorted token-budget batches ->
  forward -> order restored -> Parquet written on a background thread, temp name + fsync + rename,
  then recorded in this writer's manifest fragment (the commit);
- finally publish the merged manifest. A killed run loses at most the shards in flight; the next run
  deletes the temp files it left, and a full disk is a clear error after which the rerun resumes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from kd.common import bounds as B
from kd.common.errors import InputError, StoreError
from kd.common.hardware import check_device
from kd.common.outputs import STORE, claim_output
from kd.common.progress import Bar
from kd.pipeline import backends
from kd.pipeline import inputs as inp
from kd.pipeline.batches import encode_all, input_embeddings
from kd.pipeline.plan import ShardPlan, writer_rank
from kd.pipeline.rows import RowCounts, build_texts
from kd.pipeline.segment import segment as split_sentences
from kd.pipeline.teacher import Output, Teacher
from kd.storage import fs
from kd.storage.manifest import Manifest, same_settings
from kd.storage.schema import VectorDType, type_name, vector_type, vectors_to_arrow
from kd.storage.store import FRAGMENTS, load_manifest, open_writer, shard_file


@dataclass
class PrecomputeSummary:
    store: str
    rows_total: int
    rows_computed: int = 0
    shards_written: int = 0
    shards_skipped: int = 0
    empty_dropped: int = 0
    duplicates_dropped: int = 0
    truncated: int = 0
    seconds: float = 0.0
    bytes_written: int = 0
    teachers: list[str] = field(default_factory=list)
    vocab_written: list[str] = field(default_factory=list)  # teachers whose `vocab` output was computed
    files_written: list[str] = field(default_factory=list)  # tokenizer / input-embedding files (re)written
    retried: int = 0  # --engine ray: units run again because the worker running them died

    @property
    def nothing_to_do(self) -> bool:
        return self.shards_written == 0 and not self.vocab_written and not self.files_written

    @property
    def rate(self) -> float:
        return self.rows_computed / self.seconds if self.seconds else 0.0


def inputs_header(files: list[str], options: dict) -> dict:
    digests = [{"path": p, "sha256": fs.file_sha256(p)} for p in files]
    blob = json.dumps({"files": [d["sha256"] for d in digests], "options": options}, sort_keys=True)
    return {"fingerprint": hashlib.sha256(blob.encode()).hexdigest(), "files": digests, "options": options}


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("kd", "torch", "transformers", "tokenizers", "pyarrow", "spacy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def _teacher_outputs(t: Teacher, asked: list[str] | None) -> list[Output]:
    if not asked:
        return t.default_outputs()
    outs = []
    for o in asked:
        try:
            out = Output(o)
        except ValueError:
            choices = ", ".join([x.value for x in Output] + ["vocab", "init"])
            raise InputError(f"unknown output {o!r}", "--outputs", f"choose from {choices}") from None
        if out not in t.available():
            why = ("it has no classification head (fine-tune one with kd finetune-teacher)" if out is Output.logits
                   else "it is not a sentence-transformers directory")
            raise InputError(f"teacher {t.name!r} cannot produce {o!r}: {why}", "--outputs",
                             f"drop {o!r} or choose from {', '.join(x.value for x in t.available())}")
        outs.append(out)
    return outs


def _columns(t: Teacher, outputs: list[Output], pairs: bool, dtype: VectorDType) -> dict[str, str]:
    shapes = {Output.cls: (t.dim,), Output.mean: (t.dim,), Output.sentence: (t.dim,),
              Output.layers: (t.num_layers + 1, t.dim), Output.logits: (len(t.label_names or []),)}
    cols = {"id": "int64", "n_tokens": "int32", "truncated": "bool"}
    sides = ("",) if (not pairs or t.has_head) else ("_a", "_b")
    for o in outputs:
        for s in sides:
            cols[o.value + s] = type_name(vector_type(shapes[o], dtype))
    return cols


def _load_rows(files, spec, segment, spacy_model, dedup) -> tuple[pa.Table, RowCounts]:
    records = inp.read_inputs(files, spec)
    if segment == "sentences":
        if spec.pair:
            raise InputError("--segment sentences splits documents; it cannot be used with --pair-columns")
        records = split_sentences(records, spacy_model)
    table, counts = build_texts(records, dedup, pairs=spec.pair is not None)
    if table.num_rows == 0:
        raise InputError(f"no text left to encode ({counts.read} read, {counts.empty_dropped} empty)",
                         ", ".join(files), "check --text-column and that the files are not empty")
    return table, counts


def _reload_rows(existing: Manifest, loc: fs.Location, owned: list[int]) -> pa.Table | None:
    """This writer's texts shards from the store, if all are committed (a resume skips spaCy)."""
    rec = existing.tables.get("texts")
    if rec is None or not all(k in rec.shards for k in owned):
        return None
    from kd.storage.store import Store

    store = Store(loc, existing)  # verified reads: a tampered texts shard must not be encoded by a new teacher
    return pa.concat_tables([store.read_shard("texts", k) for k in owned])


def precompute(
    inputs: list[str], out: str, teachers: list[str], *, outputs: list[str] | None = None,
    segment: str = "none", spacy_model: str | None = None, text_column: str | None = None,
    pair_columns: str | None = None, label_column: str | None = None, delimiter: str | None = None,
    dedup: bool = False, batch_tokens: int | None = None, max_length: int | None = None, shard_rows: int = 20000,
    num_shards: int | None = None, shard_index: int | None = None, dtype: str = "float32",
    precision: str = "auto", device: str | None = None, overwrite: bool = False, progress: bool = True,
    keep_layers: str | None = None, backend: str = "torch", quantize: str = "none", threads: int | None = None,
    allow_low_fidelity: bool = False, engine: str = "local", ray_address: str | None = None,
    workers: int | None = None, gpus_per_worker: float | None = None,
) -> PrecomputeSummary:
    """Run `teachers` over `inputs` and write/extend the store at `out`. See the module docstring;
    `engine="ray"`: pipeline/ray_engine.py."""
    from kd.pipeline import ray_engine

    t0 = time.perf_counter()
    # Options first: nothing may be read, loaded or created before they are known to be usable.
    B.check("kd precompute options", ("--shard-rows", shard_rows, B.ROWS),
            ("--batch-tokens", batch_tokens, B.BATCH_TOKENS), ("--max-length", max_length, B.TOKENS),
            ("--num-shards", num_shards, B.SHARDS), ("--shard-index", shard_index, B.SHARD_INDEX),
            ("--threads", threads, B.THREADS), ("--workers", workers, B.RAY_WORKERS),
            ("--gpus-per-worker", gpus_per_worker, B.GPU_SHARE))
    if engine == "local":  # (Ray workers check their own GPUs: this driver may have none)
        check_device(device)
    if os.path.isfile(out):
        raise InputError("--out is an existing file, not a store folder", out, "pass a folder path")
    if segment not in B.choices(B.Segment):
        raise InputError(f"unknown --segment {segment!r}", None, "use none (whole documents) or sentences")
    if not teachers:
        raise InputError("no teacher given", None, "pass --teacher minilm (or a checkpoint directory)")
    vdtype = VectorDType(dtype)
    backends.check_options(backend, quantize, precision, device)
    ray_opts = ray_engine.options(engine, ray_address, workers, gpus_per_worker, num_shards, shard_index, device)
    files = inp.expand_inputs(inputs)
    if fs.resolve(out).is_local:  # never an input's folder, a student or an export; --overwrite: only a store
        claim_output(out, "kd precompute", (STORE,), files, overwrite=overwrite)
    spec = inp.ColumnSpec(text_column, inp.parse_pair_columns(pair_columns), label_column, delimiter)
    options = {"text_column": text_column, "pair_columns": spec.pair, "label_column": label_column,
               "segment": segment, "spacy_model": spacy_model if segment == "sentences" else None,
               "dedup": dedup, "shard_rows": shard_rows, "delimiter": delimiter}
    header_inputs = inputs_header(files, options)
    index, count = writer_rank(num_shards, shard_index)
    load = dict(backend=backend, quantize=quantize, device=device, precision=precision, max_length=max_length,
                threads=threads, allow_low_fidelity=allow_low_fidelity)
    # --engine ray: Ray workers encode; this process keeps a CPU copy (tokenizer, embeddings, vocab, init)
    loaded = [backends.load(t, **(ray_engine.driver_load(load) if ray_opts else load)) for t in teachers]
    names = [t.name for t in loaded]
    if len(set(names)) != len(names):
        raise InputError(f"two teachers share a name ({', '.join(names)})", "--teacher", "name them: --teacher a=PATH")
    # `vocab` is per teacher, not per row: computed apart from the row outputs, and on its own (no row
    # recompute) when it is the only output asked of a teacher the store already has.
    want_vocab = bool(outputs) and "vocab" in outputs
    want_init = bool(outputs) and "init" in outputs
    row_outputs = [o for o in outputs if o not in ("vocab", "init")] if outputs else None
    touts = {t.name: _teacher_outputs(t, row_outputs) for t in loaded}  # fail on bad --outputs before reading

    loc = fs.resolve(out)
    existing = load_manifest(loc) if fs.exists(loc) else None
    if (want_vocab or want_init) and not row_outputs and existing is not None:
        touts = {t.name: _stored_outputs(existing, t, touts[t.name]) for t in loaded}
    same = existing is not None and existing.fingerprint == header_inputs["fingerprint"]
    rows = None
    if same:
        plan = ShardPlan(existing.inputs["num_rows"], shard_rows)
        rows = _reload_rows(existing, loc, plan.owned(index, count))
        counts = RowCounts(**existing.inputs["counts"])
    if rows is None:
        table, counts = _load_rows(files, spec, segment, spacy_model, dedup)
        plan = ShardPlan(table.num_rows, shard_rows)
        rows = pa.concat_tables([table.slice(*_span(plan, k)) for k in plan.owned(index, count)]) \
            if plan.owned(index, count) else table.slice(0, 0)
    pairs = spec.pair is not None
    header = Manifest({**header_inputs, "pairs": pairs, "num_rows": plan.num_rows, "rows_per_shard": shard_rows,
                       "num_shards": plan.num_shards, "counts": counts.__dict__}, versions=package_versions())
    writer_id = f"writer-{index:05d}-of-{count:05d}"
    with _disk_full_is_clear(out):
        writer = open_writer(out, header, writer_id, overwrite)
        try:
            _remove_own_temps(writer, writer_id, names, plan.owned(index, count))
            if ray_opts:
                summary = ray_engine.write(ray_opts, out, dict(zip(names, teachers)), load, writer, loaded, touts,
                                           rows, plan, pairs, vdtype, batch_tokens, counts, progress, t0)
            else:
                summary = _write(writer, loaded, touts, rows, plan, index, count, pairs, vdtype, batch_tokens,
                                 counts, progress, t0)
            if want_vocab and index == 0:
                summary.vocab_written = [t.name for t in loaded if _write_vocab(writer, t, progress)]
            if want_init and index == 0:
                summary.vocab_written += [f"{t.name} layers {keep_layers or 'default'}" for t in loaded
                                          if _write_init(writer, t, keep_layers)]
            if (want_vocab or want_init) and index == 0:
                writer.publish()
                summary.seconds = time.perf_counter() - t0
            return summary
        finally:
            writer.close()


@contextlib.contextmanager
def _disk_full_is_clear(out: str) -> Iterator[None]:
    """Turn a full disk (ENOSPC/EDQUOT, raised by any write) into a clear error; other OSErrors pass.

    Nothing is half-written: atomic writes remove their temp file, committed shards stay committed, and
    the rerun resumes with the shard that failed.
    """
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise StoreError(f"the disk is full ({e.strerror}) while writing the store", out,
                         "free some space (or use an --out on another disk) and rerun the same command: "
                         "it resumes with the shards not yet committed") from e


def _remove_own_temps(writer, writer_id: str, teachers: list[str], owned: list[int]) -> None:
    """Delete temp files a killed or failed run of this writer left (its shards and fragment; any older
    than an hour elsewhere), so they do not take disk space forever."""
    mine = {shard_file(table, k) for k in owned for table in ["texts", *(f"teachers/{t}" for t in teachers)]}
    fs.remove_temps(writer.loc, mine | {f"{FRAGMENTS}/{writer_id}.json"})


def _stored_outputs(existing: Manifest, t: Teacher, default: list[Output]) -> list[Output]:
    """The row outputs the store already holds for teacher `t` (so `--outputs vocab` changes nothing else)."""
    rec = existing.tables.get(f"teachers/{t.name}")
    stored = (rec.meta.get("outputs") if rec else None) or []
    return [Output(o) for o in stored] or default


def _write_init(writer, t: Teacher, keep_layers: str | None) -> bool:
    """Write teachers/<name>/init-<layers>/ (embeddings + kept layers, config) once, checksummed."""
    from kd.pipeline.keep_layers import folder_name, init_files, parse_layers

    layers = parse_layers(keep_layers, t.num_layers)
    base = f"teachers/{t.name}/{folder_name(layers)}"
    known = writer.manifest.extras.get("files", {})
    if all(f"{base}/{f}" in known and fs.exists(writer.loc, base, f) for f in ("model.safetensors", "config.json")):
        return False
    files = {f"{base}/{name}": data for name, data in init_files(t, layers).items()}
    for rel, data in files.items():
        fs.atomic_write_bytes(writer.loc, data, *rel.split("/"))
    writer.set_extra("files", {**known, **{rel: fs.sha256(data) for rel, data in files.items()}})
    return True


def _write_vocab(writer, t: Teacher, progress: bool) -> bool:
    """Write teachers/<name>/vocab.safetensors once (with its sha256 in the manifest); False if present."""
    from kd.pipeline.vocab import VOCAB_FILE, vocab_bytes

    rel = f"teachers/{t.name}/{VOCAB_FILE}"
    if rel in writer.manifest.extras.get("files", {}) and fs.exists(writer.loc, *rel.split("/")):
        return False
    with Bar(f"vocab {t.name}", len(t.tokenizer), "tokens", progress) as bar:
        data = vocab_bytes(t, on_batch=bar.advance)
    fs.atomic_write_bytes(writer.loc, data, *rel.split("/"))
    writer.set_extra("files", {**writer.manifest.extras.get("files", {}), rel: fs.sha256(data)})
    return True


def _span(plan: ShardPlan, k: int) -> tuple[int, int]:
    lo, hi = plan.bounds(k)
    return lo, hi - lo


def _write(writer, loaded, touts, rows, plan, index, count, pairs, vdtype, batch_tokens, counts, progress, t0):
    existing = load_manifest(writer.loc)
    summary = PrecomputeSummary(writer.loc.root, plan.num_rows, empty_dropped=counts.empty_dropped,
                                duplicates_dropped=counts.duplicates_dropped, teachers=[t.name for t in loaded])
    writer.declare("texts", "texts", {f.name: type_name(f.type) for f in rows.schema}, {"pairs": pairs})
    for t in loaded:
        declare_teacher(writer, existing, t, touts[t.name], pairs, vdtype, t.meta(touts[t.name], vdtype.value))
        if index == 0:
            summary.files_written += _save_teacher_files(writer, t)
    owned = plan.owned(index, count)
    done = existing.tables if existing else {}
    todo = [(k, t) for k in owned for t in [None, *loaded]
            if k not in (done.get("texts" if t is None else f"teachers/{t.name}").shards
                         if done.get("texts" if t is None else f"teachers/{t.name}") else {})]
    summary.shards_skipped = len(owned) * (1 + len(loaded)) - len(todo)
    offsets = {k: i for i, k in enumerate(owned)}
    total = sum(plan.bounds(k)[1] - plan.bounds(k)[0] for k, t in todo if t is not None)
    pending: list[Future] = []
    with ThreadPoolExecutor(max_workers=1) as pool, Bar("precompute", total, "rows", progress) as bar:
        for k, t in todo:
            lo = offsets[k] * plan.shard_rows
            shard = rows.slice(lo, plan.bounds(k)[1] - plan.bounds(k)[0])
            if t is None:
                pending.append(pool.submit(writer.commit, "texts", k, shard))
                continue
            table, truncated = encode_shard(t, touts[t.name], k, shard, pairs, vdtype, batch_tokens, bar.advance)
            summary.truncated += truncated
            summary.rows_computed += table.num_rows
            # Bound memory: at most one shard waits for the writer thread while the next is computed.
            while len(pending) > 1:
                summary.bytes_written += pending.pop(0).result().bytes
            pending.append(pool.submit(writer.commit, f"teachers/{t.name}", k, table))
        for f in pending:
            summary.bytes_written += f.result().bytes
    summary.shards_written = len(todo)
    writer.publish()
    summary.seconds = time.perf_counter() - t0
    return summary


def declare_teacher(writer, existing: Manifest | None, t: Teacher, outputs: list[Output], pairs: bool,
                    vdtype: VectorDType, meta: dict) -> None:
    """Declare table teachers/<name> with `meta` (what the encoding process reports), refusing a store that
    already has this teacher written with other settings."""
    name = f"teachers/{t.name}"
    old = existing.tables.get(name) if existing else None
    if old is not None and old.meta and not same_settings(old.meta, meta):
        raise StoreError(f"the store already has teacher {t.name!r} written with other settings",
                         writer.loc.root, "use another name (--teacher NEW=PATH), a new --out, or --overwrite")
    writer.declare(name, "teacher", _columns(t, outputs, pairs, vdtype), meta)


def encode_shard(t: Teacher, outputs: list[Output], k: int, shard: pa.Table, pairs: bool, vdtype: VectorDType,
                 batch_tokens: int, on_batch=None) -> tuple[pa.Table, int]:
    """Shard k of teacher table `t` from its `texts` shard: (the table to commit, how many rows were truncated).
    Non-finite vectors are refused before anything is committed."""
    texts = (list(zip(shard["text_a"].to_pylist(), shard["text_b"].to_pylist())) if pairs
             else shard["text"].to_pylist())
    vecs, n_tokens = encode_all(t, texts, outputs, batch_tokens, on_batch=on_batch)
    _refuse_non_finite(t.name, k, shard, texts, vecs, vdtype)
    trunc = n_tokens > t.max_length
    cols = {"id": shard["id"], "n_tokens": pa.array(n_tokens), "truncated": pa.array(trunc)}
    cols |= {c: vectors_to_arrow(v, vdtype) for c, v in vecs.items()}
    return pa.table(cols), int(trunc.sum())


def _refuse_non_finite(teacher: str, k: int, shard: pa.Table, texts: list, vecs: dict, vdtype) -> None:
    """Stop before committing NaN/Inf vectors (an fp16 overflow, a broken checkpoint): they would train an
    all-NaN student without any error. Checked in the stored dtype, so float16 overflow is caught too."""
    import numpy as np

    for col, v in vecs.items():
        bad = ~np.isfinite(np.asarray(v).astype(np.float16 if vdtype.value == "float16" else np.float32))
        rows = np.nonzero(bad.reshape(len(bad), -1).any(axis=1))[0]
        if len(rows):
            ids = shard["id"].to_pylist()
            show = "; ".join(f"id {ids[i]}: {str(texts[i])[:60]!r}" for i in rows[:3])
            raise StoreError(
                f"teacher {teacher!r} produced {len(rows)} non-finite (NaN/Inf) {col!r} vector(s) in shard {k} "
                f"({show}); nothing of this shard was committed", teacher,
                "use --precision fp32 (fp16/bf16 can overflow) and --dtype float32, or check the teacher checkpoint")


def _save_teacher_files(writer, t: Teacher) -> list[str]:
    """Tokenizer files (no weights) and the input-embedding matrix, once per teacher, with their sha256
    in the manifest (`extras.files`) so training refuses a damaged tokenizer instead of mis-tokenizing.

    Written when absent: on the first run, and on the run after `kd validate --repair` set a damaged
    one aside (a tokenizer as a whole folder). Returns the files written."""
    import os
    import tempfile

    from safetensors.torch import save

    files: dict[str, bytes] = {}
    if not fs.exists(writer.loc, "tokenizers", t.name, "tokenizer_config.json"):
        with tempfile.TemporaryDirectory() as tmp:
            t.tokenizer.save_pretrained(tmp)
            for f in sorted(os.listdir(tmp)):
                with open(os.path.join(tmp, f), "rb") as fh:
                    files[f"tokenizers/{t.name}/{f}"] = fh.read()
    if not fs.exists(writer.loc, "teachers", t.name, "input_embeddings.safetensors"):
        files[f"teachers/{t.name}/input_embeddings.safetensors"] = save({"weight": input_embeddings(t)})
    for rel, data in files.items():
        fs.atomic_write_bytes(writer.loc, data, *rel.split("/"))
    if files:
        writer.set_extra("files", {**writer.manifest.extras.get("files", {}),
                                   **{rel: fs.sha256(data) for rel, data in files.items()}})
    return sorted(files)
