"""`kd` command line: thin. Each command parses options, calls one library function, prints.

All logic lives in `pipeline`, `student`, `storage` and `apps`, importable and tested without the CLI.
Heavy imports (torch, transformers) happen inside commands so `kd --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional  # noqa: F401  (Optional: typer needs it on py3.10 annotations)

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from kd.common import bounds as B
from kd.common.errors import KdError, as_kd_error


def _debug(ctx: Any = None) -> bool:
    """--debug on the command line (kept in the context) or KD_DEBUG=1: show tracebacks, translate nothing."""
    return bool(getattr(ctx, "obj", None) and ctx.obj.get("debug")) or os.environ.get("KD_DEBUG", "") not in ("", "0")


class _Commands(TyperGroup):
    """Runs every command, so one place decides what a user sees when an exception escapes one.

    A user-caused one (full disk, no permission, a wrong path, invalid JSON, a binary file, input nested too
    deeply: `as_kd_error`) is printed as what/where/fix and exits 2, never as a traceback; anything else is a
    bug and keeps its traceback, as does everything under --debug.
    """

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as e:
            err = as_kd_error(e)
            if err is None or _debug(ctx):
                raise
            if err.where is None:  # e.g. a write to an open file fails: the OSError names no file
                err = type(err)(err.what, f"while running kd {ctx.invoked_subcommand}", err.fix)
            _fail(err)


app = typer.Typer(cls=_Commands, no_args_is_help=True, add_completion=False,
                  help="Offline knowledge distillation of sentence encoders.")
console = Console(stderr=True, soft_wrap=True)
term = Console(soft_wrap=True)  # results go to stdout; errors and progress to stderr


def _in(r: B.Range) -> dict[str, Any]:
    """typer.Option keywords bounding a number to `r`: typer's min/max, plus a callback refusing an open end.

    Either way a bad value exits 2 at parse time with "Invalid value for '--flag'", before anything runs.
    """
    opts: dict[str, Any] = {"min": r.lo, "max": r.hi}
    if r.lo_open or r.hi_open:
        def edge(value: float | None) -> float | None:
            if value is not None and value not in r:
                raise typer.BadParameter(f"{value:g} is not in {r}")
            return value

        opts["callback"] = edge
    return opts


def _device(auto: bool) -> dict[str, Any]:
    """typer.Option keywords for --device: cpu, cuda, cuda:N (and auto where the command has it)."""
    forms = B.DEVICES if auto else B.DEVICES[1:]

    def check(value: str | None) -> str | None:
        if value is not None and (not B.DEVICE.fullmatch(value) or (value == "auto" and not auto)):
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(forms)}")
        return value

    return {"callback": check}


def _fail(e: KdError) -> None:
    console.print(f"[bold red]error:[/] {escape(str(e))}")  # a fix may read pip install 'kd[onnx]'
    raise typer.Exit(e.exit_code)


@app.callback()
def _options(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", envvar="KD_DEBUG", help="Show the Python traceback of an error")] = False,  # noqa: E501
) -> None:
    ctx.obj = {"debug": debug}


def main() -> None:  # pragma: no cover - console entry for `python -m kd`
    try:
        app()
    except Exception as e:  # what escapes outside a command (the commands' own are `_Commands.invoke`'s)
        err = as_kd_error(e)
        if err is None or _debug():
            raise
        console.print(f"[bold red]error:[/] {escape(str(err))}")  # a fix may read pip install 'kd[onnx]'
        sys.exit(err.exit_code)


# --- stage one: precompute, info, validate --------------------------------------------------------
# (precompute commands)
@app.command()
def precompute(
    inputs: Annotated[list[str] | None, typer.Argument(help="Input files or globs: .txt, .jsonl, .csv/.tsv, .parquet (none with --add-to)")] = None,  # noqa: E501
    out: Annotated[str | None, typer.Option("--out", "-o", help="Store folder or pyarrow filesystem URI")] = None,
    teacher: Annotated[list[str], typer.Option("--teacher", "-t", help="minilm | mpnet | bert-base | DIR | NAME=DIR")] = ["minilm"],  # noqa: E501, B006 (typer copies defaults)
    outputs: Annotated[str | None, typer.Option(help="Comma list of cls,mean,layers,sentence,logits,vocab,init (default: all but vocab, init)")] = None,  # noqa: E501
    segment: Annotated[B.Segment, typer.Option(help="none (whole documents) | sentences (spaCy)")] = "none",
    spacy_model: Annotated[str | None, typer.Option(help="Installed spaCy pipeline for --segment sentences")] = None,
    text_column: Annotated[str | None, typer.Option(help="Column with the text (name, or 0-based index without header)")] = None,  # noqa: E501
    pair_columns: Annotated[str | None, typer.Option(help="Two columns a,b holding sentence pairs")] = None,
    label_column: Annotated[str | None, typer.Option(help="Optional label column")] = None,
    delimiter: Annotated[str | None, typer.Option(help="Field delimiter for .csv/.tsv (default: sniffed)")] = None,
    dedup: Annotated[bool, typer.Option(help="Drop exact duplicate texts")] = False,
    sample: Annotated[float | None, typer.Option(help="Keep this fraction of the rows, chosen by content-hash id: the same subset for every teacher and run", **_in(B.SAMPLE))] = None,  # noqa: E501
    batch_tokens: Annotated[int | None, typer.Option(help="Token budget per batch (padded length x rows; default: 4096 on CPU, 16384 on GPU)", **_in(B.BATCH_TOKENS))] = None,  # noqa: E501
    max_length: Annotated[int | None, typer.Option(help="Truncate texts to this many tokens", **_in(B.TOKENS))] = None,
    shard_rows: Annotated[int, typer.Option(help="Rows per shard (the unit of resume and scale-out)", **_in(B.ROWS))] = 20000,  # noqa: E501
    num_shards: Annotated[int | None, typer.Option(help="Number of writers (default: torchrun WORLD_SIZE or 1)", **_in(B.SHARDS))] = None,  # noqa: E501
    shard_index: Annotated[int | None, typer.Option(help="This writer's 0-based index (default: torchrun RANK or 0)", **_in(B.SHARD_INDEX))] = None,  # noqa: E501
    dtype: Annotated[B.VectorDType, typer.Option(help="float32 | float16 | int8 for stored vectors (int8: per-vector scale, read back as float32; logits stay float32)")] = "float32",  # noqa: E501
    precision: Annotated[B.Precision, typer.Option(help="auto | fp32 | bf16 | fp16 forward precision; auto: fp16 on CUDA, bf16 on CPUs with native bf16 (AMX/AVX512-BF16), else fp32")] = "auto",  # noqa: E501
    device: Annotated[str | None, typer.Option(help="cpu | cuda | cuda:N (default: cuda when present)", **_device(False))] = None,  # noqa: E501
    overwrite: Annotated[bool, typer.Option(help="Replace a store made from other inputs/settings")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    keep_layers: Annotated[str | None, typer.Option(help="Layers the init output keeps, e.g. 2,5 (default: half, evenly spaced, ending with the last)")] = None,  # noqa: E501
    backend: Annotated[B.Backend, typer.Option(help="auto | torch | onnx | openvino: what runs the teacher's forward pass (onnx/openvino: exported once to $KD_CACHE, CPU); auto: openvino on a CPU where installed (torch if its fidelity is too low), else torch")] = "auto",  # noqa: E501
    quantize: Annotated[B.Quantize, typer.Option(help="none | int8 (onnx: dynamic quantization; openvino: static int8 on CPUs with VNNI/AMX, int8 weights elsewhere)")] = "none",  # noqa: E501
    allow_low_fidelity: Annotated[bool, typer.Option(help="Keep a backend whose cosine to torch fp32 is below the threshold")] = False,  # noqa: E501
    engine: Annotated[B.Engine, typer.Option(help="local (this process) | ray (a pool of Ray workers; pip install 'kd\\[ray]')")] = "local",  # noqa: E501
    ray_address: Annotated[str | None, typer.Option(help="--engine ray: auto | HOST:PORT of a running cluster (default: RAY_ADDRESS, else a local Ray runtime)")] = None,  # noqa: E501
    workers: Annotated[int | None, typer.Option(help="--engine ray: workers (default: one per GPU, else one per CPU)", **_in(B.RAY_WORKERS))] = None,  # noqa: E501
    gpus_per_worker: Annotated[float | None, typer.Option(help="--engine ray: GPUs each worker reserves (default 1; 0.5: two per GPU)", **_in(B.GPU_SHARE))] = None,  # noqa: E501
    reuse: Annotated[str | None, typer.Option(help="Store whose rows of the same teachers (same settings) are copied instead of encoded again: a grown corpus costs only its new rows")] = None,  # noqa: E501
    add_to: Annotated[str | None, typer.Option(help="Grow this store in place with only the new options (-t, --outputs): no inputs, its recorded input files (unchanged, same sha256) and row options are reused; its rows are not encoded again")] = None,  # noqa: E501
) -> None:
    """Run teachers over a corpus once and write their outputs to a Parquet store.

    Grow a store with only the new options: kd precompute --add-to STORE -t mpnet --outputs vocab,init
    """
    from kd.pipeline.job import PrecomputeJob
    from kd.pipeline.precompute import run

    try:
        job = PrecomputeJob(
            inputs or [], out, teacher, outputs=outputs.split(",") if outputs else None, segment=segment,
            spacy_model=spacy_model, text_column=text_column, pair_columns=pair_columns, label_column=label_column,
            delimiter=delimiter, dedup=dedup, sample=sample, batch_tokens=batch_tokens, max_length=max_length,
            shard_rows=shard_rows,
            num_shards=num_shards, shard_index=shard_index, dtype=dtype, precision=precision, device=device,
            overwrite=overwrite, progress=progress, keep_layers=keep_layers, backend=backend, quantize=quantize,
            allow_low_fidelity=allow_low_fidelity, engine=engine, ray_address=ray_address, workers=workers,
            gpus_per_worker=gpus_per_worker, reuse=reuse, add_to=add_to)
        s = run(job)
    except KdError as e:
        _fail(e)
    except ValueError as e:  # bad enum values (dtype, precision, shard index)
        _fail(KdError(str(e)))
    if s.nothing_to_do:
        term.print(f"store {s.store} is already complete for {', '.join(s.teachers)}: nothing to do")
        return
    if s.vocab_written:
        term.print(f"wrote the per-teacher outputs (vocab / init) of {', '.join(s.vocab_written)}")
    if s.files_written and not s.shards_written:  # (a fresh store writes them too: not worth a line there)
        term.print(f"restored {', '.join(s.files_written)}")
    term.print(
        f"wrote {s.shards_written} shard(s) to {s.store}: {s.rows_computed:,} rows encoded of {s.rows_total:,} "
        + (f"and {s.rows_reused:,} copied from --reuse " if s.rows_reused else "")
        + f"({s.shards_skipped} shard(s) already done); dropped {s.empty_dropped} empty, "
        f"{s.duplicates_dropped} duplicate; {s.truncated} truncated; {s.seconds:.1f} s, {s.rate:,.0f} rows/s, "
        f"{s.bytes_written / 1e6:.1f} MB" + (f"; {s.retried} unit(s) retried (their worker died)" if s.retried else "")
        + ("; rows per Ray node: " + ", ".join(f"{n[:12]}={r:,}" for n, r in s.rows_per_node.items())
           if s.rows_per_node else "")
    )


@app.command()
def info(store: Annotated[str, typer.Argument(help="Store folder or URI")]) -> None:
    """Print a store's manifest summary: inputs, tables, shards, teachers."""
    from kd.storage.info import summary_table

    try:
        term.print(summary_table(store))
    except KdError as e:
        _fail(e)


