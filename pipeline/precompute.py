"""`kd precompute`: run one or more teachers over a corpus once and commit their outputs as shards.

Algorithm (`run`; the job's options were checked when it was built, `job.PrecomputeJob`):
- --add-to: take the store's recorded inputs and row options (`grow.adopt_store_inputs`);
- fingerprint the inputs (file hashes + the options that shape the rows) so a store is never mixed with other
  inputs (a store of other ones is refused naming the difference, `grow.check_same_inputs`);
- resolve --out once and read its merged manifest once (a folder of the user's files is refused here);
- read the inputs, so that a bad line is refused before any teacher loads (unless this writer's texts shards
  are already committed: a resume reloads them from the store and skips spaCy); load the teachers and decide
  their outputs;
- segment + dedup the records into the `texts` rows; cut them into shards (`plan.ShardPlan`); this writer
  owns shards k % num_writers == index;
- open the store as this writer, delete the temp files a killed run of it left, and hand one `shards.Prepared`
  to an engine: `local_engine` (this process) or `ray_engine` (a pool of Ray workers). Each commits every owned
  (shard, teacher) not yet committed: temp name + fsync + rename, then a record in this writer's manifest
  fragment, and publishes the merged manifest. A killed run loses at most the shards in flight; a full disk is
  a clear error after which the rerun resumes;
- writer 0 then writes the per-teacher outputs asked for (vocab, init).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn

import pyarrow as pa

from kd.common.errors import InputError, StoreError
from kd.common.ids import is_empty
from kd.common.layers import parse_layers
from kd.common.outputs import STORE, claim_output
from kd.common.progress import showing
from kd.common.same_tokenizer import tokenizer_difference
from kd.pipeline import inputs as inp
from kd.pipeline.backends import loading
from kd.pipeline.engines import local as local_engine
from kd.pipeline.engines import ray_pool as ray_engine
from kd.pipeline.engines.plan import ShardPlan, writer_rank
from kd.pipeline.engines.shards import (
    PrecomputeSummary,
    Prepared,
    remove_own_temps,
    stored_backend,
    write_init,
    write_vocab,
)
from kd.pipeline.grow import adopt_store_inputs, check_same_inputs
from kd.pipeline.job import PrecomputeJob
from kd.pipeline.reuse import open_sources
from kd.pipeline.rows import RowCounts, build_texts
from kd.pipeline.segment import segment as split_sentences
from kd.pipeline.teacher.model import Output, Teacher
from kd.storage import fs
from kd.storage.manifest import Manifest, check_plan_sound
from kd.storage.schema import concat_shards
from kd.storage.soundness import require_sound_content
from kd.storage.store import Store, open_writer, readable_manifest, refuse_foreign_folder, remove_if_nothing_committed

__all__ = ["PrecomputeJob", "PrecomputeSummary", "corpus_rows", "precompute", "run"]


def precompute(inputs: list[str], out: str | None, teachers: list[str], **options: Any) -> PrecomputeSummary:
    """Run `teachers` over `inputs` and write/extend the store at `out`; `options` are `PrecomputeJob`'s fields
    (the flags of `kd precompute`; `add_to=STORE` with no inputs and out None grows STORE)."""
    return run(PrecomputeJob(inputs, out, teachers, **options))


def run(job: PrecomputeJob) -> PrecomputeSummary:
    """Run one checked job (see the module docstring); the summary the CLI prints."""
    with showing(job.progress):  # the steps before the bar (unpacking, loading, exporting) follow --progress
        return _run(job)


def _run(job: PrecomputeJob) -> PrecomputeSummary:
    t0 = time.perf_counter()
    grown = job.add_to is not None
    if grown:  # the store's own inputs and row options (its files must be unchanged: check_same_inputs)
        job = adopt_store_inputs(job)
    files = inp.expand_inputs(list(job.inputs))
    loc = fs.resolve(job.out)
    if loc.is_local:  # never an input's folder, a student or an export; --overwrite: only a store
        claim_output(job.out, "kd precompute", (STORE,), files, overwrite=job.overwrite)
    spec = job.columns()
    fingerprint = inputs_header(files, job.input_options(spec))
    index, count = writer_rank(job.num_shards, job.shard_index)
    existing = readable_manifest(loc, job.overwrite)
    refuse_foreign_folder(loc, job.overwrite, existing)  # a folder of the user's files: before any teacher loads
    if existing is not None and not job.overwrite:  # before any teacher loads: name what differs
        check_plan_sound(existing, loc.root)
        check_same_inputs(existing, fingerprint, job.out, grown)
        check_committed_files(existing, loc)
        require_sound_content(Store(loc, existing))  # --add-to and a resume pair new tables with its rows
    same = existing if existing is not None and existing.fingerprint == fingerprint["fingerprint"] else None
    # the inputs are read before any teacher loads (a bad line is refused in seconds), unless a resume reloads them
    records = None if _texts_committed(job, same, index, count) else _read(files, spec, job)
    teachers = _load_teachers(job, None if job.overwrite else existing)
    if existing is not None and not job.overwrite:  # a resume or --add-to writes beside the rows it holds
        check_same_tokenizers(Store(loc, existing), teachers, job.out)
    outputs = {t.name: teacher_outputs(t, job.row_outputs) for t in teachers}  # bad --outputs: before segmenting
    check_keep_layers(job, teachers)
    if existing is not None:
        outputs = {t.name: _stored_outputs(existing, t, outputs[t.name], job) for t in teachers}
    reuse = open_sources(job.reuse, {t.name: t.meta(outputs[t.name], job.vdtype.value) for t in teachers}) \
        if job.reuse else {}
    for source in reuse.values():
        check_same_tokenizers(source.store, [t for t in teachers if t.name == source.teacher], f"--reuse {job.reuse}")
    rows, plan, counts = _rows(job, files, records, loc, same, index, count)
    header = Manifest({**fingerprint, "pairs": spec.pair is not None, "num_rows": plan.num_rows,
                       "rows_per_shard": job.shard_rows, "num_shards": plan.num_shards, "counts": counts.record()},
                      versions=package_versions())
    created = loc.is_local and not os.path.exists(loc.root)
    try:
        with _disk_full_is_clear(job.out):
            writer = open_writer(loc, header, f"writer-{index:05d}-of-{count:05d}", job.overwrite, existing)
            try:
                ctx = Prepared(job, writer, teachers, outputs, rows, plan, plan.owned(index, count), index, counts,
                               spec.pair is not None, t0, reuse)
                remove_own_temps(writer, ctx.names, ctx.owned)
                summary = ray_engine.write(ctx, job.ray) if job.ray else local_engine.write(ctx)
                return _write_per_teacher(ctx, summary) if index == 0 else summary
            finally:
                writer.close()
    except Exception:
        if created:  # refused after the folder was made (a --reuse shard, the Ray runtime): leave no half store
            remove_if_nothing_committed(loc)
        raise


def check_committed_files(existing: Manifest, loc: fs.Location) -> None:
    """Refuse a store whose manifest records a shard whose file is gone (deleted by hand, a partial copy): the run
    would count it as done and say the store is complete while every reader refuses it. One listing call."""
    files = [rec.file for table in existing.tables.values() for rec in table.shards.values()]
    infos = loc.fs.get_file_info([loc.path(f) for f in files]) if files else []
    gone = [f for f, info in zip(files, infos) if info.type == fs.pafs.FileType.NotFound]
    if gone:
        raise StoreError(f"{len(gone)} shard file(s) the manifest records are missing (first: {', '.join(gone[:3])})",
                         loc.root, f"run `kd validate {loc.root} --repair` (it drops their records), then this command "
                         "again: it recomputes them")


def inputs_header(files: list[str], options: dict) -> dict:
    digests = [{"path": p, "sha256": fs.file_sha256(p)} for p in files]
    blob = json.dumps({"files": [d["sha256"] for d in digests], "options": options}, sort_keys=True)
    return {"fingerprint": hashlib.sha256(blob.encode()).hexdigest(), "files": digests, "options": options}


def package_versions() -> dict[str, str]:
    out = {}
    for pkg in ("kd", "torch", "transformers", "tokenizers", "pyarrow", "spacy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def _load_teachers(job: PrecomputeJob, existing: Manifest | None) -> list[Teacher]:
    """Load every --teacher (--engine ray: the driver's CPU copy, for the tokenizer, embeddings, vocab, init;
    the Ray workers encode; the job checked they are distinct). --backend auto keeps the backend a teacher
    already has in the store (`stored_backend`)."""
    load = job.load_options()
    if job.engine == "ray":
        load = ray_engine.driver_load(load)
    return [loading.load(t, **load, stored=stored_backend(existing, t.name)) for t in job.specs]


def check_same_tokenizers(store: Store, teachers: list[Teacher], where: str) -> None:
    """Each teacher the store holds rows of was stored with this teacher's tokenizer: its weights and settings
    alone (the table's meta) do not show a tokenizer that stopped lowercasing, and rows of two tokenizers would
    sit in one table (issue 48's probe: a resume and --reuse mixed them, exit 0)."""
    for t in teachers:
        if f"teachers/{t.name}" not in store.manifest.tables or \
                f"tokenizers/{t.name}/tokenizer_config.json" not in store.manifest.extras.get("files", {}):
            continue  # nothing stored for it yet, or its tokenizer set aside by --repair (written again now)
        why = tokenizer_difference(t.hf_tokenizer(), store.load_tokenizer(t.name))
        if why:
            raise InputError(f"the store holds teacher {t.name!r}'s rows from another tokenizer ({why}): they are "
                             "not what this run computes", where,
                             "run the teacher that wrote the store (kd info shows its source), or name this one "
                             "differently, or write a new store")


def teacher_outputs(t: Teacher, asked: list[str] | None) -> list[Output]:
    """The row outputs of teacher `t`: those asked for (each one it can produce), else its defaults."""
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


def check_keep_layers(job: PrecomputeJob, teachers: list[Teacher]) -> None:
    """--keep-layers against each teacher's layer count, before any row is encoded (the init output is written
    last, after every shard)."""
    if job.wants("init"):
        for t in teachers:
            parse_layers(job.keep_layers, t.num_layers, "--keep-layers")


def _stored_outputs(existing: Manifest, t: Teacher, asked: list[Output], job: PrecomputeJob) -> list[Output]:
    """The row outputs to write for teacher `t`: the store's own with only vocab/init asked (`--outputs vocab`
    changes nothing else), or where its table holds every one asked and is kept (asking for less than it holds is
    no other setting: kd distill's start model stores MiniLM's defaults, and a recipe that then asks MiniLM for
    `sentence` finds its rows there); otherwise those asked, which the store's settings check compares."""
    rec = existing.tables.get(f"teachers/{t.name}")
    stored = [Output(o) for o in ((rec.meta.get("outputs") if rec else None) or [])]
    keep = job.only_per_teacher or (not job.overwrite and set(asked) <= set(stored))
    return stored if stored and keep else asked


def _texts_committed(job: PrecomputeJob, same: Manifest | None, index: int, count: int) -> bool:
    """Whether this writer's texts shards are all in the store `same` (made from these inputs): a resume reloads
    them instead of reading the inputs again (and spaCy does not run twice)."""
    rec = same.tables.get("texts") if same is not None else None
    return rec is not None and all(k in rec.shards for k in ShardPlan(same.inputs["num_rows"], job.shard_rows)
                                   .owned(index, count))


def _rows(job: PrecomputeJob, files: list[str], records: inp.Records | None, loc: fs.Location, same: Manifest | None,
          index: int, count: int) -> tuple[pa.Table, ShardPlan, RowCounts]:
    """This writer's `texts` rows (its owned shards, in order), the shard plan and the row counts.

    - `records` None (`_texts_committed`): the store `same`'s plan and counts, and its texts shards reloaded;
    - otherwise the records read are segmented and deduplicated, and the owned shards sliced out.
    """
    if records is None:
        plan = ShardPlan(same.inputs["num_rows"], job.shard_rows)
        return _reload_rows(same, loc, plan.owned(index, count)), plan, RowCounts(**same.inputs["counts"])
    table, counts = _build_rows(records, files, job)
    plan = ShardPlan(table.num_rows, job.shard_rows)
    owned = plan.owned(index, count)
    rows = pa.concat_tables([table.slice(plan.bounds(k)[0], plan.size(k)) for k in owned]) if owned \
        else table.slice(0, 0)
    return rows, plan, counts


def corpus_rows(job: PrecomputeJob) -> tuple[pa.Table, RowCounts]:
    """The `texts` rows `job` would write (read, segmented, deduplicated, sampled), without a teacher or a store:
    what `kd distill --dry-run` sizes its plan with."""
    files = inp.expand_inputs(list(job.inputs))
    return _build_rows(_read(files, job.columns(), job), files, job)


def _read(files: list[str], spec: inp.ColumnSpec, job: PrecomputeJob) -> inp.Records:
    if job.segment != "none" and spec.pair:
        raise InputError(f"--segment {job.segment} splits documents; it cannot be used with --pair-columns")
    records = inp.read_inputs(files, spec, documents=job.segment != "none")
    if all(map(is_empty, records.texts)):  # refused here, before any teacher loads (tens of seconds on a CPU)
        _no_text_left(RowCounts(read=len(records.texts), empty_dropped=len(records.texts)), files)
    return records


def _no_text_left(counts: RowCounts, files: list[str]) -> NoReturn:
    raise InputError(f"no text left to encode ({counts.read} read, {counts.empty_dropped} empty)", ", ".join(files),
                     "check --text-column and that the files are not empty")


def _build_rows(records: inp.Records, files: list[str], job: PrecomputeJob) -> tuple[pa.Table, RowCounts]:
    if job.segment != "none":
        records = split_sentences(records, job.spacy_model, documents=job.segment == "sentences+documents")
    table, counts = build_texts(records, job.dedup, pairs=job.columns().pair is not None, sample=job.sample)
    if table.num_rows == 0:  # every text a duplicate, sampled out, or no sentence in it
        _no_text_left(counts, files)
    return table, counts


def _reload_rows(existing: Manifest, loc: fs.Location, owned: list[int]) -> pa.Table:
    """This writer's texts shards from the store (all committed: `_texts_committed`)."""
    store = Store(loc, existing)  # verified reads: a tampered texts shard must not be encoded by a new teacher
    return concat_shards([store.read_shard("texts", k) for k in owned])


def _write_per_teacher(ctx: Prepared, summary: PrecomputeSummary) -> PrecomputeSummary:
    """Writer 0, after the rows: the vocab / init outputs asked for, each written once; publish again."""
    job, writer = ctx.job, ctx.writer
    if job.wants("vocab"):
        summary.vocab_written = [t.name for t in ctx.teachers if write_vocab(writer, t, job.progress)]
    if job.wants("init"):
        summary.vocab_written += [f"{t.name} layers {job.keep_layers or 'default'}" for t in ctx.teachers
                                  if write_init(writer, t, job.keep_layers)]
    if job.wants("vocab") or job.wants("init"):
        writer.publish()
        summary.seconds = time.perf_counter() - ctx.t0
    return summary


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