@app.command()
def validate(
    store: Annotated[str, typer.Argument(help="Store folder or URI")],
    repair: Annotated[bool, typer.Option(help="Drop damaged shards from the record (re-run precompute to redo them)")] = False,  # noqa: E501
) -> None:
    """Re-check checksums, schemas and id alignment of every shard; exit 1 on any problem."""
    from kd.storage.validate import check

    if repair:
        from kd.storage.repair import describe
        from kd.storage.repair import repair as run_repair

        try:
            lines = describe(run_repair(store))
        except KdError as e:
            _fail(e)
        for line in lines:
            term.print(f"[yellow]repair[/] {line}")
    try:
        _, problems = check(store)
    except KdError as e:
        _fail(e)
    for p in problems:
        term.print(f"[red]problem[/] {p}")
    if problems:
        raise typer.Exit(1)
    term.print(f"[green]ok[/] {store}: every shard matches the manifest")

# --- stage two: train-student, embed ---------------------------------------------------------------
# (student commands)
@app.command("train-student")
def train_student(
    shards: Annotated[str, typer.Option("--shards", "-s", help="Store written by kd precompute")],
    out: Annotated[str, typer.Option("--out", "-o", help="Output folder for the student (and checkpoints)")],
    arch: Annotated[B.Arch, typer.Option(help="bilstm | bigru | cnn | ffn | transformer | static | transformer-init")] = "bilstm",  # noqa: E501
    objective: Annotated[list[str] | None, typer.Option("--objective", help="NAME[:weight][:k=v], repeatable: cosine (default), mse, contrastive, logits, pair, multi-teacher, relational, label")] = None,  # noqa: E501
    target: Annotated[str | None, typer.Option(help="teacher.column the embedding matches (default: the teacher's default_target)")] = None,  # noqa: E501
    embed_dim: Annotated[int | None, typer.Option(help="Token embedding width (default: min(300, teacher width); static 256)", **_in(B.WIDTH))] = None,  # noqa: E501
    hidden_dim: Annotated[int | None, typer.Option(help="Encoder width (per direction for RNNs)", **_in(B.WIDTH))] = None,  # noqa: E501
    out_dim: Annotated[int | None, typer.Option(help="Embedding width (default: the target's; no target: the encoder's)", **_in(B.WIDTH))] = None,  # noqa: E501
    init: Annotated[str | None, typer.Option(help="Start from this trained student folder (same --arch and tokenizer; its shape stands)")] = None,  # noqa: E501
    layers: Annotated[int, typer.Option(help="Encoder layers", **_in(B.LAYERS))] = 1,
    pooling: Annotated[B.Pooling, typer.Option(help="mean | max | attentive | cls")] = "mean",
    dropout: Annotated[float | None, typer.Option(help="[default: 0.1; static 0]", **_in(B.DROPOUT))] = None,
    max_length: Annotated[int, typer.Option(help="Student tokens per text", **_in(B.TOKENS))] = 128,
    epochs: Annotated[int | None, typer.Option(help="[default: 3]", **_in(B.EPOCHS))] = None,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many steps (overrides --epochs)", **_in(B.STEPS))] = None,  # noqa: E501
    batch_size: Annotated[int | None, typer.Option(help="[default: 64; static 256]", **_in(B.BATCH))] = None,
    lr: Annotated[float | None, typer.Option(help="[default: 1e-3; static 5e-3]; 0: weights stay as initialised", **_in(B.STUDENT_LR))] = None,  # noqa: E501
    weight_decay: Annotated[float | None, typer.Option(help="[default: 0.01; static 0]", **_in(B.WEIGHT_DECAY))] = None,  # noqa: E501
    warmup: Annotated[float, typer.Option(help="Warm-up: fraction of steps (<1) or steps (>=1); 0: none", **_in(B.WARMUP))] = 0.05,  # noqa: E501
    schedule: Annotated[B.Schedule, typer.Option(help="cosine | plateau | constant")] = "cosine",
    clip: Annotated[float, typer.Option(help="Max gradient norm (0: off)", **_in(B.CLIP))] = 1.0,
    patience: Annotated[int, typer.Option(help="Evaluations without improvement before stopping (0: never)", **_in(B.PATIENCE))] = 3,  # noqa: E501
    eval_every: Annotated[int | None, typer.Option(help="Validate every N steps (default: each epoch)", **_in(B.STEPS))] = None,  # noqa: E501
    checkpoint_every: Annotated[int, typer.Option(help="Checkpoint every N steps", **_in(B.STEPS))] = 500,
    log_every: Annotated[int, typer.Option(help="Metrics record every N steps", **_in(B.STEPS))] = 20,
    seed: Annotated[int, typer.Option(**_in(B.SEED))] = 0,
    workers: Annotated[int, typer.Option(help="DataLoader worker processes (read + tokenize; 0: in this process)", **_in(B.LOADER_WORKERS))] = 0,  # noqa: E501
    shuffle_buffer: Annotated[int, typer.Option(help="Rows in the shuffle buffer", **_in(B.ROWS))] = 10000,
    val_percent: Annotated[float, typer.Option(help="Held-out percent of rows (by id hash; 0: no validation)", **_in(B.PERCENT))] = 2.0,  # noqa: E501
    init_embeddings: Annotated[B.EmbeddingInit, typer.Option(help="auto | teacher | vocab | random")] = "auto",
    token_weights: Annotated[B.TokenWeights, typer.Option(help="Static students: sif | none")] = "sif",
    head_init: Annotated[B.HeadInit, typer.Option(help="The head onto a wider target: auto (lstsq for transformer-init) | lstsq (least squares from the start model's vectors) | random")] = "auto",  # noqa: E501
    exclude_ids: Annotated[str | None, typer.Option(help="File of row ids to leave out (kd leakage --exclude-out)")] = None,  # noqa: E501
    init_layers: Annotated[str | None, typer.Option(help="transformer-init: which stored init output, e.g. 2,5; with --init, which of that student's layers to keep (a smaller copy)")] = None,  # noqa: E501
    init_teacher: Annotated[str | None, typer.Option(help="Stored teacher whose tokenizer, embeddings and vocab/init outputs the student starts from (default: the target's; transformer-init: the teacher with an init output)")] = None,  # noqa: E501
    bucket: Annotated[bool, typer.Option(help="Batches of similar length inside the shuffle buffer (less padding)")] = True,  # noqa: E501
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N", **_device(True))] = "auto",
    amp: Annotated[bool, typer.Option(help="Mixed precision: CUDA; bf16 for Transformer students on CPUs with native bf16")] = True,  # noqa: E501
    resume: Annotated[bool, typer.Option(help="Continue from the checkpoint in --out")] = True,
    overwrite: Annotated[bool, typer.Option(help="Discard a previous run in --out")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
) -> None:
    """Train a student from a store's teacher outputs (the teacher is never loaded). DDP under torchrun."""
    from kd.student.train_config import TrainConfig
    from kd.student.trainer import train

    try:
        tuned = dict(embed_dim=embed_dim, dropout=dropout, epochs=epochs, batch_size=batch_size, lr=lr,
                     weight_decay=weight_decay)  # None: the arch's default, filled in by TrainConfig
        cfg = TrainConfig(
            shards, out, arch=arch, objectives=objective or ["cosine"], target=target, hidden_dim=hidden_dim,
            out_dim=out_dim, init=init,
            num_layers=layers, pooling=pooling, max_length=max_length, max_steps=max_steps, **tuned, warmup=warmup,
            schedule=schedule, clip=clip, patience=patience, eval_every=eval_every, checkpoint_every=checkpoint_every,
            log_every=log_every, seed=seed, num_workers=workers, shuffle_buffer=shuffle_buffer,
            val_percent=val_percent, init_embeddings=init_embeddings, token_weights=token_weights, head_init=head_init,
            exclude_ids=exclude_ids, init_layers=init_layers, init_teacher=init_teacher, bucket=bucket, device=device,
            amp=amp, resume=resume,
            overwrite=overwrite, progress=progress,
        )
        path = train(cfg)
    except KdError as e:
        _fail(e)
    except ValueError as e:  # bad enum values (schedule, init-embeddings)
        _fail(KdError(str(e)))
    if int(os.environ.get("RANK", "0")) == 0:
        term.print(f"student written to {path}")


@app.command()
def leakage(
    store: Annotated[str, typer.Argument(help="Store written by kd precompute")],
    exclude_out: Annotated[str | None, typer.Option(help="Write the overlapping rows' ids here (for train-student --exclude-ids)")] = None,  # noqa: E501
    overwrite: Annotated[bool, typer.Option(help="Replace an --exclude-out file written by kd")] = False,
) -> None:
    """Check a store against the evaluation sets: which rows are STS-B / SST-2 / clustering texts?"""
    from rich.table import Table

    from kd.apps.leakage import check_store

    try:
        res = check_store(store, exclude_out=exclude_out, overwrite=overwrite)
    except KdError as e:
        _fail(e)
    table = Table("evaluation set", "texts", "found in the store", "store rows")
    for name, (n, found, rows) in res.sets.items():
        table.add_row(name, f"{n:,}", f"{found:,} ({100 * found / max(1, n):.1f} %)", f"{rows:,}")
    term.print(table)
    term.print(f"{len(res.ids):,} of {res.rows:,} store rows overlap an evaluation set")
    if exclude_out:
        term.print(f"their ids are in {exclude_out}: kd train-student ... --exclude-ids {exclude_out}")


@app.command()
def embed(
    input: Annotated[str, typer.Argument(help="A kd store, or a .txt/.jsonl/.csv/.parquet file of texts")],
    student: Annotated[str, typer.Option("--student", help="Folder written by kd train-student")],
    out: Annotated[str | None, typer.Option("--out", "-o", help="Store: the same store (default); file input: a Parquet file")] = None,  # noqa: E501
    name: Annotated[str | None, typer.Option(help="Table students/NAME (default: the student folder name)")] = None,
    text_column: Annotated[str | None, typer.Option(help="Text column of a .jsonl/.csv/.parquet input")] = None,
    batch_size: Annotated[int, typer.Option(**_in(B.BATCH))] = 256,
    device: Annotated[str, typer.Option(help="cpu | cuda | cuda:N", **_device(False))] = "cpu",
    overwrite: Annotated[bool, typer.Option(help="Replace students/NAME written by another student, or an --out file kd wrote")] = False,  # noqa: E501
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
) -> None:
    """Write a student's vectors: an aligned table students/NAME of a store, or a Parquet file."""
    from kd.student.embed import embed as run

    try:
        s = run(student, input, out, name=name, text_column=text_column, batch_size=batch_size,
                overwrite=overwrite, device=device, progress=progress)
    except KdError as e:
        _fail(e)
    where = f"table {s.table} of {s.output}" if s.table else s.output
    term.print(f"embedded {s.rows:,} rows into {where} ({s.shards_written} shard(s) written, "
               f"{s.shards_skipped} already done; {s.seconds:.1f} s)")


@app.command("export")
def export_cmd(
    student: Annotated[str, typer.Argument(help="Folder written by kd train-student")],
    out: Annotated[str, typer.Option("--out", "-o", help="Folder to write (new or empty)")],
    format: Annotated[B.ExportFormat, typer.Option("--format", help="sentence-transformers | onnx")] = "sentence-transformers",  # noqa: E501
    quantize: Annotated[B.Quantize, typer.Option(help="none | int8: int8 weights for the ONNX graph's matrix products (--format onnx; the token table stays fp32): smaller, faster on ONNX Runtime, quality within 0.3 STS-B in docs/results.md")] = "none",  # noqa: E501
    overwrite: Annotated[bool, typer.Option(help="Replace a non-empty --out")] = False,
) -> None:
    """Write a student as a sentence-transformers directory or an ONNX model (same vectors; --quantize int8: close)."""
    from kd.student.exporters import export_student

    try:
        path = export_student(student, format, out, overwrite, quantize)
    except KdError as e:
        _fail(e)
    term.print(f"{format} export written to {path}")


# --- evaluation and demo -------------------------------------------------------------------------
# (eval commands)
def _wide() -> Console:
    """The results console; piped or logged output gets 200 columns so the table is not squashed."""
    return term if term.is_terminal else Console(width=200)


@app.command("eval")
def eval_(
    student: Annotated[list[str] | None, typer.Option("--student", help="Student folder (kd train-student --out); repeatable")] = None,  # noqa: E501
    teacher: Annotated[str | None, typer.Option(help="Teacher to run (minilm | DIR | NAME=DIR); with --store: one of its teachers")] = None,  # noqa: E501
    store: Annotated[str | None, typer.Option(help="Store whose teacher vectors are reused where it holds the texts")] = None,  # noqa: E501
    task: Annotated[list[B.Measure] | None, typer.Option("--task", help="sts | probe | cluster | agreement | neighbours | speed | mrpc | lee | retrieval | suite (sts, mrpc, lee, probe, cluster, retrieval); repeatable (default: sts, agreement, neighbours, speed)")] = None,  # noqa: E501
    target: Annotated[str | None, typer.Option(help="Teacher output compared with (default: the teacher's default_target)")] = None,  # noqa: E501
    sts_split: Annotated[B.StsSplit | None, typer.Option(help="STS-B split: train | dev | test (default: dev; test with --task suite)")] = None,  # noqa: E501
    pairs: Annotated[str | None, typer.Option(help="A scored pair file (.tsv/.csv/.jsonl) instead of STS-B")] = None,
    score_column: Annotated[str | None, typer.Option(help="Gold score column of --pairs (name, or 0-based index)")] = None,  # noqa: E501
    text_columns: Annotated[str | None, typer.Option(help="The two text columns of --pairs: A,B")] = None,
    max_pairs: Annotated[int | None, typer.Option(help="Use only the first N pairs", **_in(B.ROWS))] = None,
    cluster_set: Annotated[B.ClusterSet, typer.Option(help="news-articles | brown-genres")] = "news-articles",
    agreement_rows: Annotated[int, typer.Option(help="Store rows (or texts) for agreement and neighbours", **_in(B.AGREEMENT_ROWS))] = 10000,  # noqa: E501
    agreement_texts: Annotated[str | None, typer.Option(help="Text file (one a line) for agreement without --store")] = None,  # noqa: E501
    k: Annotated[int, typer.Option(help="Neighbours compared per text", **_in(B.K))] = 10,
    baseline: Annotated[bool, typer.Option(help="Add a model2vec baseline when model2vec is installed")] = True,
    baseline_dir: Annotated[str | None, typer.Option(help="A model2vec model already distilled from the teacher")] = None,  # noqa: E501
    threads: Annotated[int | None, typer.Option(help="Torch threads (default: all, or 1 when the CPUs are busy)", **_in(B.THREADS))] = None,  # noqa: E501
    json: Annotated[str | None, typer.Option("--json", help="Write the report as JSON")] = None,
    markdown: Annotated[str | None, typer.Option("--markdown", help="Write the table as Markdown")] = None,
    plot: Annotated[str | None, typer.Option("--plot", help="Folder for PNG plots")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace --json/--markdown/--plot files written by kd")] = False,
    cache: Annotated[bool, typer.Option(help="Reuse the teacher's vectors and speed of earlier calls (kd cache folder)")] = True,  # noqa: E501
    progress: Annotated[bool, typer.Option(help="Show progress bars")] = True,
) -> None:
    """Compare teacher, students (and a baseline) on STS, agreement, neighbours, clustering, probe, speed."""
    from kd.apps.eval import EvalConfig, Measure, evaluate

    try:
        cols = tuple(text_columns.split(",")) if text_columns else None
        if cols is not None and len(cols) != 2:
            raise KdError("--text-columns needs two names: A,B", text_columns)
        cfg = EvalConfig(
            students=student or [], teacher=teacher, store=store,
            measures=[Measure(t.value) for t in task] if task else EvalConfig().measures, target=target,
            sts_split=sts_split, pairs=pairs, score_column=score_column, text_columns=cols, max_pairs=max_pairs,
            cluster_set=cluster_set, agreement_rows=agreement_rows, agreement_texts=agreement_texts, k=k,
            baseline=baseline, baseline_dir=baseline_dir, threads=threads, json_path=json, markdown_path=markdown,
            plot_dir=plot, overwrite=overwrite, cache=cache, progress=progress,
        )
        report = evaluate(cfg)
    except KdError as e:
        _fail(e)
    _wide().print(report.rich_table())
    for key, note in report.info.items():
        if isinstance(note, str):
            term.print(f"[dim]{key}: {note}[/]")


@app.command()
def demo(
    out: Annotated[str, typer.Option("--out", "-o", help="Folder for everything the demo writes")] = "kd-demo",
    quick: Annotated[bool, typer.Option(help="Tiny corpus slice and a few training steps (smoke test)")] = False,
    epochs: Annotated[int, typer.Option(help="Training epochs of the BiLSTM tier", **_in(B.EPOCHS))] = 4,
    threads: Annotated[int | None, typer.Option(help="Torch threads (default: all, or 1 when the CPUs are busy)", **_in(B.THREADS))] = None,  # noqa: E501
    overwrite: Annotated[bool, typer.Option(help="Redo every stage instead of reusing finished ones")] = False,
    cache: Annotated[bool, typer.Option(help="Reuse the teacher's evaluation vectors and speed of earlier runs")] = True,  # noqa: E501
    progress: Annotated[bool, typer.Option(help="Show progress bars")] = True,
) -> None:
    """Precompute MiniLM on a bundled corpus, train a static and a BiLSTM student, evaluate all on STS-B dev."""
    from kd.apps.demo import DemoConfig, run_demo

    try:
        res = run_demo(DemoConfig(out=out, quick=quick, epochs=epochs, threads=threads, overwrite=overwrite,
                                  cache=cache, progress=progress))
    except KdError as e:
        _fail(e)
    _wide().print(res.report.rich_table())
    secs = ", ".join(f"{k} {v:.0f} s" for k, v in res.seconds.items())
    term.print(f"demo finished ({secs}); best STS-B dev: the [bold]{res.best}[/] student. Everything is in "
               f"[bold]{res.out}[/]: store/, students/{{{','.join(res.students)}}}/, report.md, report.json, plots/")


@app.command()
def distill(
    inputs: Annotated[list[str], typer.Argument(help="Corpus files or globs: .txt, .jsonl, .csv/.tsv, .parquet")],
    out: Annotated[str, typer.Option("--out", "-o", help="Folder for the store, the stages, the model and the report")],  # noqa: E501
    student: Annotated[str, typer.Option(help="Preset: tiny6 | tiny3 | static | bilstm (apps/recipes)")] = "tiny6",
    recipe: Annotated[str | None, typer.Option(help="Your own recipe file (TOML; see docs/distill.md)")] = None,
    teacher: Annotated[str | None, typer.Option("--teacher", "-t", help="Replace the recipe's teacher: a packaged name or a checkpoint folder")] = None,  # noqa: E501
    start: Annotated[str | None, typer.Option(help="Replace the recipe's start model: a packaged name or a checkpoint folder")] = None,  # noqa: E501
    text_column: Annotated[str | None, typer.Option(help="Column with the text (csv/jsonl/parquet)")] = None,
    segment: Annotated[B.Segment, typer.Option(help="none (whole documents) | sentences (spaCy)")] = "none",
    dedup: Annotated[bool, typer.Option(help="Drop repeated texts")] = True,
    sample: Annotated[float | None, typer.Option(help="Keep this fraction of the rows, chosen by id hash", **_in(B.SAMPLE))] = None,  # noqa: E501
    shard_rows: Annotated[int, typer.Option(help="Rows per store shard", **_in(B.ROWS))] = 20000,
    leakage: Annotated[bool, typer.Option(help="Leave out the rows that are also evaluation text")] = True,
    export: Annotated[bool, typer.Option(help="Export the chosen student (sentence-transformers, ONNX)")] = True,
    evaluate: Annotated[bool, typer.Option(help="Evaluate the chosen student on the suite")] = True,
    dry_run: Annotated[bool, typer.Option(help="Print the plan and each step's estimated time; write nothing")] = False,  # noqa: E501
    progress: Annotated[bool, typer.Option(help="Show progress")] = True,
) -> None:
    """One command from a corpus to a served student: precompute, leakage, every recipe stage, the choice on dev,
    export and the evaluation suite. Kill it anywhere; the same command resumes."""
    from kd.apps.distill import DistillConfig
    from kd.apps.distill import distill as run_distill
    from kd.apps.distill_plan import estimate

    try:
        cfg = DistillConfig(inputs, out, student=student, recipe=recipe, teacher=teacher, start=start,
                            text_column=text_column, segment=segment, dedup=dedup, sample=sample,
                            shard_rows=shard_rows, exclude_leakage=leakage, export=export, evaluate=evaluate,
                            progress=progress)
        if dry_run:
            term.print(estimate(cfg).table())
            return
        res = run_distill(cfg)
    except KdError as e:
        _fail(e)
    if res.report is not None:
        term.print((res.out / "report.md").read_text(encoding="utf-8"))
    term.print(f"distilled: the [bold]{res.chosen}[/] stage, chosen on STS-B dev; everything is in [bold]{res.out}[/]")


# --- the store as a dataset: query, index, search, cluster ---------------------------------------
# (dataset commands)
_data_out = Console()  # results of the dataset commands go to stdout


@app.command("query")
def query_cmd(
    store: Annotated[str, typer.Argument(help="Store folder")],
    sql: Annotated[str | None, typer.Argument(help="SQL; without it an interactive prompt reads stdin")] = None,
    format: Annotated[B.QueryFormat, typer.Option("--format", "-f", help="table | csv | json | parquet")] = "table",
    out_file: Annotated[str | None, typer.Option("--out", "-o", help="Write the result to this file")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an --out file written by kd")] = False,
) -> None:
    """Query the store with DuckDB SQL (views: texts, one per table, outputs). See docs/queries.md."""
    from kd.apps.query_shell import query, repl

    try:
        if sql is not None:
            query(store, sql, format, out_file, _data_out, overwrite)
        elif repl(store, sys.stdin, _data_out, interactive=sys.stdin.isatty()):
            raise typer.Exit(1)
    except KdError as e:
        _fail(e)


@app.command("index")
def index_cmd(
    store: Annotated[str, typer.Argument(help="Store folder")],
    table: Annotated[str | None, typer.Option(help="Table: view name (minilm) or path (teachers/minilm); default: the first teacher")] = None,  # noqa: E501
    column: Annotated[str | None, typer.Option(help="1-D vector column, e.g. sentence; default: sentence, else mean")] = None,  # noqa: E501
    kind: Annotated[B.IndexKind, typer.Option(help="flat (exact) | ivf | hnsw")] = "flat",
) -> None:
    """Build a faiss cosine index of a vector column, saved in the store."""
    from kd.dataset.index import build_index, default_vector

    try:
        if table is None or column is None:
            table, column = default_vector(store, table, column)
            console.print(f"indexing {table}.{column} (pass --table/--column to choose another)")
        info = build_index(store, table, column, kind)
    except KdError as e:
        _fail(e)
    _data_out.print(f"indexed {info.rows:,} rows of {info.table}.{info.column} ({info.kind}, {info.device})")
    _data_out.print(f"saved {info.file}")


@app.command("search")
def search_cmd(
    store: Annotated[str, typer.Argument(help="Store folder")],
    query: Annotated[str, typer.Argument(help="Query text")],
    student: Annotated[str | None, typer.Option(help="Student directory to embed the query")] = None,
    teacher: Annotated[str | None, typer.Option(help="Teacher of the store to embed the query")] = None,
    k: Annotated[int, typer.Option("-k", help="How many results", **_in(B.K))] = 10,
    table: Annotated[str | None, typer.Option(help="Indexed table (default: the teacher's, or by dim)")] = None,
    column: Annotated[str | None, typer.Option(help="Indexed column (default: teacher's default target)")] = None,
    kind: Annotated[B.IndexKind | None, typer.Option(help="Index kind when several exist")] = None,
) -> None:
    """Top-k texts of the store nearest to a query (build the index first with kd index)."""
    from rich.table import Table

    from kd.apps.search import search_text

    try:
        res = search_text(store, query, student=student, teacher=teacher, table=table, column=column, kind=kind, k=k)
    except KdError as e:
        _fail(e)
    t = Table("rank", "score", "id", "text", caption=f"index {res.index.name}")
    for rank, (i, s, text) in enumerate(zip(res.ids[0], res.scores[0], res.texts[0]), 1):
        if s > float("-inf"):  # -inf: an approximate index found fewer than k rows
            t.add_row(str(rank), f"{s:.4f}", str(i), text)
    _data_out.print(t)


@app.command("cluster")
def cluster_cmd(
    store: Annotated[str, typer.Argument(help="Store folder")],
    table: Annotated[str, typer.Option(help="Table: view name (minilm) or path (teachers/minilm)")],
    column: Annotated[str, typer.Option(help="1-D vector column, e.g. sentence")],
    threshold: Annotated[float, typer.Option(help="Cosine distance (1 - cos) under which clusters merge", **_in(B.COSINE_DISTANCE))],  # noqa: E501
    method: Annotated[B.ClusterMethod, typer.Option(help="auto | exact | knn (faiss kNN graph, for big stores)")] = "auto",  # noqa: E501
    exact_max: Annotated[int, typer.Option(help="Largest row count clustered exactly", **_in(B.EXACT_ROWS))] = 20000,
    k: Annotated[int, typer.Option("-k", help="Neighbours per row in the kNN graph", **_in(B.K))] = 30,
) -> None:
    """Agglomerative clustering (cosine, average linkage) into table derived/clusters-<table>-<column>."""
    from kd.dataset.cluster import cluster_store

    try:
        s = cluster_store(store, table, column, threshold, method=method, exact_max=exact_max, k=k)
    except KdError as e:
        _fail(e)
    _data_out.print(
        f"{s.rows:,} rows -> {s.clusters:,} clusters ({s.method}; largest {s.largest:,}, {s.singletons:,} singletons) "
        f"in {s.table}"
    )


# --- task teachers and fine-tuning ---------------------------------------------------------------
# (finetune commands)
def _metric_text(metrics: dict) -> str:
    shown = [f"{k} {v:.2f}" for k, v in metrics.items() if k != "n"]
    return f"dev {', '.join(shown)} (n={metrics.get('n', 0)})" if shown else "no --dev set: last epoch kept"


@app.command("finetune-teacher")
def finetune_teacher_cmd(
    base: Annotated[str, typer.Option(help="minilm | mpnet | bert-base | DIR: the encoder to fine-tune")],
    task: Annotated[B.Task, typer.Option(help="pair-regression | pair-classification | classification")],
    train: Annotated[list[str], typer.Option(help="Training file(s): .tsv/.csv/.jsonl/.parquet with labels")],
    out: Annotated[str, typer.Option("--out", "-o", help="Output folder: a Hugging Face checkpoint")],
    dev: Annotated[list[str] | None, typer.Option(help="Dev file(s), scored after every epoch")] = None,
    epochs: Annotated[int, typer.Option(**_in(B.EPOCHS))] = 3,
    lr: Annotated[float, typer.Option(**_in(B.LR))] = 2e-5,
    batch_size: Annotated[int, typer.Option(**_in(B.BATCH))] = 16,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many steps (overrides --epochs)", **_in(B.STEPS))] = None,  # noqa: E501
    warmup: Annotated[float, typer.Option(help="Warm-up: fraction of steps (<1) or steps (>=1); 0: none", **_in(B.WARMUP))] = 0.1,  # noqa: E501
    max_length: Annotated[int, typer.Option(help="Tokens per input (a pair counts both sides)", **_in(B.TEACHER_TOKENS))] = 128,  # noqa: E501
    text_column: Annotated[str | None, typer.Option(help="Text column (name, or 0-based index without header)")] = None,  # noqa: E501
    pair_columns: Annotated[str | None, typer.Option(help="Two columns a,b for pair tasks, e.g. 5,6 for STS-B")] = None,  # noqa: E501
    label_column: Annotated[str | None, typer.Option(help="Label column (default: label)")] = None,
    delimiter: Annotated[str | None, typer.Option(help="Field delimiter for .csv/.tsv (default: sniffed)")] = None,
    seed: Annotated[int, typer.Option(**_in(B.SEED))] = 0,
    device: Annotated[str | None, typer.Option(help="cpu | cuda | cuda:N (default: cuda when present)", **_device(False))] = None,  # noqa: E501
    overwrite: Annotated[bool, typer.Option(help="Replace a previous kd finetune-teacher output")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
) -> None:
    """Fine-tune a task teacher (a cross-encoder for pairs) that kd precompute --teacher DIR runs for logits."""
    from kd.pipeline.finetune_teacher import TeacherFinetuneConfig, finetune_teacher

    try:
        s = finetune_teacher(TeacherFinetuneConfig(
            base, task, train, out, dev=dev, epochs=epochs, lr=lr, batch_size=batch_size, max_steps=max_steps,
            warmup=warmup, max_length=max_length, text_column=text_column, pair_columns=pair_columns,
            label_column=label_column, delimiter=delimiter, seed=seed, device=device, overwrite=overwrite,
            progress=progress))
    except KdError as e:
        _fail(e)
    labels = f"labels {s.label_names}" if s.label_names else "one score"
    term.print(f"teacher written to {s.out} ({s.task}, {labels}; {s.train_rows:,} rows, {s.steps} steps, "
               f"{s.seconds:.0f} s); {_metric_text(s.dev_metrics)}")


@app.command("finetune")
def finetune_cmd(
    student: Annotated[str, typer.Option(help="Student folder written by kd train-student")],
    task: Annotated[B.Task, typer.Option(help="classification | pair-classification | pair-regression")],
    train: Annotated[list[str], typer.Option(help="Training file(s) with labels")],
    out: Annotated[str, typer.Option("--out", "-o", help="Output folder for the fine-tuned student")],
    dev: Annotated[list[str] | None, typer.Option(help="Dev file(s), scored after every epoch")] = None,
    kd_store: Annotated[str | None, typer.Option(help="SRA+KD: store over the training file with a task teacher's logits")] = None,  # noqa: E501
    kd_weight: Annotated[float, typer.Option(help="Weight of the logit MSE to the teacher (0: off)", **_in(B.LOSS_WEIGHT))] = 1.0,  # noqa: E501
    kd_alpha: Annotated[float | None, typer.Option(help="SRA+KD as Tang et al.: alpha x task loss + (1 - alpha) x logit MSE (replaces --kd-weight)", **_in(B.UNIT))] = None,  # noqa: E501
    kd_teacher: Annotated[str | None, typer.Option(help="Teacher of --kd-store (default: the one with logits)")] = None,  # noqa: E501
    epochs: Annotated[int, typer.Option(**_in(B.EPOCHS))] = 3,
    lr: Annotated[float, typer.Option(help="SRA picks from 2e-4, 3e-4, 5e-4, 1e-3 on dev", **_in(B.LR))] = 5e-4,
    batch_size: Annotated[int, typer.Option(**_in(B.BATCH))] = 32,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many steps (overrides --epochs)", **_in(B.STEPS))] = None,  # noqa: E501
    hidden: Annotated[int, typer.Option(help="Width of the MLP head's hidden layer", **_in(B.WIDTH))] = 256,
    dropout: Annotated[float, typer.Option(**_in(B.DROPOUT))] = 0.1,
    text_column: Annotated[str | None, typer.Option(help="Text column (name, or 0-based index without header)")] = None,  # noqa: E501
    pair_columns: Annotated[str | None, typer.Option(help="Two columns a,b for pair tasks")] = None,
    label_column: Annotated[str | None, typer.Option(help="Label column (default: label)")] = None,
    delimiter: Annotated[str | None, typer.Option(help="Field delimiter for .csv/.tsv (default: sniffed)")] = None,
    seed: Annotated[int, typer.Option(**_in(B.SEED))] = 0,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N", **_device(True))] = "auto",
    overwrite: Annotated[bool, typer.Option(help="Replace a previous kd finetune output")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
) -> None:
    """Fine-tune a student with an MLP head on a labelled task (SRA); with --kd-store also match a teacher (SRA+KD)."""
    from kd.student.finetune import FinetuneConfig, finetune

    try:
        s = finetune(FinetuneConfig(
            student, task, train, out, dev=dev, kd_store=kd_store, kd_weight=kd_weight, kd_alpha=kd_alpha,
            kd_teacher=kd_teacher, epochs=epochs, lr=lr, batch_size=batch_size, max_steps=max_steps, hidden=hidden,
            dropout=dropout,
            text_column=text_column, pair_columns=pair_columns, label_column=label_column, delimiter=delimiter,
            seed=seed, device=device, overwrite=overwrite, progress=progress))
    except KdError as e:
        _fail(e)
    kd = f", KD from {s.kd_teacher}" if s.kd_teacher else ""
    term.print(f"fine-tuned student written to {s.out} ({s.task}{kd}; {s.train_rows:,} rows, {s.steps} steps, "
               f"{s.seconds:.0f} s); {_metric_text(s.dev_metrics)}")


_ = Path

if __name__ == "__main__":
    main()
